"""Per-run cgroups: memory, pids and CPU limits, and the run's accounting (v1 and v2).

Everything lives under a `sandtree` parent of our own in each hierarchy; a run's group is named
<engine pid>-<its start time>-<pid namespace>-<run id> (procid.py) so a cleanup pass only ever
removes groups whose engine is verifiably gone. The helper joins the group before it clones the
sandbox, so every process of the run is inside from birth.

Devices: every run's group allows only the device nodes the runtime itself provides (DEVICES:
helper/mounts.c's /dev, its devpts) and denies every other open (EPERM) and every mknod, even by a
process that is host root (runsc's gofer). Defence in depth under `nodev` on every mount the
sandbox can write or that comes from an image: on cgroup v1 the `devices` controller; on v2 its
eBPF equivalent (runtime/devices.py) attached to the run's group.

Socket buffers: v2 charges them to memory.current with the rest of the run's memory. v1 charges
TCP buffers to nothing unless the group's memory.kmem.tcp.limit_in_bytes was written before the
sockets exist (a run with memory=64 MiB parked 388 MB in loopback TCP buffers; the host's tcp_mem
was the only bound): every v1 group gets it at creation, before any process joins, at
tcp_budget(memory). That limit puts the run's sockets under memory pressure rather than failing
each write, so it is one of three bounds (the others: small per-socket maxima in the sandbox's
network namespace, helper/network.c; a hard RLIMIT_NOFILE, base.RLIMITS).
"""

from __future__ import annotations

import os
import secrets
import select
import time
from dataclasses import dataclass, field

from .. import procid
from . import devices

ROOT = "/sys/fs/cgroup"
PARENT = "sandtree"

# (type, major, minor or None for all): null, zero, full, random, urandom, tty, ptmx and the
# devpts slaves (136-143: the kernel's Unix98 pty majors). mknod of these only (the helper makes
# the sandbox's /dev after joining the group; a user namespace cannot mknod at all).
DEVICES = [("c", 1, 3), ("c", 1, 5), ("c", 1, 7), ("c", 1, 8), ("c", 1, 9), ("c", 5, 0), ("c", 5, 2)] + \
          [("c", m, None) for m in range(136, 144)]


