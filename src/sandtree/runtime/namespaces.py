"""Tier `namespaces` (the default): Linux namespaces + overlayfs + seccomp + cgroups.

This module decides and supervises; runtime/helper/ performs the privileged steps (see
helper/helper.h for the process layout). Here: per-run cgroup, seccomp program, spawning the helper,
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

Output (pump.py): a stream that passes its cap stops the run at once (SIGKILL to the sandbox, as
a timeout does); the outcome says so: the stream's *_truncated flag, signal 9 and
usage["killed_by"] = "output_limit". Elsewhere: what a valid spec is (validate.py), the warm
pool (warm.py), reaping helpers (reaper.py), live sandboxes on this tier (live.py).
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

from ..errors import CommandNotFound, InvalidInput, SandboxError
from ..store.layers import IdMap
from . import seccomp
from .base import LiveTier, RunOutcome, RunSpec, Runtime
from .build import helper_path
from .cgroups import Cgroups
from .live import LiveRuntime
from .pump import parse_report, pump
from .reaper import reaper
from .runfiles import fds_of, network_args
from .validate import disk_inodes, env_args, helper_env, too_big_for_execve, validate_spec
from .warm import WarmPool

# Docker's default capability set (numbers from linux/capability.h).
KEEP_CAPS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
             "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_RAW": 13, "SYS_CHROOT": 18,
             "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31}

# Owners of the sandboxes' user namespaces (root only; helper/main.c: owner = base + the helper's
# pid, below 2^22, the kernel's pid limit): uids no account uses, in the range systemd leaves
# unused (0x70000000-0x7FFFFFFF), far from the sandbox ids (100000 + 65536). Per-user kernel
# limits a sandbox spends are charged to its owner, so to no one else.
USERNS_OWNER_BASE = 0x7E000000

# Helpers kept started in egress links (take_linked): a networked run then starts warm too; each
# holds a link of the daemon's (a namespace, a veth, nothing allowed) while it waits.
LINKED_WARM = 2


class NamespaceRuntime(Runtime):
    name = "namespaces"

    def __init__(self, layers_dir: str, idmap: IdMap, cache_dir: str, *, warm: int = 0):
        self.layers_dir = layers_dir
        self.idmap = idmap
        self.cache_dir = cache_dir
        self.cgroups = Cgroups()
        self._helper: str | None = None
        self._pool: WarmPool | None = None
        self._linked: WarmPool | None = None      # helpers born in egress links (take_linked)
        self._live: LiveRuntime | None = None
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
        for pool in (self._pool, self._linked):
            if pool is not None:
                pool.close()
        self._pool = self._linked = None
        reaper.drain()

    def validate_spec(self, spec: RunSpec) -> None:
        validate_spec(spec)

    def live(self) -> LiveTier:
        """This tier's live sandboxes (whether this host can start them: its available())."""
        if self._live is None:
            self._live = LiveRuntime(self)
        return self._live

    def helper(self) -> str:
        if self._helper is None:
            self._helper = helper_path(self.cache_dir)
        return self._helper

    # ---- one run -----------------------------------------------------------------------------
    def static_args(self) -> list[str]:
        """Options that are the same for every run of this engine."""
        args = []
        if not self.idmap.rootless:
            args += ["--uid-map", self.idmap.uid_map_line(), "--gid-map", self.idmap.gid_map_line(),
                     "--owner-base", str(USERNS_OWNER_BASE)]
        for cap in KEEP_CAPS.values():
            args += ["--keep-cap", str(cap)]
        return args + ["--seccomp-fd", str(seccomp.filter_fd())]

    def run_args(self, spec: RunSpec) -> list[str]:
        """Options of one run (argv of a cold start, or the spec of a warm one)."""
        lim = spec.limits
        return ["--layers", self.layers_dir, "--lower", ":".join(spec.layers), "--disk", str(lim.disk),
                "--inodes", str(disk_inodes(lim.disk)),
                "--hostname", spec.hostname, "--cwd", spec.cwd, "--uid", str(spec.uid), "--gid", str(spec.gid),
                "--root-mode", f"{spec.root_meta[0]:o}",
                "--root-uid", str(self.idmap.host_uid(spec.root_meta[1])),
                "--root-gid", str(self.idmap.host_gid(spec.root_meta[2])),
                "--inject", "1" if spec.prepare_changes else "0"]

    def _start_cold(self, spec: RunSpec) -> "Started":
        lim = spec.limits
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rep_r, rep_w = os.pipe()
        args = [self.helper(), "--sock", str(theirs.fileno()), "--report", str(rep_w)]
        args += self.static_args() + self.run_args(spec)
        sfd = seccomp.filter_fd()
        cg = None
        extra, rt = network_args(spec)
        args += extra
        try:
            if self.cgroups.available:
                cg = self.cgroups.create(memory=lim.memory, pids=lim.pids, cpus=lim.cpus)
                for f in cg.procs_files:
                    args += ["--cgroup", f]
            # the helper is root on the host: the command's env (the caller's, an image's config) is
            # never its own (LD_PRELOAD & co.): helper_env renames it, helper/options.c takes it back
            proc = subprocess.Popen(
                args + ["--"] + spec.argv, env=helper_env(spec.env), close_fds=True,
                pass_fds=(theirs.fileno(), rep_w, sfd, *fds_of(spec, rt)),
                stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except BaseException as exc:
            ours.close(); os.close(rep_r)
            if cg:
                cg.remove()
            if isinstance(exc, OSError) and exc.errno == errno.E2BIG:
                raise too_big_for_execve() from None
            raise
        finally:
            theirs.close()
            os.close(rep_w)
            if rt is not None:
                os.close(rt)
        return Started(proc, ours, rep_r, cg, bytearray())

    def _start_warm(self, spec: RunSpec) -> "Started | None":
        """Hand the run to a pre-started helper (namespaces made, cgroups joined): the linked one
        the caller took, or one of the pool's if one is ready."""
        w, spec.prestarted = spec.prestarted, None
        if w is None:
            pool = self._pool
            if pool is None or spec.netns_fd is not None or spec.runtime_files:
                return None                      # (a warm helper made its network namespace already)
            w = pool.take(layers=spec.layers)
            if w is None:
                return None
        lim = spec.limits
        try:
            w.cg.set_limits(memory=lim.memory, pids=lim.pids, cpus=lim.cpus)
            if spec.prepare_changes:             # the upper exists already: no round trip
                spec.prepare_changes(f"/proc/self/fd/{w.scratch_fd}/u")
            words = self.run_args(spec) + env_args(spec.env) + ["--"] + spec.argv
            data = b"".join(w.encode("utf-8", "surrogateescape") + b"\0" for w in words)
            if w.gate is not None:               # nothing runs before the caller says (the link's policy)
                w.gate()
            with os.fdopen(w.spec_w, "wb") as f:
                f.write(data)
            if not spec.stdin:
                w.proc.stdin.close()
                w.proc.stdin = None
        except BaseException:
            w.discard()
            raise
        return Started(w.proc, w.sock, w.rep_r, w.cg, w.report_raw, w.scratch_fd)

    def take_linked(self, provide, retire, fits=None, layers=()) -> "WarmPool | None":
        """See Runtime.take_linked: a pool of LINKED_WARM helpers, started on the first ask."""
        with self._pool_lock:
            if self._linked is None:
                if self.idmap.rootless or not self.cgroups.available or not self._warm_size:
                    return None
                self._linked = WarmPool(self, LINKED_WARM, provide, retire)
                return None                      # this run starts cold; the next finds one
        return self._linked.take(fits, layers)

    def warm(self, size: int = 2) -> None:
        """Keep `size` helpers started ahead of runs (root with cgroups only; otherwise cold)."""
        with self._pool_lock:                  # concurrent first runs must start one pool
            if self._pool is None and not self.idmap.rootless and self.cgroups.available and size > 0:
                self._pool = WarmPool(self, size)

    # ---- one run -----------------------------------------------------------------------------
    def run(self, spec: RunSpec) -> RunOutcome:
        lim = spec.limits
        try:
            validate_spec(spec)
        except BaseException:
            if spec.prestarted is not None:
                spec.prestarted.discard()
                spec.prestarted = None
            raise
        started = time.monotonic()
        deadline = started + lim.timeout
        st = self._start_warm(spec) or self._start_cold(spec)
        if self._pool is None and self._warm_size:
            self.warm(self._warm_size)
        proc, ours, rep_r, cg, report_raw = st.proc, st.sock, st.rep_r, st.cg, st.report_raw
        scratch_fd = st.scratch_fd
        try:
            if scratch_fd is None:               # cold: the helper makes the upper now
                scratch_fd = self.receive_scratch(ours, rep_r, report_raw, proc, deadline)
                upper = f"/proc/self/fd/{scratch_fd}/u" if scratch_fd is not None else None
                if upper and spec.prepare_changes:
                    spec.prepare_changes(upper)
                if scratch_fd is not None and spec.prepare_changes:
                    ours.send(b"g")
            out = pump(proc, spec, deadline, rep_r, report_raw,
                       kill=lambda: self._kill_sandbox(proc, report_raw, cg))
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
            if step == "exec" and err == errno.E2BIG:
                raise too_big_for_execve()
            if step == "exec":
                raise CommandNotFound(f"cannot execute {spec.argv[0]!r}: {os.strerror(err)}",
                                      command=spec.argv[0], errno=err)
            if step == "cwd":
                raise InvalidInput(f"working directory {spec.cwd!r}: {os.strerror(err)}", cwd=spec.cwd)
            raise SandboxError(f"sandbox setup failed at {step}: {os.strerror(err)}", step=step, errno=err)

        utime, stime, maxrss = report.get("rusage", (0, 0, 0))
        try:
            exit_code, sig = self._exit_status(proc, report, out)
        except BaseException:
            if scratch_fd is not None:
                os.close(scratch_fd)
            reaper.submit(proc, cg)
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
            reaper.submit(proc, cg)

        return RunOutcome(exit_code=exit_code, signal=sig, stdout=out["stdout"],
                          stderr=out["stderr"], stdout_truncated=out["stdout_truncated"],
                          stderr_truncated=out["stderr_truncated"], timed_out=out["timed_out"],
                          oom_killed=oom, usage=usage, cancelled=out["cancelled"],
                          changes=None if scratch_fd is None else
                          f"/proc/self/fd/{scratch_fd}/u", disk_limit=lim.disk).closing(close)

    # ---- pieces ------------------------------------------------------------------------------
    def _exit_status(self, proc, report: dict, out: dict) -> tuple[int | None, int | None]:
        """(exit code, signal) of the command; the helper reports them."""
        return report.get("exit"), report.get("signal")

    @staticmethod
    def receive_scratch(sock: socket.socket, rep_r: int, report_raw: bytearray, proc,
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

    @staticmethod
    def _kill_sandbox(proc, report_raw: bytearray, cg=None) -> None:
        # SIGKILL to the sandbox's pid 1 ends its pid namespace: every process of the run dies.
        pid = parse_report(report_raw).get("pid")
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
class Started:
    proc: subprocess.Popen
    sock: socket.socket
    rep_r: int
    cg: object
    report_raw: bytearray
    scratch_fd: int | None = None            # warm starts hand it over before the run


