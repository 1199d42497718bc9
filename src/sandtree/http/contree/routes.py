"""The Contree-compatible API under /v1, so Nebius Contree's own clients (contree-sdk,
contree-mcp, contree-client) work unmodified against `sandtree serve`.

An adapter like server.py: each route translates one request into engine calls and the answer
into Contree's wire shapes (contree/wire.py; Contree's OpenAPI document ships in the
`contree-client` wheel). Every route gets its engine from `engine_for(request)`, so a per-token
engine can be swapped in.

Errors are Contree's `{"error": message, "status": code}`; malformed requests are 400.
Tokens (Authorization: Bearer) are checked in front of this router by the TenantGate
(httpauth.py), as for /api/v1: each request runs against its tenant's view of the engine.
"""

import asyncio
import base64
import gzip
import io
import json
import re
import stat as stat_mod
import uuid as uuid_mod
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import (
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)

from . import compat
from . import wire
from .subprocesses import live_options, proc_events, subprocesses_router
from ..plumbing import shaped_route
from ..bodylimit import spool, unstage
from ... import config
from ...errors import InvalidInput, NotFound, SandtreeError


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status)


def _engine_error(exc: SandtreeError) -> JSONResponse:
    out = error(exc.http_status, exc.message)          # errors.py: one table
    if exc.http_status == 425:                         # NotReady: Contree's clients retry after it
        out.headers["Retry-After"] = str(exc.details.get("retry_after", 1))
    return out


# Engine errors and request validation errors in Contree's error shape
ContreeRoute = shaped_route(error, _engine_error)


