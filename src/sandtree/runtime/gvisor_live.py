"""Live sandboxes on the `gvisor` tier: the same LiveTier as the namespaces tier (live.py), on
gVisor's user-space kernel.

The helper (helper.c live_runtime) mounts the sandbox's root as for a gVisor run (the image's
layers under an overlay whose upper is on a size-capped tmpfs, in a private mount namespace) and
stays there as P, bounded by the lifetime; its child R is `runsc run` of a bundle whose pid 1 is
sandtree-init (bound in read-only from the bundle), so the Sentry, its gofer and every process
inside live as long as R. A LiveHandle names P (helper) and R (init) with their start times:
the scratch and the upper are read through /proc/P/root/tmp exactly as on the namespaces tier,
so commit is the same code and gives the same image IDs for the same changes.

Commands enter through `runsc exec --process FILE` run by the helper in P's mount namespace
(--mnt-fd: runsc's state and control socket are there), which reports like an entering helper
(pid, exit, forwarded signals). The process file (argv, env, ids, cwd, capabilities) is written
into the scratch, never onto a command line. runsc runs the root with --file-access=shared, so
files the engine writes into the upper while the sandbox runs are seen inside at once (gVisor
would otherwise cache the directory it saw). Freezing, memory and stats are the cgroup's (it
holds the Sentry), as on the other tier.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import time

from ..errors import CommandNotFound, InvalidInput, NotFound, RuntimeUnavailable, SandboxError
from .base import RunOutcome, RunSpec
from . import agentcall
from .build import agent_path
from .enter import Commands
from .live import Detached, LiveRuntime, unlink_quietly
from .liveproc import LiveHandle, kill_pid, open_of, parent_of
from .pump import parse_report
from .runfiles import fds_of, network_args
from .validate import validate_spec
from ..procid import proc_namespace, start_time

__all__ = ["GVisorLive", "AGENT", "PATH_ENV"]

AGENT = "/dev/.sandtree-agent"        # where pid 1's binary is bound in (gVisor's own /dev)
PATH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
# runsc exec's own failures (exit 128 and this on stderr) are no exit of the command's
_RUNSC_FAIL = re.compile(rb"executing processes for container: .*\n?$")


class GVisorLive(LiveRuntime):
    """The live-sandbox half of the gvisor tier (rt: its GVisorRuntime)."""

    def __init__(self, rt, flags: list[str], network_flag: str, runsc):
        super().__init__(rt)
        self.flags, self.network_flag, self.runsc = flags, network_flag, runsc

    def available(self) -> tuple[bool, str]:
        ok, why = self.rt.available()
        if not ok:
            return ok, why
        if not hasattr(os, "pidfd_open"):
            return False, "live sandboxes need pidfd_open (Linux 5.3, Python 3.9)"
        return True, ""

    def handle(self, stored: dict) -> LiveHandle:
        return LiveHandle.from_dict(stored)

    # ---- start ---------------------------------------------------------------------------------
    def start(self, spec: RunSpec, lifetime: float, *, detach: bool = True,
              restore: str | None = None) -> LiveHandle:
        self._check()
        if restore is not None:
            raise RuntimeUnavailable("hibernate is not built for the gvisor tier yet: a gVisor sandbox "
                                     "cannot be resumed", tier="gvisor")
        validate_spec(spec)
        rt, lim = self.rt, spec.limits
        runsc = self.runsc()
        if runsc is None:
            raise RuntimeUnavailable(rt.available()[1])
        agent = agent_path(rt.cache_dir)
        pid1 = dataclasses.replace(spec, argv=[AGENT], uid=0, gid=0, cwd="/", env={})
        config = rt.oci_config(pid1, ({"destination": AGENT, "type": "bind", "source": "/tmp/i/agent",
                                        "options": ["bind", "ro", "nosuid", "nodev"]},))
        inject = spec.prepare_changes

        def prepare(upper: str) -> None:
            bundle = os.path.join(os.path.dirname(upper), "b")    # in the scratch, as a run's
            os.mkdir(bundle, 0o700)
            with open(os.path.join(bundle, "config.json"), "wb") as f:
                f.write(config)
            # readable to the gofer, which runs as the sandbox's root (the bundle is the host's)
            os.mkdir(os.path.join(os.path.dirname(upper), "i"), 0o755)
            shutil.copyfile(agent, os.path.join(os.path.dirname(upper), "i", "agent"))
            os.chmod(os.path.join(os.path.dirname(upper), "i", "agent"), 0o555)
            if inject:
                inject(upper)

        cg = rt.cgroups.create(memory=lim.memory, pids=lim.pids, cpus=lim.cpus, live=True, detached=detach)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rep_r, rep_w = os.pipe()
        deadline_file = self._deadline_file(time.time() + lifetime)
        deadline_fd = os.open(deadline_file, os.O_RDONLY | os.O_CLOEXEC)
        listener, agent_sock = self._agent_socket()
        flags = self.flags + ["--file-access=shared"]
        if spec.netns_fd is not None:
            flags = [self.network_flag if f == "--network=none" else f for f in flags]
        args = [rt.helper(), "--sock", str(theirs.fileno()), "--report", str(rep_w),
                "--uid-map", rt.idmap.uid_map_line(), "--gid-map", rt.idmap.gid_map_line(),
                "--live", "1", "--detach", "1" if detach else "0", "--lifetime", str(max(1, int(lifetime))),
                "--deadline-fd", str(deadline_fd), "--agent-fd", str(listener.fileno())]
        args += rt.run_args(spec)[:-2] + ["--inject", "1", "--exec", "1"]
        for f in cg.procs_files:
            args += ["--cgroup", f]
        extra, rtfd = network_args(spec)
        args += extra
        cmd = [runsc, "--root", "/tmp/state", *flags, "run", "--bundle", "/tmp/b", "sandtree"]
        raw = bytearray()
        scratch = None
        proc = None
        try:
            try:
                proc = subprocess.Popen(args + ["--"] + cmd, env=PATH_ENV, close_fds=True,
                                        pass_fds=(theirs.fileno(), rep_w, deadline_fd, listener.fileno())
                                        + fds_of(spec, rtfd),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
            finally:
                theirs.close()
                listener.close()
                os.close(rep_w)
                os.close(deadline_fd)
                if rtfd is not None:
                    os.close(rtfd)
            if detach:
                proc.wait()                   # the helper forks away at once (see helper.c)
            deadline = time.monotonic() + min(lim.timeout, 60)
            scratch = rt.receive_scratch(ours, rep_r, raw, Detached() if detach else proc, deadline)
            if scratch is None:
                self._failed(raw)
            prepare(f"/proc/self/fd/{scratch}/u")
            ours.send(b"g")
            while b"ready\n" not in raw and b"setupfail" not in raw:
                chunk = os.read(rep_r, 4096)
                if not chunk:
                    break
                raw += chunk
            self._failed(raw)
            report = parse_report(raw)
            if b"ready\n" not in raw or "pid" not in report:
                raise SandboxError(f"live sandbox did not start: {bytes(raw).decode(errors='replace').strip()}")
            runsc_pid = report["pid"]
            helper_pid = parent_of(runsc_pid)
            handle = LiveHandle(helper_pid, start_time(helper_pid) or 0, runsc_pid, start_time(runsc_pid) or 0,
                                {"version": cg.version, "dirs": cg.dirs}, proc_namespace(),
                                deadline_file=deadline_file, tier="gvisor", agent=agent_sock)
            if not handle.init_start or not handle.helper_start:
                raise SandboxError("live sandbox exited while starting")
            handle.proc = None if detach else proc
            return handle
        except BaseException:
            unlink_quietly(deadline_file)
            unlink_quietly(agent_sock)
            rep = parse_report(raw)
            if rep.get("pid"):
                kill_pid(rep["pid"], None)
            if proc is not None and not detach:
                proc.kill()
                proc.wait()
            cg.kill_all()
            cg.remove(wait=2.0)
            raise
        finally:
            ours.close()
            os.close(rep_r)
            if scratch is not None:
                os.close(scratch)

    def _agent_socket(self) -> tuple[socket.socket, str]:
        """A listening unix socket in the store's agents/ (the engine's own directory, 0700), on
        which the sandbox's helper lends pid 1's pipes (helper.c live_runtime)."""
        d = os.path.join(os.path.dirname(self.rt.layers_dir), "agents")
        os.makedirs(d, mode=0o700, exist_ok=True)
        name = f"{os.urandom(8).hex()}.sock"
        dfd = os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(f"/proc/self/fd/{dfd}/{name}")      # (a store's path may be too long for an address)
            s.listen(64)
        except BaseException:
            s.close()
            raise
        finally:
            os.close(dfd)
        return s, os.path.join(d, name)

    def stop(self, h: LiveHandle, wait: float = 5.0) -> None:
        super().stop(h, wait)
        if h.agent is not None:
            unlink_quietly(h.agent)
            unlink_quietly(h.agent + ".busy")

    @staticmethod
    def _failed(raw: bytearray) -> None:
        """Raise the helper's reported failure, with what runsc said (helper.c: "runsc ...")."""
        report = parse_report(raw)
        if "setupfail" not in report:
            return
        err, step = report["setupfail"]
        said = next((ln[6:] for ln in bytes(raw).decode(errors="replace").splitlines() if ln.startswith("runsc ")),
                    "")
        if said:
            raise SandboxError(f"gVisor did not start the sandbox: {said.strip()[-1500:]}", step=step)
        raise SandboxError(f"sandbox setup failed at {step}: {os.strerror(err)}", step=step, errno=err)

    # ---- where its files are ---------------------------------------------------------------------
    def root(self, h: LiveHandle) -> int:
        """The sandbox's root as the host sees it: P's overlay (the Sentry serves exactly it)."""
        return open_of(h.helper_pid, h.helper_start, "root/tmp/r", os.O_PATH | os.O_DIRECTORY)

    def own_mounts(self, h: LiveHandle) -> set[int]:
        """The overlay at P's /tmp/r and what is mounted under it (gVisor's /proc, /dev and the
        like are the Sentry's own, never host mounts)."""
        fd = open_of(h.helper_pid, h.helper_start, "mountinfo", os.O_RDONLY)
        with os.fdopen(fd, "r", encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
        out = set()
        for line in text.splitlines():
            fields = line.split(" - ")[0].split()
            if len(fields) > 4 and (fields[4] == "/tmp/r" or fields[4].startswith("/tmp/r/")):
                out.add(int(fields[0]))
        return out

    def lingering(self, h: LiveHandle) -> bool:
        """Processes besides pid 1 inside (gVisor's, not the host's: runsc ps lists them)."""
        proc, rep_r = self._mnt(h, ["ps", "--format", "json", "sandtree"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            out, _ = proc.communicate(timeout=30)
        finally:
            os.close(rep_r)
        try:
            return len(json.loads(out or b"[]")) > 1
        except ValueError:
            return False

    def outsiders(self, h: LiveHandle) -> list[int]:
        """Commands running now: the runsc exec of each (children of our helpers, in P's mount
        namespace, outside the sandbox's cgroup), and the agent's, which is the sandbox's own
        process: its caller holds a lock on the socket (P stands for it in the list)."""
        out = [h.helper_pid] if h.agent is not None and _busy(h.agent) else []
        try:
            ns = os.readlink(f"/proc/{h.helper_pid}/ns/mnt")
        except OSError:
            return out
        cg = h.cg()
        mine = (cg.pids() if cg else set()) | {h.helper_pid, h.init_pid}
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in mine:
                continue
            try:
                if os.readlink(f"/proc/{name}/ns/mnt") == ns:
                    out.append(int(name))
            except OSError:
                continue
        return out

    # ---- commands --------------------------------------------------------------------------------
    def _mnt(self, h: LiveHandle, words: list[str], *, stdin, stdout, stderr, cls=subprocess.Popen):
        """runsc WORDS in the sandbox's mount namespace, run by the helper (helper.c enter_mount);
        returns the helper and its report's read end."""
        mnt = open_of(h.helper_pid, h.helper_start, "ns/mnt", os.O_RDONLY)
        rep_r, rep_w = os.pipe()
        try:
            proc = cls([self.rt.helper(), "--report", str(rep_w), "--mnt-fd", str(mnt), "--",
                                     self.runsc(), "--root", "/tmp/state", *words], env=PATH_ENV,
                                    close_fds=True, pass_fds=(rep_w, mnt),
                                    stdin=stdin, stdout=stdout, stderr=stderr)
        except BaseException:
            os.close(rep_r)
            raise
        finally:
            os.close(rep_w)
            os.close(mnt)
        return proc, rep_r

    def exec(self, h: LiveHandle, spec: RunSpec, ahead=None) -> RunOutcome:
        """By the agent (pid 1 starts it: ~1 ms inside, and a checkpoint keeps it), or by runsc exec
        for a sandbox started without one or a stdin past the agent's buffer."""
        if h.agent is None or not agentcall.fits(spec):
            return Commands.exec(self, h, spec)
        validate_spec(spec)
        started = time.monotonic()
        if not self.alive(h):
            raise NotFound("the live sandbox is no longer running")
        lock = os.open(h.agent + ".busy", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_SH)           # (outsiders: a command is running)
            try:
                conn, w, r = agentcall.lend(h.agent, timeout=max(spec.limits.timeout, 1.0))
            except (OSError, ValueError):
                if not self.alive(h):
                    raise NotFound("the live sandbox is no longer running") from None
                raise SandboxError("the sandbox's agent cannot be reached") from None
            try:
                out = agentcall.call(w, r, spec, started + spec.limits.timeout)
            except OSError as exc:
                if not self.alive(h):
                    raise NotFound("the live sandbox is no longer running") from None
                raise SandboxError(f"the sandbox's agent: {exc}") from None
            finally:
                os.close(w)
                os.close(r)
                conn.close()
        finally:
            os.close(lock)
        return _no_rusage(Commands.outcome(spec, out, started))

    def enter_ahead(self, h: LiveHandle):
        """None: runsc exec takes its command when it starts, so nothing can enter ahead."""
        return None

    def popen(self, h: LiveHandle, spec: RunSpec, *, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE, pty: bool = False, ahead=None):
        """Start spec.argv inside (runsc exec); returns as soon as it is started on the host side:
        the helper, its report's read end, what it reported so far ("pid")."""
        validate_spec(spec)
        name = f"b/p-{os.urandom(8).hex()}.json"
        scratch = self.scratch(h)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=scratch)
            try:
                # pty: stdin is a host terminal (the engine's); runsc gives it to the command as its
                # controlling terminal (gVisor's host TTY), which sets its window size and job control
                os.write(fd, json.dumps(self.rt.process(spec, terminal=pty)).encode())
            finally:
                os.close(fd)
            proc, rep_r = self._mnt(h, ["exec", "--process", f"/tmp/{name}", "--internal-pid-file",
                                        f"/tmp/{name[:-5]}.pid", "sandtree"], stdin=stdin, stdout=stdout,
                                    stderr=stderr, cls=_Exec)
        except BaseException:
            _unlink_at(scratch, name)
            os.close(scratch)
            raise
        proc.files, proc.sandbox = (scratch, name, name[:-5] + ".pid"), (self, h)   # (_Exec)
        raw = bytearray()
        while b"pid " not in raw:
            chunk = os.read(rep_r, 4096)
            if not chunk:
                break
            raw += chunk
        return proc, rep_r, raw

    def signal_command(self, proc: "_Exec", sig: int) -> None:
        """Signal a command by its pid inside (runsc kill --pid): runsc exec itself would die of
        the signal, not pass it on."""
        if not 1 <= sig <= 30:
            raise InvalidInput(f"signal {sig} cannot be sent (1..30)")
        pid, end = None, time.monotonic() + 5
        while pid is None and proc.poll() is None and time.monotonic() < end:
            pid = proc.inner_pid()
            if pid is None:
                time.sleep(0.002)                # (runsc writes it once the process exists)
        if pid is None:
            return
        killer, rep_r = self._mnt(proc.sandbox[1], ["kill", "--pid", str(pid), "sandtree", str(sig)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(rep_r)
        killer.wait()

    @staticmethod
    def returncode(report: bytes, fallback: int | None) -> int | None:
        rep = parse_report(report)
        if "execfail" in rep or "exit" not in rep:
            return Commands.returncode(report, fallback)
        code = rep["exit"]
        if code == 128:
            return 127                          # runsc could not start it (not found, bad cwd)
        return -(code - 128) if code > 128 else code

    @staticmethod
    def outcome(spec: RunSpec, out: dict, started: float) -> RunOutcome:
        """An entering helper's outcome, after runsc's ways: exit 128 and its message when it
        could not start the command; 128+N for a command killed by signal N."""
        report = out["report"]
        code = report.get("exit")
        if code == 128 and _RUNSC_FAIL.search(out["stderr"][-2000:]):
            said = out["stderr"][-2000:]
            if b"working directory" in said:
                raise InvalidInput(f"working directory {spec.cwd!r} does not exist in the sandbox", cwd=spec.cwd)
            raise CommandNotFound(f"cannot execute {spec.argv[0]!r}: not found in the sandbox", command=spec.argv[0])
        if code is not None and code > 128:
            report.pop("exit")
            report["signal"] = code - 128
        report.pop("rusage", None)              # runsc exec's own, not the command's
        return _no_rusage(Commands.outcome(spec, out, started))

    # ---- hibernate -------------------------------------------------------------------------------
    def hibernate_available(self) -> tuple[bool, str]:
        # runsc checkpoint/restore works here (branch gvisor-hibernate-wip: ~0.15 s each way), but
        # a restore kills every process runsc exec started (gVisor #11544): commands must first be
        # spawned by pid 1 (an agent inside) for a resume to keep them
        return False, ("hibernate is not built for the gvisor tier yet: gVisor restores only processes its pid 1 "
                       "started, and commands enter by runsc exec")

    def dump(self, h: LiveHandle, images: str, ghost_limit: int, link: bool = False) -> None:
        raise RuntimeUnavailable(self.hibernate_available()[1], tier="gvisor")


class _Exec(subprocess.Popen):
    """The helper of a command: its process file and pid file (in the scratch: files = (scratch
    fd, names)) go once it is done."""
    files: tuple | None = None
    sandbox: tuple | None = None               # (its GVisorLive, the sandbox's handle)

    def inner_pid(self) -> int | None:
        """The command's pid inside the sandbox (runsc's pid file), once it is started."""
        if self.files is None:
            return None
        try:
            fd = os.open(self.files[2], os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=self.files[0])
        except OSError:
            return None
        try:
            text = os.read(fd, 32).strip()
        finally:
            os.close(fd)
        return int(text) if text.isdigit() else None

    def _done(self) -> None:
        got, self.files = self.files, None
        if got is not None:
            _unlink_at(got[0], got[1])
            _unlink_at(got[0], got[2])
            os.close(got[0])

    def wait(self, timeout=None):
        rc = super().wait(timeout)
        self._done()
        return rc

    def poll(self):
        rc = super().poll()
        if rc is not None:
            self._done()
        return rc


def _no_rusage(outcome: RunOutcome) -> RunOutcome:
    """Without the command's CPU time and peak memory: gVisor's processes are the Sentry's, not
    host processes whose rusage anyone sees (the sandbox's cgroup counts the whole Sentry)."""
    for k in ("user_cpu_s", "sys_cpu_s", "max_rss_bytes"):
        outcome.usage.pop(k, None)
    return outcome


def _busy(agent: str) -> bool:
    """Whether an exec holds the agent (agent + ".busy" is locked shared by each)."""
    try:
        fd = os.open(agent + ".busy", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _unlink_at(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
