"""The API side of sandbox_popen on a cluster sandbox: a process on a node, shaped here like the
local one (engine/processes/popen.py's LiveProcess: subprocess.Popen's stdin, stdout, stderr, poll, wait,
communicate, send_signal, terminate, kill), with the caller's file descriptors.

The caller's ends stay what they are on one machine: PIPE gives it pipes of this machine, a file
descriptor (a pty's slave, a file) is used as given. Two threads relay: one takes the node's
output (terminals.py) and writes it into the caller's ends, one reads the caller's input and sends
it to the node, in order (each write answered before the next is sent: a threaded actor does not
keep the order of calls). A terminal: the node's pty does the terminal's work (echo, line
editing, ^C as SIGINT to the foreground group), so the caller's pty is made raw (a transparent
pipe between its master and this relay); its window size is read here from the caller's pty
and followed (no SIGWINCH reaches a thread that is not the terminal's session: its size is
looked at every RESIZE_POLL_S and at each input); the caller closing its end (the master) is a
hangup there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import struct
import subprocess
import termios
import threading
import tty
import uuid

from ..errors import InvalidInput
from ..runtime.popenlike import PopenLike

__all__ = ["RelayedProcess", "RESIZE_POLL_S"]

RESIZE_POLL_S = 0.1
_PIPE, _STDOUT, _DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL


def _fd(end, default: int) -> int:
    """The file descriptor of a caller's end (None: this process's own, as a child inherits)."""
    if end is None:
        return default
    return end if isinstance(end, int) else end.fileno()


def _winsize(fd: int) -> tuple[int, int]:
    rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    return cols or 80, rows or 24


class RelayedProcess(PopenLike):
    def __init__(self, fabric, nid: str, sid: str, argv, kwargs: dict, *, pty: bool = False, stdin=_PIPE,
                 stdout=_PIPE, stderr=_PIPE):
        """sandbox_popen(sid, argv, pty=, stdin=, stdout=, stderr=, **kwargs) on node `nid`;
        returns once the process exists there (its errors raised here)."""
        self._fabric, self._nid, self._key, self.args = fabric, nid, uuid.uuid4().hex, argv
        self.stdin = self.stdout = self.stderr = None
        self.returncode: int | None = None
        self.report: dict = {}
        self._error: BaseException | None = None
        self._exited, self._ended = threading.Event(), threading.Event()
        self._mine: list[int] = []                 # fds to close at the end (dups, pipes' ends made here)
        self._outs: dict[str, int] = {}            # node stream -> the fd its output is written to
        self._dropped: set[str] = set()            # streams whose caller's end was closed
        self._input: int | None = None
        self._term: int | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._mine += [self._wake_r, self._wake_w]
        try:
            kinds, winsize = self._ends(pty, stdin, stdout, stderr)
            self._items = fabric.items(nid, "popen", self._key, sid, argv, kwargs, winsize, kinds,
                                       fabric.hold(nid, self._key), what=f"a process in sandbox {sid}")
            next(self._items)                      # ("up", None): it exists (or its error is raised)
        except BaseException:
            fabric.release(nid, self._key)
            for f in (self.stdin, self.stdout, self.stderr):
                if f is not None:
                    f.close()
            self._close_mine()
            raise
        threading.Thread(target=self._down, name=f"sandtree-relay-out-{self._key[:8]}", daemon=True).start()
        if self._input is not None:
            threading.Thread(target=self._up, args=(winsize,), name=f"sandtree-relay-in-{self._key[:8]}",
                             daemon=True).start()

    def _own(self, fd: int) -> int:
        self._mine.append(fd)
        return fd

    def _ends(self, pty: bool, stdin, stdout, stderr):
        """The node's kind of each stream (terminals.py) and this side's fds; winsize if a terminal."""
        kinds, winsize = {}, None
        if pty:
            term = _fd(stdin, 0) if stdin not in (_PIPE, _DEVNULL) else -1
            if term < 0 or not os.isatty(term):
                raise InvalidInput("pty=True needs stdin to be a terminal (the slave of a pty)")
            self._term = self._input = self._own(os.dup(term))
            winsize = _winsize(self._term)
            tty.setraw(self._term)      # the node's pty is the terminal: this one only carries bytes
            kinds["stdin"] = "pty"
            same = os.fstat(self._term)
        for name, end, default in (("stdin", stdin, 0), ("stdout", stdout, 1), ("stderr", stderr, 2)):
            if name in kinds:
                continue
            if end == _DEVNULL or (end == _STDOUT and name == "stderr"):
                kinds[name] = "devnull" if end == _DEVNULL else "stdout"
                continue
            if end == _PIPE:
                r, w = os.pipe()
                if name == "stdin":
                    self._input, self.stdin = self._own(r), open(w, "wb")
                else:
                    self._outs[name], f = self._own(w), open(r, "rb")
                    setattr(self, name, f)
                kinds[name] = "pipe"
                continue
            fd = _fd(end, default)
            if pty and os.path.samestat(os.fstat(fd), same):
                kinds[name] = "pty"      # (its output comes as the terminal's)
                continue
            kinds[name] = "pipe"
            if name == "stdin":
                self._input = self._own(os.dup(fd))
            else:
                self._outs[name] = self._own(os.dup(fd))
        if self._term is not None:
            self._outs["pty"] = self._term
        return kinds, winsize

    # ---- the relays ----------------------------------------------------------------------------
    def _down(self) -> None:
        """The node's items: output into the caller's ends, the exit status, the end."""
        try:
            for kind, payload in self._items:
                if kind == "output":
                    for stream, chunk in payload:
                        self._write_out(stream, chunk)
                elif kind == "exit":
                    self.returncode, self.report = payload[0], payload[1]
                    self._exited.set()
        except BaseException as exc:       # noqa: BLE001 - NodeLost: wait() raises it
            self._error = exc
        finally:
            self._fabric.release(self._nid, self._key)
            self._exited.set()
            for name, fd in list(self._outs.items()):
                if fd != self._term:        # (the terminal's fd is the input's too: closed with it)
                    with contextlib.suppress(OSError, ValueError):
                        self._mine.remove(fd)
                        os.close(fd)        # the caller reads the end of its pipe
            os.write(self._wake_w, b"e")    # the input relay stops, then closes the rest
            self._ended.set()
            if self._input is None:
                self._close_mine()

    def _write_out(self, stream: str, chunk: bytes) -> None:
        fd = self._outs.get(stream)
        if fd is None or stream in self._dropped:
            return
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError:                     # the caller closed its end: the rest of this stream is dropped
            self._dropped.add(stream)

    def _up(self, winsize) -> None:
        """The caller's input to the node, in order; a terminal's size followed; its end told."""
        try:
            while True:
                ready, _, _ = select.select([self._input, self._wake_r], [], [],
                                            RESIZE_POLL_S if self._term is not None else None)
                if self._wake_r in ready:
                    return
                if self._term is not None:
                    with contextlib.suppress(OSError):
                        now = _winsize(self._term)
                        if now != winsize:
                            winsize = now
                            self._fabric.ask(self._nid, "popen_resize", self._key, *now)
                if self._input not in ready:
                    continue
                try:
                    data = os.read(self._input, 65536)
                except OSError:             # EIO: the caller closed its terminal's master
                    data = b""
                if not data:
                    self._fabric.ask(self._nid, "popen_close_input", self._key)
                    return
                if not self._fabric.ask(self._nid, "popen_write", self._key, data):
                    return
        except Exception:                   # noqa: BLE001 - the node went (wait() says so) or the process ended
            return
        finally:
            self._ended.wait()
            self._close_mine()

    def _close_mine(self) -> None:
        while self._mine:
            with contextlib.suppress(OSError):
                os.close(self._mine.pop())

    # ---- subprocess.Popen's shape --------------------------------------------------------------
    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        if self.returncode is None and self._error is not None:
            raise self._error
        return self.returncode

    def communicate(self, input: bytes | None = None, timeout: float | None = None):
        got: dict[str, bytes] = {}

        def drain(name: str, f) -> None:
            got[name] = f.read()
        readers = [threading.Thread(target=drain, args=(n, f), daemon=True)
                   for n, f in (("stdout", self.stdout), ("stderr", self.stderr)) if f is not None]
        for t in readers:
            t.start()
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        for t in readers:
            t.join(timeout)
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(timeout)
        return got.get("stdout"), got.get("stderr")

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self._fabric.ask(self._nid, "popen_signal", self._key, int(sig))
