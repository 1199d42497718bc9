"""/api/v1 runs and operations, the routes that need more than a call of the engine (http/derived.py makes the
others from the operation table and registers these by name): POST /runs starts one (waiting for it unless
wait=false), a fork waits for its runs, an operation is read or waited for with a finished run's output, and
its stdout/stderr followed live as Server-Sent Events that resume from Last-Event-ID."""

from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .. import defaults as D
from .derived import body_model, handler
from ..table import OPS
from .models import stdin_bytes
from .sandboxes import exec_view
from .plumbing import Plumbing

RunIn, ForkIn = body_model("run"), body_model("fork")        # the bodies, made from the rows
# what a run takes beside its image, command and stdin: the run row's keyword arguments its body names
RUN_OPTIONS = tuple(a for a in OPS["run"].http.body if a not in ("ref", "command", "stdin"))


def operation_view(ops, rec: dict) -> dict:
    """An operation's record with a finished run's output (if this process ran it)."""
    done = ops.result(rec["id"])
    if done is not None:                   # text for people, base64 for exact bytes
        rec = {**rec, "stdout": done.stdout.decode("utf-8", "replace"),
               "stderr": done.stderr.decode("utf-8", "replace"),
               "stdout_base64": base64.b64encode(done.stdout).decode(),
               "stderr_base64": base64.b64encode(done.stderr).decode()}
    return rec


def run_answer(p: Plumbing):
    """POST /api/v1/runs once its body is a valid RunIn: `await answer(body)` is the 201 response
    (engine errors raise, for the error handlers)."""
    ops, call, wait_call = p.ops, p.call, p.wait_call

    async def answer(body: RunIn) -> JSONResponse:
        opts: dict[str, Any] = {k: getattr(body, k) for k in RUN_OPTIONS}
        opts["stdin"] = stdin_bytes(body)
        opts["files"] = [f.model_dump(exclude_none=True) for f in body.files]
        if not body.wait:
            rec = await call(lambda: ops.get(ops.submit_run(body.image, body.command, **opts)))
        else:
            # one thread hop for submit and wait (each hop costs the event loop, which every
            # request shares): on the waits pool, as the run's end is what it mostly waits for
            rec = await wait_call(lambda: operation_view(ops, ops.wait([ops.submit_run(body.image, body.command,
                                                                                       **opts)])[0]))
        # the record is JSON already (rows of the database): answered as it is, not re-validated
        # against the `dict` response model (the busiest route's largest per-request cost after routing)
        return JSONResponse(rec, status_code=201)
    return answer


@handler("run")
def run(p: Plumbing):
    answer = run_answer(p)

    async def run(body: RunIn) -> dict:
        return await answer(body)       # (quickruns.QuickRuns answers a well-formed one before routing)
    return run


@handler("fork")
def fork(p: Plumbing):
    engine, wait_call = p.engine, p.wait_call

    async def fork(body: ForkIn) -> list[dict]:
        """Each command from the same image at once, one branch each; the finished runs in order."""
        opts: dict[str, Any] = {k: getattr(body, k) for k in RUN_OPTIONS}
        opts["files"] = [f.model_dump(exclude_none=True) for f in body.files]
        recs = await wait_call(engine.fork, body.image, body.commands, parallel=body.parallel, **opts)
        return [exec_view(r) for r in recs]
    return fork


@handler("get_operation")
def get_operation(p: Plumbing):
    ops, call = p.ops, p.call

    async def get_operation(op: str) -> dict:
        return await call(lambda: operation_view(ops, ops.get(op)))
    return get_operation


@handler("wait_operation")
def wait_operation(p: Plumbing):
    ops, wait_call = p.ops, p.wait_call

    async def wait_operation(op: str, timeout: float = Query(D.OPERATION_WAIT, ge=0, le=D.WAIT_MAX)) -> dict:
        return await wait_call(lambda: operation_view(ops, ops.wait([op], timeout)[0]))
    return wait_operation


def runs_router(p: Plumbing) -> APIRouter:
    """An operation's events: not a row of the table (a stream of what a run prints, as it prints it)."""
    router, ops, call, wait_call = APIRouter(), p.ops, p.call, p.wait_call

    @router.get("/api/v1/operations/{op}/events")
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

    return router
