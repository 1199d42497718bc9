"""When live sandboxes end (a mixin of sandboxes.Sandboxes, which provides store, live, default_tier,
_row, _running, _touched, _commit_lock, _set_spec, _retire, retiring, sweep_checkpoints, sweep_live_states and info): idle timeouts and lifetimes,
the reaper
that enforces them, and set_timeout, which moves a sandbox's end (its helper re-reads the
deadline the engine writes: runtime/live.py retime)."""

from __future__ import annotations

import json
import threading
import time

from ...errors import InvalidInput, RuntimeUnavailable, SandtreeError
from ..runs.spec import check_duration
from ...runtime import leftovers
from ..warm.sandboxes import orphaned



class SandboxLifetime:
    def _check_start(self, tier: str | None, idle_action: str, idle_timeout, lifetime) -> None:
        """A start's tier, idle action, idle timeout and lifetime, refused before anything is made."""
        ok, why = self.live.available(tier)
        if not ok:
            raise RuntimeUnavailable(why, tier=tier or self.default_tier())
        if idle_action not in ("stop", "hibernate"):
            raise InvalidInput(f"idle_action must be 'stop' or 'hibernate', not {idle_action!r}")
        self._check_idle_hibernate(tier, idle_action)
        check_duration("idle_timeout", idle_timeout, zero=True)
        check_duration("lifetime", lifetime)

    def _check_idle_hibernate(self, tier: str | None, idle_action: str, *, link: bool = False) -> None:
        """RuntimeUnavailable when the idle action is to hibernate and the tier cannot (in a link:
        a network policy's)."""
        if idle_action == "hibernate":
            ok, why = self.live.hibernate_available(tier, link=link)
            if not ok:
                raise RuntimeUnavailable(why, tier=tier or self.default_tier())

    def touch(self, sid: str) -> None:
        """Marks a running sandbox used now (a code interpreter's execution: interpreter.py)."""
        self._touch(self._running(sid))

    def _touch(self, row: dict, con=None) -> None:
        """Marks the sandbox used now: its idle timeout counts from here. A loop of commands touches
        several times a second and each touch is a write on the shared database, so this engine
        writes once per window, a tenth of the idle timeout and at most 1 s: the row lags the last
        use by less than that. con: write in that transaction (a command's record), else in one of
        its own, outside the one-writer lock (the row is this sandbox's alone)."""
        now = time.time()
        if now - self._touched.get(row["id"], 0.0) < min(1.0, (row["idle_timeout"] or 10) / 10):
            return
        if len(self._touched) > 4096:                # ids of ended sandboxes: a miss costs one write
            self._touched.clear()
        self._touched[row["id"]] = now
        if con is not None:
            con.execute("UPDATE sandboxes SET last_used=? WHERE id=?", (now, row["id"]))
            return
        with self.store.db.tx(serial=False) as con:
            con.execute("UPDATE sandboxes SET last_used=? WHERE id=?", (now, row["id"]))

    def _due(self, row: dict, now: float) -> bool:
        """Past its lifetime, or idle past its idle timeout (a command still running is not idle)."""
        if now > row["expires"]:
            return True
        return bool(row["idle_timeout"] and now - row["last_used"] > row["idle_timeout"]
                    and not self.live.outsiders(row["handle"]))

    def _expire(self, row: dict) -> str:
        """A sandbox past its lifetime is stopped; one idle past its idle timeout is stopped or,
        with idle_action "hibernate", hibernated (stopped if that fails). Returns its state."""
        if time.time() <= row["expires"] and row["spec"].get("idle_action") == "hibernate":
            try:
                return self.hibernate(row["id"], idle=False)["state"]
            except SandtreeError:
                pass                                 # (a command running: not idle after all)
            now = self._row(row["id"])
            if now["state"] != "running":            # stopped meanwhile (a stop raced the reaper)
                return now["state"]
            if self.live.outsiders(row["handle"]):
                return "running"
        self._retire(row, "expired")
        return "expired"

    def reap_every(self, seconds: float) -> None:
        """A long-running process (the server) reaps on a timer, not only when someone lists."""
        try:
            self.reap()                            # what a killed server left (warm/sandboxes.py), before it serves
        except Exception:                          # noqa: BLE001 - the timer tries again
            pass

        def loop():
            while not self._stop_reaping.wait(seconds):
                try:
                    self.reap()
                except Exception:                  # noqa: BLE001 - a bad round must not end the timer
                    pass
        threading.Thread(target=loop, name="sandtree-reaper", daemon=True).start()

    def reap(self) -> list[str]:
        """Stop sandboxes idle past their idle timeout or past their lifetime; mark vanished ones
        gone. Called on list and start, and by a long-running server on a timer (reap_every)."""
        now = time.time()
        self._reaped = time.monotonic()
        self._reap_ahead(now)
        self._reap_unrecorded()
        done = []
        for r in self.store.db.query("SELECT * FROM sandboxes WHERE state='running'"):
            row = self._decode(r)
            if self.live.foreign(row["handle"]):
                continue                            # (its own engine reaps it; its helper ends it)
            if self._due(row, now):
                self._expire(row)                   # (its helper ends it at its lifetime by itself)
            elif not self.live.alive(row["handle"]):
                self._lost(row)
            else:
                continue
            done.append(row["id"])
        self.retiring.leftovers()                   # old sandboxes a killed hibernator left (retiring.py)
        self.sweep_forks()                          # checkpoints a killed fork left (they hold memory)
        if self.store.objects is not None:
            self.sweep_checkpoints()                # copies left here by sandboxes resumed elsewhere
            self.sweep_live_states()                # live states gc dropped (livestates.py), fetched here
        return done

    def _reap_ahead(self, now: float) -> None:
        """Sandboxes started ahead that no one will claim (warm/sandboxes.py orphaned: their starter
        was killed, or their end passed) are stopped (processes, cgroup, deadline file; their
        mounts are their helper's) and their rows removed. The row goes only if it is still
        "ahead": a claim by its (living) starter moved it on meanwhile."""
        for r in self.store.db.query("SELECT * FROM sandboxes WHERE state='ahead'"):
            row = self._decode(r)
            fate = orphaned(row["spec"], row["expires"], now)
            if fate is None:
                continue
            if fate == "stop" and not self.live.foreign(row["handle"]):
                try:
                    self.live.stop(row["handle"])
                except Exception:                  # noqa: BLE001 - the next round tries again
                    continue
            with self.store.db.tx() as con:
                con.execute("DELETE FROM sandboxes WHERE id=? AND state='ahead'", (row["id"],))

    def _reap_unrecorded(self) -> None:
        """Sandboxes an engine killed mid-start left running with no row (runtime/leftovers.py)."""
        files = leftovers.unrecorded_candidates(self.store.home)
        if files:
            rows = self.store.db.query("SELECT handle FROM sandboxes WHERE handle IS NOT NULL")
            leftovers.reap_unrecorded(self.store.home, files, leftovers.named(json.loads(h) for (h,) in rows))

    def set_timeout(self, sid: str, timeout: float) -> dict:
        """The sandbox now stops `timeout` seconds from now, sooner or later than its lifetime
        said (E2B's set_timeout). A hibernated one gets that long once resumed."""
        check_duration("timeout", timeout)
        row = self._row(sid)
        with self._commit_lock(row["id"]):
            row = self._row(sid)
            expires = time.time() + timeout
            if row["state"] == "hibernated":
                self._set_spec(row["id"], {**row["spec"], "remaining": float(timeout)})
            else:
                row = self._running(row["id"])
                self.live.retime(row["handle"], expires)
            with self.store.db.tx() as con:
                con.execute("UPDATE sandboxes SET expires=? WHERE id=?", (expires, row["id"]))
        return self.info(row["id"])

