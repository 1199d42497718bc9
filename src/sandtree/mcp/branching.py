"""MCP tools for branching written by hand: diff (with its patch), merge (return_conflicts), the lineage tree
(text or json). branch_create, branch_list, rollback and merge_preview are made from their rows (maker.py). Image
arguments arrive resolved to full IDs (the rows' Mcp.resolve)."""

from __future__ import annotations

from ..errors import InvalidInput, MergeConflict
from ..render import render_text
from .toolkit import Toolkit


def register(t: Toolkit) -> None:
    engine = t.engine

    # ---- branching ----------------------------------------------------------------------------
    @t.handler
    def diff(a: str, b: str, patch: bool = False) -> dict:
        """What changed from image a to image b (paths and kinds); patch=true adds a unified text diff."""
        res = {"a": a, "b": b, "changes": [{"path": c.path, "kind": c.kind} for c in engine.diff(a, b)]}
        if patch:
            res["patch"] = engine.patch(a, b)
        return res

    @t.handler
    def merge(ours: str, theirs: str, base: str | None = None, strategy: str | None = None,
              ignore: list[str] | None = None, return_conflicts: bool = False) -> dict:
        return engine.merge(base, ours, theirs, strategy=strategy, ignore=ignore,
                            on_conflict="return" if return_conflicts else "raise")
    # its description names the error by the class's own code (a docstring cannot be an f-string)
    merge.__doc__ = f"""Three-way merge of two images into a new one. A conflict fails with {MergeConflict.code}
        unless strategy is ours, theirs or markers (conflict markers in text files) or return_conflicts=true.
        ignore: globs that never conflict, ours taken (default __pycache__/, *.pyc, .pytest_cache/)."""

    @t.handler
    def lineage(image: str, format: str = "text") -> dict:
        """The tree of images made from `image` (text or json), with the commands between them."""
        tree = engine.lineage_tree(image)
        if format == "json":
            return {"tree": tree}
        if format != "text":
            raise InvalidInput("format is text or json")
        return {"tree": render_text(tree), "ancestry": engine.log(image, limit=20)}

