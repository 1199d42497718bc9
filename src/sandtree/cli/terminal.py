"""The local end of an interactive session: this terminal <-> a pty whose other end is a
process inside a live sandbox (`sandtree shell`). Raw mode while it runs, window size followed."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import termios
import tty

from .. import config


def interactive(engine, sandbox_id: str, argv: list[str], **user) -> int:
    """Run argv on a pty in the sandbox until it exits; its status. user: uid/gid, if given."""
    master, slave = pty.openpty()
    on_tty = os.isatty(0)

    def resize(*_):
        if on_tty:
            fcntl.ioctl(master, termios.TIOCSWINSZ, fcntl.ioctl(0, termios.TIOCGWINSZ, b"\0" * 8))

    resize()
    try:
        proc = engine.sandbox_popen(sandbox_id, argv, pty=True, stdin=slave, stdout=slave, stderr=slave,
                                    env={"TERM": config.terminal_type()}, **user)
    finally:
        os.close(slave)
    saved = termios.tcgetattr(0) if on_tty else None
    previous = signal.signal(signal.SIGWINCH, resize)
    if on_tty:
        tty.setraw(0)
    inputs = [0, master]
    try:
        while True:
            ready, _, _ = select.select(inputs, [], [])
            if master in ready:
                try:
                    data = os.read(master, 65536)
                except OSError:                   # EIO: the program and its children are gone
                    data = b""
                if not data:
                    break
                os.write(1, data)
            if 0 in ready:
                data = os.read(0, 65536)
                if not data:                      # our input ended: end the program's (^D)
                    inputs.remove(0)
                    os.write(master, b"\x04")
                else:
                    os.write(master, data)
    finally:
        if saved is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)
        os.close(master)
    return proc.wait()
