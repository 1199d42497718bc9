"""A sandtree node: one per Ray node, an actor owning that node's engine (its store or cache, its
warm pools, its live sandboxes). A plain class: fabric.py makes it a Ray actor pinned to its node.

Runs arrive with their operation ID (the API side wrote the queued row in the shared database);
the node's engine runs and commits them and completes that row itself, as an in-process engine
does. What cannot cross processes stays on the node: a call's cancel event (cancel(key) sets it)
and its output callback. A caller watching the output gets a streamed call (run_streamed,
call_streamed: Ray generator methods) that yields ("output", [(stream, chunk), ...]) batches as
the command writes them, in order, then ("result", its value); a live run's (live_run) also
yields ("up", sandbox ID) once its sandbox runs and ("event", (kind, data)) for its processes'
events (engine/processes/instances.py), so the API side keeps the operation's event log. A caller on Ray
Client, which has no generator methods, pulls the same items instead (pull, pulled.py).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from .. import config as settings
from .pulled import Pulled
from .scheduling import NodeConfig
from .terminals import Terminals

STREAM_WORKERS = 256          # streamed calls' engine work at once (live runs hold one while they run)
SESSION_GROUP = "sessions"    # the concurrency group of open terminals (fabric.py sizes it)
STREAMED = ("run_streamed", "call_streamed", "live_run", "popen")     # the generator methods


class Node:
    def __init__(self, config: NodeConfig, make_engine, node_id: str, cpus: float):
        """make_engine(config, home): this node's engine on its own store directory `home`
        (engine/clustered.py NodeEngine)."""
        self.config, self.node_id, self.cpus = config, node_id, cpus
        self.home = config.home_for(node_id, settings.node_home())
        self.engine = make_engine(config, self.home)
        self.engine.node_id = node_id
        self._cancels: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._running = 0
        self._runs = 0                          # runs served since the actor started
        self._started = time.time()
        self._sandboxes: set[str] = set()       # live sandboxes started (or resumed) here: pinned here
        self._hibernated: set[str] = set()      # hibernated here: their checkpoints are in this home
        # the threads a streamed call's engine work runs in, kept: a new thread per call costs a new
        # database connection (the store's are per thread), ~9 ms a run here
        self._workers = ThreadPoolExecutor(max_workers=STREAM_WORKERS, thread_name_prefix="sandtree-node-stream")
        self._terminals = Terminals(self.engine)
        self._pulled = Pulled()

    def run(self, ref: str, command, op_id: str | None, options: dict, on_output=None):
        """One run on this node's engine (engine.run_operation): its RunRecord. Cancelled by
        cancel(op_id)."""
        with self._cancel_for(op_id or uuid.uuid4().hex) as cancel, self._counted():
            rec = self.engine.run_operation(ref, command, op_id=op_id, cancel=cancel, on_output=on_output,
                                            **options)
            rec.usage["node"] = self.node_id       # (the record returned; the row was written before)
            return rec

    def run_streamed(self, ref: str, command, op_id: str | None, options: dict):
        """run, its output streamed as it comes (module doc)."""
        yield from _streamed(self._workers, lambda out, _: self.run(ref, command, op_id, options, out))

    def call_streamed(self, name: str, args: tuple, kwargs: dict, key: str, output: bool):
        """call of an engine method taking on_output and cancel (sandbox_exec): cancelled by
        cancel(key); its output streamed when `output` (module doc)."""
        with self._cancel_for(key) as cancel:
            yield from _streamed(self._workers, lambda out, _: self.call(name, args, {**kwargs, "cancel": cancel,
                                                                        "on_output": out if output else None}))

    def live_run(self, op: str, ref: str, command, options: dict):
        """Live run `op` (the API side queued it) on this node's engine (engine/processes/instances.py):
        owned here while it runs, so its processes' calls come here; cancelled by cancel(op);
        its output and events streamed (module doc)."""
        def work(out, put):
            def up(sid):
                with self._lock:
                    self._sandboxes.add(op)
                put(("up", sid))
            rec = self.engine.operations.instances.run(op, ref, command, cancel=cancel, on_output=out, on_up=up,
                                                       events=lambda kind, data: put(("event", (kind, data))),
                                                       **options)
            rec.usage["node"] = self.node_id
            return rec
        with self._cancel_for(op) as cancel, self._counted():
            try:
                yield from _streamed(self._workers, work)
            finally:
                with self._lock:
                    self._sandboxes.discard(op)

    # ---- sandbox_popen here, relayed to the API side (terminals.py; its other end: relay.py) -------
    def popen(self, key: str, sid: str, argv, kwargs: dict, winsize, kinds: dict, orphan_s: float):
        """A Ray generator method: the process's output as it comes (Terminals.run)."""
        yield from self._terminals.run(key, sid, argv, kwargs, winsize, kinds, orphan_s)

    # A terminal holds its call for as long as it is open: in a group of its own, so open terminals
    # take no slot of the runs. (What @ray.method(concurrency_group=) sets, set without importing
    # Ray here; read where the actor is made, so also by a Ray Client's server, where a call's
    # .options(concurrency_group=) is refused.)
    popen.__ray_concurrency_group__ = SESSION_GROUP

    # ---- streamed calls pulled (Ray Client: pulled.py) -----------------------------------------
    def pull(self, key: str, wait: float, method: str | None = None, args: tuple = ()):
        """The items of stream `key` that came since the last pull (waiting up to `wait` s for the
        first) and whether it ended; `method`: first open it as generator method `method`(*args)."""
        if method is not None:
            if method not in STREAMED:
                raise AttributeError(method)
            self._pulled.open(key, getattr(self, method)(*args))
        return self._pulled.pull(key, wait)

    def pull_session(self, key: str, wait: float, method: str | None = None, args: tuple = ()):
        """pull of a terminal's stream (popen), in the terminals' group."""
        return self.pull(key, wait, method, args)

    pull_session.__ray_concurrency_group__ = SESSION_GROUP

    def popen_alive(self, keys: list[str]) -> None:
        self._terminals.alive(keys)

    def popen_write(self, key: str, data: bytes) -> bool:
        return self._terminals.write(key, data)

    def popen_close_input(self, key: str) -> None:
        self._terminals.close_input(key)

    def popen_resize(self, key: str, cols: int, rows: int) -> None:
        self._terminals.resize(key, cols, rows)

    def popen_signal(self, key: str, sig: int) -> None:
        self._terminals.signal(key, sig)

    @contextlib.contextmanager
    def _cancel_for(self, key: str):
        cancel = threading.Event()
        with self._lock:
            self._cancels[key] = cancel
        try:
            yield cancel
        finally:
            with self._lock:
                self._cancels.pop(key, None)

    @contextlib.contextmanager
    def _counted(self):
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                self._runs += 1

    def cancel(self, key: str) -> bool:
        """Cancel the run (its operation ID) or streamed call (its key) running here, if any."""
        with self._lock:
            ev = self._cancels.get(key)
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
        elif name in ("sandbox_fork", "fork_from"):                 # live sandboxes restored here
            self._sandboxes.update(c["id"] for c in out)
        elif name in ("sandbox_stop", "sandbox_hibernate"):     # not pinned any more
            self._sandboxes.discard(args[0])
            (self._hibernated.add if name == "sandbox_hibernate" else self._hibernated.discard)(args[0])
        return out

    def process(self, sid: str, pid: int) -> dict | None:
        """Process `pid` of live sandbox or live run `sid` here (engine/processes/instances.py's process):
        None when `sid` is a live run that ended (the API side tells it from its events)."""
        return self.engine.operations.instances.process(sid, pid)

    def owns(self, sid: str) -> bool:
        """Whether live sandbox `sid` was started (or resumed) on this node and not stopped, or
        `sid` is a live run running here (its operation ID)."""
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


def _streamed(workers: ThreadPoolExecutor, work):
    """Drive work(on_output, put) in a thread of `workers` (the engine calls back; a generator
    cannot be called back): yield ("output", chunks) batches as on_output gets them, in order, what put()
    was given, then ("result", what work returned), or raise what it raised."""
    items: queue.SimpleQueue = queue.SimpleQueue()
    outcome: list = []
    end = object()

    def target():
        try:
            outcome.append((True, work(lambda stream, chunk: items.put(("chunk", (stream, chunk))), items.put)))
        except BaseException as exc:       # noqa: BLE001 - raised to the caller below
            outcome.append((False, exc))
        finally:
            items.put(end)

    workers.submit(target)
    done = False
    while not done:
        batch = [items.get()]
        while True:                         # what came meanwhile: one message for many chunks
            try:
                batch.append(items.get_nowait())
            except queue.Empty:
                break
        chunks = []
        for item in batch:
            if item is end:
                done = True
            elif item[0] == "chunk":
                chunks.append(item[1])
            else:
                if chunks:
                    yield ("output", chunks)
                    chunks = []
                yield item
        if chunks:
            yield ("output", chunks)
    ok, value = outcome[0]
    if not ok:
        raise value
    yield ("result", value)
