"""A live sandbox's spawner: one process inside it (runtime/hold.c's `--spawn` mode, S) that forks
the holder of each command spawned there (held.py), so that a spawned command costs a fork inside
the sandbox instead of an enter (cgroups joined, namespaces entered) and two execs.

Why it may: S is started once by an enter, exactly as a command of the sandbox's root would be
(its cgroups and namespaces, the capability bounding set, no_new_privs, rlimits and the seccomp
filter of every command), and each holder it forks takes the command's groups and ids before the
command is cloned, so a command gets nothing a command started by an enter would not. S holds
one socket of the engine's (its stdin: a SOCK_SEQPACKET socketpair), on which each request is a
stream socket of the command's own (SCM_RIGHTS); the holder reads the command's spec there and
then talks frames on it as a relay would (Direct: the relay's place in held.Held).

A checkpoint cannot hold the engine's socket: S is let go (forget, wait=True: it has exited when
that returns) before a hibernation or a live fork, and started again by the next spawn. One that
died meanwhile (killed from inside) is noticed at the next request, which starts another.
"""

from __future__ import annotations

import array
import select
import socket
import struct
import subprocess
import threading

from ...errors import SandboxError
from ...runtime.reaper import reaper

__all__ = ["Direct", "Spawners"]

_UP_WAIT = 10.0                # seconds S is given to say it runs
_GONE_WAIT = 5.0               # seconds a let-go S is given to leave


class _Input:
    """The engine's side of a held command's socket as a relay's stdin: close() lets the holder
    go (it reads EOF, as from a relay that ended) without closing what is still read."""

    def __init__(self, sock: socket.socket):
        self.sock, self.closed = sock, False

    def write(self, data: bytes) -> int:
        if self.closed:
            raise ValueError("write to a closed input")
        self.sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass


class Direct:
    """A held command's connection to its holder, shaped as the relay held.py reads (stdin,
    stdout, wait, kill, returncode, report): no process of the engine's own is behind it."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.stdin = _Input(sock)
        self.stdout = sock.makefile("rb")
        self.stderr = None
        self.returncode: int | None = None
        # a holder that never said hello: its spawner died with the request (held._never_started)
        self.report: dict = {"execfail": (32, "spawner")}

    def wait(self, timeout: float | None = None) -> int:
        """Until its holder has let go of the socket (it closed its end: it left, or detached),
        as a relay's wait is until the relay ended. 127 (the relay of one that never started)."""
        if self.returncode is None:
            # (no event asked for: only POLLHUP, both ends shut, by its close or our own kill)
            p = select.poll()
            p.register(self.sock.fileno(), 0)
            if not p.poll(None if timeout is None else max(0, int(timeout * 1000))):
                raise subprocess.TimeoutExpired("held process", timeout)
            self.sock.close()
            self.returncode = 127
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _gone(sock: socket.socket, timeout: float) -> bool:
    """Whether S has left (its end of the socket closed: POLLHUP), waiting up to timeout seconds."""
    p = select.poll()
    p.register(sock.fileno(), 0)              # (no event asked for: POLLHUP alone)
    return bool(p.poll(max(0, int(timeout * 1000))))


