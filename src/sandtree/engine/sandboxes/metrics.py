"""A live sandbox's metrics over time (a mixin of sandboxes.Sandboxes, which provides live, store,
_row and _settled): CPU used (% of the CPUs it may use), memory used and its limit, disk written
and the size it may fill, sampled every defaults.METRICS_INTERVAL seconds by a long-running
engine (the server's reaper timer: lifetime.py reap_every) and kept for METRICS_WINDOW seconds in
that process's memory: samples are cheap to lose and costly to write, so none goes to the store.
A call always adds a sample of now for a running sandbox, so a one-shot engine (the CLI) answers
one point. E2B's get_metrics (http/e2b/control.py) is this row."""

from __future__ import annotations

import collections
import math
import os
import threading
import time

from ... import defaults as D
from ...errors import InvalidInput


class SandboxMetrics:
    def _metrics_state(self):
        st = self.__dict__.get("_metrics")
        if st is None:
            st = self.__dict__.setdefault("_metrics", ({}, threading.Lock()))
        return st

    def sample_metrics(self) -> int:
        """One sample of every running sandbox this engine runs; samples older than the window
        and those of sandboxes no longer running go. Returns how many were taken."""
        samples, lock = self._metrics_state()
        rows = [self._decode(r) for r in self.store.db.query("SELECT * FROM sandboxes WHERE state='running'")]
        running, taken = set(), 0
        for row in rows:
            if row["spec"].get("run") or self.live.foreign(row["handle"]):
                continue
            running.add(row["id"])
            if self._sample(row) is not None:
                taken += 1
        with lock:
            for sid in [s for s in samples if s not in running]:
                del samples[sid]
        return taken

    def sample_every(self, seconds: float = D.METRICS_INTERVAL) -> None:
        """A long-running engine (the server) samples on a timer; it ends with the engine."""
        def loop():
            while not self._stop_reaping.wait(seconds):
                try:
                    self.sample_metrics()
                except Exception:                  # noqa: BLE001 - a bad round must not end the timer
                    pass
        threading.Thread(target=loop, name="sandtree-metrics", daemon=True).start()

    def _sample(self, row: dict) -> dict | None:
        """A sample of a running sandbox now, kept in its window (None: it ended, or is not measured)."""
        try:
            got = self.live.usage(row["handle"]) if self.live.alive(row["handle"]) else None
        except Exception:                        # noqa: BLE001 - it ended under us: no sample
            got = None
        if got is None:
            return None
        samples, lock = self._metrics_state()
        now = time.time()
        lim = row["spec"].get("limits") or {}
        cpus = lim.get("cpus") or os.cpu_count() or 1
        with lock:
            kept = samples.setdefault(row["id"], collections.deque())
            prev = kept[-1] if kept else None
            # CPU % since the last sample (or since the start: the first one), of the CPUs it may use
            t0, used0 = (prev["timestamp"], prev["_cpu_ns"]) if prev and prev["_cpu_ns"] is not None \
                else (row["created"], 0)
            pct = 0.0
            if got["cpu_ns"] is not None and now > t0:
                pct = max(0.0, (got["cpu_ns"] - used0) / 1e9 / (now - t0) / cpus * 100.0)
            sample = {"timestamp": now, "cpu_count": int(math.ceil(cpus)), "cpu_used_pct": round(min(pct, 100.0), 2),
                      "mem_used": got["memory"] or 0, "mem_total": int(lim.get("memory") or 0),
                      "mem_cache": got["cache"] or 0, "disk_used": got["disk_used"],
                      "disk_total": got["disk_total"], "_cpu_ns": got["cpu_ns"]}
            kept.append(sample)
            while kept and kept[0]["timestamp"] < now - D.METRICS_WINDOW:
                kept.popleft()
        return sample

    def metrics(self, sid: str, *, start: float | None = None, end: float | None = None) -> list[dict]:
        """Samples of a live sandbox between start and end (epoch seconds; default: the window's
        whole), oldest first, with one of now when it is running and `end` is not past."""
        for name, v in (("start", start), ("end", end)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v < 0):
                raise InvalidInput(f"{name} must be epoch seconds, not {v!r}"[:120])
        if start is not None and end is not None and end < start:
            raise InvalidInput(f"end ({end}) is before start ({start})")
        row = self._settled(self._row(sid))
        if row["state"] == "running" and (end is None or end >= time.time()):
            self._sample(row)
        samples, lock = self._metrics_state()
        with lock:
            kept = list(samples.get(row["id"], ()))
        return [{k: v for k, v in s.items() if not k.startswith("_")} for s in kept
                if (start is None or s["timestamp"] >= start) and (end is None or s["timestamp"] <= end)]
