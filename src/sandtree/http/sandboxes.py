"""/api/v1 live sandboxes, the routes that need more than a call of the engine (http/derived.py makes the others
from the operation table and registers these by name): start (its options, RunOptions' wire model), exec (with
?stream=true, Server-Sent Events while it runs), a file written from the request's body."""

from __future__ import annotations

import asyncio
import base64
import json

from fastapi import Query, Request
from fastapi.responses import StreamingResponse

from .. import defaults as D
from ..errors import Ended, SandtreeError
from .derived import body_model, handler
from .models import stdin_bytes
from .plumbing import Plumbing

StartIn, ExecIn = body_model("sandbox_start"), body_model("sandbox_exec")     # their bodies, made from the rows


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


@handler("start_sandbox")
def start_sandbox(p: Plumbing):
    engine, call = p.engine, p.call

    async def start_sandbox(body: StartIn) -> dict:
        opts = body.model_dump(exclude={"image", "files"})
        opts["files"] = [f.model_dump(exclude_none=True) for f in body.files]
        return await call(engine.sandbox_start, body.image, **opts)
    return start_sandbox


@handler("exec_sandbox")
def exec_sandbox(p: Plumbing):
    engine, call = p.engine, p.call

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
    return exec_sandbox


@handler("write_sandbox_file")
def write_sandbox_file(p: Plumbing):
    engine, call = p.engine, p.call

    async def write_sandbox_file(sid: str, path: str, request: Request,
                                 mode: int = Query(D.FILE_MODE, ge=0, le=0o7777),
                                 uid: int = Query(0, ge=0, lt=65536), gid: int = Query(0, ge=0, lt=65536)) -> dict:
        """The request body is the file's bytes; the answer names its size."""
        data = await request.body()
        await call(engine.sandbox_write, sid, path, data, mode=mode, uid=uid, gid=gid)
        return {"path": path, "size": len(data)}
    return write_sandbox_file


@handler("sandbox_watch_events")
def sandbox_watch_events(p: Plumbing):
    engine, wait_call = p.engine, p.wait_call

    async def sandbox_watch_events(sid: str, watch: str, request: Request,
                                   timeout: float = Query(0.0, ge=0, le=D.WATCH_WAIT_MAX), stream: bool = False):
        """The events since the last call (waiting up to `timeout` seconds for one); with ?stream=true,
        NDJSON as they come: one event a line ({name, type, time}), an empty line to keep the connection
        while nothing happens, the stream ending when the watch does (its directory or sandbox gone)."""
        if not stream:
            return await wait_call(engine.sandbox_watch_events, sid, watch, timeout=timeout)
        got = await wait_call(engine.sandbox_watch_events, sid, watch, timeout=0.0)   # 404 for an unknown watch

        async def lines():
            nonlocal got
            while True:
                for ev in got["events"]:
                    yield json.dumps(ev, separators=(",", ":")) + "\n"
                if not got["events"]:
                    if await request.is_disconnected():
                        return
                    yield "\n"
                try:
                    got = await wait_call(engine.sandbox_watch_events, sid, watch, timeout=10.0)
                except Ended:
                    return
        return StreamingResponse(lines(), media_type="application/x-ndjson")
    return sandbox_watch_events
