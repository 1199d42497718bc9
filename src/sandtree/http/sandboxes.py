"""/api/v1 live sandboxes (start, exec, files, commit, hibernate, resume, stop) and the server's
warm pools (runs through it on a pooled image skip setup)."""

from __future__ import annotations

import asyncio
import base64
import json

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from ..errors import InvalidInput, SandtreeError
from .models import CommitIn, ExecIn, NetworkSetIn, PoolIn, SignalIn, ProcessIn, StartIn, TimeoutIn, stdin_bytes
from .plumbing import Plumbing


def exec_view(rec) -> dict:
    """A command's result (a live sandbox's exec, a fork's run), in the shape of a finished
    operation."""
    return {"id": rec.op, "source": rec.source, "result": rec.image, "status": "done",
            "outcome": {"exit_code": rec.exit_code, "signal": rec.signal, "timed_out": rec.timed_out,
                        "oom_killed": rec.oom_killed, "cancelled": rec.cancelled,
                        "stdout_truncated": rec.stdout_truncated,
                        "stderr_truncated": rec.stderr_truncated, "usage": rec.usage},
            "stdout": rec.stdout.decode("utf-8", "replace"), "stderr": rec.stderr.decode("utf-8", "replace"),
            "stdout_base64": base64.b64encode(rec.stdout).decode(),
            "stderr_base64": base64.b64encode(rec.stderr).decode()}


