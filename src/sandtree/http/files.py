"""/api/v1 files: the routes that need more than a call of the engine (http/derived.py makes the others from
the operation table): an upload spooled to the store's disk under the caller's cap, a download streamed from
the blob's own file."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import FileResponse

from .bodylimit import spool, unstage
from .derived import handler
from .plumbing import Plumbing


@handler("upload")
def upload(p: Plumbing):
    engine, call = p.engine, p.call

    async def upload(request: Request) -> dict:
        """Upload once, reference many times: runs take {"path", "sha256"}."""
        path, digest, size = await spool(request, p.stage)
        try:
            return {"sha256": await call(engine.upload_file, path, digest), "size": size}
        finally:
            unstage(path)
    return upload


@handler("download")
def download(p: Plumbing):
    engine, call = p.engine, p.call

    async def download(sha256: str):
        """Streamed from the blob's file (read whole into memory, an upload was as large as the
        body cap, per request). upload_info is the caller's check: its own upload, or 404."""
        await call(engine.upload_info, sha256)
        return FileResponse(p.blob_path(sha256), media_type="application/octet-stream")
    return download
