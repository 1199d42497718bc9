"""`sandtree serve`: the engine over HTTP (FastAPI on uvicorn), under /api/v1, with OpenAPI.

An adapter: each route translates one request into one engine call, and engine errors into HTTP
statuses through one table (errors.ERRORS: each class carries its status). Runs are operations: POST /runs starts one (waiting
for it unless wait=false), /operations/{id}/events streams its stdout/stderr live as Server-Sent
Events that resume from Last-Event-ID. Without tokens the server only listens on loopback.

Tenants (issue 4): httpauth.TenantGate turns each request's bearer token into the engine as that
tenant sees it (tenants.py); routes here call `engine.X` on a RequestEngine that forwards to it,
and other routers take the same view with `Depends(engine_for)`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import errno
import functools
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.responses import FileResponse

from .bodylimit import DEFAULT_MAX_UPLOAD, BodyLimit, spool, staged_file, unstage
from .contree import contree_router
from ..engine import Engine
from ..errors import DiskFull, Forbidden, InvalidInput, SandtreeError
from ..tenancy.gate import JsonLog, RequestEngine, TenantGate, engine_for  # noqa: F401 - engine_for: for routers
from ..store.maintenance import GC_GRACE, GC_RETENTION

LOOPBACK = ("127.0.0.1", "localhost", "::1")
CALL_THREADS = 256        # engine calls at once (runs, execs, imports: bounded by tenants' limits)
READ_CHUNK = 1 << 20      # bytes per chunk of a streamed file read
WAIT_THREADS = 256        # waits at once (an operation's end, its events); more queue behind them



class In(BaseModel):
    """A request body: a field the model does not name is refused (`"timout": 5` was taken
    silently, with the default timeout), not ignored."""
    model_config = ConfigDict(extra="forbid")


class FileIn(In):
    path: str
    sha256: str | None = Field(None, description="an upload's sha256 (POST /files)")
    content: str | None = Field(None, description="text content, instead of sha256")
    mode: int = 0o644
    uid: int = 0
    gid: int = 0


class RunIn(In):
    image: str = Field(description="an image ID, prefix, tag, or branch:NAME")
    command: str | list[str] = Field(description="a string runs in /bin/sh -c; a list is argv")
    env: dict[str, str] = {}
    cwd: str = "/"
    stdin: str | None = None
    stdin_base64: str | None = Field(None, description="stdin as base64, for bytes that are not UTF-8")
    uid: int = 0
    gid: int = 0
    hostname: str = "sandtree"
    files: list[FileIn] = []
    file_set: str | None = None
    disposable: bool = False
    timeout: float | None = None
    memory: str | int | None = None
    pids: int | None = None
    cpus: float | None = None
    disk: str | int | None = None
    output: str | int | None = None
    tier: str | None = None
    wait: bool = True


class StartIn(In):
    image: str = Field(description="an image ID, prefix, tag, or branch:NAME")
    env: dict[str, str] = {}
    cwd: str = "/"
    hostname: str = "sandtree"
    files: list[FileIn] = []
    file_set: str | None = None
    idle_timeout: float = Field(600, description="seconds without a command before it is stopped")
    lifetime: float = Field(3600, description="seconds until it is stopped in any case")
    idle_action: Literal["stop", "hibernate"] = Field("stop", description="what the idle timeout does: stop it, "
                                                       "or hibernate it (resume brings it back)")
    timeout: float | None = Field(None, description="default seconds per command")
    memory: str | int | None = None
    pids: int | None = None
    cpus: float | None = None
    disk: str | int | None = None
    output: str | int | None = None


class ExecIn(In):
    command: str | list[str] = Field(description="a string runs in the sandbox's shell session (cd and export "
                                                 "carry over); a list is a fresh process")
    env: dict[str, str] = {}
    cwd: str | None = None
    stdin: str | None = None
    stdin_base64: str | None = Field(None, description="stdin as base64, for bytes that are not UTF-8")
    uid: int = 0
    gid: int = 0
    timeout: float | None = None
    output: str | int | None = None


class PoolIn(In):
    size: int = Field(4, description="sandboxes kept started (0 empties the pool)")
    memory: str | int | None = None
    pids: int | None = None
    cpus: float | None = None
    disk: str | int | None = None
    timeout: float | None = None
    output: str | int | None = None
    hostname: str = "sandtree"
    wait: bool = Field(False, description="answer once the pool is full")


class CommitIn(In):
    tag: str | None = None


class LoginIn(In):
    registry: str
    username: str
    token: str
    insecure: bool = Field(False, description="plain HTTP to this registry (a test registry on loopback)")


class TagIn(In):
    image: str


class PullIn(In):
    reference: str
    tag: str | None = None
    insecure: bool = Field(False, description="plain HTTP to the registry (a test registry on loopback)")


class MergeIn(In):
    ours: str
    theirs: str
    base: str | None = None
    strategy: str | None = None
    ignore: list[str] | None = Field(None, description="globs that never conflict (ours taken); null: "
                                     "__pycache__/, *.pyc, .pytest_cache/; [] for none")
    on_conflict: Literal["raise", "return"] = Field("raise", description="conflicts without a strategy: 409 "
                                                    "merge_conflict (raise) or 200 with image null (return)")


class BranchIn(In):
    name: str
    image: str
    force: bool = False


class RollbackIn(In):
    steps: int | None = None
    to: str | None = None


def _stdin(body) -> bytes | None:
    if body.stdin_base64 is not None:
        if body.stdin is not None:
            raise InvalidInput("give stdin or stdin_base64, not both")
        try:
            return base64.b64decode(body.stdin_base64, validate=True)
        except ValueError:
            raise InvalidInput("stdin_base64 is not valid base64") from None
    return body.stdin.encode() if body.stdin is not None else None


class ShareIn(In):
    public: bool = True




def build_app(engine: Engine, *, log: JsonLog | None = None, max_upload: int = DEFAULT_MAX_UPLOAD) -> FastAPI:
    """log: where the JSON-lines request log goes (None: no request log). max_upload: the
    largest upload or image tar a request may send, unless its tenant's max_upload says otherwise."""
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        # Every route's engine call runs in a thread. asyncio's default pool has cpu_count + 4
        # threads (6 here): 6 callers waiting on a run froze every other route of every tenant
        # for the run's whole length. Engine calls get a pool of CALL_THREADS; pure waits
        # (an operation's end, its next events, a pool filling) one of their own, so waiting,
        # however many do it, never starves the calls that do work.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="sandtree-call"))
        yield

    app = FastAPI(title="sandtree", version="0.1.0", lifespan=lifespan,
                  description="Sandboxes for AI agents with git-like, content-addressed images.")
    waits = ThreadPoolExecutor(max_workers=WAIT_THREADS, thread_name_prefix="sandtree-wait")
    app.add_middleware(BodyLimit, max_upload=max_upload)       # inside the gate: it knows the tenant
    app.add_middleware(TenantGate, engine=engine, log=log)
    stage = engine.store.layers.stage       # uploads and exports land on the store's disk
    blobs = engine.store.blobs              # downloads stream from here, after the caller's check
    engine = RequestEngine()                # every route below: the caller's view of the engine
    ops = engine.operations

    @app.exception_handler(SandtreeError)
    async def sandtree_error(request: Request, exc: SandtreeError):
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        """Bodies and parameters that do not fit the route's model: the one error shape
        ({"error", "message"}, each field named), with FastAPI's status (422)."""
        fields = [{"field": ".".join(str(p) for p in e.get("loc", ()) if p != "body"), "problem": e.get("msg")}
                  for e in exc.errors()]
        message = "; ".join(f"{f['field'] or 'body'}: {f['problem']}" for f in fields) or "malformed request"
        return JSONResponse({"error": InvalidInput.code, "message": message, "fields": fields}, status_code=422)

    @app.exception_handler(OSError)
    async def os_error(request: Request, exc: OSError):
        """A full disk the engine did not name (a route's own file): 507 disk_full, not internal."""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            full = DiskFull("disk full: nothing was stored")
            return JSONResponse(full.to_dict(), status_code=full.http_status)
        return JSONResponse({"error": "internal", "message": str(exc)}, status_code=500)

    def call(fn, *a, **k):
        return asyncio.to_thread(fn, *a, **k)

    def wait_call(fn, *a, **k):
        """A call that mostly waits, on the waits pool (in this request's context: its engine view)."""
        ctx = contextvars.copy_context()
        return asyncio.get_running_loop().run_in_executor(waits, functools.partial(ctx.run, fn, *a, **k))

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus text format: runs, queue depth, run latency, store size. The counters are the
        whole server's (every tenant's runs): for the operator, or a token with the admin scope."""
        from ..tenancy.gate import current_engine
        from ..tenancy import TenantView
        if isinstance(current_engine(), TenantView):
            raise Forbidden("metrics count every tenant's runs: they need a token with the admin scope",
                            scope="admin")
        images = await call(engine.images)
        with ops.lock:
            counts = dict(ops.counts)
            buckets, hist, total = list(ops.latency_buckets), list(ops.latency), ops.latency_sum
        lines = ["# TYPE sandtree_runs_started_total counter",
                 f"sandtree_runs_started_total {counts.get('submitted', 0)}",
                 "# TYPE sandtree_runs_finished_total counter"]
        for status in ("done", "failed", "cancelled"):
            lines.append(f'sandtree_runs_finished_total{{status="{status}"}} {counts.get(status, 0)}')
        lines += ["# TYPE sandtree_queue_depth gauge", f"sandtree_queue_depth {ops.queue_depth()}",
                  "# TYPE sandtree_run_seconds histogram"]
        acc = 0
        for b, n in zip(buckets + ["+Inf"], hist, strict=True):
            acc += n
            lines.append(f'sandtree_run_seconds_bucket{{le="{b}"}} {acc}')
        lines += [f"sandtree_run_seconds_sum {total:.6f}", f"sandtree_run_seconds_count {acc}",
                  "# TYPE sandtree_images gauge", f"sandtree_images {len(images)}",
                  "# TYPE sandtree_images_bytes gauge", f"sandtree_images_bytes {sum(i['size'] for i in images)}"]
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    @app.get("/api/v1/health")
    async def health() -> dict:
        return {"ok": True, "tiers": [t["tier"] for t in engine.doctor() if t["available"]]}

    # ---- images ----------------------------------------------------------------------------------
    @app.get("/api/v1/images")
    async def list_images() -> list[dict]:
        return await call(engine.images)

    @app.get("/api/v1/images/{ref:path}/ls")
    async def ls(ref: str, path: str = "/") -> list[dict]:
        i = await call(engine.resolve, ref)
        return [e.to_dict() for e in await call(engine.ls, i, path)]

    @app.get("/api/v1/images/{ref:path}/read")
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

    @app.get("/api/v1/images/{ref:path}/stat")
    async def stat(ref: str, path: str) -> dict:
        i = await call(engine.resolve, ref)
        return (await call(engine.stat, i, path)).to_dict()

    @app.get("/api/v1/images/{ref:path}/grep")
    async def grep(ref: str, pattern: str, path: str = "/", glob: str | None = None,
                   max_matches: int = Query(1000, ge=1, le=100000), ignore_case: bool = False) -> list[dict]:
        i = await call(engine.resolve, ref)
        return await call(engine.grep, i, pattern, path, glob=glob, max_matches=max_matches, ignore_case=ignore_case)

    @app.get("/api/v1/images/{ref:path}/export")
    async def export(ref: str, path: str = "/") -> Response:
        i = await call(engine.resolve, ref)
        # built into a file on the store's disk and streamed from it (in memory, an export was
        # as large as the image, per request)
        tmp = await call(staged_file, stage, "export")
        try:
            with open(tmp, "xb") as f:
                await call(engine.export_tar, i, f, path)
        except BaseException:
            unstage(tmp)
            raise
        return FileResponse(tmp, media_type="application/x-tar", background=BackgroundTask(unstage, tmp))

    @app.get("/api/v1/resolve")
    async def resolve(ref: str) -> dict:
        return {"image": await call(engine.resolve, ref)}

    @app.get("/api/v1/tags")
    async def tags(image: str | None = None) -> dict:
        return await call(engine.tags, image)

    @app.get("/api/v1/whoami")
    async def whoami() -> dict:
        return engine.whoami()

    @app.get("/api/v1/doctor")
    async def doctor() -> list[dict]:
        return await call(engine.doctor)

    @app.get("/api/v1/images/{ref:path}/parents")
    async def parents(ref: str) -> list[dict]:
        return await call(engine.parents, await call(engine.resolve, ref))

    @app.get("/api/v1/images/{ref:path}/children")
    async def children(ref: str) -> list[dict]:
        return await call(engine.children, await call(engine.resolve, ref))

    @app.get("/api/v1/images/{ref:path}/log")
    async def log(ref: str, limit: int = Query(1000, ge=1, le=100_000)) -> list[dict]:
        return await call(engine.log, await call(engine.resolve, ref), limit)

    @app.get("/api/v1/images/{ref:path}/ancestors")
    async def ancestors(ref: str) -> dict:
        return await call(engine.ancestors, await call(engine.resolve, ref))

    @app.get("/api/v1/images/{ref:path}/descendants")
    async def descendants(ref: str) -> dict:
        return await call(engine.descendants, await call(engine.resolve, ref))

    @app.get("/api/v1/images/{ref:path}/produced-by")
    async def produced_by(ref: str) -> list[dict]:
        return await call(engine.produced_by, await call(engine.resolve, ref))

    @app.get("/api/v1/lineage/common")
    async def common(a: str, b: str) -> dict:
        return {"image": await call(engine.common_ancestor, await call(engine.resolve, a),
                                    await call(engine.resolve, b))}

    @app.get("/api/v1/lineage/path")
    async def lineage_path(a: str, b: str) -> list[str]:
        return await call(engine.lineage_path, await call(engine.resolve, a), await call(engine.resolve, b))

    @app.post("/api/v1/images/{ref:path}/share")
    async def share(ref: str, body: ShareIn) -> dict:
        """Make an image (one the caller owns) visible to every tenant by its ID, or stop that."""
        i = await call(engine.resolve, ref)
        return await call(engine.share if body.public else engine.unshare, i)

    @app.get("/api/v1/audit")
    async def audit(tenant: str | None = None, limit: int = Query(100, ge=1, le=10000)) -> list[dict]:
        """Who ran what on which image, newest first: a tenant's token sees its own records."""
        return await call(lambda: engine.audit(tenant=tenant, limit=limit))

    @app.delete("/api/v1/images/{ref:path}")
    async def remove_image(ref: str, force: bool = False) -> dict:
        i = await call(engine.resolve, ref)
        await call(engine.remove_image, i, force=force)
        return {"removed": i}

    @app.post("/api/v1/admin/fsck")
    async def fsck(verify_content: bool = True) -> dict:
        return await call(engine.fsck, verify_content)

    @app.post("/api/v1/admin/gc")
    async def gc(retention: float = GC_RETENTION, grace: float = GC_GRACE) -> dict:
        return await call(engine.gc, retention, grace)

    @app.get("/api/v1/images/{ref:path}/lineage")
    async def image_lineage(ref: str, max_nodes: int = Query(2000, ge=1, le=100_000)) -> dict:
        i = await call(engine.resolve, ref)
        return {"image": i, "log": await call(engine.log, i),
                "tree": await call(functools.partial(engine.lineage_tree, i, max_nodes=max_nodes))}

    @app.get("/api/v1/images/{ref:path}")
    async def get_image(ref: str) -> dict:
        return await call(engine.image_info, await call(engine.resolve, ref))

    @app.post("/api/v1/images/import", status_code=201)
    async def import_tar(request: Request, tag: str | None = None) -> dict:
        """The body is a tar (plain, gzip or zstd) of a root filesystem, or an OCI/docker archive."""
        path, _, _ = await spool(request, stage)
        try:
            return {"image": await call(engine.import_path, path, tag=tag), "tag": tag}
        finally:
            unstage(path)

    @app.post("/api/v1/images/pull", status_code=201)
    async def pull(body: PullIn) -> dict:
        return {"image": await call(functools.partial(engine.pull, body.reference, tag=body.tag,
                                                      insecure=body.insecure)), "tag": body.tag}

    @app.put("/api/v1/tags/{name:path}")
    async def set_tag(name: str, body: TagIn) -> dict:
        i = await call(engine.resolve, body.image)
        await call(engine.tag, i, name)
        return {"tag": name, "image": i}

    @app.delete("/api/v1/tags/{name:path}")
    async def delete_tag(name: str) -> dict:
        return {"tag": name, "image": await call(engine.untag, name)}

    # ---- files -----------------------------------------------------------------------------------
    @app.post("/api/v1/files", status_code=201)
    async def upload(request: Request) -> dict:
        """Upload once, reference many times: runs take {"path", "sha256"}."""
        path, digest, size = await spool(request, stage)
        try:
            return {"sha256": await call(engine.upload_file, path, digest), "size": size}
        finally:
            unstage(path)

    @app.post("/api/v1/file-sets", status_code=201)
    async def file_set(body: list[FileIn]) -> dict:
        """A reusable set of uploaded files ({"path", "sha256", "mode"}); its ID is its content hash."""
        return {"id": await call(engine.file_set_create, [f.model_dump(exclude_none=True) for f in body])}

    @app.post("/api/v1/registries/login")
    async def registry_login(body: LoginIn) -> dict:
        return {"registry": await call(functools.partial(engine.registry_login, body.registry, body.username,
                                                         body.token, insecure=body.insecure))}

    @app.get("/api/v1/files/{sha256}/info")
    async def upload_info(sha256: str) -> dict:
        """An upload's size and time (the caller's own upload, or 404)."""
        return await call(engine.upload_info, sha256)

    @app.get("/api/v1/files/{sha256}")
    async def download(sha256: str) -> Response:
        """Streamed from the blob's file (read whole into memory, an upload was as large as the
        body cap, per request). upload_info is the caller's check: its own upload, or 404."""
        await call(engine.upload_info, sha256)
        return FileResponse(blobs.path(sha256), media_type="application/octet-stream")

    # ---- runs and operations ---------------------------------------------------------------------
    @app.post("/api/v1/runs", status_code=201)
    async def run(body: RunIn) -> dict:
        opts: dict[str, Any] = {k: getattr(body, k) for k in ("env", "cwd", "uid", "gid", "hostname",
                                                               "disposable", "file_set", "tier", "timeout",
                                                               "memory", "pids", "cpus", "disk", "output")}
        opts["stdin"] = _stdin(body)
        opts["files"] = [f.model_dump(exclude_none=True) for f in body.files]
        if not body.wait:
            return await call(lambda: ops.get(ops.submit_run(body.image, body.command, **opts)))
        # one thread for submit and wait: each hop between the loop and a thread costs
        op = await call(ops.submit_run, body.image, body.command, **opts)
        return await wait_call(lambda: operation_view(ops.wait([op])[0]))

    # ---- live sandboxes --------------------------------------------------------------------------
    @app.post("/api/v1/sandboxes", status_code=201)
    async def start_sandbox(body: StartIn) -> dict:
        opts = body.model_dump(exclude={"image", "files"})
        opts["files"] = [f.model_dump(exclude_none=True) for f in body.files]
        return await call(engine.sandbox_start, body.image, **opts)

    @app.get("/api/v1/sandboxes")
    async def list_sandboxes(all: bool = False) -> list[dict]:
        return await call(engine.sandbox_list, all=all)

    @app.get("/api/v1/sandboxes/{sid}")
    async def get_sandbox(sid: str) -> dict:
        return await call(engine.sandbox_info, sid)

    @app.post("/api/v1/sandboxes/{sid}/exec")
    async def exec_sandbox(sid: str, body: ExecIn, stream: bool = False):
        """The command's result once it exits; with ?stream=true, Server-Sent Events while it runs:
        `stdout`/`stderr` (data: the bytes as base64), then `end` (data: that same result as JSON)
        or `error` (data: the error object)."""
        opts = body.model_dump(exclude={"command", "stdin", "stdin_base64"})
        opts["stdin"] = _stdin(body)
        if not stream:
            return exec_view(await call(engine.sandbox_exec, sid, body.command, **opts))
        await call(engine.sandbox_info, sid)                     # 404 for an unknown sandbox
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def on_output(name: str, chunk: bytes) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (name, base64.b64encode(chunk).decode()))

        task = asyncio.ensure_future(call(engine.sandbox_exec, sid, body.command, on_output=on_output, **opts))
        task.add_done_callback(lambda _: loop.call_soon_threadsafe(queue.put_nowait, None))

        async def events():
            while (item := await queue.get()) is not None:
                yield f"event: {item[0]}\ndata: {item[1]}\n\n"
            exc = task.exception()
            if exc is None:
                yield f"event: end\ndata: {json.dumps(exec_view(task.result()))}\n\n"
            else:
                err = exc.to_dict() if isinstance(exc, SandtreeError) else {"error": "internal", "message": str(exc)}
                yield f"event: error\ndata: {json.dumps(err, default=str)}\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    def exec_view(rec) -> dict:
        return {"id": rec.op, "source": rec.source, "result": None, "status": "done",
                "outcome": {"exit_code": rec.exit_code, "signal": rec.signal, "timed_out": rec.timed_out,
                            "cancelled": rec.cancelled, "stdout_truncated": rec.stdout_truncated,
                            "stderr_truncated": rec.stderr_truncated, "usage": rec.usage},
                "stdout": rec.stdout.decode("utf-8", "replace"), "stderr": rec.stderr.decode("utf-8", "replace"),
                "stdout_base64": base64.b64encode(rec.stdout).decode(),
                "stderr_base64": base64.b64encode(rec.stderr).decode()}

    @app.post("/api/v1/sandboxes/{sid}/commit", status_code=201)
    async def commit_sandbox(sid: str, body: CommitIn | None = None) -> dict:
        body = body or CommitIn()
        return {"image": await call(engine.sandbox_commit, sid, tag=body.tag)}

    @app.post("/api/v1/sandboxes/{sid}/stop")
    async def stop_sandbox(sid: str) -> dict:
        return await call(engine.sandbox_stop, sid)

    # ---- warm pools (the server's own: runs through it on that image use them) --------------------
    @app.put("/api/v1/pools/{image}")
    async def put_pool(image: str, body: PoolIn) -> dict:
        opts = body.model_dump(exclude={"size", "wait"})

        def create():
            stats = engine.pool_create(engine.resolve(image), body.size, **opts)
            if body.wait:
                engine.pool_wait(stats["image"])
                stats = next(p for p in engine.pool_list() if p["image"] == stats["image"])
            return stats
        return await call(create)

    @app.post("/api/v1/pools/{image}/wait")
    async def wait_pool(image: str, timeout: float = Query(30.0, ge=0, le=600)) -> dict:
        return {"ready": await wait_call(lambda: engine.pool_wait(engine.resolve(image), timeout))}

    @app.get("/api/v1/pools")
    async def list_pools() -> list[dict]:
        return await call(engine.pool_list)

    @app.delete("/api/v1/pools/{image}", status_code=204)
    async def delete_pool(image: str) -> Response:
        await call(lambda: engine.pool_remove(engine.resolve(image)))
        return Response(status_code=204)

    @app.post("/api/v1/sandboxes/{sid}/hibernate")
    async def hibernate_sandbox(sid: str) -> dict:
        return await call(engine.sandbox_hibernate, sid)

    @app.post("/api/v1/sandboxes/{sid}/resume")
    async def resume_sandbox(sid: str) -> dict:
        return await call(engine.sandbox_resume, sid)

    @app.get("/api/v1/sandboxes/{sid}/file")
    async def read_sandbox_file(sid: str, path: str) -> Response:
        return Response(await call(engine.sandbox_read, sid, path), media_type="application/octet-stream")

    @app.put("/api/v1/sandboxes/{sid}/file")
    async def write_sandbox_file(sid: str, path: str, request: Request, mode: int = Query(0o644, ge=0, le=0o7777),
                                 uid: int = Query(0, ge=0, lt=65536), gid: int = Query(0, ge=0, lt=65536)) -> dict:
        data = await request.body()
        await call(engine.sandbox_write, sid, path, data, mode=mode, uid=uid, gid=gid)
        return {"path": path, "size": len(data)}

    def operation_view(rec: dict) -> dict:
        done = ops.result(rec["id"])
        if done is not None:                   # text for people, base64 for exact bytes
            rec = {**rec, "stdout": done.stdout.decode("utf-8", "replace"),
                   "stderr": done.stderr.decode("utf-8", "replace"),
                   "stdout_base64": base64.b64encode(done.stdout).decode(),
                   "stderr_base64": base64.b64encode(done.stderr).decode()}
        return rec

    @app.get("/api/v1/operations")
    async def list_operations(status: str | None = None, limit: int = Query(50, ge=1, le=1000)) -> list[dict]:
        return await call(ops.list, status=status, limit=limit)

    @app.get("/api/v1/operations/{op}")
    async def get_operation(op: str) -> dict:
        return await call(lambda: operation_view(ops.get(op)))

    @app.post("/api/v1/operations/{op}/wait")
    async def wait_operation(op: str, timeout: float = Query(60, ge=0, le=3600)) -> dict:
        return await wait_call(lambda: operation_view(ops.wait([op], timeout)[0]))

    @app.post("/api/v1/operations/{op}/cancel")
    async def cancel_operation(op: str) -> dict:
        return await call(ops.cancel, op)

    @app.get("/api/v1/operations/{op}/events")
    async def events(op: str, request: Request) -> StreamingResponse:
        """Server-Sent Events: `start`, `stdout`, `stderr`, `end`; ids are sequence numbers, so a
        client reconnecting with Last-Event-ID gets only what it missed."""
        rec = await call(ops.get, op)                            # 404 for an unknown operation
        try:
            after = int(request.headers.get("last-event-id", "0"))
        except ValueError:
            after = 0

        async def stream():
            nonlocal after
            if rec["status"] in ("done", "failed", "cancelled"):
                new, ended = await call(ops.events_after, op, 0, 0)
                if not new and not ended:
                    return                  # run by an engine before this one (or long ago): nothing to follow
            while True:
                new, ended = await wait_call(ops.events_after, op, after, 10.0)
                for seq, kind, data in new:
                    after = seq
                    payload = "\n".join(f"data: {line}" for line in data.split("\n"))
                    yield f"id: {seq}\nevent: {kind}\n{payload}\n\n"
                if ended:
                    return
                if not new:
                    if await request.is_disconnected():
                        return
                    yield ": keep-alive\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream")

    # ---- branching -------------------------------------------------------------------------------
    @app.get("/api/v1/diff")
    async def diff(a: str, b: str, patch: bool = False) -> dict:
        ia, ib = await call(engine.resolve, a), await call(engine.resolve, b)
        out = {"a": ia, "b": ib, "changes": [c.to_dict() for c in await call(engine.diff, ia, ib)]}
        if patch:
            out["patch"] = await call(engine.patch, ia, ib)
        return out

    @app.post("/api/v1/merge")
    async def merge(body: MergeIn) -> dict:
        resolve = engine.resolve
        base = await call(resolve, body.base) if body.base else None
        return await call(engine.merge, base, await call(resolve, body.ours), await call(resolve, body.theirs),
                          strategy=body.strategy, ignore=body.ignore, on_conflict=body.on_conflict)

    @app.get("/api/v1/branches")
    async def branches() -> dict:
        return await call(engine.branches)

    @app.post("/api/v1/branches", status_code=201)
    async def create_branch(body: BranchIn) -> dict:
        i = await call(engine.resolve, body.image)
        await call(engine.branch_create, body.name, i, force=body.force)
        return {"branch": body.name, "image": i}

    @app.delete("/api/v1/branches/{name:path}")
    async def delete_branch(name: str) -> dict:
        return {"branch": name, "image": await call(engine.branch_delete, name)}

    @app.get("/api/v1/branches/{name:path}/log")
    async def branch_log(name: str) -> list[dict]:
        return await call(engine.branch_log, name)

    @app.get("/api/v1/branches/{name:path}")
    async def branch_head(name: str) -> dict:
        return {"branch": name, "image": await call(engine.branch_head, name)}

    @app.post("/api/v1/branches/{name:path}/rollback")
    async def rollback(name: str, body: RollbackIn) -> dict:
        to = await call(engine.resolve, body.to) if body.to else None
        return {"branch": name, "image": await call(engine.rollback, name, to=to, steps=body.steps)}

    app.include_router(contree_router(engine_for, stage))                  # Contree's own clients, under /v1
    return app


