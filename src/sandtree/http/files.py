"""/api/v1 files and credentials: uploads (stored once by sha256, then referenced by runs), file
sets, registry credentials for pulls, and stored secrets (runs name them; values never come back)."""

from __future__ import annotations

import functools

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.responses import FileResponse

from .bodylimit import spool, unstage
from .models import FileIn, LoginIn, SecretIn
from .plumbing import Plumbing


def files_router(p: Plumbing) -> APIRouter:
    router, engine, call = APIRouter(), p.engine, p.call

    @router.post("/api/v1/files", status_code=201)
    async def upload(request: Request) -> dict:
        """Upload once, reference many times: runs take {"path", "sha256"}."""
        path, digest, size = await spool(request, p.stage)
        try:
            return {"sha256": await call(engine.upload_file, path, digest), "size": size}
        finally:
            unstage(path)

    @router.get("/api/v1/files")
    async def uploads(limit: int = 100, offset: int = 0) -> list[dict]:
        """Uploaded files (sha256, size, created), newest first."""
        return await call(functools.partial(engine.uploads, limit=limit, offset=offset))

    @router.post("/api/v1/file-sets", status_code=201)
    async def file_set(body: list[FileIn]) -> dict:
        """A reusable set of uploaded files ({"path", "sha256", "mode"}); its ID is its content hash."""
        return {"id": await call(engine.file_set_create, [f.model_dump(exclude_none=True) for f in body])}

    @router.post("/api/v1/registries/login")
    async def registry_login(body: LoginIn) -> dict:
        return {"registry": await call(functools.partial(engine.registry_login, body.registry, body.username,
                                                         body.token, insecure=body.insecure))}

    @router.get("/api/v1/registries/host")
    async def registry_host(reference: str) -> dict:
        """The registry a URL or image reference names (docker://ghcr.io/org/x -> ghcr.io)."""
        return {"registry": await call(engine.registry_host, reference)}

    @router.put("/api/v1/secrets/{name}")
    async def secret_set(name: str, body: SecretIn) -> dict:
        """Store a secret runs name (secrets=["NAME"]): its name, hosts and times come back, never its value."""
        return await call(functools.partial(engine.secret_set, name, body.value, body.hosts, tenants=body.tenants,
                                            tenant=body.tenant))

    @router.get("/api/v1/secrets")
    async def secret_list(tenant: str | None = None) -> list[dict]:
        """The stored secrets the caller may use (its own, and the operator's shared with it)."""
        return await call(functools.partial(engine.secret_list, tenant=tenant))

    @router.delete("/api/v1/secrets/{name}")
    async def secret_remove(name: str, tenant: str | None = None) -> Response:
        await call(functools.partial(engine.secret_remove, name, tenant=tenant))
        return Response(status_code=204)

    @router.get("/api/v1/files/{sha256}/info")
    async def upload_info(sha256: str) -> dict:
        """An upload's size and time (the caller's own upload, or 404)."""
        return await call(engine.upload_info, sha256)

    @router.get("/api/v1/files/{sha256}")
    async def download(sha256: str) -> Response:
        """Streamed from the blob's file (read whole into memory, an upload was as large as the
        body cap, per request). upload_info is the caller's check: its own upload, or 404."""
        await call(engine.upload_info, sha256)
        return FileResponse(p.blob_path(sha256), media_type="application/octet-stream")

    return router
