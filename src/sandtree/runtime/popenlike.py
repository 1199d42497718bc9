"""What subprocess.Popen's shape adds to send_signal, poll and wait (engine/processes/popen.py's
LiveProcess, a process on this machine; cluster/relay.py's RelayedProcess, one on a node)."""

from __future__ import annotations

import contextlib

__all__ = ["PopenLike"]


class PopenLike:
    """terminate, kill and the context manager, from the subclass's send_signal, poll, wait and
    its stdin, stdout, stderr (file objects or None)."""

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for s in (self.stdin, self.stdout, self.stderr):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.close()
        if self.poll() is None:
            self.kill()
        self.wait()
