"""What every route group of /api/v1 shares: the caller's engine, engine calls in threads, the
store's staging and blob files, and the one error shape.

Routes call `p.engine.X`, a RequestEngine: the view TenantGate (tenancy/gate.py) picked for this
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
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..errors import DiskFull, InvalidInput, SandtreeError
from ..tenancy.gate import RequestEngine

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
    """Every error in the one shape {"error", "message"} with its status from errors.py's table."""

    @app.exception_handler(SandtreeError)
    async def sandtree_error(request: Request, exc: SandtreeError):
        return error_response(exc)

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
        return error_response(exc)


def error_response(exc: SandtreeError | OSError) -> JSONResponse:
    """The answer to an engine error (its status from errors.py's table), or to an OSError: a full
    disk the engine did not name (a route's own file) is 507 disk_full, not internal."""
    if isinstance(exc, SandtreeError):
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        full = DiskFull("disk full: nothing was stored")
        return JSONResponse(full.to_dict(), status_code=full.http_status)
    return JSONResponse({"error": "internal", "message": str(exc)}, status_code=500)
