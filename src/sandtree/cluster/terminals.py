"""The node's end of sandbox_popen on a cluster (its API side: cluster/relay.py).

A process's pipes or terminal are file descriptors of the machine that started it, so the node
runs the popen (with a pty of its own when the caller asked for a terminal, sized as the caller's)
and relays: Terminals.run is a Ray generator method's body that yields ("up", None) once the
process exists, ("output", [(stream, chunk), ...]) batches as it writes ("pty", "stdout",
"stderr"), ("exit", (returncode, report)) when it exits, then ("result", None) once its output
has ended (a background process holding the terminal keeps it open, as on one machine). The
caller's writes, window sizes, signals and the end of its input come as other node calls, by
the session's key.

Ray does not end a generator call whose caller died: a relay that has not heard from its API
process (Fabric.hold's keepalive) for `orphan_s` ends as a closed terminal would (hung up, its
process killed), so a dead API replica leaves no shell behind on the node.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import threading
import time

__all__ = ["Terminals", "EXIT_POLL_S", "set_winsize"]

# A process's exit is looked for this often while its output is quiet (a helper process: no fd
# to wait on that is not private to the engine).
EXIT_POLL_S = 0.05
_SPECIAL = {"pipe": subprocess.PIPE, "devnull": subprocess.DEVNULL, "stdout": subprocess.STDOUT}


def set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", max(1, min(rows, 1000)), max(1, min(cols, 1000)), 0, 0))


class _Session:
    def __init__(self, proc, master: int | None, orphan_s: float):
        self.proc, self.master, self.orphan_s = proc, master, orphan_s
        self.seen = time.monotonic()                # the caller's last keepalive
        self.wake_r, self.wake_w = os.pipe()        # the hangup: the reading loop closes the master itself
        self.hangup = False


class Terminals:
    """The popen sessions of one node's engine, by key."""

    def __init__(self, engine):
        self.engine = engine
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}

    def run(self, key: str, sid: str, argv, kwargs: dict, winsize: tuple[int, int] | None, kinds: dict,
            orphan_s: float):
        """sandbox_popen(sid, argv, **kwargs) here, relayed (module doc). winsize (cols, rows): a
        terminal of that size is the streams whose kind is "pty"; kinds: stdin/stdout/stderr ->
        "pty", "pipe", "devnull" or "stdout" (stderr into stdout). orphan_s: see the module doc."""
        master = slave = None
        if winsize is not None:
            master, slave = pty.openpty()
            set_winsize(master, *winsize)
        try:
            ends = {name: slave if kind == "pty" else _SPECIAL[kind] for name, kind in kinds.items()}
            proc = self.engine.sandbox_popen(sid, argv, pty=winsize is not None, **ends, **kwargs)
        except BaseException:
            if master is not None:
                os.close(master)
            raise
        finally:
            if slave is not None:
                os.close(slave)             # the process holds it now
        s = _Session(proc, master, orphan_s)
        with self._lock:
            self._sessions[key] = s
        try:
            yield ("up", None)
            yield from self._relay(s)
        finally:
            with self._lock:            # (the other calls use its fds under the lock: never a reused fd)
                self._sessions.pop(key, None)
            for fd in (s.master, s.wake_r, s.wake_w):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if proc.poll() is None:       # (the caller's side went away before it ended)
                proc.kill()
                proc.wait()

    def _relay(self, s: _Session):
        readers = {s.proc.stdout.fileno(): "stdout"} if s.proc.stdout else {}
        if s.proc.stderr:
            readers[s.proc.stderr.fileno()] = "stderr"
        if s.master is not None:
            readers[s.master] = "pty"
        exited = False
        while readers or not exited:
            ready, _, _ = select.select([*readers, s.wake_r], [], [], EXIT_POLL_S)
            batch = []
            for fd in ready:
                if fd == s.wake_r:
                    os.read(fd, 64)
                    if s.hangup and s.master is not None:    # the caller's terminal closed: so does this one
                        readers.pop(s.master, None)
                        with self._lock:
                            master, s.master = s.master, None
                        os.close(master)
                    continue
                try:
                    data = os.read(fd, 65536)
                except OSError:               # EIO: every holder of the terminal is gone
                    data = b""
                if data:
                    batch.append((readers[fd], data))
                else:
                    readers.pop(fd)
            if batch:
                yield ("output", batch)
            if not exited and time.monotonic() - s.seen > s.orphan_s and not s.hangup:
                s.hangup = True             # its caller is gone: as if its terminal closed, and killed
                os.write(s.wake_w, b"o")
                s.proc.kill()
            if not exited and s.proc.poll() is not None:
                exited = True
                yield ("exit", (s.proc.returncode, s.proc.report))
        yield ("result", None)

    def alive(self, keys: list[str]) -> None:
        """Their callers are still there (module doc)."""
        now = time.monotonic()
        with self._lock:
            for key in keys:
                s = self._sessions.get(key)
                if s is not None:
                    s.seen = now

    def write(self, key: str, data: bytes) -> bool:
        """Bytes to the process's terminal or stdin pipe (False: it has ended, or that is closed)."""
        with self._lock:                  # a copy of the fd: a write may block (the process reads
            s = self._sessions.get(key)   # slowly) and must not hold the lock, nor its fd be reused
            try:
                if s is None:
                    return False
                fd = os.dup(s.master if s.master is not None else s.proc.stdin.fileno())
            except (OSError, AttributeError, ValueError):     # its stdin is closed (or none)
                return False
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError:                   # EPIPE / EIO: it stopped reading for good
            return False
        finally:
            os.close(fd)
        return True

    def close_input(self, key: str) -> None:
        """The caller's input ended: a terminal hangs up (as a closed one does: SIGHUP to its
        session), a stdin pipe is closed."""
        with self._lock:
            s = self._sessions.get(key)
            if s is None:
                return
            if s.master is not None:
                s.hangup = True
                os.write(s.wake_w, b"h")
                return
        if s.proc.stdin is not None:
            with contextlib.suppress(OSError):
                s.proc.stdin.close()

    def resize(self, key: str, cols: int, rows: int) -> None:
        with self._lock:
            s = self._sessions.get(key)
            if s is not None and s.master is not None:
                with contextlib.suppress(OSError):
                    set_winsize(s.master, cols, rows)      # (the kernel tells its foreground group: SIGWINCH)

    def signal(self, key: str, sig: int) -> None:
        with self._lock:
            s = self._sessions.get(key)
        if s is not None:
            s.proc.send_signal(sig)
