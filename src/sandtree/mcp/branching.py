"""MCP tools for branching: diff, merge, the lineage tree, branches and rollback."""

from __future__ import annotations

from mcp.server.mcpserver.exceptions import ToolError

from ..render import render_text
from .toolkit import Toolkit


def register(t: Toolkit) -> None:
    engine = t.engine

    # ---- branching ----------------------------------------------------------------------------
    @t.tool
    def diff(a: str, b: str, patch: bool = False) -> dict:
        """What changed from image a to image b (paths and kinds); patch=true adds a unified text diff."""
        ia, ib = engine.resolve(a), engine.resolve(b)
        res = {"a": ia, "b": ib, "changes": [{"path": c.path, "kind": c.kind} for c in engine.diff(ia, ib)]}
        if patch:
            res["patch"] = engine.patch(ia, ib)
        return res

    @t.tool
    def merge(ours: str, theirs: str, base: str | None = None, strategy: str | None = None,
              ignore: list[str] | None = None, return_conflicts: bool = False) -> dict:
        """Three-way merge of two images (base: their common ancestor unless given). Conflicts make no
        image unless strategy is ours, theirs or markers (conflict markers in text files): the call
        fails with merge_conflict naming them (return_conflicts=true: returned as a list, image null).
        ignore: globs that never conflict, ours taken (default __pycache__/, *.pyc, .pytest_cache/)."""
        return engine.merge(engine.resolve(base) if base else None, engine.resolve(ours), engine.resolve(theirs),
                            strategy=strategy, ignore=ignore, on_conflict="return" if return_conflicts else "raise")

    @t.tool
    def lineage(image: str, format: str = "text") -> dict:
        """The tree of images made from `image` (text or json), with the commands between them."""
        tree = engine.lineage_tree(engine.resolve(image))
        if format == "json":
            return {"tree": tree}
        if format != "text":
            raise ToolError("invalid_input: format is text or json")
        return {"tree": render_text(tree), "ancestry": engine.log(engine.resolve(image), limit=20)}

    @t.tool
    def branch_create(name: str, image: str, force: bool = False) -> dict:
        """A branch: a name that run(image="branch:NAME") advances; rollback moves it back."""
        i = engine.resolve(image)
        engine.branch_create(name, i, force=force)
        return {"branch": name, "image": i}

    @t.tool
    def branch_list() -> dict:
        """Branches and the images they point at."""
        return engine.branches()

    @t.tool
    def rollback(branch: str, steps: int | None = None, to: str | None = None) -> dict:
        """Move a branch back: `steps` moves back in its history, or `to` an ancestor image."""
        return {"branch": branch, "image": engine.rollback(branch, steps=steps, to=engine.resolve(to) if to else None)}
