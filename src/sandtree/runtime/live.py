"""Live sandboxes on the `namespaces` tier: started once, entered by any number of commands.

A live sandbox is the same sandbox a run gets (helper.c: user/mnt/pid/net/ipc/uts/cgroup
namespaces, overlay on a size-capped tmpfs upper, masked /proc, seccomp, cgroup limits), except
that its pid 1 runs no command and its helper does not die with the engine: it is a process of
its own (re-parented to init), bounded by its lifetime. Everything needed to find it again lives
in a LiveHandle (stored by the engine), so any engine process - the CLI, a restarted server -
can enter, freeze, commit or stop it.

Commands enter with `sandtree-exec --enter-fd PIDFD`: a pidfd of the sandbox's pid 1, opened
and checked against the recorded start time here, so a recycled pid is never entered. The
upper dir is read through /proc/<helper>/root/tmp/u: the helper's private mount namespace holds
the tmpfs, for as long as the sandbox lives. Every /proc/PID file of the sandbox's processes is
opened under a pidfd checked against the start time (_open_of).

A command's stdout and stderr reach the engine through sandtree-drain (drain.c), a reader
inside the sandbox: the exec returns at the command's exit with all it wrote, and a background
job it left keeps a reader (its later output is discarded) instead of dying of SIGPIPE.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field

from ..errors import CommandNotFound, InvalidInput, NotFound, RuntimeUnavailable, SandboxError
from . import seccomp
from .base import RunOutcome, RunSpec
from . import criu
from .build import drain_path, init_path
from .cgroups import RunCgroup
from .namespaces import NamespaceRuntime, _parse_report, validate_spec
from .procid import proc_namespace, signal_member, start_time


# After the command's exit, how long the engine waits for sandtree-drain to pass on the rest of
# its output (microseconds normally; the drain runs as the sandbox's, so it is not trusted to).
RELAY_GRACE = 2.0


@dataclass
class LiveHandle:
    helper_pid: int
    helper_start: int            # start times (clock ticks since boot): a pid is ours only if
    init_pid: int                # its start time still matches
    init_start: int
    cgroup: dict | None          # {"version": ..., "dirs": {...}}
    # the pid namespace these pids are numbered in (procid.proc_namespace; None: an older row,
    # taken as ours). An engine in another pid namespace cannot judge them: see foreign().
    ns: int | None = None
    proc: object = field(default=None, repr=False, compare=False)   # not detached: our child

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "proc"}

    @classmethod
    def from_dict(cls, d: dict) -> "LiveHandle":
        return cls(**d)

    def cg(self) -> RunCgroup | None:
        return RunCgroup(self.cgroup["version"], dict(self.cgroup["dirs"])) if self.cgroup else None


class LiveRuntime:
    """The live-sandbox half of the namespaces tier (it reuses its helper, options and pump)."""

    def __init__(self, rt: NamespaceRuntime):
        self.rt = rt
        self._init: str | None = None
        self._drain: str | None = None

    def available(self) -> tuple[bool, str]:
        ok, why = self.rt.available()
        if not ok:
            return ok, why
        if self.rt.idmap.rootless:
            return False, "live sandboxes need root (their upper is reached through the helper's mount namespace)"
        if not hasattr(os, "pidfd_open"):
            return False, "live sandboxes need pidfd_open (Linux 5.3, Python 3.9)"
        return True, ""

    def init(self) -> str:
        if self._init is None:
            self._init = init_path(self.rt.cache_dir)
        return self._init

    def drain(self) -> str:
        if self._drain is None:
            self._drain = drain_path(self.rt.cache_dir)
        return self._drain

    def _check(self) -> None:
        ok, why = self.available()
        if not ok:
            raise RuntimeUnavailable(why)

    # ---- start ---------------------------------------------------------------------------------
    def start(self, spec: RunSpec, lifetime: float, *, detach: bool = True,
              restore: str | None = None) -> LiveHandle:
        """Start a sandbox on spec's image, limits, env and files; its pid 1 waits for commands.
        detach: it outlives this process (a user's live sandbox); else it dies with the thread
        that started it (a warm pool's), whose helper process is then handle.proc.
        restore: a checkpoint dir (hibernate): its processes are brought back instead of a new
        pid 1, on spec's image (the one committed when it was taken)."""
        self._check()
        validate_spec(spec)
        rt, lim = self.rt, spec.limits
        images = None
        if restore is not None:
            path, why = criu.find()
            if path is None:
                raise RuntimeUnavailable(why)
            images = os.open(restore, os.O_RDONLY | os.O_DIRECTORY)   # the helper covers /tmp
            command = criu.restore_args(path, f"/proc/self/fd/{images}", "/r")   # (helper.c criu_root)
            mode = ["--restore", "1"]
        else:
            command = ["sandtree-init"]
            mode = ["--init", self.init()]
        # CRIU restores from inside the sandbox's cgroups (its tasks inherit them): its own
        # processes and memory count there too, so the limits get headroom until it is done (the
        # restored tasks stay stopped meanwhile: see below).
        memory, pids = (lim.memory + max(lim.memory, 1 << 30), lim.pids + 1024) if restore is not None \
            else (lim.memory, lim.pids)
        cg = rt.cgroups.create(memory=memory, pids=pids, cpus=lim.cpus, live=True, detached=detach) \
            if rt.cgroups.available else None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rep_r, rep_w = os.pipe()
        args = [rt.helper(), "--sock", str(theirs.fileno()), "--report", str(rep_w), "--live", "1", *mode,
                "--detach", "1" if detach else "0", "--lifetime", str(max(1, int(lifetime)))]
        args += rt._static_args() + rt._run_args(spec)
        for f in (cg.procs_files if cg else []):
            args += ["--cgroup", f]
        raw = bytearray()
        scratch = None
        try:
            try:
                # criu runs iptables-restore & co. by name
                env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"} if restore is not None else {}
                proc = subprocess.Popen(args + ["--"] + command, env=env, close_fds=True,
                                        pass_fds=(theirs.fileno(), rep_w, seccomp.filter_fd())
                                        + ((images,) if images is not None else ()),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
            finally:
                theirs.close()
                os.close(rep_w)
                if images is not None:
                    os.close(images)
            if detach:
                proc.wait()                   # the helper forks away at once (see helper.c)
            deadline = time.monotonic() + min(lim.timeout, 60)
            scratch = rt._receive_scratch(ours, rep_r, raw, _Detached() if detach else proc, deadline)
            if scratch is not None and spec.prepare_changes:
                spec.prepare_changes(f"/proc/self/fd/{scratch}/u")
                ours.send(b"g")
            while b"ready\n" not in raw:
                chunk = os.read(rep_r, 4096)
                if not chunk:
                    break
                raw += chunk
            report = _parse_report(raw)
            if "setupfail" in report:
                err, step = report["setupfail"]
                if step == "criu-restore":
                    raise SandboxError(f"criu restore failed (exit {err}): {criu.log_tail(restore, 'restore.log')}",
                                       step=step)
                raise SandboxError(f"sandbox setup failed at {step}: {os.strerror(err)}", step=step, errno=err)
            if b"ready\n" not in raw or "pid" not in report:
                raise SandboxError(f"live sandbox did not start: {bytes(raw).decode(errors='replace').strip()}")
            init_pid = report["pid"]
            helper_pid = _parent_of(init_pid)
            handle = LiveHandle(helper_pid, start_time(helper_pid) or 0, init_pid, start_time(init_pid) or 0,
                                {"version": cg.version, "dirs": cg.dirs} if cg else None, proc_namespace())
            if not handle.init_start or not handle.helper_start:
                raise SandboxError("live sandbox exited while starting")
            handle.proc = None if detach else proc
            if restore is not None:
                self._continue_restored(handle, cg, lim)
            return handle
        except BaseException:
            rep = _parse_report(raw)
            if rep.get("pid"):
                _kill_pid(rep["pid"], None)
            if not detach:
                proc.kill()
                proc.wait()
            if cg:
                cg.kill_all()
                cg.remove(wait=2.0)
            raise
        finally:
            ours.close()
            os.close(rep_r)
            if scratch is not None:
                os.close(scratch)

    @staticmethod
    def _continue_restored(h: LiveHandle, cg, lim) -> None:
        """CRIU left the restored tasks stopped (--leave-stopped): put the sandbox's own limits
        back, then let them go on. A sandbox that no longer fits them does not run at all."""
        if cg is not None:
            try:
                cg.set_limits(memory=lim.memory, pids=lim.pids, cpus=lim.cpus)
            except OSError as exc:
                raise SandboxError(f"the restored sandbox does not fit its limits again: {exc}") from None
        if cg is None:
            _kill_pid(h.init_pid, h.init_start, signal.SIGCONT)
            return
        group = next(iter(cg.dirs.values()))
        for pid in cg.pids() - {h.helper_pid}:
            signal_member(pid, group, signal.SIGCONT)    # (a listed pid may be reused by now)

    # ---- state ---------------------------------------------------------------------------------
    @staticmethod
    def foreign(h: LiveHandle) -> bool:
        """Started by an engine in another pid namespace: its pids mean other processes here, so
        nothing here may conclude it is gone (and stop its cgroup) or enter it."""
        return h.ns is not None and h.ns != proc_namespace()

    def alive(self, h: LiveHandle) -> bool:
        return start_time(h.init_pid) == h.init_start and start_time(h.helper_pid) == h.helper_start

    def pidfd(self, h: LiveHandle) -> int:
        """A pidfd of the sandbox's pid 1, checked: the pid is pinned from here on."""
        try:
            fd = os.pidfd_open(h.init_pid)
        except ProcessLookupError:
            raise NotFound("the live sandbox is no longer running") from None
        if start_time(h.init_pid) != h.init_start:
            os.close(fd)
            raise NotFound("the live sandbox is no longer running")
        return fd

    def scratch(self, h: LiveHandle) -> int:
        """An fd of the sandbox's scratch dir: its upper (the changes so far) is `u` in it. The
        caller closes it."""
        return _open_of(h.helper_pid, h.helper_start, "root/tmp", os.O_RDONLY | os.O_DIRECTORY)

    def root(self, h: LiveHandle) -> int:
        """An O_PATH fd of the sandbox's root as its processes see it (for confined file access)."""
        return _open_of(h.init_pid, h.init_start, "root", os.O_PATH | os.O_DIRECTORY)

    def own_mounts(self, h: LiveHandle) -> set[int]:
        """Mount ids of the sandbox's own filesystems (overlay root, tmpfs mounts), from its mount
        table (the kernel's, not anything the sandbox wrote): see openat2.py."""
        from .openat2 import own_mounts
        fd = _open_of(h.init_pid, h.init_start, "mountinfo", os.O_RDONLY)
        with os.fdopen(fd, "r", encoding="utf-8", errors="surrogateescape") as f:
            return own_mounts(f.read())

    def frozen(self, h: LiveHandle) -> bool:
        cg = h.cg()
        return cg is not None and cg.is_frozen()

    def freeze(self, h: LiveHandle, frozen: bool = True) -> bool:
        """Freeze (thaw) every process of the sandbox; False if it has no freezer."""
        cg = h.cg()
        if cg is None:
            return False
        cg.freeze(frozen)
        return True

    def memory(self, h: LiveHandle) -> int | None:
        cg = h.cg()
        return cg.memory_current() if cg else None

    def stop(self, h: LiveHandle, wait: float = 5.0) -> None:
        """Kill the sandbox (its pid 1 takes the pid namespace along) and remove its cgroup."""
        cg = h.cg()
        if self.alive(h):
            try:
                fd = self.pidfd(h)
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                finally:
                    os.close(fd)
            except NotFound:
                pass
        if cg:
            try:
                cg.freeze(False, timeout=1.0)          # a frozen group would not die
            except OSError:
                pass
            cg.kill_all()
            cg.remove(wait=wait)
        if h.proc is not None:                         # not detached: our child to reap
            try:
                h.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
            return
        end = time.monotonic() + wait
        while start_time(h.helper_pid) == h.helper_start and time.monotonic() < end:
            time.sleep(0.002)

    # ---- hibernate -----------------------------------------------------------------------------
    def hibernate_available(self) -> tuple[bool, str]:
        ok, why = self.available()
        if not ok:
            return ok, why
        path, why = criu.find()
        return path is not None, why

    def outsiders(self, h: LiveHandle) -> list[int]:
        """Processes in the sandbox's cgroup that a checkpoint cannot hold: commands of an `exec`
        (children of a helper outside, not of pid 1) and the helpers entering them."""
        cg = h.cg()
        out = []
        try:
            ns = os.readlink(f"/proc/{h.init_pid}/ns/pid")
        except OSError:
            return out
        for pid in (cg.pids() if cg else set()) - {h.init_pid, h.helper_pid}:
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") != ns:
                    # an entering helper (outside): busy unless entered ahead and still waiting
                    with open(f"/proc/{pid}/comm") as f:
                        if f.read().strip() != "sandtree-ahead":
                            out.append(pid)
                    continue
            except OSError:
                continue
            p, seen = pid, 0
            while p not in (h.init_pid, 0, 1) and seen < 64:
                try:
                    p = _parent_of(p)
                except (OSError, ValueError):
                    p = 0
                seen += 1
            if p != h.init_pid:
                out.append(pid)
        return out

    def dump(self, h: LiveHandle, images: str, ghost_limit: int) -> None:
        """Checkpoint the sandbox's processes into `images` (CRIU), then they end and its cgroup
        goes. The caller froze them and committed the filesystem; on failure they run on."""
        path, why = criu.find()
        if path is None:
            raise RuntimeUnavailable(why)
        cg = h.cg()
        ns = _open_of(h.init_pid, h.init_start, "ns/user", os.O_RDONLY)
        try:
            owner = criu.namespace_owner(ns)         # CRIU runs as it (criu.as_owner: why)
        finally:
            os.close(ns)
        fd = self.pidfd(h)                           # pinned: the pid dumped is the sandbox's
        try:
            freezer = (cg.dirs.get("freezer") or cg.dirs.get("unified")) if cg else None
            # Its output goes to a file, not a pipe, and a shell records its exit status: if we die
            # now, it finishes anyway and the next engine can tell (criu.dump_finished).
            p = subprocess.Popen(["/bin/sh", "-c", '"$@" >criu.out 2>&1; echo $? >criu.rc', "sh",
                                  *criu.dump_args(path, h.init_pid, images, freezer, ghost_limit, owner)],
                                 cwd=images, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = p.wait(timeout=600)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)     # CRIU too, not only its shell
                p.wait()
                rc = -1
        finally:
            os.close(fd)
        if rc != 0 or not criu.dump_finished(images):
            raise SandboxError(f"criu dump failed: "
                               f"{criu.log_tail(images, 'dump.log') or criu.log_tail(images, 'criu.out')}",
                               step="criu-dump")
        self.stop(h)                                 # what is left: the helper, the cgroup

    # ---- commands ------------------------------------------------------------------------------
    def _spawn(self, h: LiveHandle, extra: list[str], env: dict, fds: tuple, stdin, stdout, stderr):
        rt = self.rt
        pfd = self.pidfd(h)
        rep_r, rep_w = os.pipe()
        # --drain: the command's output goes through a reader inside the sandbox (drain.c), so
        # a background job it leaves keeps a reader after the exec returns
        args = [rt.helper(), "--report", str(rep_w), "--enter-fd", str(pfd), "--drain", self.drain()] + \
            rt._static_args()
        cg = h.cg()
        for f in (cg.procs_files if cg else []):
            args += ["--cgroup", f]
        try:
            proc = subprocess.Popen(args + extra, env=env, close_fds=True,
                                    pass_fds=(rep_w, pfd, seccomp.filter_fd()) + fds,
                                    stdin=stdin, stdout=stdout, stderr=stderr)
        except BaseException:
            os.close(rep_r)
            raise
        finally:
            os.close(rep_w)
            os.close(pfd)
        return proc, rep_r

    def enter_ahead(self, h: LiveHandle) -> "Entered":
        """A helper that has joined the sandbox's cgroups and namespaces and waits for its command
        (the slow part of an exec, done before it is asked for: see helper.c). Call from a
        long-lived thread: it dies with the thread that started it."""
        spec_r, spec_w = os.pipe()
        try:
            proc, rep_r = self._spawn(h, ["--spec-fd", str(spec_r)], {}, (spec_r,), subprocess.PIPE,
                                      subprocess.PIPE, subprocess.PIPE)
        except BaseException:
            os.close(spec_w)
            raise
        finally:
            os.close(spec_r)
        e = Entered(proc, rep_r, spec_w, bytearray())
        while b"ready\n" not in e.raw:
            chunk = os.read(rep_r, 4096)
            if not chunk:
                e.discard()
                raise SandboxError(f"entering the sandbox failed: {bytes(e.raw).decode(errors='replace').strip()}")
            e.raw += chunk
        return e

    def popen(self, h: LiveHandle, spec: RunSpec, *, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE, pty: bool = False, ahead: "Entered | None" = None):
        """Start spec.argv inside the sandbox. Returns the entering helper (signal it with
        signal_command), the read end of its report pipe and what it reported so far. pty: stdin
        is a terminal that becomes the command's controlling terminal. ahead: a helper from
        enter_ahead (its pipes are the command's stdio)."""
        validate_spec(spec)
        words = ["--cwd", spec.cwd, "--uid", str(spec.uid), "--gid", str(spec.gid)]
        if pty:
            words += ["--pty", "1"]
        if ahead is None:
            proc, rep_r = self._spawn(h, words + ["--"] + spec.argv, spec.env, (), stdin, stdout, stderr)
            return proc, rep_r, bytearray()
        for k, v in spec.env.items():
            words += ["--env", f"{k}={v}"]
        data = b"".join(w.encode("utf-8", "surrogateescape") + b"\0" for w in words + ["--"] + spec.argv)
        try:
            with os.fdopen(ahead.spec_w, "wb") as f:
                f.write(data)
            ahead.spec_w = None
            if stdin is subprocess.DEVNULL:
                ahead.proc.stdin.close()
                ahead.proc.stdin = None
        except BaseException:
            ahead.discard()
            raise
        return ahead.proc, ahead.rep_r, ahead.raw

    @staticmethod
    def signal_command(proc: subprocess.Popen, sig: int) -> None:
        """Signal the command's whole process group (the entering helper forwards SIGRTMIN+n as n)."""
        if not 1 <= sig <= 30:
            raise InvalidInput(f"signal {sig} cannot be sent (1..30)")
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGRTMIN + sig)
            except ProcessLookupError:
                pass

    def exec(self, h: LiveHandle, spec: RunSpec, ahead: "Entered | None" = None) -> RunOutcome:
        """Run spec.argv inside the sandbox to its exit: output, exit status, timeout, cancel."""
        started = time.monotonic()
        proc, rep_r, raw = self.popen(h, spec, stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                                      ahead=ahead)
        try:
            out = self.rt._pump(proc, spec, started + spec.limits.timeout, rep_r, raw,
                                kill=lambda: self.signal_command(proc, signal.SIGKILL), to_exit=True,
                                eof_grace=RELAY_GRACE)
        except BaseException:
            proc.kill()
            raise
        finally:
            os.close(rep_r)
            proc.wait()
        return self.outcome(spec, out, started)

    @staticmethod
    def outcome(spec: RunSpec, out: dict, started: float) -> RunOutcome:
        report = out.pop("report")
        if "setupfail" in report:
            err, step = report["setupfail"]
            if step == "setns":
                raise NotFound("the live sandbox is no longer running")
            raise SandboxError(f"entering the sandbox failed at {step}: {os.strerror(err)}", step=step, errno=err)
        if "execfail" in report:
            err, step = report["execfail"]
            if step == "exec":
                raise CommandNotFound(f"cannot execute {spec.argv[0]!r}: {os.strerror(err)}", command=spec.argv[0])
            if step == "cwd":
                raise InvalidInput(f"working directory {spec.cwd!r}: {os.strerror(err)}", cwd=spec.cwd)
            raise SandboxError(f"command setup failed at {step}: {os.strerror(err)}", step=step, errno=err)
        utime, stime, maxrss = report.get("rusage", (0, 0, 0))
        usage = {"wall_s": round(time.monotonic() - started, 6), "user_cpu_s": utime / 1e6,
                 "sys_cpu_s": stime / 1e6, "max_rss_bytes": maxrss * 1024}
        if out.get("output_exceeded") and not out["timed_out"] and not out["cancelled"]:
            usage["killed_by"] = "output_limit"      # as a run's (namespaces.py)
        return RunOutcome(exit_code=report.get("exit"), signal=report.get("signal"), stdout=out["stdout"],
                          stderr=out["stderr"], stdout_truncated=out["stdout_truncated"],
                          stderr_truncated=out["stderr_truncated"], timed_out=out["timed_out"],
                          oom_killed=False, usage=usage, cancelled=out["cancelled"])


@dataclass
class Entered:
    """A helper waiting inside a sandbox for its command (LiveRuntime.enter_ahead)."""
    proc: subprocess.Popen
    rep_r: int
    spec_w: int | None
    raw: bytearray

    def discard(self) -> None:
        for fd in (self.spec_w, self.rep_r):
            if fd is not None:
                try:
                    os.close(fd)               # EOF on the spec: the helper exits, running nothing
                except OSError:
                    pass
        self.spec_w = self.rep_r = None
        for s in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if s is not None:
                s.close()
        self.proc.wait()


class _Detached:
    """The helper of a live sandbox forks away at once: its end says nothing about the sandbox."""

    @staticmethod
    def poll():
        return None


def _open_of(pid: int, start: int, name: str, flags: int) -> int:
    """open(/proc/PID/NAME) of the process (pid, start time), never of a later one with its pid:
    a pidfd checked against the start time pins the process; if it has not exited once the open
    is done, the pid named it all along (a pid is reused only after its process is gone)."""
    try:
        pfd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        raise NotFound("the live sandbox is no longer running") from None
    try:
        if start_time(pid) != start:
            raise NotFound("the live sandbox is no longer running")
        try:
            fd = os.open(f"/proc/{pid}/{name}", flags | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound("the live sandbox is no longer running") from None
        if _exited(pfd):
            os.close(fd)
            raise NotFound("the live sandbox is no longer running")
        return fd
    finally:
        os.close(pfd)


def _exited(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited (poll: fds above 1024 are fine)."""
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    return bool(p.poll(0))


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return int(data[data.rindex(b")") + 2:].split()[1])


def _kill_pid(pid: int, start: int | None, sig: int = signal.SIGKILL) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return
    try:
        if start is None or start_time(pid) == start:
            signal.pidfd_send_signal(fd, sig)
    finally:
        os.close(fd)
