"""Commands inside a live sandbox (the namespaces tier): `sandtree-exec --enter-fd PIDFD` joins
the sandbox's cgroups and namespaces (a pidfd of its pid 1, checked against the recorded start
time, so a recycled pid is never entered), and its output reaches the engine through
sandtree-drain (drain.c), a reader inside the sandbox: the exec returns at the command's exit
with all it wrote, and a background job it left keeps a reader (its later output is discarded)
instead of dying of SIGPIPE.

Commands is a part of LiveRuntime (live.py), which gives it rt (the NamespaceRuntime), pidfd()
and drain().
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from dataclasses import dataclass

from ..errors import CommandNotFound, InvalidInput, NotFound, SandboxError
from . import seccomp
from .base import RunOutcome, RunSpec
from .pump import parse_report, pump
from .validate import env_args, helper_env, validate_spec

# After the command's exit, how long the engine waits for sandtree-drain to pass on the rest of
# its output (microseconds normally; the drain runs as the sandbox's, so it is not trusted to).
RELAY_GRACE = 2.0


def start_reporting(argv: list[str], env: dict, fds: tuple, owned: tuple, rep_r: int, rep_w: int, stdin, stdout,
                    stderr, cls=subprocess.Popen):
    """Start a helper that reports on rep_w (closed here, with `owned`, once it has them; rep_r too
    if it cannot start). Returns (the helper, rep_r)."""
    try:
        proc = cls(argv, env=env, close_fds=True, pass_fds=(rep_w,) + tuple(fds), stdin=stdin, stdout=stdout,
                   stderr=stderr)
    except BaseException:
        os.close(rep_r)
        raise
    finally:
        os.close(rep_w)
        for fd in owned:
            os.close(fd)
    return proc, rep_r


class Commands:
    def _spawn(self, h, extra: list[str], env: dict, fds: tuple, stdin, stdout, stderr):
        rt = self.rt
        pfd = self.pidfd(h)
        rep_r, rep_w = os.pipe()
        # --drain: the command's output goes through a reader inside the sandbox (drain.c), so
        # a background job it leaves keeps a reader after the exec returns
        args = [rt.helper(), "--report", str(rep_w), "--enter-fd", str(pfd), "--drain", self.drain()] + \
            rt.static_args()
        cg = h.cg()
        for f in (cg.procs_files if cg else []):
            args += ["--cgroup", f]
        return start_reporting(args + extra, env, (pfd, seccomp.filter_fd()) + fds, (pfd,), rep_r, rep_w,
                               stdin, stdout, stderr)

    def enter_ahead(self, h, relay: tuple[int, int] | None = None) -> "Entered":
        """A helper that has joined the sandbox's cgroups and namespaces and waits for its command
        (the slow part of an exec, done before it is asked for: see helper/enter.c). Call from a
        long-lived thread: it dies with the thread that started it. relay (uid, gid): its output
        relay (sandtree-drain) is started ahead too, with those ids (a command with others starts
        its own): only for a sandbox that will never be hibernated (a warm pool's), as the waiting
        relay is a process of the sandbox holding the engine's pipes."""
        spec_r, spec_w = os.pipe()
        extra = ["--spec-fd", str(spec_r)]
        if relay is not None:
            extra += ["--relay-ahead", "1", "--uid", str(relay[0]), "--gid", str(relay[1])]
        try:
            proc, rep_r = self._spawn(h, extra, {}, (spec_r,), subprocess.PIPE, subprocess.PIPE, subprocess.PIPE)
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

    def popen(self, h, spec: RunSpec, *, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE, pty: bool = False, ahead: "Entered | None" = None):
        """Start spec.argv inside the sandbox. Returns the entering helper (signal it with
        signal_command), the read end of its report pipe and what it reported so far. pty: stdin
        is a terminal that becomes the command's controlling terminal. ahead: a helper from
        enter_ahead (its pipes are the command's stdio)."""
        validate_spec(spec)
        words = ["--cwd", spec.cwd, "--uid", str(spec.uid), "--gid", str(spec.gid)]
        if pty:
            words += ["--pty", "1"]
        if ahead is None:                   # (the env never as the host helper's own: helper_env)
            proc, rep_r = self._spawn(h, words + ["--"] + spec.argv, helper_env(spec.env), (), stdin, stdout, stderr)
            return proc, rep_r, bytearray()
        words += env_args(spec.env)
        data = b"".join(w.encode("utf-8", "surrogateescape") + b"\0" for w in words + ["--"] + spec.argv)
        try:
            fd, ahead.spec_w = ahead.spec_w, None
            try:                            # (os.write: no buffered file object on the run's path)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)                # EOF: the whole spec is there
            if stdin is subprocess.DEVNULL:
                ahead.proc.stdin.close()
                ahead.proc.stdin = None
        except BaseException:
            ahead.discard()
            raise
        return ahead.proc, ahead.rep_r, ahead.raw

    @staticmethod
    def returncode(report: bytes, fallback: int | None) -> int | None:
        rep = parse_report(report)
        if "execfail" in rep:
            return 127 if rep["execfail"][1] == "exec" else 126
        if "signal" in rep:
            return -rep["signal"]
        return rep.get("exit", fallback)

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

    def exec(self, h, spec: RunSpec, ahead: "Entered | None" = None) -> RunOutcome:
        """Run spec.argv inside the sandbox to its exit: output, exit status, timeout, cancel."""
        started = time.monotonic()
        proc, rep_r, raw = self.popen(h, spec, stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                                      ahead=ahead)
        try:
            out = pump(proc, spec, started + spec.limits.timeout, rep_r, raw,
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
            # its pid 1 gone (setns), or its groups removed by a stop that raced this exec (the
            # pidfd was taken from its pid 1 not yet reaped): it is no longer running either way
            if step == "setns" or (err == errno.ENOENT and step.endswith("/cgroup.procs")):
                raise NotFound("the live sandbox is no longer running")
            raise SandboxError(f"entering the sandbox failed at {step}: {os.strerror(err)}", step=step, errno=err)
        if "execfail" in report:
            err, step = report["execfail"]
            if step == "exec":
                raise CommandNotFound(f"cannot execute {spec.argv[0]!r}: {os.strerror(err)}", command=spec.argv[0],
                                      errno=err)
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
