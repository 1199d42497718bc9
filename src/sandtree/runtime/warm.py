"""Helpers started ahead of runs (the namespaces tier's warm pool): exec, namespaces, id maps and
cgroup membership done before a run asks, so a run pays only for its overlay, its command and
its commit. NamespaceRuntime.warm starts a pool; _start_warm hands a run to one of its helpers.
A linked pool (NamespaceRuntime.take_linked) starts its helpers inside egress links with nothing
allowed: a networked run takes one after the engine set the link's policy (the helper's gate).
"""

from __future__ import annotations

import collections
import os
import socket
import subprocess
import threading
from dataclasses import dataclass

from ..errors import SandboxError
from . import seccomp
from .base import Limits
from .reaper import reaper
from .runfiles import memfd


@dataclass
class WarmHelper:
    proc: subprocess.Popen
    sock: socket.socket
    rep_r: int
    spec_w: int
    cg: object
    report_raw: bytearray
    scratch_fd: int | None = None
    key: str | None = None          # a linked helper's link (born in its namespace, nothing allowed yet)
    scope: str | None = None        # whose runs that link served before (a recycled one); None: nobody's
    retire: object = None           # key -> None: give the link back (an unused linked helper)
    gate: object = None             # () -> None, called before the run is handed over (its link's policy set)

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
        reaper.submit(self.proc, self.cg)
        if self.gate is not None:                # its answer first: one request in flight a thread
            try:
                self.gate()
            except Exception:                    # noqa: BLE001 - it goes anyway
                pass
            self.gate = None
        if self.key is not None and self.retire is not None:
            try:
                self.retire(self.key)
            except Exception:                    # noqa: BLE001 - the daemon collects it when we go
                pass
            self.key = None


class WarmPool:
    """Helpers started ahead of runs: exec, namespaces, id maps and cgroup membership are done
    before a run asks, so a run pays only for its overlay, its command and its commit.

    Started from one long-lived thread: the helpers' PDEATHSIG is tied to the thread that
    spawned them, and must fire only when the engine itself goes."""

    def __init__(self, runtime, size: int, provide=None, retire=None):
        # runtime: the NamespaceRuntime it starts for. A linked pool (provide given): each helper is
        # born in a link's network namespace; provide() -> (key, netns_fd, runtime_files, scope)
        # makes one (the engine's egress daemon, nothing allowed until a run sets its policy),
        # retire(key) gives an unused one back.
        self.rt = runtime
        self.size = size
        self.provide, self.retire = provide, retire
        self.ready: "collections.deque[WarmHelper]" = collections.deque()
        self.cv = threading.Condition()
        self.closed = False
        self.broken: str | None = None
        self.thread = threading.Thread(target=self._fill, name="sandtree-warm", daemon=True)
        self.thread.start()

    def take(self, fits=None, layers=()) -> WarmHelper | None:
        """A ready helper (for a linked pool: one whose link's scope fits(scope) accepts) that
        sees every one of `layers`, or None. Helpers born before a layer was mounted (an EROFS
        image, store/erofs.py) are discarded: in their mount namespace, private since their
        birth, the layer is its empty mount point."""
        mounts = _mounted_lowers(self.rt.layers_dir, layers)
        stale = []
        with self.cv:
            w = None
            for x in list(self.ready):
                if fits is not None and not fits(x.scope):
                    continue
                if mounts and not mounts <= _mount_points(x.proc.pid):
                    self.ready.remove(x)
                    stale.append(x)
                    continue
                self.ready.remove(x)
                w = x
                break
            self.cv.notify()
        for x in stale:
            x.discard()
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

    def _spawn(self) -> WarmHelper:
        rt = self.rt
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rep_r, rep_w = os.pipe()
        spec_r, spec_w = os.pipe()
        cg = rt.cgroups.create(memory=Limits().memory, pids=Limits().pids, cpus=0, warm=True)
        args = [rt.helper(), "--sock", str(theirs.fileno()), "--report", str(rep_w),
                "--spec-fd", str(spec_r), "--layers", rt.layers_dir, "--disk", str(Limits().disk),
                "--root-uid", str(rt.idmap.host_uid(0)), "--root-gid", str(rt.idmap.host_gid(0))]
        args += rt.static_args()
        for f in cg.procs_files:
            args += ["--cgroup", f]
        key = netns_fd = files_fd = scope = None
        try:
            if self.provide is not None:
                key, netns_fd, files, scope = self.provide()
                files_fd = memfd(files)
                args += ["--netns-fd", str(netns_fd), "--runtime-fd", str(files_fd)]
            proc = subprocess.Popen(args, env={}, close_fds=True,
                                    pass_fds=(theirs.fileno(), rep_w, spec_r, seccomp.filter_fd(),
                                              *(f for f in (netns_fd, files_fd) if f is not None)),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except BaseException:
            ours.close(); os.close(rep_r); os.close(spec_w); cg.remove()
            if key is not None and self.retire is not None:
                self.retire(key)
            raise
        finally:
            theirs.close(); os.close(rep_w); os.close(spec_r)
            for fd in (netns_fd, files_fd):
                if fd is not None:
                    os.close(fd)
        raw = bytearray()
        w = WarmHelper(proc, ours, rep_r, spec_w, cg, raw, key=key, scope=scope, retire=self.retire)
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


def _mounted_lowers(layers_dir: str, layers) -> set[str]:
    """The paths of those layers that are mounts of their own here (a stat each)."""
    if not layers:
        return set()
    root = os.stat(layers_dir).st_dev
    out = set()
    for layer in layers:
        path = os.path.join(layers_dir, layer)
        try:
            if os.stat(path).st_dev != root:
                out.add(os.path.realpath(path))
        except FileNotFoundError:
            pass
    return out


def _mount_points(pid: int) -> set[str]:
    """Mount points in a process's mount namespace (none if it is gone)."""
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            return {line.split()[4].replace("\\040", " ") for line in f}
    except OSError:
        return set()
