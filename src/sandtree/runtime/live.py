"""Live sandboxes on the `namespaces` tier: started once, entered by any number of commands.

A live sandbox is the same sandbox a run gets (runtime/helper/: user/mnt/pid/net/ipc/uts/cgroup
namespaces, overlay on a size-capped tmpfs upper, masked /proc, seccomp, cgroup limits), except
that its pid 1 runs no command and its helper does not die with the engine: it is a process of
its own (re-parented to init), bounded by its lifetime. Everything needed to find it again lives
in a LiveHandle (liveproc.py, stored by the engine), so any engine process - the CLI, a
restarted server - can enter, freeze, commit or stop it.

The upper dir is read through /proc/<helper>/root/tmp/u: the helper's private mount namespace
holds the tmpfs, for as long as the sandbox lives. Every /proc/PID file of the sandbox's
processes is opened under a pidfd checked against the start time (liveproc.open_of). Commands
inside it: enter.py. Here: start, state, stop, hibernate.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import time

from ..errors import NotFound, RuntimeUnavailable, SandboxError
from . import criu, seccomp
from .base import LiveTier, RunSpec
from .build import agent_path, drain_path, init_path
from .enter import Commands
from .liveproc import LiveHandle, kill_pid, open_of, parent_of
from .openat2 import own_mounts
from ..procid import owner_prefix, proc_namespace, signal_member, start_time
from .pstable import process_table
from .pump import parse_report
from .runfiles import fds_of, network_args
from .validate import validate_spec


DUMP_WAIT = 60.0     # seconds a dump left running by a dead hibernator is waited for before judging


class LiveRuntime(Commands, LiveTier):
    """The live-sandbox half of the namespaces tier (it reuses its helper, options and pump)."""

    def __init__(self, rt):                    # rt: the NamespaceRuntime (or a tier built on it)
        self.rt = rt
        self._init: str | None = None
        self._drain: str | None = None
        self._agent: str | None = None

    def available(self) -> tuple[bool, str]:
        ok, why = self.rt.available()
        if not ok:
            return ok, why
        if self.rt.idmap.rootless:
            return False, "live sandboxes need root (their upper is reached through the helper's mount namespace)"
        if not hasattr(os, "pidfd_open"):
            return False, "live sandboxes need pidfd_open (Linux 5.3, Python 3.9)"
        return True, ""

    def handle(self, stored: dict) -> LiveHandle:
        return LiveHandle.from_dict(stored)

    def init(self) -> str:
        if self._init is None:
            self._init = init_path(self.rt.cache_dir)
        return self._init

    def drain(self) -> str:
        if self._drain is None:
            self._drain = drain_path(self.rt.cache_dir)
        return self._drain

    def hold_program(self, h: LiveHandle) -> tuple[str | None, str | None, bool]:
        """sandtree-agent, whose --hold mode holds a spawned command's stdio: copied in by the engine."""
        if self._agent is None:
            self._agent = agent_path(self.rt.cache_dir)
        return None, self._agent, False

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
            if spec.runtime_files:
                raise SandboxError("a restore keeps the runtime files it had (its checkpoint holds them)")
            # (helper/restore.c criu_root; with a link: restored into it, criu.py TCP_LINK)
            command = criu.restore_args(path, f"/proc/self/fd/{images}", "/r", link=spec.netns_fd is not None,
                                        forked=os.path.exists(os.path.join(restore, criu.FORKED)))
            mode = ["--restore", "1"]
            if spec.netns_fd is not None:        # its root had the resolv.conf mount point layer
                mode += ["--resolv-layer", "1"]   # (helper/runfiles.c mount_point_layer): CRIU binds onto it
            elif os.path.exists(os.path.join(restore, criu.NETNS_FRESH)):
                mode += ["--fresh-net", "1"]     # a live fork's: no network namespace in it
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
        deadline_file = self._deadline_file(time.time() + lifetime)
        deadline_fd = os.open(deadline_file, os.O_RDONLY | os.O_CLOEXEC)
        args = [rt.helper(), "--sock", str(theirs.fileno()), "--report", str(rep_w), "--live", "1", *mode,
                "--detach", "1" if detach else "0", "--lifetime", str(max(1, int(lifetime))),
                "--deadline-fd", str(deadline_fd)]
        args += rt.static_args() + rt.run_args(spec)
        for f in (cg.procs_files if cg else []):
            args += ["--cgroup", f]
        # An egress link and runtime files. A restore gets no runtime files (its checkpoint holds
        # its /dev/sandtree) but does get the link it was dumped from (design.md, "Hibernate").
        extra, rtfd = network_args(spec)
        args += extra
        raw = bytearray()
        scratch = proc = None
        try:
            # criu runs iptables-restore & co. by name
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"} if restore is not None else {}
            proc = self._spawn_helper(args + ["--"] + command, env,
                               (theirs.fileno(), rep_w, seccomp.filter_fd(), deadline_fd)
                               + ((images,) if images is not None else ()) + fds_of(spec, rtfd),
                               [theirs, rep_w, deadline_fd, images, rtfd], detach)
            scratch = self._handshake(proc, detach, ours, rep_r, raw, lim, spec.prepare_changes)
            report = parse_report(raw)
            if "setupfail" in report:
                err, step = report["setupfail"]
                if step == "criu-restore":
                    raise SandboxError(f"criu restore failed (exit {err}): {criu.log_tail(restore, 'restore.log')}",
                                       step=step)
                raise SandboxError(f"sandbox setup failed at {step}: {os.strerror(err)}", step=step, errno=err)
            if b"ready\n" not in raw or "pid" not in report:
                raise SandboxError(f"live sandbox did not start: {bytes(raw).decode(errors='replace').strip()}")
            init_pid = report["pid"]
            helper_pid = parent_of(init_pid)
            handle = LiveHandle(helper_pid, start_time(helper_pid) or 0, init_pid, start_time(init_pid) or 0,
                                {"version": cg.version, "dirs": cg.dirs} if cg else None, proc_namespace(),
                                deadline_file=deadline_file)
            if not handle.init_start or not handle.helper_start:
                raise SandboxError("live sandbox exited while starting")
            handle.proc = None if detach else proc
            if restore is not None:
                self._continue_restored(handle, cg, lim)
            return handle
        except BaseException:
            unlink_quietly(deadline_file)
            self._abort_start(raw, proc, detach, cg)
            raise
        finally:
            ours.close()
            os.close(rep_r)
            if scratch is not None:
                os.close(scratch)

    @staticmethod
    def _abort_start(raw: bytearray, proc, detach: bool, cg) -> None:
        """A start that failed half-way: what it started is killed, its cgroup removed."""
        rep = parse_report(raw)
        if rep.get("pid"):
            kill_pid(rep["pid"], None)
        if proc is not None and not detach:
            proc.kill()
            proc.wait()
        if cg:
            cg.kill_all()
            cg.remove(wait=2.0)

    @staticmethod
    def _spawn_helper(argv: list[str], env: dict, fds: tuple, give: list, detach: bool) -> subprocess.Popen:
        """Start a live helper with `fds`; `give` (fds and sockets only it keeps) are closed here
        once it has them. A detached helper forks away at once (helper/main.c): it is waited for."""
        try:
            proc = subprocess.Popen(argv, env=env, close_fds=True, pass_fds=fds, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            for f in give:
                if isinstance(f, int):
                    os.close(f)
                elif f is not None:
                    f.close()
        if detach:
            proc.wait()
        return proc

    def _handshake(self, proc, detach: bool, ours, rep_r: int, raw: bytearray, lim, prepare) -> int | None:
        """Take the scratch fd the helper sends, let prepare(upper) write into it (then the helper
        goes on), and read its report to "ready" or a setup failure (into raw). Returns the
        scratch fd (the caller closes it), or None if none came."""
        deadline = time.monotonic() + min(lim.timeout, 60)
        scratch = self.rt.receive_scratch(ours, rep_r, raw, Detached() if detach else proc, deadline)
        if scratch is not None and prepare:
            prepare(f"/proc/self/fd/{scratch}/u")
            ours.send(b"g")
        while b"ready\n" not in raw and b"setupfail" not in raw:
            chunk = os.read(rep_r, 4096)
            if not chunk:
                break
            raw += chunk
        return scratch

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
            kill_pid(h.init_pid, h.init_start, signal.SIGCONT)
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
        return open_of(h.helper_pid, h.helper_start, "root/tmp", os.O_RDONLY | os.O_DIRECTORY)

    def root(self, h: LiveHandle) -> int:
        """An O_PATH fd of the sandbox's root as its processes see it (for confined file access)."""
        return open_of(h.init_pid, h.init_start, "root", os.O_PATH | os.O_DIRECTORY)

    def own_mounts(self, h: LiveHandle) -> set[int]:
        """Mount ids of the sandbox's own filesystems (overlay root, tmpfs mounts), from its mount
        table (the kernel's, not anything the sandbox wrote): see openat2.py."""
        fd = open_of(h.init_pid, h.init_start, "mountinfo", os.O_RDONLY)
        with os.fdopen(fd, "r", encoding="utf-8", errors="surrogateescape") as f:
            return own_mounts(f.read())

    def frozen(self, h: LiveHandle) -> bool:
        cg = h.cg()
        return cg is not None and cg.is_frozen()

    def freeze(self, h: LiveHandle, frozen: bool = True, *, checkpoint: bool = False) -> bool:
        """Freeze (thaw) every process of the sandbox; False if it has no freezer."""
        cg = h.cg()
        if cg is None:
            return False
        try:
            cg.freeze(frozen)
        except FileNotFoundError:
            # its group is gone: the sandbox ended (a stop won the race to it), not an error of ours
            raise NotFound("the live sandbox is no longer running") from None
        return True

    def memory(self, h: LiveHandle) -> int | None:
        cg = h.cg()
        return cg.memory_current() if cg else None

    def stats(self, h: LiveHandle) -> dict | None:
        cg = h.cg()
        return cg.stats() if cg else None

    def processes(self, h: LiveHandle) -> list[dict]:
        cg = h.cg()
        try:
            ns = os.readlink(f"/proc/{h.init_pid}/ns/pid")
        except OSError:
            return []
        return process_table((cg.pids() if cg else set()) | {h.init_pid}, ns)

    def usage(self, h: LiveHandle) -> dict | None:
        """Its cgroup's counters now (cgroups.RunCgroup.usage) and its disk: the bytes written to
        its upper and the size of the tmpfs that holds it (the run's disk limit)."""
        cg = h.cg()
        if cg is None:
            return None
        out = cg.usage()
        fd = self.scratch(h)
        try:
            st = os.fstatvfs(fd)
        finally:
            os.close(fd)
        out["disk_total"] = st.f_blocks * st.f_frsize
        out["disk_used"] = (st.f_blocks - st.f_bfree) * st.f_frsize
        return out

    def lingering(self, h: LiveHandle) -> bool:
        cg = h.cg()
        return cg is not None and bool(cg.pids() - {h.init_pid, h.helper_pid})

    # ---- its deadline -----------------------------------------------------------------------
    def _deadline_file(self, deadline: float) -> str:
        """A new file holding `deadline` (epoch seconds) in the store's deadlines/ (the engine's
        own directory: the helper reads it, nothing of the sandbox's can)."""
        d = os.path.join(os.path.dirname(self.rt.layers_dir), "deadlines")
        os.makedirs(d, mode=0o700, exist_ok=True)
        # named after this engine process: should it die before the sandbox's row is written,
        # the next reap finds the sandbox by it (leftovers.py reap_unrecorded)
        path = os.path.join(d, f"{owner_prefix()}{os.urandom(8).hex()}.deadline")
        _write_deadline(path, deadline, create=True)
        return path

    def retime(self, h: LiveHandle, deadline: float) -> None:
        """The sandbox now lives until `deadline` (epoch seconds; earlier or later than before):
        written where its helper reads it, then its helper is told (SIGALRM) to re-read it."""
        if h.deadline_file is None:
            raise SandboxError("this sandbox was started before deadlines could move: it keeps its lifetime")
        _write_deadline(h.deadline_file, deadline)
        try:
            fd = os.pidfd_open(h.helper_pid)
        except ProcessLookupError:
            raise NotFound("the live sandbox is no longer running") from None
        try:
            if start_time(h.helper_pid) != h.helper_start:      # a reused pid is not ours to signal
                raise NotFound("the live sandbox is no longer running")
            signal.pidfd_send_signal(fd, signal.SIGALRM)
        finally:
            os.close(fd)

    def stop(self, h: LiveHandle, wait: float = 5.0, *, idle: bool = False) -> None:
        """Kill the sandbox (its pid 1 takes the pid namespace along) and remove its cgroup.
        idle: its threads are SCHED_IDLE first, so their exit (a gVisor Sentry frees its memory
        file then: 40-90 ms of CPU for 100 MB) runs only when nothing else wants the CPU (a
        resume right after a hibernation's stop, engine/sandboxes/retiring.py)."""
        if h.deadline_file is not None:
            unlink_quietly(h.deadline_file)
        cg = h.cg()
        if idle and cg:
            for tid in cg.threads():
                try:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                except OSError:
                    pass                               # (exited meanwhile)
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
    def hibernate_available(self, link: bool = False) -> tuple[bool, str]:
        ok, why = self.available()              # (a link stays out of the dump: "Hibernating a networked sandbox")
        if not ok:
            return ok, why
        path, why = criu.find()
        return path is not None, why

    @staticmethod
    def dump_finished(h: LiveHandle, images: str) -> bool:
        """Whether the dump into `images` succeeded; one still running (its hibernator died, it
        killed the tree and is about to record its status) is waited for first."""
        criu.wait_dumper(images, DUMP_WAIT)
        return criu.dump_finished(images)

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
                    p = parent_of(p)
                except (OSError, ValueError):
                    p = 0
                seen += 1
            if p != h.init_pid:
                out.append(pid)
        return out

    def end_spawners(self, h: LiveHandle, wait: float = 2.0) -> int:
        """SIGKILL every command spawner in the sandbox (pid 1's children named sandtree-spawn:
        hold.c --spawn), another engine process's included, and wait for them to exit: each holds
        a socket of its engine's, which a checkpoint cannot hold. Their holders go on; an engine
        whose spawner ended starts another at its next spawn (engine/processes/spawner.py)."""
        cg = h.cg()
        ended = []
        for pid in (cg.pids() if cg else set()) - {h.init_pid, h.helper_pid}:
            try:
                fd = os.pidfd_open(pid)               # (pinned: the one looked at is the one killed)
            except OSError:
                continue
            try:
                with open(f"/proc/{pid}/comm") as f:
                    name = f.read().strip()
                if name == "sandtree-spawn" and parent_of(pid) == h.init_pid:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    ended.append(fd)
                    continue
            except (OSError, ValueError):
                pass
            os.close(fd)
        end = time.monotonic() + wait
        for fd in ended:
            try:
                select.select([fd], [], [], max(0.0, end - time.monotonic()))   # (readable: it exited)
            finally:
                os.close(fd)
        return len(ended)

    def dump(self, h: LiveHandle, images: str, ghost_limit: int, link: bool = False,
             leave_running: bool = False, meanwhile=None):
        """Checkpoint the sandbox's processes into `images` (CRIU), then they end and its cgroup
        goes. The caller froze them and committed the filesystem; on failure they run on.
        link: the sandbox runs in an egress link, which stays the daemon's (not in the checkpoint;
        a restore is given it again: start(spec with netns_fd, restore=...)).
        leave_running (a live fork): they stay, frozen (CRIU leaves the freezer as it found it),
        and their TCP connections untouched (criu.py TCP_FORK).
        meanwhile (a live fork's commit) runs while CRIU starts and dumps: CRIU only reads the
        frozen sandbox's files (ghosts are copied into `images`; without --link-remap it makes
        no links in its filesystem), so the commit sees what it would see before. Its error is
        raised once CRIU has ended: a CRIU killed mid-dump could leave its parasite in the
        source's tasks."""
        path, why = criu.find()
        if path is None:
            raise RuntimeUnavailable(why)
        cg = h.cg()
        ns = open_of(h.init_pid, h.init_start, "ns/user", os.O_RDONLY)
        try:
            owner = criu.namespace_owner(ns)         # CRIU runs as it (criu.as_owner: why)
        finally:
            os.close(ns)
        fd = self.pidfd(h)                           # pinned: the pid dumped is the sandbox's
        # a link's, or a live fork's own namespace (criu.NETNS_FRESH): the dump runs inside it,
        # which leaves it out of the checkpoint
        net = open_of(h.init_pid, h.init_start, "ns/net", os.O_RDONLY) if link or leave_running else None
        try:
            if leave_running and not link:
                with open(os.path.join(images, criu.NETNS_FRESH), "w") as f:
                    f.write("own\n")
            freezer = (cg.dirs.get("freezer") or cg.dirs.get("unified")) if cg else None
            # Its output goes to a file, not a pipe, and a shell records its exit status: if we die
            # now, it finishes anyway and the next engine can tell (criu.dump_finished), waiting
            # for it while the shell (its pid in criu.pid) still runs (criu.dumper_running).
            p = subprocess.Popen(["/bin/sh", "-c", 'echo $$ >criu.pid; "$@" >criu.out 2>&1; echo $? >criu.rc', "sh",
                                  *(criu.in_netns(net) if net is not None else []),
                                  *criu.dump_args(path, h.init_pid, images, freezer, ghost_limit, owner, link,
                                                  leave_running)],
                                 cwd=images, stdin=subprocess.DEVNULL, start_new_session=True,
                                 pass_fds=(net,) if net is not None else (),
                                 env=criu.dump_env(images, leave_running, link))
            try:
                got = meanwhile() if meanwhile is not None else None
            finally:
                try:
                    rc = p.wait(timeout=600)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)     # CRIU too, not only its shell
                    p.wait()
                    rc = -1
        finally:
            os.close(fd)
            if net is not None:
                os.close(net)
        if rc != 0 or not criu.dump_finished(images):
            raise SandboxError(f"criu dump failed: "
                               f"{criu.log_tail(images, 'dump.log') or criu.log_tail(images, 'criu.out')}",
                               step="criu-dump")
        if not leave_running:
            self.stop(h)                             # what is left: the helper, the cgroup
        return got


class Detached:
    """The helper of a live sandbox forks away at once: its end says nothing about the sandbox."""

    @staticmethod
    def poll():
        return None


def _write_deadline(path: str, deadline: float, *, create: bool = False) -> None:
    """Whole seconds, zero-padded to one width, written in place (the helper holds the file open:
    a rename would leave it reading the old one)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        os.pwrite(fd, b"%020d\n" % int(deadline), 0)
    finally:
        os.close(fd)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
