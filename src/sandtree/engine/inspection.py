"""Inspection (a mixin of engine.Engine): an image's files without running it (store/inspect.py)
and its history (what made it, from what: records.py's operation rows and edges)."""

from __future__ import annotations

from ..store import inspect
from ..store.objects import Entry


class InspectionOps:
    """Mixed into engine.Engine, which provides store and records."""

    # ---- files ---------------------------------------------------------------------------------
    def ls(self, image: str, path: str = "/") -> list[Entry]:
        return inspect.listdir(self.store, image, path)

    def stat(self, image: str, path: str) -> Entry:
        return inspect.resolve(self.store, image, path, follow=False)[1]

    def read(self, image: str, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        return inspect.read(self.store, image, path, offset=offset, limit=limit)

    def grep(self, image: str, pattern: str, path: str = "/", **kw) -> list[dict]:
        return inspect.grep(self.store, image, pattern, path, **kw)

    def export_tar(self, image: str, fileobj, path: str = "/") -> None:
        inspect.export_tar(self.store, image, fileobj, path)

    # ---- history -------------------------------------------------------------------------------
    def parents(self, image: str) -> list[dict]:
        return self.records.parents(image)

    def children(self, image: str) -> list[dict]:
        return self.records.children(image)

    def _edge(self, row) -> dict:
        # (tenancy/tenants.py calls these two; they are records.py's edge_view and summary)
        return self.records.edge_view(row)

    def _op_summary(self, op: str) -> dict:
        return self.records.summary(op)

    def operation(self, op: str) -> dict:
        return self.records.get(op)

    def log(self, image: str, limit: int = 1000) -> list[dict]:
        """Ancestry, newest first: each image with the operation that made it from its parent."""
        out, seen, todo = [], set(), [image]
        while todo and len(out) < limit:
            cur = todo.pop(0)
            if cur in seen:
                continue
            seen.add(cur)
            parents = self.parents(cur)
            if not parents:
                made = self.records.import_of(cur)
                out.append({"image": cur, "parents": [], "command": made[1]["source"] if made else None,
                            "op": made[0] if made else None, "exit_code": None,
                            "tags": sorted(self.store.tags(cur))})
                continue
            first = parents[0]
            out.append({"image": cur, "parents": [p["parent"] for p in parents], "command": first.get("command"),
                        "op": first["op"], "exit_code": first.get("exit_code"),
                        "tags": sorted(self.store.tags(cur))})
            todo.extend(p["parent"] for p in parents)
        return out
