"""/api/v1 images and what is inside them: list, import, pull, tag, share, remove; ls, read,
stat, grep, export (no sandbox is started to look inside an image)."""

from __future__ import annotations

import functools
import json

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.responses import FileResponse

from .bodylimit import spool, staged_file, unstage
from .models import AnnotateIn, PullIn, PushIn, ShareIn, TagIn
from .plumbing import Plumbing

READ_CHUNK = 1 << 20      # bytes per chunk of a streamed file read


def images_router(p: Plumbing) -> APIRouter:
    """Its GET /images/{ref} takes any path below /images/ not matched before it: routers with
    /images/{ref}/... routes of their own (branching's lineage) are included ahead of this one."""
    router, engine, call = APIRouter(), p.engine, p.call

    @router.get("/api/v1/images")
    async def list_images() -> list[dict]:
        return await call(engine.images)

    @router.get("/api/v1/images/{ref:path}/ls")
    async def ls(ref: str, path: str = "/") -> list[dict]:
        i = await call(engine.resolve, ref)
        return [e.to_dict() for e in await call(engine.ls, i, path)]

    @router.get("/api/v1/images/{ref:path}/read")
    async def read(ref: str, path: str, offset: int = Query(0, ge=0), limit: int | None = Query(None, ge=0)) -> Response:
        """A file's bytes from `offset`, at most `limit`; streamed a chunk at a time (a large
        file read whole into memory per request was a way to exhaust the server's)."""
        i = await call(engine.resolve, ref)
        first = await call(engine.read, i, path, offset, min(limit, READ_CHUNK) if limit is not None else READ_CHUNK)
        if len(first) < READ_CHUNK or limit == len(first):
            return Response(first, media_type="application/octet-stream")

        async def rest():
            yield first
            pos, left = offset + len(first), None if limit is None else limit - len(first)
            while left is None or left > 0:
                chunk = await call(engine.read, i, path, pos, READ_CHUNK if left is None else min(left, READ_CHUNK))
                if not chunk:
                    return
                yield chunk
                pos += len(chunk)
                left = None if left is None else left - len(chunk)
        return StreamingResponse(rest(), media_type="application/octet-stream")

    @router.get("/api/v1/images/{ref:path}/stat")
    async def stat(ref: str, path: str) -> dict:
        i = await call(engine.resolve, ref)
        return (await call(engine.stat, i, path)).to_dict()

    @router.get("/api/v1/images/{ref:path}/grep")
    async def grep(ref: str, pattern: str, path: str = "/", glob: str | None = None,
                   max_matches: int = Query(1000, ge=1, le=100000), ignore_case: bool = False) -> list[dict]:
        i = await call(engine.resolve, ref)
        return await call(engine.grep, i, pattern, path, glob=glob, max_matches=max_matches, ignore_case=ignore_case)

    @router.get("/api/v1/images/{ref:path}/export")
    async def export(ref: str, path: str = "/") -> Response:
        i = await call(engine.resolve, ref)
        # built into a file on the store's disk and streamed from it (in memory, an export was
        # as large as the image, per request)
        tmp = await call(staged_file, p.stage, "export")
        try:
            with open(tmp, "xb") as f:
                await call(engine.export_tar, i, f, path)
        except BaseException:
            unstage(tmp)
            raise
        return FileResponse(tmp, media_type="application/x-tar", background=BackgroundTask(unstage, tmp))

    @router.get("/api/v1/images/{ref:path}/oci")
    async def export_oci(ref: str, name: str | None = None) -> Response:
        i = await call(engine.resolve, ref)
        tmp = await call(staged_file, p.stage, "export")     # on the store's disk, as export is
        try:
            with open(tmp, "xb") as f:
                res = await call(functools.partial(engine.export_oci, i, f, name=name))
        except BaseException:
            unstage(tmp)
            raise
        return FileResponse(tmp, media_type="application/x-tar", background=BackgroundTask(unstage, tmp),
                            headers={"X-Sandtree-OCI": json.dumps(res)})

    @router.post("/api/v1/images/{ref:path}/push")
    async def push(ref: str, body: PushIn) -> dict:
        i = await call(engine.resolve, ref)
        return await call(functools.partial(engine.push, i, body.reference, insecure=body.insecure))

    @router.get("/api/v1/resolve")
    async def resolve(ref: str) -> dict:
        return {"image": await call(engine.resolve, ref)}

    @router.get("/api/v1/tags")
    async def tags(image: str | None = None) -> dict:
        return await call(engine.tags, image)

    @router.post("/api/v1/images/{ref:path}/share")
    async def share(ref: str, body: ShareIn) -> dict:
        """Make an image (one the caller owns) visible to every tenant by its ID, or stop that."""
        i = await call(engine.resolve, ref)
        return await call(engine.share if body.public else engine.unshare, i)

    @router.delete("/api/v1/images/{ref:path}")
    async def remove_image(ref: str, force: bool = False) -> dict:
        i = await call(engine.resolve, ref)
        await call(engine.remove_image, i, force=force)
        return {"removed": i}

    @router.get("/api/v1/images/{ref:path}")
    async def get_image(ref: str) -> dict:
        return await call(engine.image_info, await call(engine.resolve, ref))

    @router.post("/api/v1/images/import", status_code=201)
    async def import_tar(request: Request, tag: str | None = None) -> dict:
        """The body is a tar (plain, gzip or zstd) of a root filesystem, or an OCI/docker archive."""
        path, _, _ = await spool(request, p.stage)
        try:
            return {"image": await call(engine.import_path, path, tag=tag), "tag": tag}
        finally:
            unstage(path)

    @router.post("/api/v1/images/pull", status_code=201)
    async def pull(body: PullIn) -> dict:
        return {"image": await call(functools.partial(engine.pull, body.reference, tag=body.tag,
                                                      insecure=body.insecure)), "tag": body.tag}

    @router.put("/api/v1/tags/{name:path}")
    async def set_tag(name: str, body: TagIn) -> dict:
        i = await call(engine.resolve, body.image)
        await call(engine.tag, i, name)
        return {"tag": name, "image": i}

    @router.post("/api/v1/images/{image:path}/annotations")
    async def annotate(image: str, body: AnnotateIn) -> dict:
        return await call(engine.annotate, await call(engine.resolve, image), body.score, body.meta)

    @router.delete("/api/v1/tags/{name:path}")
    async def delete_tag(name: str) -> dict:
        return {"tag": name, "image": await call(engine.untag, name)}

    return router
