"""A spawned process's terminal: the host side (master) of a pseudo-terminal whose other side is
the process's stdin, stdout and stderr and its controlling terminal (E2B's PTY, sandtree's
`sandbox_spawn(pty=True)`). What it writes comes back on the master as one stream (stdout);
what is written to the master is its input; its size is the master's window size (resize)."""

from __future__ import annotations

import fcntl
import os
import struct
import termios

from ... import defaults as D
from ...errors import InvalidInput

__all__ = ["open_terminal", "set_size", "read_terminal"]


def _check(cols, rows) -> tuple[int, int]:
    if not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= D.TERMINAL_MAX_SIDE for n in (cols, rows)):
        raise InvalidInput(f"a terminal's size is 1..{D.TERMINAL_MAX_SIDE} columns and rows, not {cols}x{rows}")
    return cols, rows


def open_terminal(cols: int, rows: int) -> tuple[int, int]:
    """(master, slave) of a new pseudo-terminal of cols x rows; the caller closes both."""
    cols, rows = _check(cols, rows)
    master, slave = os.openpty()
    set_size(master, cols, rows)
    return master, slave


def set_size(master: int, cols: int, rows: int) -> None:
    """The terminal's window size (the process gets SIGWINCH, as from a resized window)."""
    cols, rows = _check(cols, rows)
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def read_terminal(master: int) -> bytes:
    """What the terminal's side wrote next; b"" once nothing holds it open any more (EIO)."""
    try:
        return os.read(master, 65536)
    except OSError:
        return b""
