"""E2B's code interpreter on port 49999 of a sandbox (dispatch.py): what `e2b-code-interpreter`'s
Sandbox.run_code and its context calls ask, answered by the table's rows (sandbox_run_code,
sandbox_code_context_*: engine/sandboxes/interpreter.py) as the caller's tenant sees them.

    POST   /execute                {code, context_id, language, env_vars} -> NDJSON lines as the
                                   code runs: stdout, stderr, result, error, number_of_executions
    POST   /contexts               {language, cwd} -> {id, language, cwd}
    GET    /contexts               -> [{id, language, cwd}]
    POST   /contexts/{id}/restart
    DELETE /contexts/{id}
    GET    /health

The client bounds an execution by its own read timeout and then drops the connection: a dropped
connection interrupts the code (the context's state is kept), as E2B's server does. Errors are
E2B's {"code", "message"} with sandtree's status (wire.py): 404 for an unknown sandbox or
context (the client's NotFoundException), 400 for a language the image does not have."""

from __future__ import annotations

import asyncio
import json
import threading

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, Router

from ...errors import InvalidInput, SandtreeError
from ..gate import current_engine
from .dispatch import INTERPRETER_PORT, SANDBOX_KEY, serves
from .wire import error_response

# the fields of the kernel's messages that are E2B's /execute lines (kernel.py.in's shapes are
# Jupyter's, as E2B's are); "start" and anything else is not sent
_LINES = {"stdout": ("text", "timestamp"), "stderr": ("text", "timestamp"),
          "error": ("name", "value", "traceback"), "number_of_executions": ("execution_count",)}
_RESULT = ("text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript", "data", "chart",
           "extra", "is_main_result")


def execute_line(msg: dict) -> str | None:
    """One message of an execution as E2B's NDJSON line (None: not one of E2B's)."""
    kind = msg.get("type")
    if kind == "result":
        fields = _RESULT
    elif kind in _LINES:
        fields = _LINES[kind]
    else:
        return None
    return json.dumps({"type": kind, **{k: msg[k] for k in fields if k in msg}}) + "\n"


def _sid(request: Request) -> str:
    return request.scope[SANDBOX_KEY][0]


async def _body(request: Request) -> dict:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise InvalidInput("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object")
    return body


def _text(body: dict, name: str) -> str | None:
    v = body.get(name)
    if v is not None and not isinstance(v, str):
        raise InvalidInput(f"{name} must be a string")
    return v or None


async def execute(request: Request) -> Response:
    engine = current_engine()
    body = await _body(request)
    code = body.get("code")
    if not isinstance(code, str):
        raise InvalidInput("code must be a string")
    env = body.get("env_vars") or {}
    if not isinstance(env, dict):
        raise InvalidInput("env_vars must be an object of strings")
    loop, queue, cancel = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()

    def on_output(msg: dict) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, msg)

    task = asyncio.ensure_future(asyncio.to_thread(
        engine.sandbox_run_code, _sid(request), code, context=_text(body, "context_id"),
        language=_text(body, "language"), env=env, on_output=on_output, cancel=cancel))
    task.add_done_callback(lambda _: loop.call_soon_threadsafe(queue.put_nowait, None))
    try:
        first = await queue.get()            # "start", or the end of a call that failed before it
    except asyncio.CancelledError:           # the client left while its context was being made
        cancel.set()
        raise
    if first is None:
        await task                           # its error (a SandtreeError: E2B's shape below)
        return JSONResponse({"code": 500, "message": "the execution did not start"}, status_code=500)

    async def lines():
        try:
            while (msg := await queue.get()) is not None:
                line = execute_line(msg)
                if line is not None:
                    yield line
            exc = task.exception()
            if exc is not None:               # the sandbox ended under it: E2B's error line
                name = type(exc).__name__
                yield json.dumps({"type": "error", "name": name, "value": str(exc), "traceback": ""}) + "\n"
        finally:
            cancel.set()                      # the client went away (its timeout): interrupt the code
    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def create_context(request: Request) -> Response:
    engine, body = current_engine(), await _body(request)
    made = await asyncio.to_thread(engine.sandbox_code_context_create, _sid(request),
                                   language=_text(body, "language"), cwd=_text(body, "cwd"))
    return JSONResponse(made)


async def list_contexts(request: Request) -> Response:
    engine = current_engine()
    return JSONResponse(await asyncio.to_thread(engine.sandbox_code_contexts, _sid(request)))


async def restart_context(request: Request) -> Response:
    engine = current_engine()
    await asyncio.to_thread(engine.sandbox_code_context_restart, _sid(request), request.path_params["cid"])
    return JSONResponse({})


async def remove_context(request: Request) -> Response:
    engine = current_engine()
    await asyncio.to_thread(engine.sandbox_code_context_remove, _sid(request), request.path_params["cid"])
    return Response(status_code=204)


async def health(request: Request) -> Response:
    return PlainTextResponse("OK")


_router = Router(routes=[
    Route("/execute", execute, methods=["POST"]),
    Route("/contexts", create_context, methods=["POST"]),
    Route("/contexts", list_contexts, methods=["GET"]),
    Route("/contexts/{cid}/restart", restart_context, methods=["POST"]),
    Route("/contexts/{cid}", remove_context, methods=["DELETE"]),
    Route("/health", health, methods=["GET"]),
])


@serves(INTERPRETER_PORT)
async def interpreter_app(scope, receive, send):
    """The port's ASGI app: the routes above, sandtree's errors in E2B's shape."""
    try:
        await _router(scope, receive, send)
    except SandtreeError as exc:
        await error_response(exc)(scope, receive, send)
