"""Inspection (a mixin of engine.Engine): an image's files without running it (store/inspect.py)
and its history (what made it, from what: records.py's operation rows and edges)."""

from __future__ import annotations

from ... import defaults as D
from ...branching import lineage
from ...store import inspect
from ...store.objects import Entry


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

    def operation(self, op: str) -> dict:
        return self.records.get(op)

    def log(self, image: str, limit: int = D.LOG_LIMIT) -> list[dict]:
        """Ancestry, newest first: each image with the operation that made it from its parent
        (branching/lineage.py's walk, unfiltered; a tenant's view gives it its filter)."""
        return lineage.log(self.store, image, limit)
