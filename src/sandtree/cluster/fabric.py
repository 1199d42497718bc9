"""The API side of a cluster: the Ray connection, one Node actor per Ray node, and the calls.

Which Ray nodes are sandtree nodes: every live node with a CPU resource (a head started with
`--num-cpus=0` only coordinates). Each gets one detached, named actor (`sandtree-node-<node id>`
in the namespace `sandtree`), so every API replica on the cluster finds the same actors instead of
starting its own. A run goes to choose_node's pick; a live sandbox stays on the node that started
it (every later call goes there), as does a live run (its operation ID) while it runs. A call
whose caller watches its output is streamed (a Ray generator method of the node: node.py), its
chunks passed on in order as they come; a cancel reaches the node as Node.cancel(key). A node that
dies takes its calls with it: they end as NodeLost (a typed error naming the node and Ray's
reason), and the node leaves the picture.

Through Ray Client (`ray://HOST:PORT`) the same calls work, with two differences Ray Client
imposes: it has no generator methods, so a streamed call's items are pulled (Node.pull,
pulled.py: one call per batch of items, a round trip more than a stream); and its head's proxy
starts a server process for each connection, which can fail on a loaded head (or when another
cluster's proxy on the same machine took the port it chose): the connection is tried
CONNECT_ATTEMPTS times, then refused as RuntimeUnavailable with Ray's reason.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid

from ..errors import NodeLost, RuntimeUnavailable
from ..optional import load
from .node import SESSION_GROUP, Node
from .scheduling import NodeConfig, NodeView, choose_node

# Ray (the `cluster` extra) is loaded by the first Fabric (optional.py), not with this module.
ray = NodeAffinitySchedulingStrategy = None
_LOST: tuple = ()


def _load_ray() -> bool:
    global ray, NodeAffinitySchedulingStrategy, _LOST
    if ray is None:
        strategies = load("ray.util.scheduling_strategies")
        if strategies is None:
            return False
        ray, NodeAffinitySchedulingStrategy = load("ray"), strategies.NodeAffinitySchedulingStrategy
        _LOST = (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError,
                 ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError)
    return True


log = logging.getLogger("sandtree.cluster")

NAMESPACE = "sandtree"
REFRESH_S = 5.0               # how often the node list is read again from Ray (new nodes, dead nodes)
CALLS_PER_CPU = 4             # concurrent calls a node actor serves per CPU (runs wait in their sandboxes)
SESSIONS = 256               # open terminals (popen relays) a node actor serves at once, beside its calls
KEEPALIVE_S = 5.0             # how often the nodes hear that this process's relays are still open
STATUS_TIMEOUT = 10.0
LAYERS_TIMEOUT = 2.0          # a refresh's wait for the nodes' cache contents
PULL_WAIT_S = 5.0             # through Ray Client: how long one pull of a stream waits for its next items
CONNECT_ATTEMPTS = 3          # through Ray Client: connections tried before the cluster is refused


class Fabric:
    def __init__(self, address: str, config: NodeConfig, make_engine):
        """address: `auto`, HOST:PORT (the GCS) or ray://HOST:PORT (Ray Client). config: every node's
        NodeConfig. make_engine(config): a node's engine, run on the node (must pickle by name)."""
        if not _load_ray():
            raise RuntimeUnavailable("a cluster needs Ray: pip install 'sandtree[cluster]'")
        self.address, self.config, self._make_engine = address, config, make_engine
        if not ray.is_initialized():
            _connect(address)
        self.client = ray.util.client.ray.is_connected()       # through Ray Client: streams are pulled
        self._lock = threading.Lock()
        self._views: dict[str, NodeView] = {}
        self._actors: dict[str, object] = {}
        self._pinned: dict[str, str] = {}       # live sandbox -> the node it runs on
        self._lost: dict[str, str] = {}         # live sandbox -> the node it ran on, which was lost
        self.on_lost = None                     # (node, sandbox IDs, reason): engine/clustered.py marks rows
        self._asked: dict = {}                  # held_layers() calls in flight -> their node
        self._read = 0.0
        self._held: dict[str, set[str]] = {}    # node -> keys of the relayed processes open here
        self._keeping = False
        self.keepalive_s = KEEPALIVE_S
        self.refresh()

    # ---- nodes ---------------------------------------------------------------------------------
    def refresh(self, wait: float = LAYERS_TIMEOUT) -> list[NodeView]:
        """Read the nodes from Ray: an actor for each new node with CPUs, dead ones dropped; and
        what their caches hold, waiting up to `wait` s for the answers (0, on the run path: the
        answers that came since the last refresh; a node busy with runs answers later)."""
        alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) > 0}
        gone = []
        with self._lock:
            for nid in [n for n in self._views if n not in alive]:
                gone.append((nid, self._drop(nid)))
            for nid, n in alive.items():
                if nid not in self._actors:
                    cpus = float(n["Resources"]["CPU"])
                    self._actors[nid] = ray.remote(concurrency_groups={SESSION_GROUP: SESSIONS})(Node).options(
                        name=f"sandtree-node-{nid}", namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                        num_cpus=0, max_restarts=0, max_concurrency=max(8, int(cpus * CALLS_PER_CPU)),
                        scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False),
                    ).remote(self.config, self._make_engine, nid, cpus)
                    self._views[nid] = NodeView(nid, cpus, address=n.get("NodeManagerAddress", ""))
            self._read = time.monotonic()
            views = list(self._views.values())
            actors = {v.id: self._actors[v.id] for v in views}
        for nid, sids in gone:
            self._report_lost(nid, sids, "Ray reports the node dead")
        self._read_layers(actors, wait)
        return views

    def _read_layers(self, actors: dict, wait: float) -> None:
        """What each node's layer cache holds (Node.held_layers), for locality: one question per
        node in flight at a time; a node that has not answered keeps what was known."""
        with self._lock:
            asking = set(self._asked.values())
            for nid, a in actors.items():
                if nid not in asking:
                    self._asked[a.held_layers.remote()] = nid
            refs = dict(self._asked)
        if not refs:
            return
        try:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=wait)
        except _LOST:
            ready = []
        for ref in ready:
            with self._lock:
                self._asked.pop(ref, None)
            try:
                held = ray.get(ref)
            except (_LOST + (ray.exceptions.RayTaskError,)):
                continue
            if held is not None:
                self.note_layers(refs[ref], held)

    def _drop(self, nid: str) -> list[str]:
        """(under the lock) node `nid` out of the picture; returns its live sandboxes, now lost."""
        self._views.pop(nid, None)
        self._actors.pop(nid, None)
        sids = [s for s, n in self._pinned.items() if n == nid]
        for sid in sids:
            self._lost[sid] = self._pinned.pop(sid)
        return sids

    def _report_lost(self, nid: str, sids: list[str], reason: str) -> None:
        """on_lost(node, sandbox IDs, reason), set by the engine side: their rows say `lost`."""
        if sids and self.on_lost is not None:
            self.on_lost(nid, sids, reason)

    def lost_sandbox(self, sid: str) -> str | None:
        """The node live sandbox `sid` ran on when that node was lost (None: not known lost)."""
        with self._lock:
            return self._lost.get(sid)

    def nodes(self) -> list[NodeView]:
        if time.monotonic() - self._read > REFRESH_S:
            return self.refresh(wait=0)
        with self._lock:
            return list(self._views.values())

    def slots(self) -> int:
        """How many calls the cluster serves at once (the API side's worker threads)."""
        return sum(max(8, int(v.cpus * CALLS_PER_CPU)) for v in self.nodes())

    def note_layers(self, nid: str, layers, *, add: bool = False) -> None:
        """What node `nid` holds: choose_node prefers it for images of these layers. refresh()
        replaces it with Node.held_layers() (its cache's index); add: a run there just used these
        layers (they are in its cache now, until it evicts them: the next refresh says)."""
        with self._lock:
            view = self._views.get(nid)
            if view is not None:
                view.layers = frozenset(layers) | (view.layers or frozenset() if add else frozenset())

    def pick(self, layers=(), avoid=()) -> str:
        """The node for a run or a start; `avoid`: nodes this run was lost on (Ray may list a dead
        node as alive for a while after its actor's calls failed)."""
        views = [v for v in self.nodes() if v.id not in avoid]
        with self._lock:
            for v in views:
                v.sandboxes = sum(1 for n in self._pinned.values() if n == v.id)
        return choose_node(views, layers).id

    # ---- calls ---------------------------------------------------------------------------------
    def _get(self, nid: str, ref, what: str, cancel=None, on_cancel=None):
        """ray.get of a call on node `nid`: its result, its own error re-raised, or NodeLost."""
        with self._answer(nid, what):
            _await(ref, cancel, on_cancel)
            return ray.get(ref)

    def _stream(self, nid: str, method: str, args: tuple, what: str, on_output, cancel=None, on_cancel=None,
                on_item=None):
        """Drive streamed call `method`(*args) on node `nid` (node.py's items): its output to
        on_output(stream, chunk) in order as it comes, its other items to on_item(kind, payload);
        its result, its own error re-raised, or NodeLost."""
        with self._answer(nid, what):
            for kind, payload in self._items(nid, method, args, cancel, on_cancel):
                if kind == "result":          # (a stream ends with its result or its error)
                    return payload
                if kind == "output":
                    for stream, chunk in payload:
                        on_output(stream, chunk)
                elif on_item is not None:
                    on_item(kind, payload)

    @contextlib.contextmanager
    def _answer(self, nid: str, what: str):
        """A call on node `nid` answered: its own error re-raised, a lost node's as NodeLost."""
        try:
            yield
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise
        except _LOST as exc:
            with self._lock:
                sids = self._drop(nid)
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self._report_lost(nid, sids, f"{type(exc).__name__}: {reason}")
            raise NodeLost(f"node {nid[:12]} was lost during {what}: {reason}", node=nid,
                           reason=type(exc).__name__) from None

    def _actor(self, nid: str):
        with self._lock:
            actor = self._actors.get(nid)
        if actor is None:
            raise NodeLost(f"node {nid[:12]} is not in the cluster any more", node=nid)
        return actor

    def run(self, ref: str, command, *, op_id: str | None, options: dict, layers=(), cancel=None, avoid=(),
            on_output=None):
        """A run on the chosen node (Node.run): its RunRecord. on_output: its output streamed
        (Node.run_streamed); cancel: an event whose setting cancels it there (needs op_id)."""
        nid = self.pick(layers, avoid)
        actor = self._actor(nid)
        with self._running(nid):
            what = f"operation {op_id}" if op_id else "a run"
            on_cancel = (lambda: actor.cancel.remote(op_id)) if op_id else None
            if on_output is None:        # (the cheaper call: one answer)
                rec = self._get(nid, actor.run.remote(ref, command, op_id, options), what, cancel, on_cancel)
            else:
                rec = self._stream(nid, "run_streamed", (ref, command, op_id, options), what, on_output, cancel,
                                   on_cancel)
            if layers and self._views.get(nid) is not None and self._views[nid].layers is not None:
                self.note_layers(nid, layers, add=True)
            return rec

    def live_run(self, op: str, ref: str, command, options: dict, *, cancel, on_output, on_up, events, layers=()):
        """Live run `op` on the chosen node (Node.live_run): pinned there from its sandbox's start
        (on_up(sandbox ID) after) to its end, so its processes' calls go there; its output to
        on_output and its events to events(kind, data) as they come. Its RunRecord."""
        nid = self.pick(layers)
        actor = self._actor(nid)

        def item(kind, payload):
            if kind == "up":
                self.pin(op, nid)
                on_up(payload)
            else:
                events(*payload)
        try:
            with self._running(nid):
                return self._stream(nid, "live_run", (op, ref, command, options), f"live run {op}", on_output,
                                    cancel, lambda: actor.cancel.remote(op), item)
        finally:
            with self._lock:
                self._pinned.pop(op, None)

    @contextlib.contextmanager
    def _running(self, nid: str):
        """A run in flight on node `nid` (its view's count: choose_node's load)."""
        view = self._views.get(nid)
        if view is not None:
            with self._lock:
                view.running += 1
        try:
            yield
        finally:
            if view is not None:
                with self._lock:
                    view.running -= 1

    def pin(self, sid: str, nid: str) -> None:
        """Calls on `sid` (a live sandbox or live run) go to node `nid` from now on."""
        with self._lock:
            self._pinned[sid] = nid

    def start_sandbox(self, name: str, args: tuple, kwargs: dict, layers=(), node: str | None = None) -> dict:
        """sandbox_start (or a resume): on `node`, else the chosen one, and pinned there."""
        nid = node or self.pick(layers)
        out = self._get(nid, self._actor(nid).call.remote(name, args, kwargs), name)
        with self._lock:
            self._pinned[out["id"]] = nid
        return out

    def spread(self, k: int, first: str | None = None) -> list[str]:
        """The nodes for k sandboxes restored from one live state (a live fork's children), one
        choose_node each with the ones placed before counted (so they spread by load); `first`: a
        node already given one (the source's). No layer locality: the checkpoint, the memory of the
        whole sandbox, travels to whichever node it is, and dwarfs the layers it lacks."""
        views = self.nodes()
        with self._lock:
            base = {v.id: sum(1 for n in self._pinned.values() if n == v.id) for v in views}
        planned = {first: 1} if first else {}
        out = []
        for _ in range(k):
            for v in views:
                v.sandboxes = base[v.id] + planned.get(v.id, 0)
            nid = choose_node(views).id
            planned[nid] = planned.get(nid, 0) + 1
            out.append(nid)
        return out

    def checkpoint_node(self, sid: str) -> str | None:
        """The node that hibernated sandbox `sid` and holds its checkpoint (asked of every node)."""
        for view in self.nodes():
            try:
                if self._get(view.id, self._actor(view.id).holds_checkpoint.remote(sid), "a lookup"):
                    return view.id
            except NodeLost:
                continue
        return None

    def sandbox_node(self, sid: str) -> str | None:
        """The node live sandbox `sid` runs on (asked of every node when this process did not start it)."""
        with self._lock:
            nid = self._pinned.get(sid)
        if nid is not None:
            return nid
        for view in self.nodes():
            try:
                if self._get(view.id, self._actor(view.id).owns.remote(sid), "a lookup"):
                    with self._lock:
                        self._pinned[sid] = view.id
                    return view.id
            except NodeLost:
                continue
        return None

    def call(self, nid: str, name: str, args: tuple = (), kwargs: dict | None = None, *, on_output=None,
             cancel=None):
        """Engine method `name` on node `nid`. on_output, cancel (sandbox_exec's): the call is
        streamed (Node.call_streamed), its output passed on as it comes, cancelled there when
        `cancel` is set."""
        if on_output is not None or cancel is not None:
            key, actor = uuid.uuid4().hex, self._actor(nid)
            return self._stream(nid, "call_streamed", (name, args, kwargs or {}, key, on_output is not None), name,
                                on_output, cancel, lambda: actor.cancel.remote(key))
        out = self._get(nid, self._actor(nid).call.remote(name, args, kwargs or {}), name)
        if name in ("sandbox_stop", "sandbox_hibernate"):       # not pinned any more
            with self._lock:
                self._pinned.pop(args[0], None)
        return out

    def items(self, nid: str, method: str, *args, what: str):
        """The items of node generator method `method` on node `nid`, as they come (an iterator;
        its own error re-raised, or NodeLost). A terminal's (popen): in the actor's sessions
        group (node.py), pulled in it too."""
        with self._answer(nid, what):
            yield from self._items(nid, method, args, session=True)

    def _items(self, nid: str, method: str, args: tuple, cancel=None, on_cancel=None, session: bool = False):
        """The items of generator method `method`(*args) of node `nid` as they come: a Ray
        generator call, or pulled through Ray Client (module doc). While waiting for the next,
        once `cancel` is set, on_cancel() once."""
        actor = self._actor(nid)
        if not self.client:
            gen = getattr(actor, method).remote(*args)
            while True:
                on_cancel = _await(gen, cancel, on_cancel)
                try:
                    ref = next(gen)
                except StopIteration:
                    return
                yield ray.get(ref)
        key, pull, start = uuid.uuid4().hex, actor.pull_session if session else actor.pull, (method, args)
        while True:
            ref = pull.remote(key, PULL_WAIT_S, *start)
            start = ()
            on_cancel = _await(ref, cancel, on_cancel)
            items, ended = ray.get(ref)
            yield from items
            if ended:
                return

    def hold(self, nid: str, key: str) -> float:
        """Relayed process `key` on node `nid` is open here: the node hears so every keepalive_s
        (Node.popen_alive); returns how long the node waits without hearing before it takes this
        process as gone and ends its relay (a terminal hung up, its process killed)."""
        with self._lock:
            self._held.setdefault(nid, set()).add(key)
            start, self._keeping = not self._keeping, True
        if start:
            threading.Thread(target=self._keepalive, name="sandtree-relay-keepalive", daemon=True).start()
        return self.keepalive_s * 6

    def release(self, nid: str, key: str) -> None:
        with self._lock:
            self._held.get(nid, set()).discard(key)

    def _keepalive(self) -> None:
        while True:
            time.sleep(self.keepalive_s)
            with self._lock:
                held = [(self._actors.get(n), sorted(keys)) for n, keys in self._held.items() if keys]
            for actor, keys in held:
                if actor is not None:
                    with contextlib.suppress(Exception):     # a lost node: its relays end as NodeLost
                        actor.popen_alive.remote(keys)       # (no answer waited for)

    def ask(self, nid: str, method: str, *args):
        """Node method `method` (not an engine call) on node `nid`."""
        return self._get(nid, getattr(self._actor(nid), method).remote(*args), method)

    def call_all(self, name: str, args: tuple = (), kwargs: dict | None = None) -> dict:
        """`name` on every node: node ID -> its answer (a lost node's is its NodeLost)."""
        refs = {v.id: self._actor(v.id).call.remote(name, args, kwargs or {}) for v in self.nodes()}
        out = {}
        for nid, ref in refs.items():
            try:
                out[nid] = self._get(nid, ref, name)
            except NodeLost as exc:
                out[nid] = exc
        return out

    def status(self) -> dict:
        views = self.refresh()
        refs = {v.id: self._actor(v.id).status.remote() for v in views}
        nodes = []
        for v in views:
            try:
                ready, _ = ray.wait([refs[v.id]], timeout=STATUS_TIMEOUT)
                st = ray.get(ready[0]) if ready else {"alive": False, "reason": "no answer"}
            except _LOST as exc:
                st = {"alive": False, "reason": type(exc).__name__}
            nodes.append({"node": v.id, "address": v.address, "cpus": v.cpus, "in_flight": v.running,
                          "alive": True, **st})
        return {"mode": "cluster", "address": self.address, "ray_client": self.client,
                "objects": self.config.objects_url, "database": "postgresql" if (self.config.database_url or "").startswith("postgres") else "sqlite",
                "nodes": nodes}


