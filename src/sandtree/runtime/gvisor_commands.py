"""Commands in a live gVisor sandbox (a part of GVisorLive, gvisor_live.py, which gives it rt,
runsc, scratch() and alive()). exec goes to the agent, pid 1 (agent.c, agentcall.py); popen (pipes
kept open, a terminal) and what the agent cannot take go by `runsc exec --process FILE` in the
sandbox's mount namespace, run by the helper (--mnt-fd), which reports like an entering helper.
The process file (argv, env, ids, cwd, capabilities) is written into the scratch, never onto a
command line. Signals to those go by `runsc kill --pid`: signalled itself, runsc exec dies
instead of passing them on.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import subprocess
import time

from ..errors import CommandNotFound, InvalidInput, NotFound, SandboxError
from . import agentcall
from .base import RunOutcome, RunSpec
from .enter import Commands, start_reporting
from .liveproc import LiveHandle, open_of
from .pump import parse_report
from .validate import validate_spec

__all__ = ["GVisorCommands", "PATH_ENV", "AGENT", "unlink_at"]

AGENT = "/dev/.sandtree-agent"        # where pid 1's binary is bound in (gVisor's own /dev)

PATH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
# runsc exec's own failures (exit 128 and this on stderr) are no exit of the command's
_RUNSC_FAIL = re.compile(rb"executing processes for container: .*\n?$")


class GVisorCommands:
    def lingering(self, h: LiveHandle) -> bool:
        """Processes besides pid 1 inside (gVisor's, not the host's: runsc ps lists them)."""
        return len(self.processes(h)) > 1

    def processes(self, h: LiveHandle) -> list[dict]:
        """gVisor's own table (its kernel's, not the host's): runsc ps, whose columns are UID PID
        PPID C TTY STIME TIME CMD (CMD: the command's name only; no state, no argv)."""
        proc, rep_r = self._mnt(h, ["ps", "sandtree"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
        try:
            out, _ = proc.communicate(timeout=30)
        finally:
            os.close(rep_r)
        lines = out.decode("utf-8", "replace").splitlines()
        found = []
        for line in lines[1:] if lines and lines[0].split()[:3] == ["UID", "PID", "PPID"] else []:
            cols = line.split(None, 7)
            if len(cols) == 8 and cols[0].isdigit() and cols[1].isdigit() and cols[2].isdigit():
                found.append({"pid": int(cols[1]), "ppid": int(cols[2]), "uid": int(cols[0]), "state": "?",
                              "name": cols[7], "argv": []})
        return sorted(found, key=lambda p: p["pid"])

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
    def _mnt(self, h: LiveHandle, words: list[str], *, stdin, stdout, stderr, cls=subprocess.Popen, pass_fds=(),
             pty: bool = False):
        """runsc WORDS in the sandbox's mount namespace, run by the helper (helper/gvisor.c enter_mount);
        returns the helper and its report's read end. pty: stdin is a terminal, made runsc's
        controlling one (its window size changes reach runsc as SIGWINCH)."""
        mnt = open_of(h.helper_pid, h.helper_start, "ns/mnt", os.O_RDONLY)
        rep_r, rep_w = os.pipe()
        return start_reporting([self.rt.helper(), "--report", str(rep_w), "--mnt-fd", str(mnt),
                                *(["--pty", "1"] if pty else []), "--",
                                self.runsc(), "--root", "/tmp/state", *words], PATH_ENV, (mnt,) + tuple(pass_fds),
                               (mnt,), rep_r, rep_w, stdin, stdout, stderr, cls=cls)

    def exec(self, h: LiveHandle, spec: RunSpec, ahead=None) -> RunOutcome:
        """By the agent (pid 1 starts it: ~1 ms inside, and a checkpoint keeps it), or by runsc exec
        for a sandbox started without one or a stdin past the agent's buffer."""
        if h.agent is None or not agentcall.fits(spec):
            return Commands.exec(self, h, spec)
        validate_spec(spec)
        started = time.monotonic()
        # (no alive() first: a gone sandbox fails the lend or the call, which then ask it)
        lock = os.open(h.agent + ".busy", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            # The agent runs one command at a time: one that comes while another runs goes by runsc
            # exec instead of waiting (the lock also tells outsiders() a command is running)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return Commands.exec(self, h, spec)
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
        alone = out["report"].pop("alone", False)
        outcome = _no_rusage(Commands.outcome(spec, out, started))
        outcome.quiescent = alone
        return outcome

    def hold_program(self, h: LiveHandle) -> tuple[str | None, str | None, bool]:
        """pid 1's own binary, bound in (hold.c), started by it (exec): gVisor kills what runsc exec
        started at a restore, descendants too. None without an agent."""
        return (AGENT if h.agent is not None else None), None, True

    def enter_ahead(self, h: LiveHandle, relay: tuple[int, int] | None = None):
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
                # pty: stdin is a host terminal (the engine's). gVisor gives it to the process as its
                # stdio but as no session's controlling terminal: the agent's --tty mode (agent.c)
                # runs the command on a terminal of gVisor's own that is, and relays the two
                run = dataclasses.replace(spec, argv=[AGENT, "--tty", "--", *spec.argv]) if pty else spec
                os.write(fd, json.dumps(self.rt.process(run, terminal=pty)).encode())
            finally:
                os.close(fd)
            proc, rep_r = self._mnt(h, ["exec", "--process", f"/tmp/{name}", "--internal-pid-file",
                                        f"/tmp/{name[:-5]}.pid", "sandtree"], stdin=stdin, stdout=stdout,
                                    stderr=stderr, cls=_Exec, pty=pty)
        except BaseException:
            unlink_at(scratch, name)
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
            unlink_at(got[0], got[1])
            unlink_at(got[0], got[2])
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
    """Whether an exec holds the agent (agent + ".busy" is locked by it)."""
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


def unlink_at(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