def tcp_budget(memory: int) -> int:
    """Bytes of TCP buffers a v1 group may hold, on top of its memory limit (v1 keeps them in a
    counter of their own): a quarter of it, at least 4 MiB (a few connections at full speed)."""
    return max(memory // 4, 4 << 20)


def _v1_device_rules() -> list[str]:
    return [f"{t} {ma}:{'*' if mi is None else mi} rwm" for t, ma, mi in DEVICES]


def sandbox_pid_budget() -> int:
    """All sandboxes together (our parent group's pids.max): three quarters of the host's pid
    space, so runs that each stay within their own `pids` cannot together leave the host unable
    to fork (pid_max is 32,768 on this kind of machine; each run may hold 1,024)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            pid_max = int(f.read())
    except (OSError, ValueError):
        pid_max = 32768
    return max(1024, pid_max * 3 // 4)


def _write_if_possible(path: str, value: str) -> None:
    try:
        _write(path, value)
    except OSError:
        pass                     # a host that manages it itself (or a v2 parent without pids)


def detect() -> str | None:
    if os.path.exists(os.path.join(ROOT, "cgroup.controllers")):
        with open(os.path.join(ROOT, "cgroup.controllers")) as f:
            if {"memory", "pids"} <= set(f.read().split()):
                return "v2"
    if os.path.isdir(os.path.join(ROOT, "memory")) and os.path.isdir(os.path.join(ROOT, "pids")):
        return "v1"
    return None


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _write_tcp_limit(group: str, memory: int) -> None:
    """v1: account the group's TCP buffers (from now on) and cap them. A kernel without the file
    (v1 memory without kmem accounting) is refused: the run would be unbounded there."""
    _write(os.path.join(group, "memory.kmem.tcp.limit_in_bytes"), str(tcp_budget(memory)))


def _read(path: str, default: str = "") -> str:
    # os.open/os.read, not open(): no buffered text wrapper for a small kernel file (a pool run
    # reads several of them on the caller's path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return default
    try:
        data = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return data.decode()
            data += chunk
    except OSError:
        return default
    finally:
        os.close(fd)


def _pread(fd: int, default: str = "") -> str:
    """A kernel file held open, read whole again: the kernel makes a cgroup file's text anew for a
    read at offset 0 (seq_file)."""
    data = b""
    try:
        while chunk := os.pread(fd, 65536, len(data)):
            data += chunk
    except OSError:
        return default
    return data.decode()


@dataclass
class RunCgroup:
    version: str
    dirs: dict[str, str] = field(default_factory=dict)     # controller (or "unified") -> dir
    # path -> fd of the files a run's end reads (stats), opened once ahead (hold): a warm
    # pool's sandbox opens them when it starts, not on each run's path
    held: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def _read(self, path: str) -> str:
        fd = self.held.get(path)
        return _read(path) if fd is None else _pread(fd)

    def _procs_dir(self) -> str:
        # every process joins all of the run's controllers (helper/main.c, helper/enter.c), so one of them tells
        return self.dirs.get("pids") or self.dirs.get("unified") or next(iter(self.dirs.values()))

    def hold(self) -> None:
        """Open the files stats() reads, for as long as the group lives (unhold)."""
        if self.version == "v1":
            m = self.dirs.get("memory")
            paths = [os.path.join(m, f) for f in ("memory.oom_control", "memory.max_usage_in_bytes")] if m else []
        else:
            paths = [os.path.join(self.dirs["unified"], f) for f in ("memory.events", "memory.peak", "cpu.stat")]
        # (not cgroup.procs: v1 serves a held one's later reads from a pid list it keeps for a second)
        for path in paths:
            try:
                self.held[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass                                 # (read by path then: as without hold)

    def unhold(self) -> None:
        for fd in self.held.values():
            os.close(fd)
        self.held.clear()

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def stats(self) -> dict:
        out = {"oom_killed": False, "memory_peak": None, "cpu_usage_ns": None}
        if self.version == "v1":
            m = self.dirs.get("memory")
            if m:
                oc = dict(l.split() for l in self._read(os.path.join(m, "memory.oom_control")).splitlines() if l)
                out["oom_killed"] = int(oc.get("oom_kill", 0)) > 0
                peak = self._read(os.path.join(m, "memory.max_usage_in_bytes")).strip()
                out["memory_peak"] = int(peak) if peak else None
        else:
            d = self.dirs["unified"]
            ev = dict(l.split() for l in self._read(os.path.join(d, "memory.events")).splitlines() if l)
            out["oom_killed"] = int(ev.get("oom_kill", 0)) > 0
            peak = self._read(os.path.join(d, "memory.peak")).strip()
            out["memory_peak"] = int(peak) if peak.isdigit() else None
            st = dict(l.split() for l in self._read(os.path.join(d, "cpu.stat")).splitlines() if l)
            if "usage_usec" in st:
                out["cpu_usage_ns"] = int(st["usage_usec"]) * 1000
        return out

    def set_limits(self, *, memory: int, pids: int, cpus: float | None) -> None:
        """(Re)write the limits of a group made ahead of its run (a warm helper's)."""
        quota = max(1000, int(cpus * 100000)) if cpus else None
        if self.version == "v1":
            _write(os.path.join(self.dirs["memory"], "memory.limit_in_bytes"), str(memory))
            _write_tcp_limit(self.dirs["memory"], memory)
            _write(os.path.join(self.dirs["pids"], "pids.max"), str(pids))
            if "cpu" in self.dirs:
                _write(os.path.join(self.dirs["cpu"], "cpu.cfs_quota_us"), str(quota or -1))
        else:
            d = self.dirs["unified"]
            _write(os.path.join(d, "memory.max"), str(memory))
            _write(os.path.join(d, "pids.max"), str(pids))
            _write(os.path.join(d, "cpu.max"), f"{quota or 'max'} 100000")

    def freeze(self, frozen: bool = True, timeout: float = 5.0) -> None:
        """Stop (or resume) every process of the group at once: a live sandbox's filesystem is
        read for a commit while nothing in it can write. Waits until the kernel says so."""
        if self.version == "v1":
            self._freeze_v1(frozen, timeout)
            return
        d = self.dirs["unified"]
        _write(os.path.join(d, "cgroup.freeze"), "1" if frozen else "0")
        flag = f"frozen {1 if frozen else 0}"
        end = time.monotonic() + timeout
        while flag not in _read(os.path.join(d, "cgroup.events")):
            if time.monotonic() > end:
                raise OSError(f"cgroup did not become {'frozen' if frozen else 'thawed'} in {timeout}s")
            time.sleep(0.0005)

    def _freeze_v1(self, frozen: bool, timeout: float) -> None:
        # v1's freezer sends the freeze to the tasks it sees when FROZEN is written; a task forked
        # while the group is FREEZING can miss it and leave the group FREEZING for good (a shell
        # loop forking `sleep` did, under gVisor's many threads). Writing FROZEN again freezes
        # the late ones, and a short thaw now and then lets a fork storm settle (runc does both).
        d = self.dirs.get("freezer")
        if d is None:
            raise OSError("this group has no freezer")
        state = os.path.join(d, "freezer.state")
        want = "FROZEN" if frozen else "THAWED"
        end = time.monotonic() + timeout
        tries = 0
        while True:
            _write(state, want)
            if _read(state).strip() == want:
                return
            tries += 1
            if time.monotonic() > end:
                if frozen:
                    _write(state, "THAWED")          # not left half frozen: the sandbox goes on
                raise OSError(f"cgroup did not become {'frozen' if frozen else 'thawed'} in {timeout}s")
            if frozen and tries % 200 == 0:
                _write(state, "THAWED")
                time.sleep(0.01)
            else:
                time.sleep(0.0005)

    def is_frozen(self) -> bool:
        if self.version == "v1":
            d = self.dirs.get("freezer")
            return d is not None and _read(os.path.join(d, "freezer.state")).strip() in ("FROZEN", "FREEZING")
        return "frozen 1" in _read(os.path.join(self.dirs["unified"], "cgroup.events"))

    def pids(self) -> set[int]:
        return {int(p) for p in _read(os.path.join(self._procs_dir(), "cgroup.procs")).split()}

    def threads(self) -> set[int]:
        """Every thread of the group's processes (v1 `tasks`, v2 `cgroup.threads`)."""
        d = self._procs_dir()
        text = _read(os.path.join(d, "tasks"), "") or _read(os.path.join(d, "cgroup.threads"), "")
        return {int(t) for t in text.split()}

    def settle(self, known: set[int], wait: float) -> set[int]:
        """The group's processes other than `known`, once those have had up to `wait` seconds to
        exit (a command's output relay ends just after the command: waiting for its exit on a
        pidfd is cheaper than freezing the group). The answer is a fresh read of the group: a
        pid that exited and was reused meanwhile only costs the wait."""
        others = self.pids() - known
        if not others:
            return others
        end = time.monotonic() + wait
        for p in others:
            try:
                fd = os.pidfd_open(p)
            except OSError:                     # exited already
                continue
            try:
                select.select([fd], [], [], max(0.0, end - time.monotonic()))
            finally:
                os.close(fd)
        return self.pids() - known

    def usage(self) -> dict:
        """What a metrics sample reads now (engine/sandboxes/metrics.py): CPU time used so far in
        ns, memory in use and the page cache within it, in bytes (None: not counted here). CPU
        time is the group's own counter where one is kept (v2 cpu.stat, v1 cpuacct co-mounted
        with cpu); on a v1 host whose groups have no cpuacct, its processes' own times (their
        children's included once waited for: the sandbox's init reaps them)."""
        out = {"cpu_ns": None, "memory": self.memory_current(), "cache": None}
        if self.version == "v1":
            m = self.dirs.get("memory")
            stat = _kv(_read(os.path.join(m, "memory.stat"))) if m else {}
            out["cache"] = stat.get("total_cache", stat.get("cache"))
            c = self.dirs.get("cpuacct") or self.dirs.get("cpu")
            used = _read(os.path.join(c, "cpuacct.usage")).strip() if c else ""
            out["cpu_ns"] = int(used) if used.isdigit() else _procs_cpu_ns(self.pids())
        else:
            d = self.dirs["unified"]
            out["cache"] = _kv(_read(os.path.join(d, "memory.stat"))).get("file")
            used = _kv(_read(os.path.join(d, "cpu.stat"))).get("usage_usec")
            out["cpu_ns"] = used * 1000 if used is not None else _procs_cpu_ns(self.pids())
        return out

    def memory_current(self) -> int | None:
        if self.version == "v1":
            m = self.dirs.get("memory")
            v = _read(os.path.join(m, "memory.usage_in_bytes")).strip() if m else ""
        else:
            v = _read(os.path.join(self.dirs["unified"], "memory.current")).strip()
        return int(v) if v.isdigit() else None

    def kill_all(self, wait: float = 5.0) -> bool:
        """SIGKILL every process in the group (a runtime whose processes are not one pid
        namespace under us, like runsc's sandbox and gofer) and wait, up to `wait` seconds, for
        their exits: each on the pidfd it was signalled through, readable once the process is
        gone (its files closed: none of its writes can still land), then the group read again.
        True once it is empty."""
        end = time.monotonic() + wait
        while True:
            pids = {}
            for d in self.dirs.values():
                pids.update((int(p), d) for p in _read(os.path.join(d, "cgroup.procs")).split())
            if not pids:
                return True
            fds = [fd for p, d in pids.items()
                   if (fd := procid.signal_member_pidfd(p, d)) is not None]   # only while still a member
            try:
                left = fds
                while left and (t := end - time.monotonic()) > 0:
                    done = select.select(left, [], [], t)[0]
                    left = [fd for fd in left if fd not in done]
            finally:
                for fd in fds:
                    os.close(fd)
            if time.monotonic() >= end:
                return not any(_read(os.path.join(d, "cgroup.procs")).split() for d in self.dirs.values())
            if not fds:
                time.sleep(0.001)            # (listed, but exited before the signal: not yet unlisted)

    def kill(self) -> None:
        for d in self.dirs.values():
            k = os.path.join(d, "cgroup.kill")
            if os.path.exists(k):
                try:
                    _write(k, "1")
                except OSError:
                    pass

    def remove(self, wait: float = 0.0) -> bool:
        """rmdir every group; with wait, retry while the kernel still releases exited tasks
        (EBUSY for a moment after the last one is reaped). True if all are gone."""
        deadline = time.monotonic() + wait
        left = dict(self.dirs)
        pause = 0.0005                          # (a kill's tasks are reaped within a millisecond or two:
        while True:                             # a stop waits that, not a fixed 5 ms step)
            for c, d in list(left.items()):
                try:
                    os.rmdir(d)
                    del left[c]
                except FileNotFoundError:
                    del left[c]
                except OSError:
                    pass
            if not left or time.monotonic() >= deadline:
                return not left
            time.sleep(pause)
            pause = min(pause * 2, 0.005)


class Cgroups:
    # cpu only when a run asks for a quota: joining a cpu group costs ~0.15 ms per start, and
    # without a quota a run's CPU time is bounded by its timeout. CPU accounting comes from rusage.
    V1_CONTROLLERS = ("memory", "pids", "cpu", "devices")

    def __init__(self):
        self.version = detect()
        self.available = self.version is not None and os.access(ROOT, os.W_OK)
        self._prefix = procid.owner_prefix()          # PID-START-NS-: see procid.py
        if self.available:
            try:
                self._setup_parents()
                self.cleanup_stale()
            except OSError:
                self.available = False

    def _parents(self, cpu: bool = True, freezer: bool = True, acct: bool = True) -> dict[str, str]:
        """acct: v1's cpuacct where it is a hierarchy of its own (a live sandbox's CPU time for its
        metrics: the processes of its commands end, and their times with them, outside any
        parent's reach); mounted with cpu, it is cpu's group (joined only for a quota)."""
        if self.version == "v1":
            out = {c: os.path.join(ROOT, c, PARENT) for c in self.V1_CONTROLLERS + ("freezer",)
                   if os.path.isdir(os.path.join(ROOT, c)) and (cpu or c != "cpu")
                   and (freezer or c != "freezer")}
            if acct and os.path.isdir(os.path.join(ROOT, "cpuacct")) and \
                    os.path.realpath(os.path.join(ROOT, "cpuacct")) != os.path.realpath(os.path.join(ROOT, "cpu")):
                out["cpuacct"] = os.path.join(ROOT, "cpuacct", PARENT)
            return out
        return {"unified": os.path.join(ROOT, PARENT)}

    def _setup_parents(self) -> None:
        self._devices_inherited = False
        for c, p in self._parents().items():
            os.makedirs(p, exist_ok=True)
            if c in ("pids", "unified"):
                _write_if_possible(os.path.join(p, "pids.max"), str(sandbox_pid_budget()))
            if c == "devices":
                self._devices_inherited = self._parent_device_policy(p)
            elif self.version == "v2":
                _write(os.path.join(p, "cgroup.subtree_control"), "+memory +pids +cpu")
            elif c == "memory":
                try:
                    _write(os.path.join(p, "memory.use_hierarchy"), "1")
                except OSError:
                    pass

    @staticmethod
    def _parent_device_policy(parent: str) -> bool:
        """v1: the device policy on our parent group, which every run's group copies when it is
        made (the kernel copies a devices group's behaviour and exceptions from its parent): 10
        writes, 0.14 ms, saved on every start. Writable only while the parent has no child (the
        kernel refuses a new default then); with children from an engine that did not set it,
        each run's group gets the policy itself. True when the parent holds exactly the policy."""
        want = {f"{t} {ma}:{'*' if mi is None else mi} rwm" for t, ma, mi in DEVICES}
        listed = lambda: set(_read(os.path.join(parent, "devices.list")).split("\n")) - {""}  # noqa: E731
        if listed() != want and not any(os.path.isdir(os.path.join(parent, n)) for n in os.listdir(parent)):
            try:
                _write(os.path.join(parent, "devices.deny"), "a")
                for rule in _v1_device_rules():
                    _write(os.path.join(parent, "devices.allow"), rule)
            except OSError:
                return False
        return listed() == want

    def cleanup_stale(self) -> None:
        """Remove run groups left by engines that died (kill -9); never anyone else's, and never
        a detached live sandbox's ("live-...") while it holds a process. A group frozen when its
        engine died (a commit cut short) is thawed first: frozen processes cannot even die."""
        for p in self._parents().values():
            for name in os.listdir(p):
                if name.startswith("live-"):
                    # a detached live sandbox's, named after the engine that made it: never
                    # killed here (it outlives its engine), but an empty one of a dead maker is
                    # nobody's (its start was cut short, or it ended with no engine to stop it);
                    # rmdir fails on a group that still holds a process
                    if procid.dead_owner(name[len("live-"):]):
                        try:
                            os.rmdir(os.path.join(p, name))
                        except OSError:
                            pass
                    continue
                if not procid.dead_owner(name):     # (pid, start time, pid namespace)
                    continue
                state = os.path.join(ROOT, "freezer", PARENT, name, "freezer.state")
                if os.path.exists(state) and _read(state).strip() != "THAWED":
                    try:
                        _write(state, "THAWED")
                    except OSError:
                        pass
                cg = RunCgroup(self.version, {"x": os.path.join(p, name)})
                if cg.pids():
                    cg.kill_all()
                cg.remove(wait=0.5)

    def create(self, *, memory: int, pids: int, cpus: float | None, warm: bool = False,
               live: bool = False, detached: bool = False) -> RunCgroup:
        """A run's group. warm: made ahead of the run, in every controller (joining cpu is slow,
        and the run's limits, written later by set_limits, are not known yet). live: a live
        sandbox's, with a freezer (v1; v2 groups freeze by themselves). detached: it outlives this
        engine (cleanup_stale leaves it to whoever stops the sandbox)."""
        # detached live sandboxes outlive this engine: their groups must not look like its runs'
        # (named after this engine too: cleanup_stale removes it once empty and its maker dead)
        name = ("live-" + self._prefix if detached else self._prefix) + secrets.token_hex(4 if not detached else 8)
        cg = RunCgroup(self.version)
        if warm:
            cpus = None
        try:
            for c, p in self._parents(cpu=warm or cpus is not None, freezer=live, acct=live).items():
                d = os.path.join(p, name)
                os.mkdir(d)
                cg.dirs[c] = d
                if c == "memory":
                    _write(os.path.join(d, "memory.limit_in_bytes"), str(memory))
                    _write_tcp_limit(d, memory)          # before any process (or socket) is in
                elif c == "pids":
                    _write(os.path.join(d, "pids.max"), str(pids))
                elif c == "devices" and not self._devices_inherited:
                    _write(os.path.join(d, "devices.deny"), "a")      # then only DEVICES back
                    for rule in _v1_device_rules():
                        _write(os.path.join(d, "devices.allow"), rule)
                elif c == "cpu":
                    _write(os.path.join(d, "cpu.cfs_period_us"), "100000")
                    _write(os.path.join(d, "cpu.cfs_quota_us"),
                           str(max(1000, int(cpus * 100000))) if cpus else "-1")
                elif c == "unified":
                    _write(os.path.join(d, "memory.max"), str(memory))
                    _write(os.path.join(d, "memory.swap.max"), "0") if os.path.exists(
                        os.path.join(d, "memory.swap.max")) else None
                    _write(os.path.join(d, "pids.max"), str(pids))
                    devices.attach(d, DEVICES)
                    if cpus is not None:
                        _write(os.path.join(d, "cpu.max"), f"{max(1000, int(cpus * 100000))} 100000")
        except BaseException:
            cg.remove()
            raise
        return cg


def _kv(text: str) -> dict[str, int]:
    """A cgroup's `name value` lines (memory.stat, cpu.stat), numbers only."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _procs_cpu_ns(pids) -> int:
    """CPU time of these processes and of their children they waited for (utime, stime, cutime,
    cstime of /proc/PID/stat), in ns; a process that ends meanwhile counts nothing."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])
    return total * 1_000_000_000 // tick
