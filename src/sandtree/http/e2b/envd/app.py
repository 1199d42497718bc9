"""envd on port 49983 of a sandbox: one ASGI app that hands each request to the part serving its
path. The parts add themselves to ROUTES (`route(prefix)(app)`) as their modules load:

    /process.Process/...        process.py     (Connect-RPC, the wheel's ProcessASGIApplication)
    /filesystem.Filesystem/...  filesystem.py  (Connect-RPC, FilesystemASGIApplication)
    /files                      files.py       (HTTP upload and download)
    /health                     here           (204, as envd answers it)

A prefix ending in "/" matches the paths under it; any other matches itself exactly. Nothing else
is served (404 in envd's error shape)."""

from __future__ import annotations

import asyncio
import contextvars

from starlette.responses import JSONResponse, Response

from .... import errors
from ... import gate
from ..dispatch import ENVD_PORT, SANDBOX_KEY, serves

SANDBOX: contextvars.ContextVar = contextvars.ContextVar("sandtree_e2b_sandbox", default=None)
ROUTES: list[tuple[str, object]] = []         # (path prefix, ASGI app), the longest match wins


def route(prefix: str):
    """Register the ASGI app answering `prefix` (see the module doc) on envd's port."""
    def register(app):
        ROUTES.append((prefix, app))
        ROUTES.sort(key=lambda r: -len(r[0]))
        return app
    return register


def _matches(prefix: str, path: str) -> bool:
    return path.startswith(prefix) if prefix.endswith("/") else path == prefix


def here():
    """(the engine as this request's caller sees it, the full id of the sandbox it addresses):
    for envd's parts, inside a request envd() passed on."""
    return gate.current_engine(), SANDBOX.get()


async def _health(scope, receive, send):
    """GET /health: envd's liveness probe (the SDK probes it after a failed request): 204, as envd
    answers it, once envd() found the sandbox running."""
    await Response(status_code=204)(scope, receive, send)


route("/health")(_health)


def _running(sid: str) -> str | None:
    """The full id of the caller's sandbox `sid` if it runs; None: not there, or not running."""
    try:
        info = gate.current_engine().sandbox_info(sid)
    except (errors.NotFound, errors.Forbidden, errors.InvalidInput):
        return None
    return info["id"] if info["state"] == "running" else None


@serves(ENVD_PORT)
async def envd(scope, receive, send):
    path = scope.get("path", "/")
    sid = scope[SANDBOX_KEY][0]
    full = await asyncio.to_thread(_running, sid)          # (to_thread carries the gate's context)
    if full is None:
        # what E2B's proxy answers for a sandbox killed or timed out: its SDK reads the words
        # "was not found" as SandboxNotRunningException (sandbox.is_running() is False)
        return await JSONResponse({"code": 502, "message": f"The sandbox {sid} was not found"},
                                  status_code=502)(scope, receive, send)
    token = SANDBOX.set(full)
    try:
        for prefix, app in ROUTES:
            if _matches(prefix, path):
                return await app(scope, receive, send)
    finally:
        SANDBOX.reset(token)
    await JSONResponse({"code": 404, "message": f"envd serves no {path}"}, status_code=404)(scope, receive, send)
