"""Tier `namespaces` (the default): Linux namespaces + overlayfs + seccomp + cgroups.

This module decides and supervises; runtime/helper.c performs the privileged steps (see its
header for the process layout). Here: per-run cgroup, seccomp program, spawning the helper,
injecting files into the fresh upper before the overlay is mounted, feeding stdin, collecting
capped output live, the wall-clock timeout (SIGKILL to the sandbox's pid 1 takes the whole pid
namespace with it), and reading the helper's report.

Isolation, as set up for every run: user namespace (sandbox uid 0 is an unprivileged host uid,
also when sandtree runs as root), mount namespace with pivot_root into the overlay (no host path
remains), pid, net (loopback only), ipc, uts and cgroup namespaces; /proc with sensitive entries
masked; a minimal /dev; capability bounding set cut to Docker's default; no_new_privs; seccomp.
Every mount the sandbox can write or that comes from an image is nodev, and the run's cgroup
allows only the runtime's own device nodes. Each user namespace has an owner uid of its own (not
host root), so per-user kernel limits a sandbox spends are its own.

Output: each stream keeps its first limits.output bytes, and only those reach on_output. A
stream that passes its cap stops the run at once (SIGKILL to the sandbox, as a timeout does):
what it writes after that is lost anyway, and a command that floods (`yes`) would otherwise
burn CPU until its timeout. The outcome says so: the stream's *_truncated flag, signal 9 and
usage["killed_by"] = "output_limit".
"""

from __future__ import annotations

import collections
import os
import queue
import selectors
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

from ..errors import CommandNotFound, InvalidInput, SandboxError, TooLarge
from ..store.layers import IdMap
from . import seccomp
from .base import Limits, RunOutcome, RunSpec
from .build import helper_path
from .cgroups import Cgroups

# Docker's default capability set (numbers from linux/capability.h).
KEEP_CAPS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
             "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_RAW": 13, "SYS_CHROOT": 18,
             "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31}

MAX_ENV_BYTES = 256 * 1024

# Owners of the sandboxes' user namespaces (root only; helper.c: owner = base + the helper's
# pid, below 2^22, the kernel's pid limit): uids no account uses, in the range systemd leaves
# unused (0x70000000-0x7FFFFFFF), far from the sandbox ids (100000 + 65536). Per-user kernel
# limits a sandbox spends are charged to its owner, so to no one else.
USERNS_OWNER_BASE = 0x7E000000