class Spawners:
    """The spawners of the live sandboxes this engine process spawned in (one each), by the
    engine's end of its socket."""

    def __init__(self, sandboxes):
        self.sandboxes = sandboxes
        self.by_sid: dict[str, socket.socket] = {}
        self.starting: dict[str, threading.Lock] = {}   # sid -> held while its spawner starts
        self.lock = threading.Lock()              # the two dicts

    def spawn(self, sid: str, key: str, argv: list[str], *, env, cwd, uid, gid) -> Direct | None:
        """The connection to a new holder of argv (as the command of an enter: its spec is the
        sandbox's, sandboxes.spawn_spec), listening as `key`; None where the sandbox's tier has
        no spawner (gVisor's holders are started by its agent)."""
        if self.sandboxes.holder(sid)[1]:
            return None
        spec, groups = self.sandboxes.spawn_spec(sid, argv, env=env, cwd=cwd, uid=uid, gid=gid)
        words = [key, spec.cwd, str(spec.uid), str(spec.gid), "1" if groups else "0", str(len(spec.env)),
                 *(f"{k}={v}" for k, v in spec.env.items()), *spec.argv]
        data = b"".join(w.encode("utf-8", "surrogateescape") + b"\0" for w in words)
        for attempt in (1, 2):
            try:
                ctl = self._spawner(sid)
            except SandboxError:
                if attempt == 2:
                    raise
                self.sandboxes.holder(sid, again=True)   # (its copy removed from inside?)
                continue
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                ctl.sendmsg([b"s"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]))])
            except OSError:
                mine.close()
                self.forget(sid)                  # (it died: killed from inside) another one, once
                if attempt == 2:
                    raise SandboxError(f"the command spawner of sandbox {sid[:12]} ended at once: "
                                       "the sandbox may be out of processes or memory") from None
                continue
            finally:
                theirs.close()
            try:
                mine.sendall(struct.pack("=I", len(data)) + data)
            except OSError:
                pass                              # (its holder is gone: Direct's reader hears EOF)
            return Direct(mine)
        return None

    def _spawner(self, sid: str, handle=None) -> socket.socket:
        """Sandbox `sid`'s spawner: the running one, else one started now (one start at a time per
        sandbox; other sandboxes' spawns do not wait for it)."""
        with self.lock:
            ctl = self.by_sid.get(sid)
            if ctl is not None and not _gone(ctl, 0):
                return ctl
            if ctl is not None:
                del self.by_sid[sid]
                ctl.close()
            starting = self.starting.setdefault(sid, threading.Lock())
        with starting:
            with self.lock:
                ctl = self.by_sid.get(sid)
            if ctl is not None and not _gone(ctl, 0):
                return ctl                        # (started meanwhile by another caller)
            try:
                return self._launch(sid, handle)
            finally:
                with self.lock:
                    if self.starting.get(sid) is starting:
                        del self.starting[sid]

    def _launch(self, sid: str, handle) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = self.sandboxes.spawner_process(sid, theirs.fileno(), handle)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ready, _, _ = select.select([ours], [], [], _UP_WAIT)
        said = ours.recv(1) if ready else b""
        if said != b"r":
            ours.close()
            proc.kill()
            proc.wait()
            raise SandboxError(f"the command spawner of sandbox {sid[:12]} did not start "
                               f"({proc.report or 'no answer'})")
        reaper.submit(proc, None)                 # (its enter ends as S runs on, pid 1's)
        with self.lock:
            old = self.by_sid.get(sid)
            self.by_sid[sid] = ours
            if len(self.by_sid) > 4096:           # (sandboxes stopped by another engine process)
                for other in [k for k, v in self.by_sid.items() if _gone(v, 0)]:
                    self.by_sid.pop(other).close()
        if old is not None:
            old.close()
        return ours

    def prepare(self, sid: str, handle) -> None:
        """Start the spawner of a sandbox started ahead (warm/sandboxes.py: off any caller's path),
        so that its first command, once claimed, is a fork too; on failure, its first spawn starts one."""
        try:
            self._spawner(sid, handle)
        except Exception:                         # noqa: BLE001 - (started when first needed)
            pass

    def forget(self, sid: str, *, wait: bool = False) -> None:
        """Let sandbox `sid`'s spawner go (the next spawn starts another): EOF, and it leaves (its
        holders go on). wait: until it has left (before a checkpoint, which cannot hold its
        socket); else without waiting (a stop, which ends it anyway)."""
        with self.lock:
            ctl = self.by_sid.pop(sid, None)
        if ctl is None:
            return
        try:
            if wait:
                ctl.shutdown(socket.SHUT_WR)
                _gone(ctl, _GONE_WAIT)
        except OSError:
            pass
        finally:
            ctl.close()

    def close(self) -> None:
        with self.lock:
            ctls, self.by_sid = list(self.by_sid.values()), {}
        for ctl in ctls:
            ctl.close()
