"""Reaping exited helpers and removing their cgroups off the caller's path: a run's outcome is
returned while its helper still tears down its mount namespace."""

from __future__ import annotations

import queue
import threading


class Reaper:
    """Waits for exiting helpers and removes their cgroups, off the caller's path."""

    def __init__(self):
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, proc, cg) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="sandtree-reaper", daemon=True)
                self._thread.start()
        self._queue.put((proc, cg))

    def _loop(self) -> None:
        while True:
            proc, cg = self._queue.get()
            proc.wait()
            if cg:
                cg.remove(wait=2.0)

    def drain(self) -> None:
        """Wait until every submitted helper is reaped (tests, shutdown)."""
        done = threading.Event()
        self._queue.put((_Done(done), None))
        if self._thread is not None and self._thread.is_alive():
            done.wait(30)


class _Done:
    def __init__(self, ev):
        self.ev = ev

    def wait(self):
        self.ev.set()


reaper = Reaper()
