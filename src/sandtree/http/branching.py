"""/api/v1 branching and lineage: diff, merge (and its preview), branches and rollback; where an image came from
(parents, log, ancestors, produced-by) and what came from it (children, descendants, the tree)."""

from __future__ import annotations

import functools

from fastapi import APIRouter, Query

from .models import BranchIn, MergeIn, RollbackIn
from .plumbing import Plumbing


def branching_router(p: Plumbing) -> APIRouter:
    router, engine, call = APIRouter(), p.engine, p.call

    @router.get("/api/v1/diff")
    async def diff(a: str, b: str, patch: bool = False) -> dict:
        ia, ib = await call(engine.resolve, a), await call(engine.resolve, b)
        out = {"a": ia, "b": ib, "changes": [c.to_dict() for c in await call(engine.diff, ia, ib)]}
        if patch:
            out["patch"] = await call(engine.patch, ia, ib)
        return out

    @router.post("/api/v1/merge")
    async def merge(body: MergeIn) -> dict:
        resolve = engine.resolve
        base = await call(resolve, body.base) if body.base else None
        return await call(engine.merge, base, await call(resolve, body.ours), await call(resolve, body.theirs),
                          strategy=body.strategy, ignore=body.ignore, on_conflict=body.on_conflict)

    @router.get("/api/v1/merge/preview")
    async def merge_preview(ours: str, theirs: str, base: str | None = None) -> dict:
        resolve = engine.resolve
        b = await call(resolve, base) if base else None
        return await call(engine.merge_preview, b, await call(resolve, ours), await call(resolve, theirs))

    @router.get("/api/v1/branches")
    async def branches() -> dict:
        return await call(engine.branches)

    @router.post("/api/v1/branches", status_code=201)
    async def create_branch(body: BranchIn) -> dict:
        i = await call(engine.resolve, body.image)
        await call(engine.branch_create, body.name, i, force=body.force)
        return {"branch": body.name, "image": i}

    @router.delete("/api/v1/branches/{name:path}")
    async def delete_branch(name: str) -> dict:
        return {"branch": name, "image": await call(engine.branch_delete, name)}

    @router.get("/api/v1/branches/{name:path}/log")        # before GET /branches/{name}: it takes any suffix
    async def branch_log(name: str) -> list[dict]:
        return await call(engine.branch_log, name)

    @router.get("/api/v1/branches/{name:path}")
    async def branch_head(name: str) -> dict:
        return {"branch": name, "image": await call(engine.branch_head, name)}

    @router.post("/api/v1/branches/{name:path}/rollback")
    async def rollback(name: str, body: RollbackIn) -> dict:
        to = await call(engine.resolve, body.to) if body.to else None
        return {"branch": name, "image": await call(engine.rollback, name, to=to, steps=body.steps)}

    # ---- lineage ---------------------------------------------------------------------------------
    @router.get("/api/v1/images/{ref:path}/parents")
    async def parents(ref: str) -> list[dict]:
        return await call(engine.parents, await call(engine.resolve, ref))

    @router.get("/api/v1/images/{ref:path}/children")
    async def children(ref: str) -> list[dict]:
        return await call(engine.children, await call(engine.resolve, ref))

    @router.get("/api/v1/images/{ref:path}/log")
    async def log(ref: str, limit: int = Query(1000, ge=1, le=100_000)) -> list[dict]:
        return await call(engine.log, await call(engine.resolve, ref), limit)

    @router.get("/api/v1/images/{ref:path}/ancestors")
    async def ancestors(ref: str) -> dict:
        return await call(engine.ancestors, await call(engine.resolve, ref))

    @router.get("/api/v1/images/{ref:path}/descendants")
    async def descendants(ref: str) -> dict:
        return await call(engine.descendants, await call(engine.resolve, ref))

    @router.get("/api/v1/images/{ref:path}/produced-by")
    async def produced_by(ref: str) -> list[dict]:
        return await call(engine.produced_by, await call(engine.resolve, ref))

    @router.get("/api/v1/lineage/common")
    async def common(a: str, b: str) -> dict:
        return {"image": await call(engine.common_ancestor, await call(engine.resolve, a),
                                    await call(engine.resolve, b))}

    @router.get("/api/v1/lineage/path")
    async def lineage_path(a: str, b: str) -> list[str]:
        return await call(engine.lineage_path, await call(engine.resolve, a), await call(engine.resolve, b))

    @router.get("/api/v1/images/{ref:path}/lineage")
    async def image_lineage(ref: str, max_nodes: int = Query(2000, ge=1, le=100_000)) -> dict:
        i = await call(engine.resolve, ref)
        return {"image": i, "log": await call(engine.log, i),
                "tree": await call(functools.partial(engine.lineage_tree, i, max_nodes=max_nodes))}

    return router
