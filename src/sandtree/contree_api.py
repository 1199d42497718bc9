"""The Contree-compatible API under /v1, so Nebius Contree's own clients (contree-sdk,
contree-mcp, contree-client) work unmodified against `sandtree serve`.

An adapter like server.py: each route translates one request into engine calls and the answer
into Contree's wire shapes (its OpenAPI document ships in the `contree-client` wheel). Every
route gets its engine from `engine_for(request)`, so a per-token engine can be swapped in.

Names: Contree names images, operations and uploads by UUID. Ours are hex digests (images,
uploads: sha256) and uuid4 hex (operations), so a UUID is just the first 128 bits of the ID,
and goes back by prefix: stable across restarts, with no mapping table.

Errors are Contree's `{"error": message, "status": code}`; malformed requests are 400.
Tokens (Authorization: Bearer, Project) are accepted and not checked here: tokens and
tenants are issue 4's other part.
"""

import asyncio
import base64
import datetime as dt
import io
import json
import re
import stat as stat_mod
import time
import uuid as uuid_mod
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from .errors import InvalidInput, NotFound, SandtreeError

STATUS = {"not_found": 404, "image_not_found": 404, "path_not_found": 404, "conflict": 409,
          "runtime_unavailable": 503, "sandbox_error": 500, "store_corrupt": 500, "registry_error": 502}

# our operation statuses -> Contree's enum (a run that exited non-zero still SUCCEEDED: it ran)
OP_STATUS = {"queued": "PENDING", "running": "EXECUTING", "done": "SUCCESS", "failed": "FAILED",
             "cancelled": "CANCELLED"}
TERMINAL = {"SUCCESS", "FAILED", "CANCELLED"}

# our scopes -> Contree's permission names
PERMISSIONS = {"import": ["import"], "run": ["spawn", "spawn_disposable"], "list": ["list"],
               "cancel": ["cancel"], "tag": ["set_image_tag"]}


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status)


