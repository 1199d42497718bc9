"""A command run by sandtree-agent, pid 1 of a live gVisor sandbox (agent.c has the protocol and
why): one request (ids, cwd, env, argv, stdin), then the agent's frames (output, then the exit)
on the pipes its helper lends us (helper/gvisor.c live_runtime: a unix socket in the store, which hands
over the agent's stdin and stdout, one caller at a time). The result is shaped as the other
tier's helper reports it, for enter.Commands.outcome.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import struct
import time

from .base import RunSpec
from .pump import keep

__all__ = ["MAX_STDIN", "MAX_WORDS", "MAX_FRAME", "GIVE_UP", "lend", "request", "fits", "call"]

_RQ, _SG, _RS = 0x51525453, 0x47535453, 0x53525453
MAX_STDIN = 4 << 20              # agent.c MAXIN: larger stdin goes by runsc exec
MAX_WORDS = 1 << 18              # agent.c words[]
MAX_FRAME = 1 << 16              # agent.c buf[]: no reply frame is larger
GIVE_UP = 5.0                    # seconds past the deadline (and its kill) before the agent counts as gone
_HEAD = struct.Struct("=4I")


def lend(path: str, timeout: float = 60.0) -> tuple[socket.socket, int, int]:
    """The agent's stdin (write end) and stdout (read end), lent by its helper while the returned
    socket stays open (other callers wait meanwhile). path: the helper's socket."""
    d = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        # (through the directory's fd: a store's path may be longer than a socket address takes)
        s.connect(f"/proc/self/fd/{d}/{os.path.basename(path)}")
        _, fds, _, _ = socket.recv_fds(s, 1, 2)
        if len(fds) != 2:
            raise OSError("the sandbox's helper lent no pipes")
        return s, fds[0], fds[1]
    except BaseException:
        s.close()
        raise
    finally:
        os.close(d)


def request(spec: RunSpec, rid: int) -> bytes:
    words = [spec.cwd, str(spec.uid), str(spec.gid), str(len(spec.env))]
    words += [f"{k}={v}" for k, v in spec.env.items()] + list(spec.argv)
    body = b"".join(w.encode("utf-8", "surrogateescape") + b"\0" for w in words)
    stdin = spec.stdin or b""
    return _HEAD.pack(_RQ, rid, len(body), len(stdin)) + body + stdin


def fits(spec: RunSpec) -> bool:
    """Whether the agent takes this command (else runsc exec runs it)."""
    return len(spec.stdin or b"") <= MAX_STDIN and len(request(spec, 0)) - len(spec.stdin or b"") < MAX_WORDS


def call(w: int, r: int, spec: RunSpec, deadline: float) -> dict:
    """Run spec on the agent through its pipes (w: its stdin, r: its stdout): output kept to the
    caps (pump.keep: on_output sees what is kept), killed at the deadline, on cancel, or once a
    stream passed its cap; returns pump's dict, with the report parsed from the agent's frames.
    The agent is the sandbox's own process (its root could drive it): a frame past MAX_FRAME or
    out of order ends the call (OSError), and one that never reports gives up GIVE_UP seconds after
    its deadline's kill (no status)."""
    rid = int.from_bytes(os.urandom(4), "little")
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    trunc = {"stdout": False, "stderr": False}
    pending = memoryview(request(spec, rid))
    timed_out = cancelled = False
    exceeded = None
    report: dict = {}
    raw = bytearray()
    sel = selectors.DefaultSelector()
    os.set_blocking(w, False)
    sel.register(r, selectors.EVENT_READ)
    sel.register(w, selectors.EVENT_WRITE)
    writing = True
    poll = 0.05 if spec.cancel is not None else 3600

    def kill(sig: int = signal.SIGKILL) -> None:
        nonlocal pending, writing
        pending = memoryview(bytes(pending) + _HEAD.pack(_SG, rid, sig, 0))
        if not writing:
            sel.register(w, selectors.EVENT_WRITE)
            writing = True
    try:
        while not report:
            left = deadline - time.monotonic()
            if left <= 0 and timed_out:
                break                              # killed, and still no word: given up
            if left <= 0:
                timed_out = True
                kill()
                deadline = time.monotonic() + GIVE_UP
                continue
            if spec.cancel is not None and spec.cancel.is_set() and not cancelled:
                cancelled = True
                kill()
            for key, ev in sel.select(min(max(left, 0), poll)):
                if key.fd == w:
                    n = os.write(w, pending[:1 << 16])
                    pending = pending[n:]
                    if not pending:
                        sel.unregister(w)
                        writing = False
                    continue
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    raise OSError("the sandbox's agent is gone")
                raw += chunk
                while len(raw) >= 16:
                    magic, fid, kind, n = _HEAD.unpack_from(raw)
                    if magic != _RS or n > MAX_FRAME:
                        raise OSError("the sandbox's agent answered out of turn")
                    if len(raw) < 16 + n:
                        break
                    data = bytes(raw[16:16 + n])
                    del raw[:16 + n]
                    if fid != rid:
                        continue                   # an earlier caller's, who went away
                    if kind in (ord("o"), ord("e")):
                        name = "stdout" if kind == ord("o") else "stderr"
                        keep(name, data, bufs, trunc, spec)
                        if trunc[name] and exceeded is None:
                            exceeded = name
                            kill()
                    elif kind == ord("x") and n in (4, 8):
                        st = struct.unpack_from("=I", data)[0]
                        report = {"signal": st & 0x7F} if st & 0x7F else {"exit": (st >> 8) & 0xFF}
                        # (8: the agent also says whether it is alone in the sandbox now)
                        report["alone"] = n == 8 and struct.unpack_from("=I", data, 4)[0] == 1
                    elif kind == ord("f") and n >= 4:
                        step = data[4:].rstrip(b"\0").decode("ascii", "replace")
                        report = {"execfail": (struct.unpack_from("=I", data)[0],
                                               step if step in ("exec", "cwd") else "exec")}
    finally:
        sel.close()
    return {"stdout": bytes(bufs["stdout"]), "stderr": bytes(bufs["stderr"]),
            "stdout_truncated": trunc["stdout"], "stderr_truncated": trunc["stderr"],
            "timed_out": timed_out, "cancelled": cancelled, "output_exceeded": exceeded, "report": report}
