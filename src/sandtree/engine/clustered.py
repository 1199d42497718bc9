"""An engine whose runs and live sandboxes go to a Ray cluster's nodes (cluster/), its metadata
operations staying here (the database is shared, so tags, lineage, images and operations read the
same from every node and every API replica).

attach(engine, address) is called by Engine.__init__ when a cluster is configured: it makes the
Fabric and sets, on that engine object, the calls that go to nodes (so the adapters, the tenant
views and the table's signatures stay those of Engine: one engine, nothing for an adapter to know).
What goes to nodes: run_operation (so run, submit_run, fork, map and best_of's fan-out), live
runs (submit_run(live=True), Contree's instances: engine/processes/instances.py runs them on a node) and
their processes' calls (spawn, stdin, signal, process: to the node while the run runs; an ended
one's are answered here, from its events), sandbox starts (the node choose_node picks) and every
later call on that sandbox (its node), sandbox_popen on such a sandbox (run there; its pipes or
terminal are the caller's file descriptors, relayed: cluster/relay.py, a RelayedProcess shaped as
the local LiveProcess), pools (one per node; pool_recipe's through these calls, engine/warm/rollover.py),
and a build's RUN steps (they are run_operation: the step's cache row, a buildcache.Entry, goes
with the run and is written in the node's transaction recording its result, in the shared
database). What stays here: everything else (a build's COPY and configure steps, cache lookups).

A caller's on_output gets a node's output as it comes (a streamed call, cluster/fabric.py), in
order; without one a run is the one-answer call (cheaper: bench/cluster.py). A cancel event set
while the run (or sandbox_exec) runs cancels it on its node, and it ends cancelled as here. A run
retried after its node was lost (retries=) passes on the output of each attempt.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid

from ..cluster import Fabric, NodeConfig, RelayedProcess
from ..errors import NodeLost, NotFound, RuntimeUnavailable
from ..runtime.validate import check_command, check_env
from ..values import check_retries
from .runs.spec import command_argv

log = logging.getLogger("sandtree.cluster")

# A live sandbox's calls after its start: to the node it runs on.
PINNED = ("sandbox_exec", "sandbox_run_code", "sandbox_code_context_create", "sandbox_code_contexts",
          "sandbox_code_context_restart", "sandbox_code_context_remove", "sandbox_commit", "sandbox_stop", "sandbox_hibernate", "sandbox_info", "sandbox_read",
          "sandbox_write", "sandbox_set_timeout", "sandbox_set_network", "sandbox_ls", "sandbox_exists",
          "sandbox_remove", "sandbox_mkdir", "sandbox_stat", "sandbox_rename", "sandbox_watch",
          "sandbox_watch_events", "sandbox_unwatch", "sandbox_expose", "sandbox_unexpose", "sandbox_ports",
          "sandbox_port_url", "sandbox_metrics", "sandbox_spawn", "sandbox_stdin", "sandbox_signal", "sandbox_process", "sandbox_popen")
# of these, the calls on a live run's processes too (its operation ID): wait while it starts here
INSTANCE_CALLS = ("sandbox_spawn", "sandbox_stdin", "sandbox_signal", "sandbox_process")
ON_LOST_ROWS = ("sandbox_info", "sandbox_stop")   # on a lost node's sandbox: answered here, from its row


class NodeEngine:
    """make_engine for the node actors: Engine(home, database=, objects=) on the node, with no
    cluster of its own. Pickles by reference to the engine's class (the node imports sandtree).
    Endpoint and credentials of the objects come from the node's own environment (config.py)."""

    def __init__(self, cls, warm: int, tier: str):
        self.cls, self.warm, self.tier = cls, warm, tier

    def __call__(self, config: NodeConfig, home: str):
        return self.cls(home, database=config.database_url or "", objects=config.objects_url or "", cluster="",
                        warm=self.warm, tier=self.tier, max_runs=max(4, (os.cpu_count() or 1) * 4))


