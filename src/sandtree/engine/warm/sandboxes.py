"""Live sandboxes started ahead: for the last few start specs this process used, one sandbox of
that spec already started (detached, pid 1 waiting), so the next `sandbox_start` with the same
spec only claims it: its row goes from state "ahead" to "running" with the caller's record, and
its end moves from AHEAD_LIFETIME to the caller's lifetime (runtime/live.py retime). One
long-lived thread starts the replacement off the caller's path. An evaluation that forks one
image per sample (inspect-ai's sample_init) pays for a claim, not for a start.

Only specs that carry nothing per call are started ahead: no injected files, no network link
(a link is per sandbox), tier namespaces; the key covers everything else the sandbox is made
from (image, env, cwd, hostname, limits). An "ahead" row keeps its image from gc (maintenance.py)
and is listed nowhere; an unclaimed sandbox is stopped at engine close or, for a process that
never closed its engine, at its exit. Its row names the process that started it (procid.Owner):
if that process was killed, the next reap of any engine process on the machine (a restarted
server reaps once before it listens) stops it and removes the row; failing that, its helper
ends it after AHEAD_LIFETIME by itself.
Used by sandboxes.py's start, with the engine's warm option (warm=0: nothing is started ahead)."""

from __future__ import annotations

import atexit
import dataclasses
import json
import time
import uuid

from ...procid import Owner, boot_id
from ...runtime.base import LiveTier, RunSpec
from ...runtime.liveproc import LiveHandle
from ...store.db import dumps
from ...store.store import Store
from .kept import KeptAhead

AHEAD_LIFETIME = 600.0        # an unclaimed sandbox's own end, should its engine die without stopping it
AHEAD_TIER = "namespaces"    # sandboxes are started ahead on this tier only (a start on another starts its own)


class StartsAhead(KeptAhead):
    KEEP = 4                  # specs kept started ahead (one sandbox each: about 0.5 MB of memory idle)
    NAME = "sandtree-start-ahead"

    def __init__(self, store: Store, live: LiveTier):
        super().__init__()
        self.store, self.live = store, live
        # (sid, handle) of one started ahead: its command spawner started too (the engine's
        # processes/spawner.py), and let go of once it is stopped unclaimed
        self.prepare = lambda sid, handle: None
        self.forget = lambda sid: None

    @staticmethod
    def key(image: str, spec: RunSpec) -> str:
        return json.dumps([image, spec.env, spec.cwd, spec.hostname, dataclasses.asdict(spec.limits)], sort_keys=True)

    def take(self, key: str, lifetime: float) -> tuple[str, LiveHandle] | None:
        """A sandbox of this spec started ahead, now ending `lifetime` seconds from now, its row
        still "ahead" (the caller writes it); None if there is none."""
        with self.cv:
            got = self.ready.pop(key, None)
        if got is None:
            return None
        try:
            self.live.retime(got[1], time.time() + lifetime)
        except Exception:                              # noqa: BLE001 - gone meanwhile: the caller starts one
            self._stop(*got)
            return None
        return got

    def after(self, key: str, image: str, spec: RunSpec) -> None:
        """A start with this spec happened: keep one ready for the next."""
        with self.cv:
            if self.closed:
                return
            started = self.thread is None
            self._want(key, (image, dataclasses.replace(spec, prepare_changes=None)))
        if started:
            # A process that ends without closing its engine (a script, `inspect eval`) would leave
            # its unclaimed sandboxes running until AHEAD_LIFETIME: they are stopped at its exit.
            atexit.register(self.close)

    def _make(self, key: str, wanted) -> tuple[str, LiveHandle] | None:
        return self._start(*wanted)

    def _discard(self, made) -> None:
        self._stop(*made)

    def _start(self, image: str, spec: RunSpec) -> tuple[str, LiveHandle] | None:
        sid = uuid.uuid4().hex
        try:
            with self.store.using():                   # gc keeps the image: its row is written below
                handle = self.live.start(spec, AHEAD_LIFETIME, tier=AHEAD_TIER)
        except Exception:                              # noqa: BLE001 - the next start starts by itself
            return None
        now = time.time()
        try:
            with self.store.db.tx() as con:
                con.execute("INSERT INTO sandboxes(id, image, state, handle, spec, created, last_used, idle_timeout, "
                            "expires, head) VALUES(?,?,?,?,?,?,?,?,?,?)",
                            (sid, image, "ahead", dumps(handle.to_dict()), dumps({"owner": Owner.me().to_dict()}),
                             now, now, 0,
                             now + AHEAD_LIFETIME, image))
        except Exception:                              # noqa: BLE001 - not kept without its row
            self.live.stop(handle)
            return None
        self.prepare(sid, handle)
        return sid, handle

    def _stop(self, sid: str, handle: LiveHandle) -> None:
        self.forget(sid)
        try:
            self.live.stop(handle)
        finally:
            with self.store.db.tx() as con:
                # never anybody's: no row is left for lists (it has no spec of a caller to show)
                con.execute("DELETE FROM sandboxes WHERE id=? AND state='ahead'", (sid,))

    def close(self) -> None:
        atexit.unregister(self.close)
        super().close()


def orphaned(spec: dict, expires: float, now: float) -> str | None:
    """What becomes of an "ahead" row's sandbox no one will claim: "stop" it (its starter
    (spec["owner"]) is verifiably dead, or its end passed and it was started on this machine),
    "drop" only its row (past its end, started on another machine: its helper ended it there),
    or None (its starter may still claim it; one on another machine or in another pid namespace
    is left to its own engine until its end)."""
    owner = Owner.from_dict(spec.get("owner") or {}) if isinstance(spec, dict) else None
    alive = owner.alive() if owner is not None else None
    if alive is False:
        return "stop"
    if expires >= now:
        return None
    return "drop" if owner is not None and owner.boot is not None and owner.boot != boot_id() else "stop"
