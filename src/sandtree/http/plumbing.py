"""What every route group of /api/v1 shares: the caller's engine, engine calls in threads, the
store's staging and blob files, and the one error shape.

Routes call `p.engine.X`, a RequestEngine: the view TenantGate (http/gate.py) picked for this
request, never the unscoped engine. An engine call blocks (a run, an import), so it goes to a
thread: `p.call`, on the app's call pool; a call that mostly waits (an operation's end, its next
events, a pool filling) goes to `p.wait_call`, on a pool of its own, so waiting, however many do
it, never starves the calls that do work.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import functools
import logging
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from ..errors import ERRORS, INTERNAL, DiskFull, InvalidInput, MethodNotAllowed, SandtreeError, code_of_status
from .gate import RequestEngine

log = logging.getLogger("sandtree.http")

CALL_THREADS = 256        # engine calls at once (runs, execs, imports: bounded by tenants' limits)
WAIT_THREADS = 256        # waits at once (an operation's end, its events); more queue behind them


class Plumbing:
    """Handed to each route group's router. stage(prefix): a new staging dir on the store's disk
    (uploads and exports land there, never in memory); blob_path(sha256): where an upload's bytes
    are, for streaming a download after the caller's check."""

    def __init__(self, stage, blob_path):
        self.engine = RequestEngine()       # every route: the caller's view of the engine
        self.ops = self.engine.operations
        self.stage, self.blob_path = stage, blob_path
        self.waits = ThreadPoolExecutor(max_workers=WAIT_THREADS, thread_name_prefix="sandtree-wait")

    @staticmethod
    def call(fn, *a, **k):
        return asyncio.to_thread(fn, *a, **k)

    def wait_call(self, fn, *a, **k):
        """A call that mostly waits, on the waits pool (in this request's context: its engine view)."""
        ctx = contextvars.copy_context()
        return asyncio.get_running_loop().run_in_executor(self.waits, functools.partial(ctx.run, fn, *a, **k))


@contextlib.asynccontextmanager
async def lifespan(_app):
    # asyncio's default pool has cpu_count + 4 threads (6 here): 6 callers waiting on a run froze
    # every other route of every tenant for the run's whole length
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="sandtree-call"))
    yield


def add_error_handlers(app: FastAPI) -> None:
    """Every error in the one shape {"error", "message"} with its status from errors.py's table;
    under /v1, Contree's own shape (contree/routes.py). Nothing reaches a client as FastAPI's
    {"detail"} or as a text/plain 500."""

    @app.exception_handler(SandtreeError)
    async def sandtree_error(request: Request, exc: SandtreeError):
        return error_response(exc, request.scope)

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
        return error_response(exc, request.scope)

    @app.exception_handler(HTTPException)
    async def framework_error(request: Request, exc: HTTPException):
        """What the framework answers by itself: an unknown path (404), a method the path does
        not take (405), a body it cannot parse (400: not UTF-8, nested too deep, a number too long).
        A body that grew past its cap while FastAPI read it (bodylimit.py's TooLarge) is that error: 413."""
        if isinstance(exc.__cause__, SandtreeError):
            return error_response(exc.__cause__, request.scope)
        message = {400: "the request body is not valid JSON (or not UTF-8, or nested too deep)"}.get(
            exc.status_code, str(exc.detail))
        return shaped(request.scope, exc.status_code, code_of_status(exc.status_code), message, exc.headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        """A bug: logged with its traceback (Starlette re-raises it to the server's log too), and
        answered as a typed 500 in the one shape, never a text/plain page."""
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        # connection: close, as the server closes it after the exception (a client reusing it was reset)
        return shaped(request.scope, 500, INTERNAL, f"internal error ({type(exc).__name__}); it is in the server's log",
                      {"connection": "close"})


def contree_path(scope) -> bool:
    """Under Contree's /v1 API (contree/routes.py): its errors have Contree's shape."""
    path = scope.get("path", "")
    return path == "/v1" or path.startswith("/v1/")


def shaped(scope, status: int, code: str, message: str, headers=None) -> JSONResponse:
    """An error answer for a request: {"error": code, "message"} (the one shape), or Contree's
    {"error": message, "status"} under /v1."""
    body = {"error": message, "status": status} if contree_path(scope) else {"error": code, "message": message}
    return JSONResponse(body, status_code=status, headers=dict(headers) if headers else None)


def error_response(exc: SandtreeError | OSError, scope=None) -> JSONResponse:
    """The answer to an engine error (its status from errors.py's table), or to an OSError: a full
    disk the engine did not name (a route's own file) is 507 disk_full, not internal.
    scope: the request's (under /v1: Contree's shape)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        exc = DiskFull("disk full: nothing was stored")
    if isinstance(exc, SandtreeError):
        if scope is not None and contree_path(scope):
            return shaped(scope, exc.http_status, exc.code, exc.message)
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)
    log.error("internal error: %s", exc, exc_info=exc)
    return shaped(scope or {}, 500, INTERNAL, str(exc))


class ErrorOut(BaseModel):
    """The one error shape of /api/v1 (errors.py's to_dict): more fields may name details."""
    model_config = ConfigDict(extra="allow")
    error: str = Field(description="a stable code of errors.py's table (invalid_input, not_found, ...), or internal")
    message: str


class ContreeErrorOut(BaseModel):
    """Contree's error shape, under /v1 (contree.py)."""
    model_config = ConfigDict(extra="allow")
    error: str = Field(description="what went wrong, for people")
    status: int


def error_statuses() -> dict[int, list[str]]:
    """Each status an error answer may have -> the codes that give it: errors.py's table, plus
    what the framework answers by itself (a body that fits no model: 422; a bug: 500 internal).
    Not 405: no documented method of a path gets it."""
    out: dict[int, list[str]] = {422: [InvalidInput.code], 500: [INTERNAL]}
    for code, cls in ERRORS.items():
        if cls not in (SandtreeError, MethodNotAllowed):
            out.setdefault(cls.http_status, []).append(code)
    return dict(sorted(out.items()))


def error_responses(contree: bool = False) -> dict:
    """The error answers of every route, for the OpenAPI document (include_router's responses=),
    in the shape they come in: every engine error passes the one table (errors.py), so any route
    may answer any of its statuses (413 for a body over its cap, 401/403 for a token, 429 for a
    tenant's limit...). contree: Contree's routes (/v1), in Contree's shape."""
    model = ContreeErrorOut if contree else ErrorOut
    return {status: {"model": model, "description": "error: " + ", ".join(codes)}
            for status, codes in error_statuses().items()}


def shaped_route(error, answer=None) -> type[APIRoute]:
    """An APIRoute class for a foreign API (Contree's /v1, E2B's /e2b): engine errors and malformed requests
    answered in its error shape. error(status, message): its error answer; answer(exc): an engine error's,
    when it needs more than the shape (default: error(exc.http_status, exc.message), errors.py's table)."""
    def engine_error(exc: SandtreeError):
        return answer(exc) if answer is not None else error(exc.http_status, exc.message)

    class ShapedRoute(APIRoute):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def guarded(request: Request):
                try:
                    return await handler(request)
                except RequestValidationError as exc:
                    msgs = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
                    return error(400, "; ".join(msgs) or "malformed request")
                except SandtreeError as exc:
                    return engine_error(exc)
            return guarded
    return ShapedRoute
