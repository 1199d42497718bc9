"""/api/v1 images: the routes that need more than a call of the engine (http/derived.py makes the others from
the operation table): a file's bytes streamed, grep's options, an image exported as a tar or an OCI layout (staged
on the store's disk, then streamed), an image tar imported (spooled under the upload cap)."""

from __future__ import annotations

import functools
import json

from fastapi import Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.responses import FileResponse

from .. import defaults as D
from .bodylimit import spool, staged_file, unstage
from .derived import handler, resolved
from .plumbing import Plumbing

READ_CHUNK = 1 << 20      # bytes per chunk of a streamed file read


@handler("read")
def read(p: Plumbing):
    engine, call = p.engine, p.call

    async def read(ref: str, path: str, offset: int = Query(0, ge=0), limit: int | None = Query(None, ge=0)) -> Response:
        """A file's bytes from `offset`, at most `limit`; streamed a chunk at a time (a large
        file read whole into memory per request was a way to exhaust the server's)."""
        i = await resolved(p, ref)
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
    return read


@handler("grep")
def grep(p: Plumbing):
    """(The row's **kw are the engine's glob, max_matches and ignore_case: named here until the row names them.)"""
    engine, call = p.engine, p.call

    async def grep(ref: str, pattern: str, path: str = "/", glob: str | None = None,
                   max_matches: int = Query(D.GREP_MAX_MATCHES, ge=1, le=100000),
                   ignore_case: bool = False) -> list[dict]:
        i = await resolved(p, ref)
        return await call(engine.grep, i, pattern, path, glob=glob, max_matches=max_matches, ignore_case=ignore_case)
    return grep


@handler("export")
def export(p: Plumbing):
    engine, call = p.engine, p.call

    async def export(ref: str, path: str = "/") -> Response:
        i = await resolved(p, ref)
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
    return export


@handler("export_oci")
def export_oci(p: Plumbing):
    engine, call = p.engine, p.call

    async def export_oci(ref: str, name: str | None = None) -> Response:
        i = await resolved(p, ref)
        tmp = await call(staged_file, p.stage, "export")     # on the store's disk, as export is
        try:
            with open(tmp, "xb") as f:
                res = await call(functools.partial(engine.export_oci, i, f, name=name))
        except BaseException:
            unstage(tmp)
            raise
        return FileResponse(tmp, media_type="application/x-tar", background=BackgroundTask(unstage, tmp),
                            headers={"X-Sandtree-OCI": json.dumps(res)})
    return export_oci


@handler("import_tar")
def import_tar(p: Plumbing):
    engine, call = p.engine, p.call

    async def import_tar(request: Request, tag: str | None = None) -> dict:
        """The body is a tar (plain, gzip or zstd) of a root filesystem, or an OCI/docker archive."""
        path, _, _ = await spool(request, p.stage)
        try:
            return {"image": await call(engine.import_path, path, tag=tag), "tag": tag}
        finally:
            unstage(path)
    return import_tar
