"""Lineage queries over the edges table: ancestors, descendants, paths, common ancestors, what
produced an image, and the tree under a root (as data; sandtree/render.py draws it)."""

from __future__ import annotations

import json
from collections import deque

from ..errors import NotFound
from ..store.store import Store


def _parents(store: Store, image: str) -> list[str]:
    return [r[0] for r in store.db.query("SELECT DISTINCT parent FROM edges WHERE child=? ORDER BY created", (image,))]


def _children(store: Store, image: str) -> list[str]:
    return [r[0] for r in store.db.query("SELECT DISTINCT child FROM edges WHERE parent=? ORDER BY created", (image,))]


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


def ancestors(store: Store, image: str) -> dict[str, int]:
    """Every ancestor with its distance (the image itself at 0)."""
    return _distances(image, lambda i: _parents(store, i))


def descendants(store: Store, image: str) -> dict[str, int]:
    return _distances(image, lambda i: _children(store, i))


def common_ancestor(store: Store, a: str, b: str) -> str | None:
    """The nearest common ancestor (least total distance; ties go to the newer image)."""
    da, db = ancestors(store, a), ancestors(store, b)
    common = set(da) & set(db)
    if not common:
        return None
    created = dict(store.db.query(f"SELECT id, created FROM images WHERE id IN ({','.join('?' * len(common))})",
                                  list(common)))
    return min(common, key=lambda x: (da[x] + db[x], -created.get(x, 0)))


def path(store: Store, a: str, b: str) -> list[str]:
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
            for c in _children(store, cur):
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
    base = common_ancestor(store, a, b)
    if base is None:
        raise NotFound("the two images share no ancestor")
    return chain(base, a)[::-1] + chain(base, b)[1:]


def produced_by(store: Store, image: str) -> list[dict]:
    rows = store.db.query("SELECT id, kind, source, spec, outcome, started FROM operations WHERE result=? "
                          "ORDER BY started", (image,))
    out = []
    for op, kind, source, spec, outcome, started in rows:
        spec, outcome = json.loads(spec), json.loads(outcome) if outcome else {}
        out.append({"op": op, "kind": kind, "source": source, "started": started,
                    "command": spec.get("command") or spec.get("source"), "exit_code": outcome.get("exit_code")})
    return out


MAX_TREE_NODES = 2000
# Nesting past this depth is cut (the node says "cut": its subtree is the tree of that image):
# lineage depth is a caller's to make (1,000 runs in a chain cost seconds), and nested JSON
# deeper than the interpreter's recursion limit cannot even be encoded.
MAX_TREE_DEPTH = 200


def tree(store: Store, root: str, *, max_nodes: int = MAX_TREE_NODES, children=None, names=None,
         via=None) -> dict:
    """The lineage tree under `root`: nested nodes with tags, branches and the command per edge.
    Iterative (no recursion on lineage depth). The tenant view passes its own filters:
    children(image) -> [(child, op)] in order, names: image -> [names], via(op) -> {"command",
    "exit_code"}; by default the whole store's."""
    if names is None:
        names = {}
        for kind, name, image in store.db.query("SELECT kind, name, image FROM refs"):
            names.setdefault(image, []).append(name if kind == "tag" else f"branch:{name}")
    if children is None:
        alive = {r[0] for r in store.db.query("SELECT id FROM images")}

        def children(image: str) -> list[tuple[str, str]]:      # removed ones (best_of losers) left out
            return [(c, op) for c, op in store.db.query(
                "SELECT child, op FROM edges WHERE parent=? ORDER BY created", (image,)) if c in alive]
    if via is None:
        def via(op: str) -> dict:
            r = store.db.one("SELECT kind, spec, outcome FROM operations WHERE id=?", (op,))
            spec = json.loads(r[1]) if r else {}
            outcome = json.loads(r[2]) if r and r[2] else {}
            return {"command": spec.get("command") or (r[0] if r else None), "exit_code": outcome.get("exit_code")}
    count, drawn = 0, set()
    top: list[dict] = []
    stack = [(root, None, top, 0)]              # (image, the edge that led here, where it goes, depth)
    while stack:
        image, edge, into, depth = stack.pop()
        count += 1
        n = {"image": image, "short": image[:12], "names": sorted(names.get(image, [])),
             "command": edge and edge["command"], "exit_code": edge and edge["exit_code"], "children": []}
        into.append(n)
        if image in drawn:                       # a merge reached from both parents: drawn once
            n["repeat"] = True
            continue
        drawn.add(image)
        if count > max_nodes:
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
            stack.append((child, via(op), n["children"], depth + 1))
    return top[0]