def _connect(address: str) -> None:
    """ray.init of `address`; RuntimeUnavailable with Ray's reason when it cannot connect. A Ray
    Client connection whose server (on the head) failed to start is tried again, up to
    CONNECT_ATTEMPTS times (module doc); one that found no proxy is not (Ray waited ~30 s for it:
    RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S / RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S)."""
    attempt = 1
    while True:
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="WARNING")
            return
        except ConnectionError as exc:
            with contextlib.suppress(Exception):
                ray.shutdown()
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            reason = lines[-1] if lines else type(exc).__name__      # (Ray's message ends a server traceback)
            if not isinstance(exc, ConnectionAbortedError) or attempt == CONNECT_ATTEMPTS:
                raise RuntimeUnavailable(f"cannot connect to the Ray cluster at {address} "
                                         f"({attempt} attempt{'s' * (attempt > 1)}): {reason}",
                                         address=address, reason=reason) from None
            attempt += 1
            log.warning("connecting to %s: %s; attempt %d of %d", address, reason, attempt, CONNECT_ATTEMPTS)
            time.sleep(attempt - 1)


def _await(ref, cancel, on_cancel):
    """Wait for `ref` (a call's answer, or a stream's next item); while waiting, once `cancel`
    is set, on_cancel() once. Returns on_cancel, or None once it was called."""
    while cancel is not None and not ray.wait([ref], timeout=0.2)[0]:
        if cancel.is_set() and on_cancel is not None:
            on_cancel()
            on_cancel = None
    return on_cancel
