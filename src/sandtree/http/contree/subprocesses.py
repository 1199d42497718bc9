"""Contree's subprocesses of a running instance under /v1/operations/{id}/subprocesses, and the
events they add to the operation's stream (for contree/routes.py).

An instance that is still running is a live sandbox (engine/processes/instances.py); its subprocesses are
processes started in it: spid 1 is the instance's own command, 2, 3, ... the ones added here.
Each route is one row of the operation table on the operation's ID (sandbox_spawn / sandbox_stdin /
sandbox_signal / sandbox_process: a live run's ID names its live sandbox); what they answer is put
in Contree's shapes here. Statuses as Contree's document: 425 (with Retry-After) while the
instance is still starting, 409 when the operation is not a running instance or a stdin is closed,
410 for a stdin of an instance that finished, 404 for a process it never had or one that exited.
"""

import asyncio
import base64
import datetime as dt
import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from . import wire
from ...errors import InvalidInput


class SubprocessIn(wire.Lenient):
    """Contree's ExecSpec: process fields only (the instance's own are set at its spawn)."""
    command: str = Field(min_length=1)
    args: list[str] = []
    shell: bool = False
    env: dict[str, str | None] | None = None
    cwd: str = Field("", pattern=r"^((/[^/]*)+/?)?$")
    uid: int = Field(0, ge=0)
    gid: int = Field(0, ge=0)
    stdin: wire.StreamIn | None = None
    truncate_output_at: int | None = Field(None, ge=1, le=10 << 20)


def live_options(body) -> dict:
    """How an instance (wire.SpawnIn) runs: in a live sandbox, so subprocesses may join it while it
    runs (an instance still running is a live sandbox); its stdin open unless closed at spawn; a
    missing cwd made, as Contree does (its processes' too)."""
    return {"live": True, "stdin_open": body.stdin is not None and not body.stdin.close, "make_cwd": True}


def stream_bytes(s: wire.StreamIn | None) -> bytes:
    if s is None or not s.value:
        return b""
    if s.encoding == "base64":
        try:
            return base64.b64decode(s.value, validate=True)
        except ValueError:
            raise InvalidInput("stdin.value is not valid base64") from None
    return s.value.encode()


def result_view(p: dict) -> dict:
    """Contree's InstanceResult of a process (the sandbox_process row): -1 for what is not known yet."""
    running = p["running"]
    out = {s: base64.b64decode(p[s + "_base64"]) for s in ("stdout", "stderr")}
    code, sig = p["exit_code"], p["signal"]
    wall = ((p.get("finished") or 0) - (p.get("started") or 0)) if not running else 0.0
    zero = ("block_input", "block_output", "involuntary_switches", "max_rss", "page_faults", "page_faults_io",
            "shared_memory", "signals", "swaps", "unshared_memory", "voluntary_switches")
    return {"resources": {**{k: 0 for k in zero}, "cost": 0.0, "elapsed_time": max(0.0, wall),
                          "monotonic_time": max(0.0, wall), "system_cpu_time": 0.0, "user_cpu_time": 0.0},
            "state": {"continued": False, "core_dump": False, "pid": p["pid"], "stopped": False,
                      "exit_code": -1 if running or code is None else code,
                      "signal": -1 if running else (sig or 0), "timed_out": bool(p["timed_out"])},
            "stdout": wire.stream_repr(out["stdout"], p["stdout_truncated"]),
            "stderr": wire.stream_repr(out["stderr"], p["stderr_truncated"])}


def proc_events(seq: int, data: str) -> list[dict]:
    """Contree events (id STEP*seq, as contree_wire.events_of) of one engine "proc" event."""
    e = json.loads(data)
    now = dt.datetime.now(dt.UTC).isoformat()
    head = {"id": wire.STEP * seq, "ts": now, "spid": e["spid"], "type": e["type"]}
    if e["type"] in ("stdout", "stderr", "stdin"):
        return [{**head, "data": wire.stream_repr(e["data"].encode())}]
    if e["type"] == "truncated":
        return [{**head, "data": {k: e[k] for k in ("stream", "bytes_emitted", "bytes_dropped")}}]
    if e["type"] == "network":
        # the configured policy is the run's (its hosts and ports); the link's counters live in the
        # egress daemon, not in the sandbox: told as Contree tells a failed counter read
        return [{**head, "data": {"interfaces": [], "configured": {},
                                  "error": "per-interface counters are not read here"}}]
    if e["type"] == "spawn":
        return [{**head, "data": {"pid": e["spid"], "command": e["argv"][0], "args": e["argv"][1:],
                                  "shell": e["shell"], "cwd": e["cwd"] or "", "uid": e["uid"] or 0,
                                  "gid": e["gid"] or 0, "timeout": 0, "truncate_at": e["truncate_at"], "env": {}}}]
    code, sig = e["exit_code"], e["signal"]
    return [{**head, "data": {"pid": e["spid"], "code": code if code is not None else -1,
                              "signal": sig if sig is not None else -1, "timed_out": e["timed_out"],
                              "duration_ms": e["duration_ms"], "resources": wire.event_resources(None)}}]


def subprocesses_router(engine_for, route_class) -> APIRouter:
    """Routes added to routes.py's /v1 router; route_class: its ContreeRoute (Contree's errors).
    (No `from __future__ import annotations` here: FastAPI reads the local Engine annotation.)"""
    router = APIRouter(route_class=route_class)

    def engine_dep(request: Request):
        return engine_for(request)
    Engine = Annotated[Any, Depends(engine_dep)]

    def call(fn, *a, **k):
        return asyncio.to_thread(fn, *a, **k)

    @router.post("/operations/{operation_id}/subprocesses", status_code=201)
    async def create(operation_id: str, body: SubprocessIn, request: Request, engine: Engine) -> JSONResponse:
        op = wire.op_id(operation_id)
        if body.shell and body.args:
            raise InvalidInput("args must be empty when shell is true")
        command = body.command if body.shell else [body.command, *body.args]
        spid = await call(engine.sandbox_spawn, op, command,
                          env={k: v for k, v in (body.env or {}).items() if v is not None} or None,
                          cwd=body.cwd.rstrip("/") or None, uid=body.uid, gid=body.gid,
                          stdin=stream_bytes(body.stdin) or None,
                          stdin_open=body.stdin is not None and not body.stdin.close,
                          output=body.truncate_output_at)
        where = f"{request.scope.get('root_path', '')}/v1/operations/{wire.to_uuid(op)}/subprocesses/{spid}"
        return JSONResponse({"spid": spid}, status_code=201, headers={"Location": where})

    @router.get("/operations/{operation_id}/subprocesses/{spid}")
    async def result(operation_id: str, engine: Engine, spid: int = Path(ge=1)) -> dict:
        return result_view(await call(engine.sandbox_process, wire.op_id(operation_id), spid))

    @router.delete("/operations/{operation_id}/subprocesses/{spid}", status_code=204)
    async def kill(operation_id: str, engine: Engine, spid: int = Path(ge=1), signal: str | None = None) -> Response:
        await call(engine.sandbox_signal, wire.op_id(operation_id), spid, "KILL" if signal is None else signal)
        return Response(status_code=204)

    @router.post("/operations/{operation_id}/subprocesses/{spid}/stdin", status_code=204)
    async def stdin(operation_id: str, body: wire.StreamIn, engine: Engine, spid: int = Path(ge=1)) -> Response:
        await call(engine.sandbox_stdin, wire.op_id(operation_id), spid, stream_bytes(body), close=body.close)
        return Response(status_code=204)

    return router
