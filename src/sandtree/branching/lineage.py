"""Lineage queries over the edges table: ancestors, descendants, paths, common ancestors, what
produced an image, an image's log, and the tree under a root (as data; sandtree/render.py draws it).

Every query takes `visible`: None answers from the whole store; a Visible answers as if only
what it lets through existed (a tenant's view: tenancy/). An edge shows when both its images and
its operation do, so a filtered walk never passes through, or names, anything hidden."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Container
from dataclasses import dataclass, field

from ..errors import NotFound
from ..store.store import Store


@dataclass(frozen=True)
class Visible:
    """What a lineage answer may show."""
    images: Container[str]                          # image IDs that exist for the caller
    op: Callable[[str], bool] = lambda op: True     # whether an operation's record may be shown
    tags: dict = field(default_factory=dict)        # image -> the tag names shown on it
    branches: dict = field(default_factory=dict)    # image -> the branch names shown on it
    notes: Callable[[str], dict] | None = None      # image -> the annotations it reads (a tree's scores)
    live: Container[str] = ()                       # images with a live state it may start (fork_from)

    def edge(self, parent: str, child: str, op: str) -> bool:
        return parent in self.images and child in self.images and self.op(op)


def _edge_rows(store: Store, image: str, up: bool, visible: Visible | None) -> list[tuple]:
    col = "child" if up else "parent"
    rows = store.db.query(f"SELECT parent, child, op, created FROM edges WHERE {col}=? ORDER BY created", (image,))
    return rows if visible is None else [r for r in rows if visible.edge(r[0], r[1], r[2])]


def _step(store: Store, image: str, up: bool, visible: Visible | None) -> list[str]:
    """The images one edge away, in the order their edges were made (each once)."""
    if visible is None:
        col, other = ("child", "parent") if up else ("parent", "child")
        return [r[0] for r in store.db.query(
            f"SELECT {other} FROM edges WHERE {col}=? GROUP BY {other} ORDER BY MIN(created), {other}", (image,))]
    return list(dict.fromkeys(r[0 if up else 1] for r in _edge_rows(store, image, up, visible)))


def _distances(image: str, step) -> dict[str, int]:
    dist = {image: 0}
    q = deque([image])
    while q:
        cur = q.popleft()
        for nxt in step(cur):
            if nxt not in dist:
                dist[nxt] = dist[cur] + 1
                q.append(nxt)
    return dist


def ancestors(store: Store, image: str, visible: Visible | None = None) -> dict[str, int]:
    """Every ancestor with its distance (the image itself at 0)."""
    return _distances(image, lambda i: _step(store, i, True, visible))


def descendants(store: Store, image: str, visible: Visible | None = None) -> dict[str, int]:
    return _distances(image, lambda i: _step(store, i, False, visible))


def common_ancestor(store: Store, a: str, b: str, visible: Visible | None = None) -> str | None:
    """The nearest common ancestor (least total distance; ties go to the newer image)."""
    da, db = ancestors(store, a, visible), ancestors(store, b, visible)
    common = set(da) & set(db)
    if not common:
        return None
    created = dict(store.db.query(f"SELECT id, created FROM images WHERE id IN ({','.join('?' * len(common))})",
                                  list(common)))
    return min(common, key=lambda x: (da[x] + db[x], -created.get(x, 0)))


def path(store: Store, a: str, b: str, visible: Visible | None = None) -> list[str]:
    """Images from a to b along lineage edges (through their common ancestor if neither
    descends from the other)."""
    def chain(frm: str, to: str) -> list[str] | None:
        prev = {frm: None}
        q = deque([frm])
        while q:
            cur = q.popleft()
            if cur == to:
                out = []
                while cur is not None:
                    out.append(cur)
                    cur = prev[cur]
                return out[::-1]
            for c in _step(store, cur, False, visible):
                if c not in prev:
                    prev[c] = cur
                    q.append(c)
        return None

    down = chain(a, b)
    if down:
        return down
    up = chain(b, a)
    if up:
        return up[::-1]
    base = common_ancestor(store, a, b, visible)
    if base is None:
        raise NotFound("the two images share no ancestor")
    return chain(base, a)[::-1] + chain(base, b)[1:]


def op_summary(store: Store, op: str) -> dict:
    """An operation's kind, command (or what it imported), exit code and duration in seconds
    (None while it runs), for a run that had network its policy (hermetic false) and its egress tape
    (the one it recorded, else the one it replayed); {} if it is gone."""
    r = store.db.one("SELECT kind, spec, outcome, started, finished FROM operations WHERE id=?", (op,))
    if not r:
        return {}
    spec, outcome = json.loads(r[1]), json.loads(r[2]) if r[2] else {}
    net = {"network": spec["network"], "hermetic": False} if spec.get("network") else {}
    # an egress tape it recorded (its usage), else the one it replayed (its spec): engine/tapes.py
    tape = (outcome.get("usage") or {}).get("tape") or spec.get("tape")
    return {"kind": r[0], "command": spec.get("command") or spec.get("source"), "exit_code": outcome.get("exit_code"),
            "seconds": _seconds(r[3], r[4]), **net, **({"tape": tape} if tape else {})}


def _seconds(started, finished) -> float | None:
    return round(finished - started, 3) if started is not None and finished is not None else None


def edges(store: Store, image: str, *, up: bool, visible: Visible | None = None) -> list[dict]:
    """An image's parent edges (up) or child edges, each with its operation's summary."""
    return [{"parent": p, "child": c, "op": op, "created": t, **op_summary(store, op)}
            for p, c, op, t in _edge_rows(store, image, up, visible)]


def log(store: Store, image: str, limit: int = 1000, visible: Visible | None = None) -> list[dict]:
    """Ancestry, newest first: each image with the operation that made it from its parent (a
    root: the import that brought it in)."""
    out, seen, todo = [], set(), [image]
    while todo and len(out) < limit:
        cur = todo.pop(0)
        if cur in seen:
            continue
        seen.add(cur)
        tags = sorted(store.tags(cur)) if visible is None else visible.tags.get(cur, [])
        parents = edges(store, cur, up=True, visible=visible)
        if not parents:
            made = next((r for r in store.db.query("SELECT id, spec FROM operations WHERE result=? AND kind='import' "
                                                   "ORDER BY started", (cur,))
                         if visible is None or visible.op(r[0])), None)
            out.append({"image": cur, "parents": [], "command": json.loads(made[1])["source"] if made else None,
                        "op": made[0] if made else None, "exit_code": None, "tags": tags})
            continue
        first = parents[0]
        # each parent once: two runs that wrote the same files made the same image (content-addressed), one
        # edge each, from the same parent
        out.append({"image": cur, "parents": list(dict.fromkeys(p["parent"] for p in parents)), "command": first.get("command"),
                    "op": first["op"], "exit_code": first.get("exit_code"), "tags": tags,
                    **({"network": first["network"], "hermetic": False} if first.get("network") else {})})
        todo.extend(p["parent"] for p in parents)
    return out


def recorded_network(db, image: str) -> dict | None:
    """The network policy (its canonical JSON) recorded on the run that produced `image`; None
    when no networked run made it (what network="inherit" means)."""
    # (a run that changed nothing "results" in its own source: it did not make the image)
    row = db.one("SELECT spec FROM operations WHERE result=? AND kind='run' AND finished IS NOT NULL "
                 "AND (source IS NULL OR source != result) ORDER BY finished DESC LIMIT 1", (image,))
    return json.loads(row[0]).get("network") if row else None


def produced_by(store: Store, image: str, visible: Visible | None = None) -> list[dict]:
    rows = store.db.query("SELECT id, kind, source, spec, outcome, started FROM operations WHERE result=? "
                          "ORDER BY started", (image,))
    out = []
    for op, kind, source, spec, outcome, started in rows:
        if visible is not None and not visible.op(op):
            continue
        spec, outcome = json.loads(spec), json.loads(outcome) if outcome else {}
        out.append({"op": op, "kind": kind, "source": source, "started": started,
                    "command": spec.get("command") or spec.get("source"), "exit_code": outcome.get("exit_code")})
    return out


MAX_TREE_NODES = 2000
# Nesting past this depth is cut (the node says "cut": its subtree is the tree of that image):
# lineage depth is a caller's to make (1,000 runs in a chain cost seconds), and nested JSON
# deeper than the interpreter's recursion limit cannot even be encoded.
MAX_TREE_DEPTH = 200


def tree(store: Store, root: str, *, max_nodes: int = MAX_TREE_NODES, visible: Visible | None = None,
         via=None, notes=None) -> dict:
    """The lineage tree under `root`: nested nodes with tags, branches and, per edge, its
    operation (`op`), command, exit code and duration (`seconds`), and `live` on an image whose
    live state fork_from can start (a live fork's or hibernation's checkpoint). Iterative (no recursion on
    lineage depth). via(op) -> {"command", "exit_code", "seconds"} labels an edge (default: the
    operation's command, else its kind). Past `max_nodes` a node is not expanded: `more` says it
    has children (its own tree is the next page: how the web page expands lazily).
    notes(image) -> its annotations (default: the filter's): a node's `score`, and `metrics` (its
    numeric annotations: a reward, a pass rate), each only when it has one; strings stay on the
    image's own record (they may be long)."""
    notes = notes if notes is not None else (visible.notes if visible is not None else None)
    # images whose live state (engine/sandboxes/livestates.py) fork_from starts: a node's "live"
    live = visible.live if visible is not None else {r[0] for r in store.db.query("SELECT image FROM live_states")}
    if visible is not None:
        names = {i: list(v) for i, v in visible.tags.items()}
        for image, bs in visible.branches.items():
            names.setdefault(image, []).extend(f"branch:{b}" for b in bs)

        def children(image: str) -> list[tuple[str, str]]:
            return [(r[1], r[2]) for r in _edge_rows(store, image, False, visible)]
    else:
        names = {}
        for kind, name, image in store.db.query("SELECT kind, name, image FROM refs"):
            names.setdefault(image, []).append(name if kind == "tag" else f"branch:{name}")
        alive = {r[0] for r in store.db.query("SELECT id FROM images")}

        def children(image: str) -> list[tuple[str, str]]:      # removed ones (best_of losers) left out
            return [(c, op) for c, op in store.db.query(
                "SELECT child, op FROM edges WHERE parent=? ORDER BY created", (image,)) if c in alive]
    if via is None:
        def via(op: str) -> dict:
            r = store.db.one("SELECT kind, spec, outcome, started, finished FROM operations WHERE id=?", (op,))
            spec = json.loads(r[1]) if r else {}
            outcome = json.loads(r[2]) if r and r[2] else {}
            return {"command": spec.get("command") or (r[0] if r else None), "exit_code": outcome.get("exit_code"),
                    "seconds": _seconds(r[3], r[4]) if r else None}
    count, drawn = 0, set()
    top: list[dict] = []
    stack = [(root, None, None, top, 0)]        # (image, its edge's op and label, where it goes, depth)
    while stack:
        image, op, edge, into, depth = stack.pop()
        count += 1
        n = {"image": image, "short": image[:12], "names": sorted(names.get(image, [])), "op": op,
             "command": edge and edge["command"], "exit_code": edge and edge["exit_code"],
             "seconds": edge and edge.get("seconds"), "children": []}
        if image in live:
            n["live"] = True
        into.append(n)
        if image in drawn:                       # a merge reached from both parents: drawn once
            n["repeat"] = True
            continue
        drawn.add(image)
        if notes is not None:
            _annotate(n, notes(image))
        if count > max_nodes:
            if children(image):
                n["more"] = True
            continue
        kids, shown = [], set()
        for child, op in children(image):
            if child not in shown:
                shown.add(child)
                kids.append((child, op))
        if kids and depth >= MAX_TREE_DEPTH:
            n["cut"] = True
            continue
        for child, op in reversed(kids):         # popped in order: depth first, as drawn
            stack.append((child, op, via(op), n["children"], depth + 1))
    return top[0]


def _annotate(node: dict, notes: dict) -> None:
    if notes.get("score") is not None:
        node["score"] = notes["score"]
    metrics = {k: v for k, v in sorted((notes.get("meta") or {}).items())
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if metrics:
        node["metrics"] = metrics
