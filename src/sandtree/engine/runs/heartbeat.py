"""Heartbeats of the engines that own operations (API replicas on one database).

An unfinished operation row names its owner (procid.Owner: boot id, pid, start time, pid
namespace). An owner on this machine is judged by its process; one of another boot id (another
machine sharing the database, or this one before a reboot) cannot be, so each engine that runs or
watches operations writes its row of `engines` every BEAT seconds, and an owner whose beat is
older than LEASE, or who has none, is gone: its unfinished operations are ended as interrupted by
whichever engine looks next (Operations' sweep, every SWEEP seconds). An engine that closes
removes its row. Clocks of the machines must agree within LEASE - BEAT.

Cost: one write transaction per engine per BEAT (PostgreSQL: ~0.6 ms; a few API replicas, not the
nodes' engines, beat), and one indexed read per unfinished foreign operation per SWEEP."""

from __future__ import annotations

import threading
import time

from ...procid import Owner

__all__ = ["Heartbeats", "BEAT", "LEASE", "SWEEP"]

BEAT = 2.0          # seconds between an engine's beats
LEASE = 15.0        # an owner whose last beat is older is gone
SWEEP = 5.0         # seconds between looks for operations of gone owners


class Heartbeats:
    def __init__(self, db, owner: Owner | None = None):
        self.db = db
        self.owner = owner or Owner.me()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def beat(self) -> None:
        with self.db.tx() as con:
            con.execute("INSERT OR REPLACE INTO engines(owner, beat) VALUES(?, ?)", (self.owner.key(), time.time()))

    def alive(self, owner: Owner) -> bool | None:
        """True/False for an owner that beats (one with a boot id), None for one that does not."""
        if owner.boot is None:
            return None
        row = self.db.one("SELECT beat FROM engines WHERE owner=?", (owner.key(),))
        return row is not None and time.time() - row[0] < LEASE

    def start(self, sweep) -> None:
        """Beat every BEAT seconds from now on, and call sweep() every SWEEP (in a daemon thread)."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self.beat()                          # before anything is judged by it
            self._thread = threading.Thread(target=self._run, args=(sweep,), name="sandtree-heartbeat",
                                            daemon=True)
            self._thread.start()

    def _run(self, sweep) -> None:
        last_sweep = 0.0
        while not self._stop.wait(BEAT):
            try:
                self.beat()
                if time.monotonic() - last_sweep >= SWEEP:
                    last_sweep = time.monotonic()
                    sweep()
            except Exception:                    # noqa: BLE001 - the database away for a moment: beat on
                continue

    def stop(self) -> None:
        """No more beats; the row goes (its operations are ended by their own engine's close)."""
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(BEAT + 5)
            try:
                with self.db.tx() as con:
                    con.execute("DELETE FROM engines WHERE owner=?", (self.owner.key(),))
            except Exception:                    # noqa: BLE001 - a closing engine: its row ages out
                pass
