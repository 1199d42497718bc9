"""envd on port 49983 of a sandbox: one ASGI app that hands each request to the part serving its
path. The parts add themselves to ROUTES (`route(prefix)(app)`) as their modules load:

    /process.Process/...        process.py     (Connect-RPC, the wheel's ProcessASGIApplication)
    /filesystem.Filesystem/...  filesystem.py  (Connect-RPC, FilesystemASGIApplication)
    /files                      files.py       (HTTP upload and download)
    /health                     here           (204, as envd answers it)

A prefix ending in "/" matches the paths under it; any other matches itself exactly. Nothing else
is served (404 in envd's error shape)."""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from ..dispatch import ENVD_PORT, serves

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


async def _health(scope, receive, send):
    """GET /health: envd's liveness probe (the SDK probes it after a failed request): 204 while the
    sandbox is addressable here at all (dispatch and the gate found it)."""
    await Response(status_code=204)(scope, receive, send)


route("/health")(_health)


@serves(ENVD_PORT)
async def envd(scope, receive, send):
    path = scope.get("path", "/")
    for prefix, app in ROUTES:
        if _matches(prefix, path):
            return await app(scope, receive, send)
    await JSONResponse({"code": 404, "message": f"envd serves no {path}"}, status_code=404)(scope, receive, send)