class ContreeRoute(APIRoute):
    """Engine errors and request validation errors in Contree's error shape."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                msgs = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
                return error(400, "; ".join(msgs) or "malformed request")
            except SandtreeError as exc:
                return error(STATUS.get(exc.code, 400), exc.message)
        return guarded


# ---- names ----------------------------------------------------------------------------------------
def to_uuid(hex_id: str | None) -> str | None:
    """The UUID of an ID: its first 128 bits."""
    return str(uuid_mod.UUID(hex_id[:32])) if hex_id else None


def from_uuid(value: str, what: str) -> str:
    try:
        return uuid_mod.UUID(value).hex
    except (ValueError, AttributeError, TypeError):
        raise InvalidInput(f"{what} must be a UUID, not {value!r}") from None


def image_of(engine, ref: str) -> str:
    """An image ID for a UUID or `tag:NAME` (Contree's ImageSource)."""
    if not isinstance(ref, str) or not ref:
        raise InvalidInput("image must be a UUID or tag:NAME")
    if ref.startswith("tag:"):
        return tagged(engine, ref[4:])
    return engine.resolve(from_uuid(ref, "image"))


def tagged(engine, tag: str) -> str:
    """The image a tag names: only tags (not IDs, prefixes or branches)."""
    image = engine.tags().get(tag)
    if image is None:
        raise NotFound(f"no image tagged {tag!r}")
    return image


def iso(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat() if ts is not None else None


def image_view(info: dict, tag: str | None = None) -> dict:
    tags = info.get("tags") or []
    return {"uuid": to_uuid(info["id"]), "tag": tag if tag is not None else (tags[0] if tags else None),
            "created_at": iso(info.get("created"))}


INTERVAL = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(value: str | None, name: str) -> float | None:
    """Contree's since/until: an interval ago (600s, 15m, 2h, 3d, 1w), a Unix time or ISO 8601."""
    if value is None or value == "":
        return None
    m = INTERVAL.match(value)
    if m:
        return time.time() - float(m[1]) * UNIT_S[m[2]]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"{name} must be an interval (15m), a Unix time or ISO 8601, not {value!r}") from None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()


def flag(value: str | None) -> bool:
    """Contree's HTTP-flag booleans: present without a value, or anything but 0, is on."""
    return value is not None and value not in ("0", "false")


# ---- operations -----------------------------------------------------------------------------------
def stream_repr(data: bytes, truncated: bool = False) -> dict:
    if all(32 <= b < 127 or b in (9, 10, 13) for b in data):
        return {"value": data.decode("ascii"), "encoding": "ascii", "truncated": truncated}
    return {"value": base64.b64encode(data).decode(), "encoding": "base64", "truncated": truncated}


def instance_result(outcome: dict, run) -> dict | None:
    """InstanceResult: the process's state, resources and output. Output is known only to the
    process that ran the operation (ours are not stored); elsewhere it is empty and truncated."""
    if run is None and "exit_code" not in outcome:
        return None
    src = run.__dict__ if run is not None else outcome
    usage = src.get("usage") or {}
    code, sig = src.get("exit_code"), src.get("signal")
    wall = float(usage.get("wall_s") or 0.0)
    out = stream_repr(run.stdout, run.stdout_truncated) if run else stream_repr(b"", True)
    err = stream_repr(run.stderr, run.stderr_truncated) if run else stream_repr(b"", True)
    return {"resources": {"block_input": 0, "block_output": 0, "cost": 0.0, "elapsed_time": wall,
                          "involuntary_switches": 0, "max_rss": int((usage.get("max_rss_bytes") or 0) // 1024),
                          "monotonic_time": wall, "page_faults": 0, "page_faults_io": 0, "shared_memory": 0,
                          "signals": 0, "swaps": 0, "system_cpu_time": float(usage.get("sys_cpu_s") or 0.0),
                          "unshared_memory": 0, "user_cpu_time": float(usage.get("user_cpu_s") or 0.0),
                          "voluntary_switches": 0},
            "state": {"continued": False, "core_dump": False,
                      "exit_code": code if code is not None else 128 + (sig or 0), "pid": 1, "signal": sig or 0,
                      "stopped": False, "timed_out": bool(src.get("timed_out"))},
            "stdout": out, "stderr": err}


def instance_metadata(rec: dict, run) -> dict:
    """OperationInstanceMetadata from the operation's record (a queued one records only its command)."""
    spec, outcome = rec.get("spec") or {}, rec.get("outcome") or {}
    argv = spec.get("argv")
    # a shell string is recorded as itself, an argv joined: that tells `sh -c X` from ["/bin/sh", "-c", X]
    if argv and len(argv) == 3 and argv[:2] == ["/bin/sh", "-c"] and spec.get("command") == argv[2]:
        command, args, shell = argv[2], [], True
    elif argv:
        command, args, shell = argv[0], argv[1:], False
    else:
        command, args, shell = spec.get("command", ""), [], True
    limits = spec.get("limits") or {}
    return {"command": command, "args": args, "shell": shell, "image": to_uuid(rec.get("source")),
            "cwd": spec.get("cwd", "/"), "env": spec.get("env") or {}, "hostname": spec.get("hostname", ""),
            "uid": spec.get("uid", 0), "gid": spec.get("gid", 0), "disposable": bool(spec.get("disposable")),
            "preserve_env": False, "files": {p: {} for p in spec.get("files") or []},
            "stdin": {"value": "", "encoding": "ascii"}, "timeout": int(limits.get("timeout") or 0),
            "truncate_output_at": int(limits.get("output") or 0),
            "result": instance_result(outcome, run) if rec.get("finished") else None}


def operation_view(rec: dict, run) -> dict:
    status = OP_STATUS.get(rec["status"], "FAILED")
    outcome = rec.get("outcome") or {}
    end = rec.get("finished") or time.time()
    usage = (run.usage if run is not None else outcome.get("usage")) or {}
    terminal = status in TERMINAL
    out = {"uuid": to_uuid(rec["id"]), "status": status,
           "error": outcome.get("message") if status == "FAILED" else None,
           "created_at": iso(rec.get("started")), "duration": round(end - (rec.get("started") or end), 6),
           "image_size": None,
           "consumed_cpu": (usage.get("user_cpu_s", 0) + usage.get("sys_cpu_s", 0)) if usage else None,
           "consumed_memory": int(usage["max_rss_bytes"] // 1024) if usage.get("max_rss_bytes") else None,
           "result_image_uuid": to_uuid(rec.get("result")) if status == "SUCCESS" else None}
    if rec.get("kind") == "run":
        out.update(kind="instance", image_uuid=to_uuid(rec.get("source")), metadata=instance_metadata(rec, run))
    else:
        spec = rec.get("spec") or {}
        source = str(spec.get("source", ""))
        url = "docker://" + source[5:] if source.startswith("pull:") else source
        out.update(kind="image_import", image_uuid=None,
                   metadata={"registry": {"url": url}, "tag": spec.get("tag"), "timeout": 0})
    tag = (rec.get("spec") or {}).get("tag") if rec.get("kind") != "run" and status == "SUCCESS" else None
    out["result"] = {"image": out["result_image_uuid"], "tag": tag} if terminal else None
    return out


def op_id(value: str) -> str:
    return from_uuid(value, "operation")


# ---- request bodies -------------------------------------------------------------------------------
class Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")     # clients newer than this adapter send more fields


class StreamIn(Lenient):
    value: str = ""
    encoding: str = Field("ascii", pattern="^(ascii|base64)$")
    close: bool = True


class FileSpecIn(Lenient):
    uuid: str
    mode: str = Field("0644", pattern="^0?[0-7]{3,4}$")
    uid: int = Field(0, ge=0)
    gid: int = Field(0, ge=0)


class LimitsIn(Lenient):
    max_layer_bytes: int | None = Field(None, ge=1)


class SpawnIn(Lenient):
    command: str = Field(min_length=1)
    image: str = Field(min_length=1)
    args: list[str] = []
    shell: bool = False
    env: dict[str, str | None] | None = None
    preserve_env: bool = False
    cwd: str = Field("", pattern=r"^((/[^/]*)+/?)?$")
    uid: int = Field(0, ge=0)
    gid: int = Field(0, ge=0)
    hostname: str | None = None
    disposable: bool = False
    stdin: StreamIn | None = None
    timeout: int | None = Field(None, ge=1)
    truncate_output_at: int | None = Field(None, ge=1, le=10 << 20)
    files: dict[str, FileSpecIn] | None = None
    resources_limits: LimitsIn | None = None


class CredentialsIn(Lenient):
    username: str = Field(min_length=1)
    password: str = Field(min_length=1)


class RegistryIn(Lenient):
    url: str = Field(min_length=1)
    credentials: CredentialsIn | None = None


class ImportIn(Lenient):
    registry: RegistryIn
    tag: str | None = None
    timeout: int = Field(300, ge=1)


class TagIn(Lenient):
    tag: str = Field(min_length=1)


def contree_router(engine_for) -> APIRouter:
    router = APIRouter(prefix="/v1", route_class=ContreeRoute, tags=["contree"])

    def engine_dep(request: Request):
        return engine_for(request)      # typed here: FastAPI takes an unannotated `request` for a query
    Engine = Annotated[Any, Depends(engine_dep)]

    def call(fn, *a, **k):
        return asyncio.to_thread(fn, *a, **k)

    # ---- auth ------------------------------------------------------------------------------------
    @router.get("/whoami")
    async def whoami(engine: Engine) -> dict:
        me = await call(engine.whoami)
        granted = {p for s in me.get("scopes", []) for p in PERMISSIONS.get(s, [s])}
        known = {p for ps in PERMISSIONS.values() for p in ps} | granted
        lim = me.get("limits") or {}
        limits = {"instance_max_timeout": lim.get("timeout"), "instance_max_concurrency": lim.get("concurrent_runs"),
                  "instance_max_memory": lim.get("memory"), "instance_max_pids": lim.get("pids"),
                  "instance_max_layer_bytes": lim.get("disk"), "instance_max_output": lim.get("output")}
        stat: dict[str, int] = {}
        for rec in await call(engine.operations.list, limit=1000):      # the recent ones, by status
            key = OP_STATUS.get(rec["status"], "FAILED")
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
        t0, t1 = parse_time(since, "since"), parse_time(until, "until")
        want = from_uuid(uuid, "uuid") if uuid else None
        out = []
        for info in reversed(await call(engine.images)):           # newest first
            tags = info["tags"]
            if tag is not None:
                tags = [t for t in tags if t.startswith(tag)]
            if ((tag is not None or flag(tagged_only)) and not tags) or (want and info["id"][:32] != want) or \
                    (t0 is not None and info["created"] < t0) or (t1 is not None and info["created"] > t1):
                continue
            if kind is not None and bool(await call(engine.parents, info["id"])) != (kind == 0):
                continue                                             # 0: made by runs, 1: imported
            out.append(image_view(info, tags[0] if tags else None))
        return {"images": out[offset:offset + limit]}

    @router.patch("/images/{image_uuid}/tag")
    async def set_tag(image_uuid: str, body: TagIn, engine: Engine) -> dict:
        image = await call(engine.resolve, from_uuid(image_uuid, "image"))
        await call(engine.tag, image, body.tag)              # a tag on another image moves here
        return image_view(await call(engine.image_info, image), body.tag)

    @router.delete("/images/{image_uuid}/tag", status_code=204)
    async def remove_tag(image_uuid: str, engine: Engine, tag: str | None = None) -> Response:
        image = await call(engine.resolve, from_uuid(image_uuid, "image"))
        names = sorted(await call(engine.tags, image))
        if tag is not None:
            if tag not in names:
                raise NotFound(f"image {image_uuid} has no tag {tag!r}")
            names = [tag]
        for name in names:
            await call(engine.untag, name)
        return Response(status_code=204)

    @router.post("/images/import", status_code=201)
    async def import_image(body: ImportIn, request: Request, engine: Engine) -> JSONResponse:
        """A registry pull as an operation. Credentials are checked against the registry and kept
        for its later pulls (what `registry_login` does)."""
        reference = body.registry.url if "://" in body.registry.url else f"docker://{body.registry.url}"
        creds = body.registry.credentials
        if creds is not None:
            from .store import registry
            await call(engine.registry_login, registry.parse(reference).registry, creds.username, creds.password)
        op = await call(engine.operations.submit_pull, reference, tag=body.tag)
        return JSONResponse({"uuid": to_uuid(op)}, status_code=201,
                            headers={"Location": f"{request.scope.get('root_path', '')}/v1/operations/{to_uuid(op)}"})

    # ---- files -----------------------------------------------------------------------------------
    def file_view(info: dict) -> dict:
        return {"uuid": to_uuid(info["sha256"]), "sha256": info["sha256"], "size": info["size"]}

    @router.post("/files", status_code=201)
    async def upload(request: Request, engine: Engine) -> dict:
        data = await request.body()
        return file_view({"sha256": await call(engine.upload, data), "size": len(data)})

    def digest(sha256: str) -> str:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
            raise InvalidInput(f"sha256 must be 64 hex digits, not {sha256!r}")
        return sha256.lower()

    @router.get("/files/{sha256}")
    async def file_info(sha256: str, engine: Engine) -> dict:
        info = await call(engine.upload_info, digest(sha256))
        return {**file_view(info), "created_at": iso(info["created"]), "updated_at": iso(info["created"])}

    @router.head("/files/{sha256}")
    async def file_exists(sha256: str, engine: Engine) -> Response:
        await call(engine.upload_info, digest(sha256))
        return Response(status_code=200)

    # ---- instances and operations ----------------------------------------------------------------
    @router.post("/instances", status_code=201)
    async def spawn(body: SpawnIn, request: Request, engine: Engine) -> JSONResponse:
        image = await call(image_of, engine, body.image)
        files = []
        for path, f in (body.files or {}).items():
            sha = await call(engine.find_upload, from_uuid(f.uuid, f"files[{path}].uuid"))
            files.append({"path": path, "sha256": sha, "mode": f.mode, "uid": f.uid, "gid": f.gid})
        stdin = None
        if body.stdin is not None and body.stdin.value:
            try:
                stdin = (base64.b64decode(body.stdin.value, validate=True) if body.stdin.encoding == "base64"
                         else body.stdin.value.encode())
            except ValueError:
                raise InvalidInput("stdin.value is not valid base64") from None
        opts: dict[str, Any] = {
            "env": {k: v for k, v in (body.env or {}).items() if v is not None},   # null unsets: none set
            "cwd": body.cwd.rstrip("/") or "/", "uid": body.uid, "gid": body.gid,
            "hostname": body.hostname or "sandtree", "disposable": body.disposable, "stdin": stdin,
            "files": files, "timeout": body.timeout, "output": body.truncate_output_at,
            "disk": body.resources_limits.max_layer_bytes if body.resources_limits else None}
        command = body.command if body.shell else [body.command, *body.args]
        op = await call(engine.operations.submit_run, image, command, **opts)
        echo = body.model_dump(exclude_none=True)
        echo.update(uuid=to_uuid(op), image=to_uuid(image), result=None)
        return JSONResponse(echo, status_code=201,
                            headers={"Location": f"{request.scope.get('root_path', '')}/v1/operations/{to_uuid(op)}"})

    def view(engine, op: str) -> dict:
        ops = engine.operations
        rec = ops.get(op)
        if rec["status"] in ("done", "failed", "cancelled"):
            rec = ops.wait([op], 10)[0]     # the row is written just before the run's record is handed over
        return operation_view(rec, ops.result(op) if rec["kind"] == "run" else None)

    @router.get("/operations")
    async def list_operations(engine: Engine, limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0),
                              status: str | None = Query(None, pattern="^(PENDING|ASSIGNED|EXECUTING|SUCCESS|FAILED|CANCELLED)$"),
                              kind: str | None = Query(None, pattern="^(image_import|instance)$"),
                              since: str | None = None, until: str | None = None) -> list[dict]:
        t0, t1 = parse_time(since, "since"), parse_time(until, "until")
        if kind == "image_import" or status == "ASSIGNED":
            return []                       # imports are not operations here; nothing is ever ASSIGNED
        ours = {v: k for k, v in OP_STATUS.items()}.get(status) if status else None
        recs = await call(engine.operations.list, status=ours, limit=min(1000, offset + limit))
        keep = ("uuid", "kind", "status", "error", "created_at", "duration", "image_size", "consumed_cpu",
                "consumed_memory", "image_uuid", "result_image_uuid")
        out = []
        for rec in recs:
            if (t0 is not None and rec["started"] < t0) or (t1 is not None and rec["started"] > t1):
                continue
            v = operation_view(rec, None)
            out.append({k: v[k] for k in keep})
        return out[offset:offset + limit]

    @router.get("/operations/{operation_id}")
    async def get_operation(operation_id: str, engine: Engine, inflight: str | None = None) -> dict:
        return await call(view, engine, op_id(operation_id))

    @router.delete("/operations/{operation_id}", status_code=202)
    async def cancel_operation(operation_id: str, engine: Engine) -> Response:
        op = op_id(operation_id)
        rec = await call(engine.operations.get, op)
        if rec["status"] not in ("queued", "running"):
            return error(409, f"operation {operation_id} is already {OP_STATUS.get(rec['status'], rec['status'])}")
        await call(engine.operations.cancel, op)
        return Response(status_code=202)

    @router.get("/operations/{operation_id}/events")
    async def events(operation_id: str, request: Request, engine: Engine, follow: str | None = None,
                     since: int | None = Query(None, ge=0), spid: int | None = Query(None, ge=0)) -> StreamingResponse:
        """Server-Sent Events in Contree's shape: spawn, stdout, stderr, exit (spid 1), then
        completion. Our event n is Contree event 2n, the completion after our `end` is 2n+1."""
        op = op_id(operation_id)
        ops = engine.operations
        rec = await call(ops.get, op)                              # 404 for an unknown operation
        header = request.headers.get("last-event-id")
        if header is not None:
            try:
                since = int(header)
            except ValueError:
                return error(400, f"Last-Event-Id must be an integer, not {header!r}")
        after = -1 if since is None else since
        following = flag(follow)

        def translate(seq: int, kind: str, data: str) -> list[dict]:
            now = dt.datetime.now(dt.UTC).isoformat()
            if kind in ("stdout", "stderr"):
                return [{"id": 2 * seq, "ts": now, "spid": 1, "type": kind, "data": stream_repr(data.encode())}]
            cur = ops.get(op)
            if kind == "start" and cur.get("kind") != "run":
                return []                                        # an import: no process, only its completion
            if kind == "start":
                md = instance_metadata(cur, None)
                return [{"id": 2 * seq, "ts": now, "spid": 1, "type": "spawn",
                         "data": {"pid": 1, "command": md["command"], "args": md["args"], "shell": md["shell"],
                                  "cwd": md["cwd"], "uid": md["uid"], "gid": md["gid"], "timeout": md["timeout"],
                                  "truncate_at": md["truncate_output_at"], "env": md["env"]}}]
            end = json.loads(data) if kind == "end" else {}
            out = []
            ms = int(((cur.get("finished") or time.time()) - (cur.get("started") or time.time())) * 1000)
            if end.get("exit_code") is not None or end.get("signal") is not None:
                code, sig = end.get("exit_code"), end.get("signal")
                out.append({"id": 2 * seq, "ts": now, "spid": 1, "type": "exit",
                            "data": {"pid": 1, "code": code if code is not None else 128 + sig,
                                     "signal": sig if sig is not None else -1,
                                     "timed_out": bool(end.get("timed_out")), "duration_ms": ms, "resources": {}}})
            status = OP_STATUS.get(cur["status"], "FAILED")
            out.append({"id": 2 * seq + 1, "ts": now, "type": "completion",
                        "data": {"status": status, "duration_ms": ms,
                                 "result_image_uuid": to_uuid(cur.get("result")) if status == "SUCCESS" else None,
                                 "error": (cur.get("outcome") or {}).get("message") if status == "FAILED" else None}})
            return out

        def frames(evs: list[dict]) -> str:
            keep = [e for e in evs if e["id"] > after and (spid is None or e.get("spid") == spid)]
            return "".join(f"id: {e['id']}\nevent: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in keep)

        async def stream():
            nonlocal after
            cursor = max(0, after // 2 - 1) if after >= 0 else 0
            if rec["status"] in ("done", "failed", "cancelled"):
                _, ended = await call(ops.events_after, op, 0, 0)
                if not ended:                # run by an engine before this one: only the end is known
                    yield frames(await call(translate, 0, "end", "{}"))
                    return
            while True:
                new, ended = await call(ops.events_after, op, cursor, 10.0 if following else 0)
                for seq, kind, data in new:
                    cursor = seq
                    text = frames(await call(translate, seq, kind, data))
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
        image = await call(tagged, engine, tag)
        return RedirectResponse(here(request, f"/inspect/{to_uuid(image)}/"), status_code=302)

    @router.get("/inspect/{image_uuid}", include_in_schema=False)
    async def inspect_image_redirect(image_uuid: str, request: Request) -> RedirectResponse:
        return RedirectResponse(here(request, f"/inspect/{image_uuid}/"), status_code=307)

    async def resolved(engine, image_uuid: str) -> str:
        return await call(engine.resolve, from_uuid(image_uuid, "image"))

    @router.get("/inspect/{image_uuid}/")
    async def inspect_image(image_uuid: str, engine: Engine) -> dict:
        return image_view(await call(engine.image_info, await resolved(engine, image_uuid)))

    @router.get("/inspect/{image_uuid}/list")
    async def list_files(image_uuid: str, engine: Engine, path: str = Query(min_length=1),
                         text: str | None = None) -> Response:
        image = await resolved(engine, image_uuid)
        entries = [file_item(e.to_dict()) for e in await call(engine.ls, image, path)]
        if text is not None:
            lines = [f"{stat_mod.filemode(e['mode'])} {e['nlink']} {e['uid']} {e['gid']} {e['size']:>10} {e['path']}"
                     + (f" -> {e['symlink_to']}" if e["is_symlink"] else "") for e in entries]
            return Response("\n".join(lines) + "\n", media_type="text/plain")
        return JSONResponse({"path": path, "files": entries})

    @router.get("/inspect/{image_uuid}/download")
    async def download(image_uuid: str, engine: Engine, path: str = Query(min_length=1),
                       text: str | None = None) -> Response:
        image = await resolved(engine, image_uuid)
        if (await call(engine.stat, image, path)).to_dict()["type"] == "dir":
            return error(422, f"{path} is a directory")
        data = await call(engine.read, image, path)
        return Response(data, media_type="text/plain" if text is not None else "application/octet-stream")

    @router.head("/inspect/{image_uuid}/download")
    async def file_check(image_uuid: str, engine: Engine, path: str = Query(min_length=1)) -> Response:
        image = await resolved(engine, image_uuid)
        kind = (await call(engine.stat, image, path)).to_dict()["type"]
        return Response(status_code=422 if kind == "dir" else 200)

    @router.get("/inspect/{image_uuid}/archive")
    async def archive(image_uuid: str, engine: Engine, path: str = Query(min_length=1)) -> Response:
        image = await resolved(engine, image_uuid)
        await call(engine.stat, image, path)                     # 404 before any byte is sent

        def build() -> bytes:
            buf = io.BytesIO()
            engine.export_tar(image, buf, path)
            return buf.getvalue()
        name = (path.strip("/").replace("/", "_") or "root") + ".tar"
        return Response(await call(build), media_type="application/x-tar",
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @router.head("/inspect/{image_uuid}/archive")
    async def archive_check(image_uuid: str, engine: Engine, path: str = Query(min_length=1)) -> Response:
        await call(engine.stat, await resolved(engine, image_uuid), path)
        return Response(status_code=200)

    @router.get("/inspect/{image_uuid}/grep")
    async def grep(image_uuid: str, engine: Engine, pattern: Annotated[list[str], Query(min_length=1, max_length=16)],
                   path: Annotated[list[str] | None, Query(max_length=16)] = None, glob: str | None = None,
                   max_total: int = Query(1000, ge=1, le=10000), max_count: int | None = Query(None, ge=1, le=10000),
                   case: str = Query("sensitive", pattern="^(sensitive|insensitive|smart)$")) -> dict:
        image = await resolved(engine, image_uuid)
        path = path or ["/"]
        rx = "|".join(f"(?:{p})" for p in pattern)
        ignore = case == "insensitive" or (case == "smart" and rx == rx.lower())
        matches: list[dict] = []
        for root in path:
            left = max_total - len(matches)
            if left <= 0:
                break
            hits = await call(engine.grep, image, rx, root, glob=glob, max_matches=left + 1, ignore_case=ignore)
            per_file: dict[str, int] = {}
            for h in hits:
                per_file[h["path"]] = per_file.get(h["path"], 0) + 1
                if max_count is None or per_file[h["path"]] <= max_count:
                    matches.append(grep_match(h, rx, ignore))
        truncated = len(matches) > max_total
        return {"path": path[0], "patterns": pattern, "matches": matches[:max_total], "truncated": truncated}

    return router


KIND_BITS = {"file": stat_mod.S_IFREG, "dir": stat_mod.S_IFDIR, "symlink": stat_mod.S_IFLNK,
             "char": stat_mod.S_IFCHR, "block": stat_mod.S_IFBLK, "fifo": stat_mod.S_IFIFO,
             "socket": stat_mod.S_IFSOCK}


def file_item(e: dict) -> dict:
    """Contree's FileItem from one of our directory entries (mode with its file-type bits)."""
    kind = e["type"]
    return {"path": e["name"], "size": e["size"], "owner": str(e["uid"]), "group": str(e["gid"]),
            "uid": e["uid"], "gid": e["gid"], "mode": KIND_BITS.get(kind, 0) | int(e["mode"], 8),
            "mtime": int(e.get("mtime") or 0), "nlink": 1, "is_dir": kind == "dir", "is_regular": kind == "file",
            "is_symlink": kind == "symlink", "is_socket": kind == "socket", "is_fifo": kind == "fifo",
            "symlink_to": e.get("target", "") if kind == "symlink" else ""}


def grep_match(h: dict, rx: str, ignore: bool) -> dict:
    text = h["text"]
    subs = [{"text": m.group(0), "start": m.start(), "end": m.end()}
            for m in re.finditer(rx, text, re.IGNORECASE if ignore else 0) if m.group(0)]
    line = text + "\n"
    return {"path": h["path"], "line_number": h["line"], "absolute_offset": 0, "line_text": line,
            "line_bytes": len(line.encode()), "submatches": subs, "type": "match"}
