"""/api/v1 lineage: the one route of branching and lineage that needs more than a call of the engine
(http/derived.py makes the others from the operation table): an image's lineage tree answered with its log."""

from __future__ import annotations

import functools

from fastapi import Query

from .. import defaults as D
from .derived import handler, resolved
from .plumbing import Plumbing


@handler("image_lineage")
def image_lineage(p: Plumbing):
    engine, call = p.engine, p.call

    async def image_lineage(ref: str, max_nodes: int = Query(D.LINEAGE_MAX_NODES, ge=1, le=100_000)) -> dict:
        i = await resolved(p, ref)
        return {"image": i, "log": await call(engine.log, i),
                "tree": await call(functools.partial(engine.lineage_tree, i, max_nodes=max_nodes))}
    return image_lineage