class NamespaceRuntime:
    name = "namespaces"

    def __init__(self, layers_dir: str, idmap: IdMap, cache_dir: str, *, warm: int = 0):
        self.layers_dir = layers_dir
        self.idmap = idmap
        self.cache_dir = cache_dir
        self.cgroups = Cgroups()
        self._helper: str | None = None
        self._pool: _WarmPool | None = None
        self._pool_lock = threading.Lock()
        self._warm_size = warm             # started after the first run, not at construction

    def available(self) -> tuple[bool, str]:
        if not os.path.exists("/proc/self/ns/user"):
            return False, "the kernel has no user namespaces"
        try:
            self.helper()
        except Exception as exc:       # noqa: BLE001 - reported, not raised
            return False, str(exc)
        return True, ""

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        _reaper.drain()

    def helper(self) -> str:
        if self._helper is None:
            self._helper = helper_path(self.cache_dir)
        return self._helper

    # ---- one run -----------------------------------------------------------------------------
    def _static_args(self) -> list[str]:
        """Options that are the same for every run of this engine."""
        args = []
        if not self.idmap.rootless:
            args += ["--uid-map", self.idmap.uid_map_line(), "--gid-map", self.idmap.gid_map_line(),
                     "--owner-base", str(USERNS_OWNER_BASE)]
        for cap in KEEP_CAPS.values():
            args += ["--keep-cap", str(cap)]
        return args + ["--seccomp-fd", str(seccomp.filter_fd())]

    def _run_args(self, spec: RunSpec) -> list[str]:
        """Options of one run (argv of a cold start, or the spec of a warm one)."""
        lim = spec.limits
        return ["--layers", self.layers_dir, "--lower", ":".join(spec.layers), "--disk", str(lim.disk),
                "--inodes", str(disk_inodes(lim.disk)),
                "--hostname", spec.hostname, "--cwd", spec.cwd, "--uid", str(spec.uid), "--gid", str(spec.gid),
                "--root-mode", f"{spec.root_meta[0]:o}",
                "--root-uid", str(self.idmap.host_uid(spec.root_meta[1])),
                "--root-gid", str(self.idmap.host_gid(spec.root_meta[2])),
                "--inject", "1" if spec.prepare_changes else "0"]

    def _start_cold(self, spec: RunSpec) -> "_Started":
        lim = spec.limits
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rep_r, rep_w = os.pipe()
        args = [self.helper(), "--sock", str(theirs.fileno()), "--report", str(rep_w)]
        args += self._static_args() + self._run_args(spec)
        sfd = seccomp.filter_fd()
        cg = None
        try:
            if self.cgroups.available:
                cg = self.cgroups.create(memory=lim.memory, pids=lim.pids, cpus=lim.cpus)
                for f in cg.procs_files:
                    args += ["--cgroup", f]
            proc = subprocess.Popen(
                args + ["--"] + spec.argv, env=spec.env, close_fds=True,
                pass_fds=(theirs.fileno(), rep_w, sfd),
                stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except BaseException:
            ours.close(); os.close(rep_r)
            if cg:
                cg.remove()
            raise
        finally:
            theirs.close()
            os.close(rep_w)
        return _Started(proc, ours, rep_r, cg, bytearray())

    def _start_warm(self, spec: RunSpec) -> "_Started | None":
        """Hand the run to a pre-started helper (namespaces made, cgroups joined), if one is ready."""
        pool = self._pool
        if pool is None:
            return None
        w = pool.take()
        if w is None:
            return None
        lim = spec.limits
        try:
            w.cg.set_limits(memory=lim.memory, pids=lim.pids, cpus=lim.cpus)
            if spec.prepare_changes:             # the upper exists already: no round trip
                spec.prepare_changes(f"/proc/self/fd/{w.scratch_fd}/u")
            words = self._run_args(spec)
            for k, v in spec.env.items():
                words += ["--env", f"{k}={v}"]
            words += ["--"] + spec.argv
            data = b"".join(w.encode("utf-8", "surrogateescape") + b"\0" for w in words)
            with os.fdopen(w.spec_w, "wb") as f:
                f.write(data)
            if not spec.stdin:
                w.proc.stdin.close()
                w.proc.stdin = None
        except BaseException:
            w.discard()
            raise
        return _Started(w.proc, w.sock, w.rep_r, w.cg, w.report_raw, w.scratch_fd)

    def warm(self, size: int = 2) -> None:
        """Keep `size` helpers started ahead of runs (root with cgroups only; otherwise cold)."""
        with self._pool_lock:                  # concurrent first runs must start one pool
            if self._pool is None and not self.idmap.rootless and self.cgroups.available and size > 0:
                self._pool = _WarmPool(self, size)

    # ---- one run -----------------------------------------------------------------------------
    def run(self, spec: RunSpec) -> RunOutcome:
        lim = spec.limits
        validate_spec(spec)
        started = time.monotonic()
        deadline = started + lim.timeout
        st = self._start_warm(spec) or self._start_cold(spec)
        if self._pool is None and self._warm_size:
            self.warm(self._warm_size)
        proc, ours, rep_r, cg, report_raw = st.proc, st.sock, st.rep_r, st.cg, st.report_raw
        scratch_fd = st.scratch_fd
        try:
            if scratch_fd is None:               # cold: the helper makes the upper now
                scratch_fd = self._receive_scratch(ours, rep_r, report_raw, proc, deadline)
                upper = f"/proc/self/fd/{scratch_fd}/u" if scratch_fd is not None else None
                if upper and spec.prepare_changes:
                    spec.prepare_changes(upper)
                if scratch_fd is not None and spec.prepare_changes:
                    ours.send(b"g")
            out = self._pump(proc, spec, deadline, rep_r, report_raw, cg)
        except BaseException:
            self._kill(proc, rep_r, report_raw, cg)
            if scratch_fd is not None:
                os.close(scratch_fd)
            if cg:
                cg.remove()
            raise
        finally:
            ours.close()
        report = out.pop("report")
        os.close(rep_r)
        stats = cg.stats() if cg else {}
        wall = time.monotonic() - started

        if "setupfail" in report or "execfail" in report:
            proc.wait()
            if cg:
                cg.remove()
        if "setupfail" in report:
            if scratch_fd is not None:
                os.close(scratch_fd)
            err, step = report["setupfail"]
            raise SandboxError(f"sandbox setup failed at {step}: {os.strerror(err)}", step=step, errno=err)
        if "execfail" in report:
            if scratch_fd is not None:
                os.close(scratch_fd)
            err, step = report["execfail"]
            if step == "exec":
                raise CommandNotFound(f"cannot execute {spec.argv[0]!r}: {os.strerror(err)}",
                                      command=spec.argv[0])
            if step == "cwd":
                raise InvalidInput(f"working directory {spec.cwd!r}: {os.strerror(err)}", cwd=spec.cwd)
            raise SandboxError(f"sandbox setup failed at {step}: {os.strerror(err)}", step=step, errno=err)

        utime, stime, maxrss = report.get("rusage", (0, 0, 0))
        try:
            exit_code, sig = self._exit_status(proc, report, out)
        except BaseException:
            if scratch_fd is not None:
                os.close(scratch_fd)
            _reaper.submit(proc, cg)
            raise
        oom = bool(stats.get("oom_killed")) and not out["timed_out"]
        usage = {"wall_s": round(wall, 6), "user_cpu_s": utime / 1e6, "sys_cpu_s": stime / 1e6,
                 "max_rss_bytes": maxrss * 1024, "cgroup_memory_peak_bytes": stats.get("memory_peak"),
                 "cgroup_cpu_s": (stats["cpu_usage_ns"] / 1e9) if stats.get("cpu_usage_ns") else None,
                 "limits_enforced": cg is not None}
        if out["output_exceeded"] and not out["timed_out"] and not out["cancelled"]:
            usage["killed_by"] = "output_limit"      # why the command ended (RunRecord.usage)

        def close(fd=scratch_fd):
            if fd is not None:
                os.close(fd)                 # frees the run's tmpfs
            # The helper has written its last line and is exiting (tearing down its mount
            # namespace); reaping it and removing its cgroup need not delay the caller.
            _reaper.submit(proc, cg)

        return RunOutcome(exit_code=exit_code, signal=sig, stdout=out["stdout"],
                          stderr=out["stderr"], stdout_truncated=out["stdout_truncated"],
                          stderr_truncated=out["stderr_truncated"], timed_out=out["timed_out"],
                          oom_killed=oom, usage=usage, cancelled=out["cancelled"],
                          changes=None if scratch_fd is None else
                          f"/proc/self/fd/{scratch_fd}/u", disk_limit=lim.disk, _close=close)

    # ---- pieces ------------------------------------------------------------------------------
    def _exit_status(self, proc, report: dict, out: dict) -> tuple[int | None, int | None]:
        """(exit code, signal) of the command; the helper reports them."""
        return report.get("exit"), report.get("signal")

    @staticmethod
    def _receive_scratch(sock: socket.socket, rep_r: int, report_raw: bytearray, proc,
                         deadline: float) -> int | None:
        sel = selectors.DefaultSelector()
        sel.register(sock, selectors.EVENT_READ)
        sel.register(rep_r, selectors.EVENT_READ)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError("sandbox setup did not finish before the timeout")
                for key, _ in sel.select(min(left, 1.0)):
                    if key.fileobj is sock:
                        _, fds, _, _ = socket.recv_fds(sock, 1, 1)
                        if fds:
                            return fds[0]
                        return None
                    # the report: "pid ..." is harmless; setupfail or EOF means no scratch comes
                    chunk = os.read(rep_r, 4096)
                    report_raw += chunk
                    if not chunk or b"setupfail" in report_raw:
                        return None
                if proc.poll() is not None:
                    return None
        finally:
            sel.close()

    def _pump(self, proc, spec: RunSpec, deadline: float, rep_r: int, report_raw: bytearray, cg=None,
              *, kill=None, to_exit: bool = False, eof_grace: float = 0.0) -> dict:
        """Feed stdin, collect capped output, enforce the deadline and cancel. kill: how to end
        the command (default: the sandbox's pid 1). to_exit: stop at the command's exit instead
        of at EOF of its output (a command entering a live sandbox may leave a background
        process holding the pipes); its output is in the pipes by then and is drained. eof_grace:
        if the helper reported a relay (live exec: a reader inside the sandbox passes the output
        on and closes the pipes once the command exited), read to that EOF, for at most this long."""
        kill = kill or (lambda: self._kill_sandbox(proc, report_raw, cg))
        bufs = {"stdout": bytearray(), "stderr": bytearray()}
        trunc = {"stdout": False, "stderr": False}
        sel = selectors.DefaultSelector()
        streams = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
        for fd in streams:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        sel.register(rep_r, selectors.EVENT_READ)
        pending = memoryview(spec.stdin or b"")
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        timed_out = cancelled = False
        exceeded = None                      # the stream that passed its cap: the command is stopped
        open_fds = len(streams) + 1
        poll = 0.05 if spec.cancel is not None else 3600
        exit_by = None                               # exited, relay: the rest comes until then
        try:
            while open_fds:
                if exit_by is not None and time.monotonic() >= exit_by:
                    for sfd, name in streams.items():
                        self._drain(sfd, name, bufs, trunc, spec)
                    break
                left = deadline - time.monotonic()
                if exit_by is not None:
                    left = poll = exit_by - time.monotonic()
                elif left <= 0:
                    timed_out = True
                    kill()
                    deadline = float("inf")
                    continue
                if spec.cancel is not None and spec.cancel.is_set() and not cancelled and exit_by is None:
                    cancelled = True
                    kill()
                    deadline = float("inf")
                for key, ev in sel.select(min(left, poll)):
                    fd = key.fd
                    if ev & selectors.EVENT_WRITE:
                        try:
                            n = os.write(fd, pending[:65536])
                            pending = pending[n:]
                        except (BrokenPipeError, OSError):
                            pending = memoryview(b"")
                        if not pending:
                            sel.unregister(fd)
                            proc.stdin.close()
                        continue
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(fd)
                        open_fds -= 1
                        continue
                    if fd == rep_r:
                        report_raw += chunk
                        if b"rusage " in report_raw and report_raw.endswith(b"\n"):
                            # the helper's last words: do not wait for it to exit (close() reaps it)
                            sel.unregister(fd)
                            open_fds -= 1
                            if to_exit and eof_grace > 0 and _parse_report(report_raw).get("relay"):
                                exit_by = time.monotonic() + eof_grace
                                continue
                            if to_exit:
                                for sfd, name in streams.items():
                                    self._drain(sfd, name, bufs, trunc, spec)
                                open_fds = 0
                                break
                        continue
                    self._keep(streams[fd], chunk, bufs, trunc, spec)
                    if trunc[streams[fd]] and exceeded is None:
                        # Past the cap nothing more is kept, so a command still writing only
                        # burns CPU until its timeout (`yes`): stop it, as a closed pipe would.
                        exceeded = streams[fd]
                        kill()
                        deadline = float("inf")
        finally:
            sel.close()
            if proc.stdin is not None and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        proc.stdout.close()
        proc.stderr.close()
        return {"stdout": bytes(bufs["stdout"]), "stderr": bytes(bufs["stderr"]),
                "stdout_truncated": trunc["stdout"], "stderr_truncated": trunc["stderr"],
                "timed_out": timed_out, "cancelled": cancelled, "output_exceeded": exceeded,
                "report": _parse_report(report_raw)}

    @staticmethod
    def _keep(name: str, chunk: bytes, bufs: dict, trunc: dict, spec: RunSpec) -> None:
        """Keep what fits under the stream's cap; only that reaches on_output (a listener that
        stores or forwards chunks must not see more than the run may produce)."""
        room = spec.limits.output - len(bufs[name])
        kept = chunk[:max(room, 0)]
        if kept:
            bufs[name] += kept
            if spec.on_output:
                spec.on_output(name, kept)
        if len(chunk) > room:
            trunc[name] = True

    def _drain(self, fd: int, name: str, bufs: dict, trunc: dict, spec: RunSpec) -> None:
        """What is in a pipe now, without waiting for more."""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except (BlockingIOError, OSError):
                return
            if not chunk:
                return
            self._keep(name, chunk, bufs, trunc, spec)

    @staticmethod
    def _kill_sandbox(proc, report_raw: bytearray, cg=None) -> None:
        # SIGKILL to the sandbox's pid 1 ends its pid namespace: every process of the run dies.
        pid = _parse_report(report_raw).get("pid")
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            proc.kill()

    def _kill(self, proc, rep_r: int, report_raw: bytearray, cg) -> None:
        if proc is None:
            return
        os.set_blocking(rep_r, False)
        try:
            report_raw += os.read(rep_r, 65536)
        except OSError:
            pass
        self._kill_sandbox(proc, report_raw, cg)
        proc.kill()
        if cg:
            cg.kill()
        proc.wait()
        for s in (proc.stdout, proc.stderr, proc.stdin):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        try:
            os.close(rep_r)
        except OSError:
            pass


@dataclass
class _Started:
    proc: subprocess.Popen
    sock: socket.socket
    rep_r: int
    cg: object
    report_raw: bytearray
    scratch_fd: int | None = None            # warm starts hand it over before the run


@dataclass
class _WarmHelper:
    proc: subprocess.Popen
    sock: socket.socket
    rep_r: int
    spec_w: int
    cg: object
    report_raw: bytearray
    scratch_fd: int | None = None

    def discard(self) -> None:
        for fd in (self.spec_w, self.rep_r, self.scratch_fd):
            if fd is None:
                continue
            try:
                os.close(fd)                     # EOF on the spec: the helper exits unused
            except OSError:
                pass
        self.sock.close()
        for s in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if s is not None:
                s.close()
        _reaper.submit(self.proc, self.cg)


class _WarmPool:
    """Helpers started ahead of runs: exec, namespaces, id maps and cgroup membership are done
    before a run asks, so a run pays only for its overlay, its command and its commit.

    Started from one long-lived thread: the helpers' PDEATHSIG is tied to the thread that
    spawned them, and must fire only when the engine itself goes."""

    def __init__(self, runtime: "NamespaceRuntime", size: int):
        self.rt = runtime
        self.size = size
        self.ready: "collections.deque[_WarmHelper]" = collections.deque()
        self.cv = threading.Condition()
        self.closed = False
        self.broken: str | None = None
        self.thread = threading.Thread(target=self._fill, name="sandtree-warm", daemon=True)
        self.thread.start()

    def take(self) -> _WarmHelper | None:
        with self.cv:
            w = self.ready.popleft() if self.ready else None
            self.cv.notify()
            return w

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()
            idle = list(self.ready)
            self.ready.clear()
        for w in idle:
            w.discard()
        self.thread.join(timeout=30)          # a helper being started is discarded by the thread

    def _fill(self) -> None:
        while True:
            with self.cv:
                while not self.closed and len(self.ready) >= self.size:
                    self.cv.wait()
                if self.closed:
                    return
            try:
                w = self._spawn()
            except Exception as exc:          # noqa: BLE001 - the pool is an optimisation
                self.broken = str(exc)
                return
            with self.cv:
                if self.closed:
                    w.discard()
                    return
                self.ready.append(w)

    def _spawn(self) -> _WarmHelper:
        rt = self.rt
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rep_r, rep_w = os.pipe()
        spec_r, spec_w = os.pipe()
        cg = rt.cgroups.create(memory=Limits().memory, pids=Limits().pids, cpus=0, warm=True)
        args = [rt.helper(), "--sock", str(theirs.fileno()), "--report", str(rep_w),
                "--spec-fd", str(spec_r), "--layers", rt.layers_dir, "--disk", str(Limits().disk),
                "--root-uid", str(rt.idmap.host_uid(0)), "--root-gid", str(rt.idmap.host_gid(0))]
        args += rt._static_args()
        for f in cg.procs_files:
            args += ["--cgroup", f]
        try:
            proc = subprocess.Popen(args, env={}, close_fds=True,
                                    pass_fds=(theirs.fileno(), rep_w, spec_r, seccomp.filter_fd()),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except BaseException:
            ours.close(); os.close(rep_r); os.close(spec_w); cg.remove()
            raise
        finally:
            theirs.close(); os.close(rep_w); os.close(spec_r)
        raw = bytearray()
        w = _WarmHelper(proc, ours, rep_r, spec_w, cg, raw)
        while b"ready\n" not in raw:
            chunk = os.read(rep_r, 4096)
            if not chunk:
                w.discard()
                raise SandboxError(f"warm helper failed: {bytes(raw).decode(errors='replace').strip()}")
            raw += chunk
        _, fds, _, _ = socket.recv_fds(ours, 1, 1, socket.MSG_DONTWAIT)   # sent before "ready"
        if not fds:
            w.discard()
            raise SandboxError("warm helper sent no scratch directory")
        w.scratch_fd = fds[0]
        return w


class _Reaper:
    """Waits for exiting helpers and removes their cgroups, off the caller's path."""

    def __init__(self):
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, proc, cg) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="sandtree-reaper", daemon=True)
                self._thread.start()
        self._queue.put((proc, cg))

    def _loop(self) -> None:
        while True:
            proc, cg = self._queue.get()
            proc.wait()
            if cg:
                cg.remove(wait=2.0)

    def drain(self) -> None:
        """Wait until every submitted helper is reaped (tests, shutdown)."""
        done = threading.Event()
        self._queue.put((_Done(done), None))
        if self._thread is not None and self._thread.is_alive():
            done.wait(30)