def contree_router(engine_for, stage) -> APIRouter:
    """stage: where upload bodies are spooled (the store's LayerDirs.stage: never memory)."""
    router = APIRouter(prefix="/v1", route_class=ContreeRoute, tags=["contree"])

    def engine_dep(request: Request):
        return engine_for(request)      # typed here: FastAPI takes an unannotated `request` for a query
    Engine = Annotated[Any, Depends(engine_dep)]

    def call(fn, *a, **k):
        return asyncio.to_thread(fn, *a, **k)

    async def resolved(engine, image_uuid: str) -> str:
        """The image a path's UUID names (Contree's image UUID is the ID's first 32 hex digits)."""
        return await call(engine.resolve, wire.from_uuid(image_uuid, "image"))

    # ---- auth ------------------------------------------------------------------------------------
    @router.get("/whoami")
    async def whoami(engine: Engine) -> dict:
        me = await call(engine.whoami)
        granted = {p for s in me.get("scopes", []) for p in wire.PERMISSIONS.get(s, [s])}
        known = {p for ps in wire.PERMISSIONS.values() for p in ps} | granted
        lim = me.get("limits") or {}
        limits = {"instance_max_timeout": lim.get("timeout"), "instance_max_concurrency": lim.get("concurrent_runs"),
                  "instance_max_memory": lim.get("memory"), "instance_max_pids": lim.get("pids"),
                  "instance_max_layer_bytes": lim.get("disk"), "instance_max_output": lim.get("output")}
        stat: dict[str, int] = {}
        for rec in await call(engine.operations.list, limit=1000):      # the recent ones, by status
            key = wire.OP_STATUS.get(rec["status"], "FAILED")
            stat[key] = stat.get(key, 0) + 1
        return {"token_uuid": str(uuid_mod.uuid5(uuid_mod.NAMESPACE_URL, f"sandtree:tenant:{me.get('tenant')}")),
                "token_expiration": None, "permissions": {p: p in granted for p in sorted(known)},
                "limits": {k: int(v) for k, v in limits.items() if v is not None}, "operations_stat": stat}

    # ---- images ----------------------------------------------------------------------------------
    @router.get("/images")
    async def list_images(engine: Engine, limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0),
                          tagged_only: str | None = Query(None, alias="tagged"), tag: str | None = None,
                          uuid: str | None = None, kind: int | None = Query(None, ge=0, le=1),
                          since: str | None = None, until: str | None = None) -> dict:
        t0, t1 = wire.parse_time(since, "since"), wire.parse_time(until, "until")
        want = wire.from_uuid(uuid, "uuid") if uuid else None
        out = []
        for info in reversed(await call(engine.images)):           # newest first
            tags = info["tags"]
            if tag is not None:
                tags = [t for t in tags if t.startswith(tag)]
            if ((tag is not None or wire.flag(tagged_only)) and not tags) or (want and info["id"][:32] != want) or \
                    (t0 is not None and info["created"] < t0) or (t1 is not None and info["created"] > t1):
                continue
            if kind is not None and bool(await call(engine.parents, info["id"])) != (kind == 0):
                continue                                             # 0: made by runs, 1: imported
            out.append(wire.image_view(info, tags[0] if tags else None))
        return {"images": out[offset:offset + limit]}

    @router.patch("/images/{image_uuid}/tag")
    async def set_tag(image_uuid: str, body: wire.TagIn, engine: Engine) -> dict:
        image = await resolved(engine, image_uuid)
        await call(engine.tag, image, body.tag)              # a tag on another image moves here
        return wire.image_view(await call(engine.image_info, image), body.tag)

    @router.delete("/images/{image_uuid}/tag", status_code=204)
    async def remove_tag(image_uuid: str, engine: Engine, tag: str | None = None) -> Response:
        image = await resolved(engine, image_uuid)
        names = sorted(await call(engine.tags, image))
        if tag is not None:
            if tag not in names:
                raise NotFound(f"image {image_uuid} has no tag {tag!r}")
            names = [tag]
        for name in names:
            await call(engine.untag, name)
        return Response(status_code=204)

    @router.post("/images/import", status_code=201)
    async def import_image(body: wire.ImportIn, request: Request, engine: Engine) -> JSONResponse:
        """A registry pull as an operation (credentials are kept for the registry's later pulls)."""
        reference = body.registry.url if "://" in body.registry.url else f"docker://{body.registry.url}"
        creds = body.registry.credentials
        op = await call(engine.operations.submit_pull, reference, tag=body.tag,
                        credentials=(creds.username, creds.password) if creds else None)
        return JSONResponse({"uuid": wire.to_uuid(op)}, status_code=201,
                            headers={"Location": f"{request.scope.get('root_path', '')}/v1/operations/{wire.to_uuid(op)}"})

    # ---- files -----------------------------------------------------------------------------------
    def file_view(info: dict) -> dict:
        return {"uuid": wire.to_uuid(info["sha256"]), "sha256": info["sha256"], "size": info["size"]}

    @router.post("/files", status_code=201)
    async def upload(request: Request, engine: Engine) -> dict:
        path, sha, size = await spool(request, stage)      # streamed to disk under bodylimit's cap
        try:
            return file_view({"sha256": await call(engine.upload_file, path, sha), "size": size})
        finally:
            unstage(path)

    @router.get("/files")
    async def list_uploads(engine: Engine, limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0),
                           since: str | None = None, until: str | None = None) -> dict:
        """FilesListResponse: the caller's uploads, newest first (since/until: as for images)."""
        t0, t1 = wire.parse_time(since, "since"), wire.parse_time(until, "until")
        infos = [i for i in await call(engine.uploads, limit=1000)
                 if (t0 is None or i["created"] >= t0) and (t1 is None or i["created"] <= t1)]
        return {"files": [{**file_view(i), "created_at": wire.iso(i["created"]), "updated_at": wire.iso(i["created"])}
                          for i in infos[offset:offset + limit]]}

    def digest(sha256: str) -> str:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
            raise InvalidInput(f"sha256 must be 64 hex digits, not {sha256!r}")
        return sha256.lower()

    @router.get("/files/{sha256}")
    async def file_info(sha256: str, engine: Engine) -> dict:
        info = await call(engine.upload_info, digest(sha256))
        return {**file_view(info), "created_at": wire.iso(info["created"]), "updated_at": wire.iso(info["created"])}

    @router.head("/files/{sha256}")
    async def file_exists(sha256: str, engine: Engine) -> Response:
        await call(engine.upload_info, digest(sha256))
        return Response(status_code=200)

    # ---- instances and operations ----------------------------------------------------------------
    @router.post("/instances", status_code=201)
    async def spawn(body: wire.SpawnIn, request: Request, engine: Engine) -> JSONResponse:
        image = await call(wire.image_of, engine, body.image)
        files = []
        for path, f in (body.files or {}).items():
            sha = await call(engine.find_upload, wire.from_uuid(f.uuid, f"files[{path}].uuid"))
            files.append({"path": path, "sha256": sha, "mode": f.mode, "uid": f.uid, "gid": f.gid})
        stdin = None
        if body.stdin is not None and body.stdin.value:
            try:
                stdin = (base64.b64decode(body.stdin.value, validate=True) if body.stdin.encoding == "base64"
                         else body.stdin.value.encode())
            except ValueError:
                raise InvalidInput("stdin.value is not valid base64") from None
        cwd = body.cwd.rstrip("/") or (None if not body.cwd else "/")     # "": the image's own, else /
        if body.preserve_cwd and (keep := await call(compat.preserve_cwd_file, engine, image, cwd, body.disposable)):
            files.append(keep)
        if body.preserve_env:
            files = await call(compat.preserve_env_files, engine, image, body.env or {}, body.disposable, files)
        opts: dict[str, Any] = {
            "env": {k: v for k, v in (body.env or {}).items() if v is not None},   # null unsets: none set
            "cwd": cwd, "uid": body.uid, "gid": body.gid,
            "hostname": body.hostname or "sandtree", "stdin": stdin,
            # a disposable run's end state is still the result's image (Contree's clients chain on it)
            "disposable": "ephemeral" if body.disposable else False,
            "files": files, "timeout": body.timeout, "output": body.truncate_output_at,
            "disk": body.resources_limits.max_layer_bytes if body.resources_limits else None,
            # enabled: the server's configured default policy; false or absent: none
            "network": compat.network_for(body.networking and body.networking.enabled, config.network_default())}
        command = body.command if body.shell else [body.command, *body.args]
        op = await call(engine.operations.submit_run, image, command, **opts, **live_options(body))
        echo = body.model_dump(exclude_none=True)
        echo.update(uuid=wire.to_uuid(op), image=wire.to_uuid(image), result=None)
        return JSONResponse(echo, status_code=201,
                            headers={"Location": f"{request.scope.get('root_path', '')}/v1/operations/{wire.to_uuid(op)}"})

    def view(engine, op: str, inflight: bool = False) -> dict:
        ops = engine.operations
        rec = ops.get(op)
        if rec["status"] in ("done", "failed", "cancelled"):
            rec = ops.wait([op], 10)[0]     # the row is written just before the run's record is handed over
        out = wire.operation_view(rec, ops.result(op) if rec["kind"] == "run" else None)
        out["error"] = compat.spawn_failure(rec.get("outcome")) or out["error"]
        if inflight and rec["status"] == "running" and rec["kind"] == "run":
            # the output so far, from the live event log (?inflight, as Contree does)
            events, _ = ops.events_after(op, 0, 0)
            streams = {k: "".join(d for _, kind, d in events if kind == k).encode() for k in ("stdout", "stderr")}
            out["metadata"]["result"] = {k: wire.stream_repr(v) for k, v in streams.items()}
        return out

    @router.get("/operations")
    async def list_operations(engine: Engine, limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0),
                              status: str | None = Query(None, pattern="^(PENDING|ASSIGNED|EXECUTING|SUCCESS|FAILED|CANCELLED)$"),
                              kind: str | None = Query(None, pattern="^(image_import|instance)$"),
                              since: str | None = None, until: str | None = None) -> list[dict]:
        t0, t1 = wire.parse_time(since, "since"), wire.parse_time(until, "until")
        if status == "ASSIGNED":
            return []                       # nothing is ever ASSIGNED here
        ours = {v: k for k, v in wire.OP_STATUS.items()}.get(status) if status else None
        recs = await call(compat.list_operations, engine, kind, ours, min(1000, offset + limit))
        keep = ("uuid", "kind", "status", "error", "created_at", "duration", "image_size", "consumed_cpu",
                "consumed_memory", "image_uuid", "result_image_uuid")
        out = []
        for rec in recs:
            if (t0 is not None and rec["started"] < t0) or (t1 is not None and rec["started"] > t1):
                continue
            v = wire.operation_view(rec, None)
            v["error"] = compat.spawn_failure(rec.get("outcome")) or v["error"]
            out.append({k: v[k] for k in keep})
        return out[offset:offset + limit]

    @router.get("/operations/{operation_id}")
    async def get_operation(operation_id: str, engine: Engine, inflight: str | None = None) -> dict:
        return await call(view, engine, wire.op_id(operation_id), wire.flag(inflight))

    @router.delete("/operations/{operation_id}", status_code=202)
    async def cancel_operation(operation_id: str, engine: Engine) -> Response:
        op = wire.op_id(operation_id)
        rec = await call(engine.operations.get, op)
        if rec["status"] not in ("queued", "running"):
            return error(409, f"operation {operation_id} is already {wire.OP_STATUS.get(rec['status'], rec['status'])}")
        await call(engine.operations.cancel, op)
        return Response(status_code=202)

    @router.get("/operations/{operation_id}/events")
    async def events(operation_id: str, request: Request, engine: Engine, follow: str | None = None,
                     since: int | None = Query(None, ge=0), spid: int | None = Query(None, ge=0)) -> StreamingResponse:
        """Server-Sent Events in Contree's shape: init, spawn, stdin, stdout, stderr, truncated,
        exit (spid 1 and the subprocesses'), network, size_cap, shutdown, then completion. Our
        event n gives Contree events wire.STEP*n and after (contree_wire.events_of)."""
        op = wire.op_id(operation_id)
        ops = engine.operations
        rec = await call(ops.get, op)                              # 404 for an unknown operation
        header = request.headers.get("last-event-id")
        if header is not None:
            try:
                since = int(header)
            except ValueError:
                return error(400, f"Last-Event-Id must be an integer, not {header!r}")
        after = -1 if since is None else since
        following = wire.flag(follow)

        def translate(seq: int, kind: str, data: str) -> list[dict]:
            cur = ops.get(op) if kind not in ("stdout", "stderr") else None
            evs = wire.events_of(seq, kind, data, cur)
            for e in evs:
                if e["type"] == "completion" and e["data"].get("error"):
                    e["data"]["error"] = compat.spawn_failure(cur.get("outcome")) or e["data"]["error"]
            return evs

        def frames(evs: list[dict]) -> str:
            keep = [e for e in evs if e["id"] > after and (spid is None or e.get("spid") == spid)]
            return "".join(f"id: {e['id']}\nevent: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in keep)

        async def stream():
            nonlocal after, following
            cursor = max(0, after // wire.STEP - 1) if after >= 0 else 0
            if rec["status"] in ("done", "failed", "cancelled"):
                logged, ended = await call(ops.events_after, op, 0, 0)
                if not logged and not ended:  # run by an engine before this one: only the end is known
                    yield frames(await call(translate, 0, "end", "{}"))
                    return
                following = True             # its end is being logged (the row is written first): wait for it
            while True:
                new, ended = await call(ops.events_after, op, cursor, 10.0 if following else 0)
                for seq, kind, data in new:
                    cursor = seq
                    # a subprocess's events are contree/subprocesses.py's
                    evs = proc_events(seq, data) if kind == "proc" else await call(translate, seq, kind, data)
                    text = frames(evs)
                    if text:
                        yield text
                if ended or not following:
                    return
                if not new:
                    if await request.is_disconnected():
                        return
                    yield ": keepalive\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    # ---- inspect ---------------------------------------------------------------------------------
    def here(request: Request, path: str) -> str:
        return f"{request.scope.get('root_path', '')}/v1{path}"

    @router.get("/inspect", include_in_schema=False)
    async def inspect_redirect(request: Request) -> RedirectResponse:
        q = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(here(request, "/inspect/") + q, status_code=307)

    @router.get("/inspect/")
    async def find_by_tag(request: Request, engine: Engine, tag: str = Query(min_length=1)) -> RedirectResponse:
        image = await call(wire.tagged, engine, tag)
        return RedirectResponse(here(request, f"/inspect/{wire.to_uuid(image)}/"), status_code=302)

    @router.get("/inspect/{image_uuid}", include_in_schema=False)
    async def inspect_image_redirect(image_uuid: str, request: Request) -> RedirectResponse:
        return RedirectResponse(here(request, f"/inspect/{image_uuid}/"), status_code=307)

    async def here_path(engine, image: str, path: str) -> str:
        return await call(compat.image_path, engine, image, path)          # ~ and relative paths

    @router.get("/inspect/{image_uuid}/")
    async def inspect_image(image_uuid: str, engine: Engine) -> dict:
        return wire.image_view(await call(engine.image_info, await resolved(engine, image_uuid)))

    @router.get("/inspect/{image_uuid}/list")
    async def list_files(image_uuid: str, engine: Engine, path: str = Query(min_length=1),
                         text: str | None = None) -> Response:
        image = await resolved(engine, image_uuid)
        entries = [wire.file_item(e.to_dict()) for e in await call(engine.ls, image, await here_path(engine, image, path))]
        if text is not None:
            lines = [f"{stat_mod.filemode(e['mode'])} {e['nlink']} {e['uid']} {e['gid']} {e['size']:>10} {e['path']}"
                     + (f" -> {e['symlink_to']}" if e["is_symlink"] else "") for e in entries]
            return Response("\n".join(lines) + "\n", media_type="text/plain")
        return JSONResponse({"path": path, "files": entries})

    @router.get("/inspect/{image_uuid}/download")
    async def download(image_uuid: str, engine: Engine, path: str = Query(min_length=1),
                       text: str | None = None) -> Response:
        image = await resolved(engine, image_uuid)
        path = await here_path(engine, image, path)
        if (await call(engine.stat, image, path)).to_dict()["type"] == "dir":
            return error(422, f"{path} is a directory")
        data = await call(engine.read, image, path)
        return Response(data, media_type="text/plain" if text is not None else "application/octet-stream")

    @router.head("/inspect/{image_uuid}/download")
    async def file_check(image_uuid: str, engine: Engine, path: str = Query(min_length=1)) -> Response:
        image = await resolved(engine, image_uuid)
        kind = (await call(engine.stat, image, await here_path(engine, image, path))).to_dict()["type"]
        return Response(status_code=422 if kind == "dir" else 200)

    @router.get("/inspect/{image_uuid}/archive")
    async def archive(image_uuid: str, request: Request, engine: Engine, path: str = Query(min_length=1)) -> Response:
        image = await resolved(engine, image_uuid)
        path = await here_path(engine, image, path)
        await call(engine.stat, image, path)                     # 404 before any byte is sent

        def build() -> bytes:
            buf = io.BytesIO()
            engine.export_tar(image, buf, path)
            return buf.getvalue()
        name = (path.strip("/").replace("/", "_") or "root") + ".tar"
        headers = {"Content-Disposition": f'attachment; filename="{name}"'}
        body = await call(build)
        if "gzip" in request.headers.get("accept-encoding", ""):     # Contree serves archives compressed
            body = await call(gzip.compress, body, 6)
            headers["Content-Encoding"] = "gzip"
        return Response(body, media_type="application/x-tar", headers=headers)

    @router.head("/inspect/{image_uuid}/archive")
    async def archive_check(image_uuid: str, engine: Engine, path: str = Query(min_length=1)) -> Response:
        image = await resolved(engine, image_uuid)
        await call(engine.stat, image, await here_path(engine, image, path))
        return Response(status_code=200)

    @router.get("/inspect/{image_uuid}/grep")
    async def grep(image_uuid: str, engine: Engine, pattern: Annotated[list[str], Query(min_length=1, max_length=16)],
                   path: Annotated[list[str] | None, Query(max_length=16)] = None, glob: str | None = None,
                   max_total: int = Query(1000, ge=1, le=10000), max_count: int | None = Query(None, ge=1, le=10000),
                   case: str = Query("sensitive", pattern="^(sensitive|insensitive|smart)$"),
                   before: int = Query(0, ge=0, le=50), after: int = Query(0, ge=0, le=50)) -> dict:
        image = await resolved(engine, image_uuid)
        path = [await here_path(engine, image, p) for p in path or ["/"]]
        rx = "|".join(f"(?:{p})" for p in pattern)
        ignore = case == "insensitive" or (case == "smart" and rx == rx.lower())
        matches: list[dict] = []
        for root in path:
            left = max_total - len(matches)
            if left <= 0:
                break
            hits = await call(engine.grep, image, rx, root, glob=glob, max_matches=left + 1, ignore_case=ignore,
                              **({"before": before, "after": after} if before or after else {}))
            per_file: dict[str, int] = {}
            for h in hits:
                if not h.get("context"):
                    per_file[h["path"]] = per_file.get(h["path"], 0) + 1
                if max_count is None or per_file.get(h["path"], 0) <= max_count:
                    matches.append(wire.grep_match(h, rx, ignore))
        found = [i for i, m in enumerate(matches) if m["type"] == "match"]
        truncated = len(found) > max_total
        if truncated:
            matches = matches[:found[max_total]]
        return {"path": path[0], "patterns": pattern, "matches": matches, "truncated": truncated}

    router.include_router(subprocesses_router(engine_for, ContreeRoute))
    return router