class Dispatch:
    """The engine's calls that go to nodes; attach() binds them onto the engine object."""

    def __init__(self, store, resolve, fabric: Fabric, instances):
        self.store, self.resolve, self.fabric = store, resolve, fabric       # the engine's
        self.instances = instances      # () -> the engine's Instances (made with its operations)

    def _layers(self, ref: str):
        """The image's layers, when some node reported what it holds (locality); () otherwise."""
        if all(v.layers is None for v in self.fabric.nodes()):
            return ()
        return self.store.image(self.resolve(ref)).layers

    def run_operation(self, ref: str, command, *, op_id: str | None = None, check_only: bool = False, **options):
        if check_only:                    # validation reads only the shared store: here
            return self.local_run_operation(ref, command, op_id=op_id, check_only=True, **options)
        check_command(command_argv(command))    # (a huge command is refused here, not shipped to a node)
        check_env({str(k): str(v) for k, v in (options.get("env") or {}).items()})
        on_output, cancel = options.pop("on_output", None), options.pop("cancel", None)
        retries = check_retries(options.pop("retries", 0))
        # (its row tells whether it committed; a cancel names the run on its node)
        op_id = op_id or (uuid.uuid4().hex if retries or cancel is not None else None)
        lost = []
        while True:
            try:
                rec = self.fabric.run(ref, command, op_id=op_id, options=options, layers=self._layers(ref),
                                      cancel=cancel, avoid=lost, on_output=on_output)
                break
            except NodeLost as exc:
                if len(lost) >= retries or (cancel is not None and cancel.is_set()):
                    raise
                row = self.store.db.one("SELECT finished, result FROM operations WHERE id=?", (op_id,))
                if row is not None and row[0] is not None:    # it committed before the node went
                    # (its output went with the node, but what it made is the caller's: a rerun
                    # would run the command a second time)
                    raise NodeLost(f"{exc} (not retried: the run had finished and committed on that node, "
                                   f"its operation {op_id} made image {row[1]})",
                                   **{**exc.details, "operation": op_id, "image": row[1]}) from None
                lost.append(exc.details.get("node"))
                log.warning("run %s: %s; retry %d of %d on another node", op_id, exc, len(lost), retries)
        if lost:                          # (a run is a function of its image and command: a rerun is the run)
            rec.usage["retried_after_lost"] = lost
        return rec

    def live_run(self, op: str, ref: str, command, options: dict, **how):
        """Instances.elsewhere: live run `op` on a node (Fabric.live_run; `how`: its callbacks)."""
        return self.fabric.live_run(op, ref, command, options, layers=self._layers(ref), **how)

    def sandbox_start(self, ref: str, **options) -> dict:
        return self.fabric.start_sandbox("sandbox_start", (ref,), options, self._layers(ref))

    def sandbox_resume(self, sid: str) -> dict:
        nid = self.fabric.sandbox_node(sid)
        if nid is not None:
            return self.fabric.call(nid, "sandbox_resume", (sid,))
        row = self.store.db.one("SELECT image, state, spec FROM sandboxes WHERE id=?", (sid,))
        spec = json.loads(row[2]) if row is not None else {}
        if self.fabric.config.objects_url and row is not None and row[1] == "hibernated" and spec.get("checkpoint"):
            # its checkpoint is in object storage (engine/sandboxes/hibernation.py): any node, by load
            # and the layers of the image it resumes on; its node may be gone
            return self.fabric.start_sandbox("sandbox_resume", (sid,), {}, self._layers(spec.get("base") or row[0]))
        # else on the node holding its checkpoint (a home per node): hibernated before checkpoints
        # went to S3, or its upload failed
        home = self.fabric.checkpoint_node(sid) if self.fabric.config.objects_url else None
        if self.fabric.config.objects_url and home is None and self._hibernated(sid):
            raise NodeLost(f"sandbox {sid} was hibernated on a node that is no longer in the cluster, and its "
                           "checkpoint stayed in that node's home (its upload to object storage failed)", sandbox=sid)
        return self.fabric.start_sandbox("sandbox_resume", (sid,), {}, self._layers(row[0]) if row else (),
                                         node=home)   # (None: any node; one shared home has it)

    def sandbox_fork(self, sid: str, n: int = 1, **options) -> list[dict]:
        """A live fork over the cluster: the checkpoint is taken on the source's node, which
        restores the first child (no transfer) and keeps it as the fork image's live state, in
        object storage (engine/sandboxes/livestates.py); the other children are placed by load
        (Fabric.spread) and restored there from it (fork_from), so a fork of N spreads over the
        nodes. A part that fails stops the children already started (the source runs on)."""
        nid = self.fabric.sandbox_node(sid)
        if nid is None:
            lost = self._lost(sid)
            if lost is not None:
                raise NodeLost(f"sandbox {sid} ran on node {lost['node'][:12]}, which was lost ({lost['reason']})",
                               node=lost["node"], sandbox=sid, reason=lost["reason"])
            return self.local["sandbox_fork"](sid, n, **options)     # (its row answers: hibernated, stopped, none)
        if isinstance(n, bool) or not isinstance(n, int) or n < 2 or not self.fabric.config.objects_url:
            # one child, or no object storage (a shared home: the nodes' starts would read one disk)
            children = self.fabric.call(nid, "sandbox_fork", (sid, n), options)
            self._pin(children, nid)
            # (its live state is kept after the call: any node may be asked to start it next)
            self.fabric.call(nid, "wait_live_state", (children[0]["forked_from"]["image"],), {})
            return children
        plan = self.fabric.spread(n - 1, first=nid)
        here = 1 + plan.count(nid)
        children = self.fabric.call(nid, "sandbox_fork", (sid, here), options)
        self._pin(children, nid)
        image = children[0]["forked_from"]["image"]
        try:
            self.fabric.call(nid, "wait_live_state", (image,), {})      # (kept after its call returned)
            kept = self.store.db.one("SELECT checkpoint FROM live_states WHERE image=?", (image,))
            if kept is None or not kept[0]:
                raise RuntimeUnavailable(f"the checkpoint of the fork of sandbox {sid} did not reach object storage "
                                         "(its node's log says why), so no child can be restored on another node: "
                                         f"fork it with n=1, or again", sandbox=sid)
            for other in dict.fromkeys(x for x in plan if x != nid):
                more = self.fabric.call(other, "fork_from", (image, plan.count(other)), options)
                self._pin(more, other)
                # (as the source's children say it: the fork, not the later start from its state)
                children += [{**c, "forked_from": children[0]["forked_from"]} for c in more]
        except BaseException:
            self._stop_all(children)
            raise
        return children

    def fork_from(self, ref: str, n: int = 1, **options) -> list[dict]:
        """Live sandboxes from an image's live state, placed by load (any node fetches the state
        from object storage; without it the nodes share one home)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            return self.fabric.call(self.fabric.pick(), "fork_from", (ref, n), options)   # (its error)
        plan = self.fabric.spread(n)
        out: list[dict] = []
        try:
            for nid in dict.fromkeys(plan):
                more = self.fabric.call(nid, "fork_from", (ref, plan.count(nid)), options)
                self._pin(more, nid)
                out += more
        except BaseException:
            self._stop_all(out)
            raise
        return out

    def _pin(self, infos: list[dict], nid: str) -> None:
        for c in infos:                          # (started by a call of their own, not start_sandbox)
            self.fabric.pin(c["id"], nid)

    def _stop_all(self, infos: list[dict]) -> None:
        for c in infos:
            try:
                self.pinned("sandbox_stop")(c["id"])
            except Exception as exc:            # noqa: BLE001 - its node went too: its deadline ends it
                log.warning("live fork: sandbox %s not stopped after a failed part: %s", c["id"], exc)

    def pinned(self, name: str):
        def call(sid: str, *args, **kwargs):
            if name in INSTANCE_CALLS:    # a live run submitted here, not up yet: wait (or NotReady)
                self.instances().wait_started(sid)
            nid = self.fabric.sandbox_node(sid)
            if nid is None and self._hibernated(sid):   # to its checkpoint's node (a stop removes it there),
                nid = self.fabric.checkpoint_node(sid)  # else answered here from its row
                if nid is None:
                    return self.local[name](sid, *args, **kwargs)
            if nid is None:
                lost = self._lost(sid)
                if lost is not None and name in ON_LOST_ROWS:     # its row: state `lost` and why; stop ends it
                    return self.local[name](sid, *args, **kwargs)
                if lost is not None:
                    raise NodeLost(f"sandbox {sid} ran on node {lost['node'][:12]}, which was lost "
                                   f"({lost['reason']})", node=lost["node"], sandbox=sid, reason=lost["reason"])
                if name in INSTANCE_CALLS:     # a live run that ended: its events and result are here
                    return self.local[name](sid, *args, **kwargs)
                raise NotFound(f"no live sandbox {sid!r} on any node of the cluster")
            if name == "sandbox_process":      # None: it ended meanwhile (told from its events here)
                now = self.fabric.ask(nid, "process", sid, *args)
                return now if now is not None else self.local[name](sid, *args, **kwargs)
            if name == "sandbox_popen":        # run there, its pipes or terminal relayed (cluster/relay.py)
                argv = args[0] if args else kwargs.pop("argv")
                ends = {k: kwargs.pop(k) for k in ("pty", "stdin", "stdout", "stderr") if k in kwargs}
                return RelayedProcess(self.fabric, nid, sid, argv, kwargs, **ends)
            on_output, cancel = kwargs.pop("on_output", None), kwargs.pop("cancel", None)
            return self.fabric.call(nid, name, (sid, *args), kwargs, on_output=on_output, cancel=cancel)
        call.__name__ = name
        return call

    def _hibernated(self, sid: str) -> bool:
        row = self.store.db.one("SELECT state FROM sandboxes WHERE id=?", (sid,))
        return row is not None and row[0] == "hibernated"

    def _lost(self, sid: str) -> dict | None:
        """{node, reason, at} when live sandbox `sid`'s node was lost (this process saw it, or
        any replica did and marked its row); None otherwise."""
        row = self.store.db.one("SELECT state, spec FROM sandboxes WHERE id=?", (sid,))
        if row is not None and row[0] == "lost":
            return json.loads(row[1]).get("lost") or {"node": "", "reason": "its node was lost"}
        nid = self.fabric.lost_sandbox(sid)
        return None if nid is None else {"node": nid, "reason": "its node was lost"}

    def mark_lost(self, nid: str, sids: list[str], reason: str) -> None:
        """Fabric.on_lost: the rows of a lost node's live sandboxes say `lost`, with the node and
        why, for every replica (a hibernated one is not pinned to a node: never marked)."""
        with self.store.db.tx() as con:
            for sid in sids:
                row = con.execute("SELECT spec FROM sandboxes WHERE id=? AND state='running'", (sid,)).fetchone()
                if row is not None:
                    spec = {**json.loads(row[0]), "lost": {"node": nid, "reason": reason, "at": time.time()}}
                    con.execute("UPDATE sandboxes SET state='lost', spec=? WHERE id=? AND state='running'",
                                (json.dumps(spec), sid))
        log.warning("node %s lost: live sandboxes %s marked lost (%s)", nid[:12], ", ".join(sids), reason)

    def sandbox_list(self, *, all: bool = False, labels: dict | None = None) -> list[dict]:
        return self.fabric.call(self.fabric.pick(), "sandbox_list", (), {"all": all, "labels": labels})

    # ---- pools: one per node -------------------------------------------------------------------
    def _every(self, name: str, args: tuple, kwargs: dict) -> dict:
        out = self.fabric.call_all(name, args, kwargs)
        for answer in out.values():
            if isinstance(answer, BaseException):
                raise answer
        return out

    def pool_create(self, ref: str, size: int, **options) -> dict:
        answers = self._every("pool_create", (ref, size), options)
        return {**next(iter(answers.values())), "nodes": len(answers)}

    def pool_and_wait(self, ref: str, size: int, **options) -> dict:
        answers = self._every("pool_and_wait", (ref, size), options)
        return {**next(iter(answers.values())), "nodes": len(answers)}

    def pool_wait(self, ref: str, timeout: float | None = None) -> bool:
        kw = {} if timeout is None else {"timeout": timeout}
        return all(self._every("pool_wait", (ref,), kw).values())

    def pool_list(self) -> list[dict]:
        return [{**p, "node": nid} for nid, ps in self._every("pool_list", (), {}).items() for p in ps]

    def pool_remove(self, ref: str) -> None:
        self._every("pool_remove", (ref,), {})

    def pool_drain(self, image: str) -> None:
        """A rolled-over recipe pool (engine/warm/rollover.py) removed on every node, behind the caller
        (a node's remove waits for the runs in it)."""
        def drain():
            try:
                self.pool_remove(image)
            except Exception:          # noqa: BLE001 - a lost node took its pool with it
                log.warning("draining the pool of %s on the nodes failed", image, exc_info=True)
        threading.Thread(target=drain, name="sandtree-pool-drain", daemon=True).start()

    def cluster_status(self) -> dict:
        return self.fabric.status()


def node_config(store) -> NodeConfig:
    """The nodes of an API engine's store: its database and objects. Without S3 objects every node
    shares its store directory; with them each has a home of its own under home/nodes/ (or its
    SANDTREE_NODE_HOME), a cache of the bucket. SQLite is named by its path (one machine only)."""
    database = store.database_url or f"sqlite:///{os.path.join(store.home, 'sandtree.db')}"
    if store.objects is None:
        return NodeConfig(store.home, store.database_url, None)
    return NodeConfig(os.path.join(store.home, "nodes"), database, store.objects.url)


def attach(engine, address: str, *, warm: int, tier: str) -> Fabric:
    """Make engine's runs and live sandboxes go to the cluster at `address` (node_config: what
    the nodes are made of)."""
    config = node_config(engine.store)
    fabric = Fabric(address, config, NodeEngine(type(engine), warm, tier))
    d = Dispatch(engine.store, engine.resolve, fabric, lambda: engine.operations.instances)
    fabric.on_lost = d.mark_lost
    d.local_run_operation = engine.run_operation
    d.local = {name: getattr(engine, name) for name in PINNED + ("sandbox_fork",)}   # this process's own, from rows
    for name in ("run_operation", "sandbox_start", "sandbox_resume", "sandbox_fork", "fork_from", "sandbox_list",
                 "pool_create", "pool_and_wait",
                 "pool_wait", "pool_list", "pool_remove", "cluster_status"):
        setattr(engine, name, getattr(d, name))
    for name in PINNED:
        setattr(engine, name, d.pinned(name))
    engine.live_elsewhere = d.live_run
    engine.drain_elsewhere = d.pool_drain
    return fabric