def sandboxes_router(p: Plumbing) -> APIRouter:
    router, engine, call, wait_call = APIRouter(), p.engine, p.call, p.wait_call

    @router.post("/api/v1/sandboxes", status_code=201)
    async def start_sandbox(body: StartIn) -> dict:
        opts = body.model_dump(exclude={"image", "files"})
        opts["files"] = [f.model_dump(exclude_none=True) for f in body.files]
        return await call(engine.sandbox_start, body.image, **opts)

    @router.get("/api/v1/sandboxes")
    async def list_sandboxes(all: bool = False, label: list[str] = Query([], description="NAME=VALUE: only "
                                                                   "sandboxes with this label (repeatable)")) -> list[dict]:
        labels = {}
        for pair in label:
            name, sep, value = pair.partition("=")
            if not sep:
                raise InvalidInput(f"a label filter is NAME=VALUE, not {pair!r}")
            labels[name] = value
        return await call(engine.sandbox_list, all=all, labels=labels or None)

    @router.get("/api/v1/sandboxes/{sid}")
    async def get_sandbox(sid: str) -> dict:
        return await call(engine.sandbox_info, sid)

    @router.post("/api/v1/sandboxes/{sid}/exec")
    async def exec_sandbox(sid: str, body: ExecIn, stream: bool = False):
        """The command's result once it exits; with ?stream=true, Server-Sent Events while it runs:
        `stdout`/`stderr` (data: the bytes as base64), then `end` (data: that same result as JSON)
        or `error` (data: the error object)."""
        opts = body.model_dump(exclude={"command", "stdin", "stdin_base64"})
        opts["stdin"] = stdin_bytes(body)
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

    # ---- processes started without waiting (sid: a live sandbox, or a live run's operation ID) ----
    @router.post("/api/v1/sandboxes/{sid}/processes", status_code=201)
    async def spawn_process(sid: str, body: ProcessIn) -> dict:
        opts = body.model_dump(exclude={"command", "stdin", "stdin_base64"})
        return {"pid": await call(engine.sandbox_spawn, sid, body.command, stdin=stdin_bytes(body), **opts)}

    @router.post("/api/v1/sandboxes/{sid}/processes/{pid}/stdin", status_code=204)
    async def process_stdin(sid: str, pid: int, request: Request, close: bool = True) -> Response:
        """The request body is written to the process's stdin; close=false keeps it open."""
        await call(engine.sandbox_stdin, sid, pid, await request.body(), close=close)
        return Response(status_code=204)

    @router.post("/api/v1/sandboxes/{sid}/processes/{pid}/signal", status_code=204)
    async def process_signal(sid: str, pid: int, body: SignalIn | None = None) -> Response:
        await call(engine.sandbox_signal, sid, pid, str((body or SignalIn()).signal))
        return Response(status_code=204)

    @router.get("/api/v1/sandboxes/{sid}/processes/{pid}")
    async def get_process(sid: str, pid: int) -> dict:
        return await call(engine.sandbox_process, sid, pid)

    @router.post("/api/v1/sandboxes/{sid}/commit", status_code=201)
    async def commit_sandbox(sid: str, body: CommitIn | None = None) -> dict:
        body = body or CommitIn()
        return {"image": await call(engine.sandbox_commit, sid, tag=body.tag)}

    @router.post("/api/v1/sandboxes/{sid}/stop")
    async def stop_sandbox(sid: str) -> dict:
        return await call(engine.sandbox_stop, sid)

    # ---- warm pools (the server's own: runs through it on that image use them) --------------------
    @router.put("/api/v1/pools/{image}")
    async def put_pool(image: str, body: PoolIn) -> dict:
        opts = body.model_dump(exclude={"size", "wait", "wait_timeout"})
        if body.wait:
            return await call(engine.pool_and_wait, image, body.size, wait_timeout=body.wait_timeout, **opts)
        return await call(engine.pool_create, image, body.size, **opts)

    @router.post("/api/v1/pools/{image}/wait")
    async def wait_pool(image: str, timeout: float = Query(30.0, ge=0, le=600)) -> dict:
        return {"ready": await wait_call(lambda: engine.pool_wait(engine.resolve(image), timeout))}

    @router.get("/api/v1/pools")
    async def list_pools() -> list[dict]:
        return await call(engine.pool_list)

    @router.delete("/api/v1/pools/{image}", status_code=204)
    async def delete_pool(image: str) -> Response:
        await call(lambda: engine.pool_remove(engine.resolve(image)))
        return Response(status_code=204)

    @router.post("/api/v1/sandboxes/{sid}/hibernate")
    async def hibernate_sandbox(sid: str) -> dict:
        return await call(engine.sandbox_hibernate, sid)

    @router.post("/api/v1/sandboxes/{sid}/resume")
    async def resume_sandbox(sid: str) -> dict:
        return await call(engine.sandbox_resume, sid)

    @router.get("/api/v1/sandboxes/{sid}/file")
    async def read_sandbox_file(sid: str, path: str) -> Response:
        return Response(await call(engine.sandbox_read, sid, path), media_type="application/octet-stream")

    @router.put("/api/v1/sandboxes/{sid}/file")
    async def write_sandbox_file(sid: str, path: str, request: Request, mode: int = Query(0o644, ge=0, le=0o7777),
                                 uid: int = Query(0, ge=0, lt=65536), gid: int = Query(0, ge=0, lt=65536)) -> dict:
        data = await request.body()
        await call(engine.sandbox_write, sid, path, data, mode=mode, uid=uid, gid=gid)
        return {"path": path, "size": len(data)}

    @router.delete("/api/v1/sandboxes/{sid}/file", status_code=204)
    async def remove_sandbox_file(sid: str, path: str) -> Response:
        """Remove a file, a link or an empty directory."""
        await call(engine.sandbox_remove, sid, path)
        return Response(status_code=204)

    @router.post("/api/v1/sandboxes/{sid}/timeout")
    async def set_sandbox_timeout(sid: str, body: TimeoutIn) -> dict:
        """The sandbox now stops `timeout` seconds from now (E2B's set_timeout)."""
        return await call(engine.sandbox_set_timeout, sid, body.timeout)

    @router.post("/api/v1/sandboxes/{sid}/network")
    async def set_sandbox_network(sid: str, body: NetworkSetIn) -> dict:
        """Replace the live sandbox's network policy (connections it now forbids are cut)."""
        return await call(engine.sandbox_set_network, sid, body.network)

    @router.get("/api/v1/sandboxes/{sid}/ls")
    async def list_sandbox_dir(sid: str, path: str = "/") -> list[dict]:
        return await call(engine.sandbox_ls, sid, path)

    @router.get("/api/v1/sandboxes/{sid}/exists")
    async def sandbox_path_exists(sid: str, path: str) -> dict:
        return {"path": path, "exists": await call(engine.sandbox_exists, sid, path)}

    @router.post("/api/v1/sandboxes/{sid}/mkdir")
    async def make_sandbox_dir(sid: str, path: str, mode: int = Query(0o755, ge=0, le=0o7777),
                               uid: int = Query(0, ge=0, lt=65536), gid: int = Query(0, ge=0, lt=65536)) -> dict:
        """Make a directory and any missing parents (mkdir -p)."""
        await call(engine.sandbox_mkdir, sid, path, mode=mode, uid=uid, gid=gid)
        return {"path": path}

    return router