class _Done:
    def __init__(self, ev):
        self.ev = ev

    def wait(self):
        self.ev.set()


_reaper = _Reaper()


def _parse_report(raw: bytes) -> dict:
    out: dict = {}
    for line in bytes(raw).decode("ascii", "replace").splitlines():
        parts = line.split()
        if not parts:
            continue
        k, v = parts[0], parts[1:]
        if k in ("pid", "exit", "signal") and v:
            out[k] = int(v[0])
        elif k in ("execfail", "setupfail") and len(v) >= 2:
            out[k] = (int(v[0]), v[1])
        elif k == "rusage" and len(v) == 3:
            out[k] = tuple(int(x) for x in v)
        elif k == "relay":                       # live exec: output passes a reader inside (drain.c)
            out[k] = True
    return out


def disk_inodes(disk: int) -> int:
    """The inode cap of a run's scratch: one per 4 KiB of disk (a page, what the smallest
    non-empty file takes there), at least 1024. Without it, a run under disk=1M could create
    50,000 empty files (each a host inode after commit)."""
    return max(disk // 4096, 1024)


def validate_spec(spec: RunSpec) -> None:
    """Bad input gets a clear error before anything starts (shared by every tier and the engine's checks)."""
    lim = spec.limits
    if not spec.argv or not all(isinstance(a, str) and "\0" not in a for a in spec.argv):
        raise InvalidInput("the command must be a non-empty list of strings without NUL bytes")
    if not (lim.timeout > 0):
        raise InvalidInput(f"timeout must be positive, not {lim.timeout}")
    for name in ("memory", "pids", "disk", "output"):
        if getattr(lim, name) <= 0:
            raise InvalidInput(f"{name} must be positive")
    if lim.cpus is not None and lim.cpus <= 0:
        raise InvalidInput("cpus must be positive")
    if lim.memory < (8 << 20):
        raise InvalidInput("memory must be at least 8 MiB")
    size = 0
    for k, v in spec.env.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise InvalidInput(f"bad environment variable {k!r}")
        size += len(k) + len(v) + 2
    if size > MAX_ENV_BYTES:
        raise InvalidInput(f"environment too large ({size} bytes; the limit is {MAX_ENV_BYTES})")
    if not spec.cwd.startswith("/") or "\0" in spec.cwd:
        raise InvalidInput(f"cwd must be an absolute path, not {spec.cwd!r}")
    if not spec.hostname or len(spec.hostname) > 64 or not all(c.isalnum() or c in "-." for c in spec.hostname):
        raise InvalidInput(f"bad hostname {spec.hostname!r}")
    for v in (spec.uid, spec.gid):
        if not (0 <= v < 65536):
            raise InvalidInput("uid and gid must be in 0..65535")
    check_files_fit(spec)


def check_files_fit(spec: RunSpec) -> None:
    """Injected files are written into the run's scratch, so they count against its disk (in
    whole pages, as tmpfs counts them) and its inodes: refused here, before any sandbox starts,
    rather than failing half-written inside one."""
    if not spec.files:
        return
    disk = spec.limits.disk
    sizes = [f.size for f in spec.files]
    used = sum(-(-n // 4096) * 4096 for n in sizes)
    if used > disk:
        raise TooLarge(f"files are {sum(sizes)} bytes ({used} in 4 KiB pages), disk is {disk}: "
                       f"ask for more disk", files_bytes=sum(sizes), disk=disk)
    parts = [[p for p in f.path.split("/") if p] for f in spec.files]
    inodes = len(spec.files) + len({tuple(p[:i]) for p in parts for i in range(1, len(p))})
    if inodes > disk_inodes(disk):                     # the files and their parent dirs
        raise TooLarge(f"{len(spec.files)} files and their directories need {inodes} inodes, "
                       f"disk={disk} gives {disk_inodes(disk)}: ask for more disk", inodes=inodes, disk=disk)
