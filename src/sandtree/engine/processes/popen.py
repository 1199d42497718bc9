"""A process inside a live sandbox, shaped like subprocess.Popen (sandboxes.py's popen)."""

from __future__ import annotations

import os
import subprocess

from ...runtime.base import LiveTier
from ...runtime.popenlike import PopenLike
from ...runtime.pump import parse_report


class LiveProcess(PopenLike):
    """A process inside a live sandbox: subprocess.Popen's shape (stdin, stdout, stderr, wait,
    communicate, send_signal, kill) with the exit status of the command itself."""

    def __init__(self, proc: subprocess.Popen, rep_r: int, live: LiveTier, raw: bytearray | None = None):
        self._proc, self._rep_r, self._live = proc, rep_r, live
        self.stdin, self.stdout, self.stderr = proc.stdin, proc.stdout, proc.stderr
        self.returncode: int | None = None
        self.report: dict = {}
        self._raw = raw if raw is not None else bytearray()

    def _finish(self) -> None:
        self._proc.wait()
        if self._rep_r is not None:
            while True:
                chunk = os.read(self._rep_r, 4096)
                if not chunk:
                    break
                self._raw += chunk
            os.close(self._rep_r)
            self._rep_r = None
        self.report = parse_report(self._raw)    # what the entering helper said (execfail, rusage)
        self.returncode = self._live.returncode(bytes(self._raw), self._proc.returncode)   # (the tier's ways)

    def poll(self) -> int | None:
        if self.returncode is None and self._proc.poll() is not None:
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._proc.wait(timeout)
            self._finish()
        return self.returncode

    def communicate(self, input: bytes | None = None, timeout: float | None = None):
        out, err = self._proc.communicate(input, timeout)
        self.wait()
        return out, err

    def send_signal(self, sig: int) -> None:
        self._live.signal_command(self._proc, int(sig))
