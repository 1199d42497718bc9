"""A sandtree node: one per Ray node, an actor owning that node's engine (its store or cache, its
warm pools, its live sandboxes). A plain class: fabric.py makes it a Ray actor pinned to its node.

Runs arrive with their operation ID (the API side wrote the queued row in the shared database);
the node's engine runs and commits them and completes that row itself, as an in-process engine
does. What cannot cross processes stays on the node: a run's cancel event (cancel() sets it) and
its output callback (a cluster run's output arrives with its record at the end).
"""

from __future__ import annotations

import os
import threading
import time
import uuid

from .. import config as settings
from .scheduling import NodeConfig


class Node:
    def __init__(self, config: NodeConfig, make_engine, node_id: str, cpus: float):
        """make_engine(config, home): this node's engine on its own store directory `home`
        (engine/clustered.py NodeEngine)."""
        self.config, self.node_id, self.cpus = config, node_id, cpus
        self.home = config.home_for(node_id, settings.node_home())
        self.engine = make_engine(config, self.home)
        self._cancels: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._running = 0
        self._runs = 0                          # runs served since the actor started
        self._started = time.time()
        self._sandboxes: set[str] = set()       # live sandboxes started (or resumed) here: pinned here
        self._hibernated: set[str] = set()      # hibernated here: their checkpoints are in this home

    def run(self, ref: str, command, op_id: str | None, options: dict):
        """One run on this node's engine (engine.run_operation): its RunRecord."""
        key = op_id or uuid.uuid4().hex
        cancel = threading.Event()
        with self._lock:
            self._cancels[key] = cancel
            self._running += 1
        try:
            rec = self.engine.run_operation(ref, command, op_id=op_id, cancel=cancel, **options)
            rec.usage["node"] = self.node_id       # (the record returned; the row was written before)
            return rec
        finally:
            with self._lock:
                self._cancels.pop(key, None)
                self._running -= 1
                self._runs += 1

    def cancel(self, op_id: str) -> bool:
        ev = self._cancels.get(op_id)
        if ev is not None:
            ev.set()
        return ev is not None

    def call(self, name: str, args: tuple, kwargs: dict):
        """Any other engine call (live sandboxes, pools): the engine's method `name`."""
        if name.startswith("_"):
            raise AttributeError(name)
        out = getattr(self.engine, name)(*args, **kwargs)
        if name in ("sandbox_start", "sandbox_resume"):
            self._sandboxes.add(out["id"])
            self._hibernated.discard(out["id"])
        elif name in ("sandbox_stop", "sandbox_hibernate"):     # not pinned any more
            self._sandboxes.discard(args[0])
            (self._hibernated.add if name == "sandbox_hibernate" else self._hibernated.discard)(args[0])
        return out

    def owns(self, sid: str) -> bool:
        """Whether live sandbox `sid` was started (or resumed) on this node and not stopped."""
        return sid in self._sandboxes

    def holds_checkpoint(self, sid: str) -> bool:
        """Whether sandbox `sid` was hibernated here (its CRIU checkpoint is in this node's home:
        with a home per node, only this node can resume it)."""
        return sid in self._hibernated

    def held_layers(self) -> list[str] | None:
        """The layer IDs in this node's layer cache: what choose_node prefers. None without S3
        objects (nodes sharing one store directory each see every layer)."""
        cache = self.engine.store.cache
        return None if cache is None else [layer for _, layer, _ in cache.entries()]

    def status(self) -> dict:
        sandboxes = sorted(self._sandboxes)
        cache = self.engine.store.cache
        if cache is not None:           # layers downloaded by this node's engine, layers cached now
            cached = cache.entries()
            held = {"fetched": cache.fetched, "cached_layers": len(cached), "cached_bytes": sum(s for *_, s in cached)}
        else:
            held = {}
        return {**held, "node": self.node_id, "pid": os.getpid(), "cpus": self.cpus, "running": self._running, "runs": self._runs,
                "sandboxes": len(sandboxes), "sandbox_ids": sandboxes, "home": self.home,
                "objects": self.config.objects_url, "up_s": round(time.time() - self._started, 1)}
