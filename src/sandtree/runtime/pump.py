"""The supervisor's side of a running command: feeding its stdin, keeping its capped output,
the wall-clock deadline and cancel, and reading what the helper reports (helper/helper.h's report
lines). Shared by a run (namespaces.py, gvisor.py) and a live exec (live.py).

Output: each stream keeps its first limits.output bytes, and only those reach on_output. A
stream that passes its cap stops the command at once (kill, as a timeout does): what it writes
after that is lost anyway, and a command that floods (`yes`) would otherwise burn CPU until its
timeout. The result says so: the stream's *_truncated flag and output_exceeded.
"""

from __future__ import annotations

import os
import selectors
import time
from typing import Callable

from .base import RunSpec

# Seconds after a kill (timeout, cancel, output cap) for the command's pipes to close; then the
# helper itself is killed, and after as long again the pipes are given up on: a run that was
# told to stop always ends, even if its helper is stuck (a caller waits on it, and it holds a
# --max-runs slot and the server's shutdown).
GIVE_UP = 5.0


def pump(proc, spec: RunSpec, deadline: float, rep_r: int, report_raw: bytearray, kill: Callable[[], None],
         *, to_exit: bool = False, eof_grace: float = 0.0) -> dict:
    """Feed stdin, collect capped output, enforce the deadline and cancel. kill: how to end
    the command (a run's: SIGKILL to the sandbox's pid 1). to_exit: stop at the command's exit instead
    of at EOF of its output (a command entering a live sandbox may leave a background
    process holding the pipes); its output is in the pipes by then and is drained. eof_grace:
    if the helper reported a relay (live exec: a reader inside the sandbox passes the output
    on and closes the pipes once the command exited), read to that EOF, for at most this long."""
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
    killed = 0                                   # 1: kill() called, 2: and the helper killed (GIVE_UP)

    def stop() -> None:
        nonlocal killed, deadline
        kill()
        killed, deadline = 1, time.monotonic() + GIVE_UP
    try:
        while open_fds:
            if exit_by is not None and time.monotonic() >= exit_by:
                for sfd, name in streams.items():
                    drain(sfd, name, bufs, trunc, spec)
                break
            left = deadline - time.monotonic()
            if exit_by is not None:
                left = poll = exit_by - time.monotonic()
            elif left <= 0:
                if killed == 0:
                    timed_out = True
                    stop()
                elif killed == 1:                # killed, and the pipes still open: the helper too
                    proc.kill()
                    killed, deadline = 2, time.monotonic() + GIVE_UP
                else:                            # nothing more will come: what we have is the output
                    for sfd, name in streams.items():
                        drain(sfd, name, bufs, trunc, spec)
                    break
                continue
            if spec.cancel is not None and spec.cancel.is_set() and not cancelled and exit_by is None:
                cancelled = True
                if not killed:
                    stop()
            # The report first: the helper writes the sandbox's pid before the command can write a
            # byte, so a kill for output seen in the same round knows the pid (without it, kill
            # falls back to the helper itself, and the outcome has no exit status or signal).
            for key, ev in sorted(sel.select(min(left, poll)), key=lambda kv: kv[0].fd != rep_r):
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
                        if to_exit and eof_grace > 0 and parse_report(report_raw).get("relay"):
                            exit_by = time.monotonic() + eof_grace
                            continue
                        if to_exit:
                            for sfd, name in streams.items():
                                drain(sfd, name, bufs, trunc, spec)
                            open_fds = 0
                            break
                    continue
                keep(streams[fd], chunk, bufs, trunc, spec)
                if trunc[streams[fd]] and exceeded is None:
                    # Past the cap nothing more is kept, so a command still writing only
                    # burns CPU until its timeout (`yes`): stop it, as a closed pipe would.
                    exceeded = streams[fd]
                    if not killed:
                        stop()
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
            "report": parse_report(report_raw)}

def keep(name: str, chunk: bytes, bufs: dict, trunc: dict, spec: RunSpec) -> None:
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

def drain(fd: int, name: str, bufs: dict, trunc: dict, spec: RunSpec) -> None:
    """What is in a pipe now, without waiting for more."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            return
        if not chunk:
            return
        keep(name, chunk, bufs, trunc, spec)


def parse_report(raw: bytes) -> dict:
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
