"""The engine's branching operations (a mixin of engine.Engine): diff, merge, branches, lineage
queries and bundles, wired to the store. The algorithms live in sandtree/branching/ (diff,
merge, lineage, bundle) and store/refs.py; here they meet layers and transactions."""

from __future__ import annotations

import os
import time
import uuid

from ..runs import commit as commit_mod
from ...store.blobs import BlobStore
from ...store.db import Database
from ...store.delta import write_delta
from ...store.layers import remove_tree
from ...store.objects import DIR, FILE, decode_tree
from ...store.store import Store
from ...branching import lineage
from ...store import durable, refs
from .. import parts             # diff, merge, bundle: loaded when first used (start-up time: parts.py)
from ..runs.records import Records
from .annotations import shown_annotations

PREVIEW_FILES, PREVIEW_BYTES = 50, 256 * 1024     # a merge preview's marked files: how many, how much of each




class BranchingOps:
    """Mixed into engine.Engine (which provides self.store): diff, merge, branches, lineage and
    bundles. New images made from objects get a delta layer on a parent (store/delta.py)."""

    # ---- diff and merge ------------------------------------------------------------------------
    def diff(self, a: str, b: str) -> list:
        return parts.diff.diff(self.store, a, b)

    def patch(self, a: str, b: str) -> str:
        return parts.diff.patch(self.store, parts.diff.diff(self.store, a, b))

    def merge(self, base: str | None, ours: str, theirs: str, *, strategy: str | None = None,
              ignore: list[str] | None = None, on_conflict: str = "raise") -> dict:
        """{"image", "base", "conflicts", "ignored"}. Conflicts left without a strategy make no
        image and raise MergeConflict (its details list them) unless on_conflict="return", which
        returns them with image None. ignore: globs that never conflict (merge.DEFAULT_IGNORE if
        None; [] for none): ours is taken there."""
        parts.merge.check_on_conflict(on_conflict)
        with self.store.using():
            res = self._merge(base, ours, theirs, strategy=strategy, ignore=ignore)
        return parts.merge.conflict_outcome(res, on_conflict)

    def merge_preview(self, base: str | None, ours: str, theirs: str) -> dict:
        """{"base", "clean", "conflicts", "ignored", "marked"}: what merge would do, writing nothing
        (its trees and blobs stay in memory). marked: each conflicted text file as the "markers"
        strategy would leave it (at most PREVIEW_FILES files of PREVIEW_BYTES each)."""
        if base is None:
            base = lineage.common_ancestor(self.store, ours, theirs)
        plain = parts.merge.merge_trees(self.store, base, ours, theirs, None, None)
        out = {"base": base, "clean": not plain.conflicts, "conflicts": [c.to_dict() for c in plain.conflicts],
               "ignored": plain.ignored, "marked": []}
        if plain.conflicts:
            mk = parts.merge.merge_trees(self.store, base, ours, theirs, "markers", None)
            for c in plain.conflicts[:PREVIEW_FILES]:
                e = _lookup(self.store, mk.trees, mk.root, c.path)
                if e is None or e.kind != FILE:
                    continue
                if e.ref in mk.blobs:
                    data = mk.blobs[e.ref][:PREVIEW_BYTES]
                else:
                    with self.store.blobs.open(e.ref) as f:
                        data = f.read(PREVIEW_BYTES)
                if b"\0" not in data:
                    out["marked"].append({"path": c.path, "text": data.decode("utf-8", "replace"),
                                          "truncated": e.size > PREVIEW_BYTES})
        return out

    def _merge(self, base: str | None, ours: str, theirs: str, *, strategy: str | None = None,
               ignore: list[str] | None = None) -> dict:
        """{"image": id or None, "base": id, "conflicts": [...], "ignored": [...]}: an image only
        if the merge is clean or a strategy resolved it; its lineage has both ours and theirs as parents."""
        if base is None:
            base = lineage.common_ancestor(self.store, ours, theirs)
        tm = parts.merge.merge_trees(self.store, base, ours, theirs, strategy, ignore)
        result = {"image": None, "base": base, "conflicts": [c.to_dict() for c in tm.conflicts],
                  "ignored": tm.ignored}
        if tm.root is None:
            return result
        for _digest, data in tm.blobs.items():
            self.store.blobs.put_bytes(data)
        links = self._links_of(tm.root, tm.trees, [ours, theirs])
        write = self._image_from_trees(tm.root, tm.trees, links, ours)
        op = uuid.uuid4().hex
        now = time.time()
        spec = {"command": f"merge {theirs[:12]} into {ours[:12]}" + (f" ({strategy})" if strategy else ""),
                "base": base, "ours": ours, "theirs": theirs, "strategy": strategy}
        with self.store.db.tx() as con:
            if write is not None:
                write(con)
            Records.write(con, op, "merge", ours, tm.root, spec, {"conflicts": len(tm.conflicts)}, now, now,
                          parents=(ours, theirs), replace=False)
        result["image"] = tm.root
        return result

    def _links_of(self, root: str, trees: dict[str, bytes], sources: list[str]) -> dict[str, list[str]]:
        """Hard-link groups of a new tree, found from its sources' groups (cost: the links)."""
        groups: dict[str, list[str]] = {}
        candidates = {p for s in sources for members in self.store.image(s).links.values() for p in members}
        for p in sorted(candidates, key=commit_mod.path_key):
            e = _lookup(self.store, trees, root, p)
            if e is not None and e.hl:
                groups.setdefault(e.hl, []).append(p)
        return {k: v for k, v in groups.items() if len(v) > 1}

    def _image_from_trees(self, root: str, trees: dict[str, bytes], links: dict, parent: str | None):
        """Publish a delta layer turning `parent` into `root`; returns write(con) or None if the
        image exists. The delta is what differs (identical subtrees are skipped)."""
        if self.store.has_image(root):
            return None
        below = self.store.image(parent).layers if parent else []
        if len(below) + 1 > commit_mod.MAX_LAYERS:
            parent, below = None, []
        staged = self.store.layers.stage("delta")
        tree = lambda h: decode_tree(trees[h]) if h in trees else self.store.tree(h)
        try:
            locations = write_delta(self.store, parent, root, staged, tree, self.store.blobs.path, links)
        except BaseException:
            remove_tree(staged)
            raise
        layer = self.store.layers.publish(staged)
        size, files = _totals(tree, root)

        def write(con):
            Database.put_trees(con, trees)
            if Store.insert_image(con, root, [layer] + below, links, size, files):
                BlobStore.record(con, {h: f"layers/{layer}/{p}" for h, p in locations.items()})
        return write

    # ---- branches ------------------------------------------------------------------------------
    def branch_create(self, name: str, image: str, *, force: bool = False) -> None:
        refs.create(self.store, name, image, force=force)

    def branch_delete(self, name: str) -> str:
        return refs.delete(self.store, name)

    def branches(self) -> dict[str, str]:
        return refs.branches(self.store)

    def branch_log(self, name: str) -> list[dict]:
        refs.head(self.store, name)
        return refs.reflog(self.store, name)

    def rollback(self, name: str, *, to: str | None = None, steps: int | None = None) -> str:
        target = refs.rollback_target(self.store, name, steps=steps, to=to,
                                      is_ancestor=lambda a, b: a in lineage.ancestors(self.store, b))
        refs.advance(self.store, name, refs.head(self.store, name), target, "rollback")
        return target

    # ---- lineage -------------------------------------------------------------------------------
    def ancestors(self, image: str) -> dict[str, int]:
        return lineage.ancestors(self.store, image)

    def descendants(self, image: str) -> dict[str, int]:
        return lineage.descendants(self.store, image)

    def common_ancestor(self, a: str, b: str) -> str | None:
        return lineage.common_ancestor(self.store, a, b)

    def lineage_path(self, a: str, b: str) -> list[str]:
        return lineage.path(self.store, a, b)

    def produced_by(self, image: str) -> list[dict]:
        return lineage.produced_by(self.store, image)

    def lineage_tree(self, root: str, *, max_nodes: int = lineage.MAX_TREE_NODES) -> dict:
        return lineage.tree(self.store, root, max_nodes=max_nodes,
                            notes=lambda image: shown_annotations(self.store.db, image))

    # ---- bundles -------------------------------------------------------------------------------
    def bundle_create(self, path: str, images: list[str], *, with_ancestry: bool = False) -> dict:
        tmp = path + ".part"
        with open(tmp, "wb") as f:
            info = parts.bundle.create(self.store, f, images, with_ancestry=with_ancestry,
                                 ancestors=lambda i: sorted(lineage.ancestors(self.store, i),
                                                            key=lambda x: -lineage.ancestors(self.store, i)[x]))
        os.replace(tmp, path)
        return {"file": path, **info}

    def bundle_import(self, path: str) -> dict:
        with self.store.using():
            return self._bundle_import(path)

    def _bundle_import(self, path: str) -> dict:
        staging = self.store.layers.stage("bundle")
        try:
            with open(path, "rb") as f:
                man, trees, blobs = parts.bundle.read(self.store, f, staging)
            durable.sync_tree(staging)                     # on the disk before any row names them
            shards = set()
            for name in os.listdir(staging):               # verified: now they are the store's
                dst = self.store.blobs.file_path(name)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.rename(os.path.join(staging, name), dst)
                shards.add(os.path.dirname(dst))
            for d in [*shards, self.store.blobs.root]:
                durable.sync_dir(d)
        finally:
            remove_tree(staging)
        parents: dict[str, list[str]] = {}
        for e in man["edges"]:
            parents.setdefault(e["child"], []).append(e["parent"])
        order, seen = [], set()
        info = {i["id"]: i for i in man["images"]}
        for start in info:                     # parents first; iterative (a bundle's depth is untrusted)
            stack = [(start, iter(parents.get(start, [])))] if start not in seen else []
            seen.add(start)
            while stack:
                node, it = stack[-1]
                p = next(it, None)
                if p is None:
                    stack.pop()
                    order.append(node)
                elif p not in seen:
                    seen.add(p)
                    stack.append((p, iter(parents.get(p, []))))
        imported = []
        for image in order:
            if image not in info or self.store.has_image(image):
                continue
            base = next((p for p in parents.get(image, []) if self.store.has_image(p)), None)
            write = self._image_from_trees(image, trees, info[image].get("links", {}), base)
            with self.store.db.tx() as con:
                if write is not None:
                    write(con)
            imported.append(image)
        with self.store.db.tx() as con:
            Database.put_trees(con, trees)
            for op_id, op in man["operations"].items():
                Records.copy(con, op_id, op)
            for e in man["edges"]:
                Records.edge(con, e["parent"], e["child"], e["op"], time.time())
            skipped = []
            for r in man.get("refs", []):
                held = refs.target(con, "tag", r["name"])
                if held is None:
                    refs.set_tag(con, r["name"], r["image"], "bundle import")
                elif held != r["image"]:
                    skipped.append(r["name"])
        return {"images": [i["id"] for i in man["images"]], "imported": imported, "tags_skipped": skipped}


def _lookup(store: Store, trees: dict[str, bytes], root: str, path: str):
    h = root
    parts = path.strip("/").split("/")
    for i, part in enumerate(parts):
        t = decode_tree(trees[h]) if h in trees else store.tree(h)
        e = t.get(part)
        if e is None:
            return None
        if i == len(parts) - 1:
            return e
        if e.kind != DIR:
            return None
        h = e.ref
    return None


def _totals(tree, root: str) -> tuple[int, int]:
    size = files = 0
    todo = [root]
    while todo:
        for name, e in tree(todo.pop()).items():
            if name == ".":
                continue
            if e.kind == DIR:
                todo.append(e.ref)
            elif e.kind == FILE:
                size += e.size
                files += 1
    return size, files