def serve(home: str, *, host: str = "127.0.0.1", port: int = 8080, max_runs: int = 4,
          access_log: str = "json", pools: dict[str, int] | None = None,
          max_upload: int | str = DEFAULT_MAX_UPLOAD) -> None:
    """access_log: "json" (one JSON object per request on stderr) or "off". pools: image -> size,
    warm pools kept by this server (runs through it on those images skip setup). max_upload:
    the largest upload or image tar (a tenant's max_upload limit replaces it)."""

    import uvicorn

    from ..engine import parse_size
    max_upload = parse_size(max_upload)
    engine = Engine(home, max_runs=max_runs)
    try:
        tokens = engine.tenancy.configured()
        if host not in LOOPBACK and not tokens:
            raise SystemExit("sandtree serve: no tokens are configured, so it listens on loopback only "
                             f"(asked for {host}); create one with `sandtree token create --tenant NAME`")
        log = JsonLog(sys.stderr) if access_log == "json" else None
        auth = "tokens" if tokens else "none: no tokens configured, listening on loopback only"
        print(f"sandtree serve: http://{host}:{port} (auth: {auth})", file=sys.stderr, flush=True)
        if log is not None:
            log("start", host=host, port=port, auth="tokens" if tokens else "none", loopback_only=not tokens)
        engine.sandboxes.reap_every(5.0)          # idle timeouts hold with nobody listing
        for image, size in (pools or {}).items():
            engine.pool_create(engine.resolve(image), size)
        uvicorn.run(build_app(engine, log=log, max_upload=max_upload), host=host, port=port, log_level="warning")
    finally:
        engine.close()

