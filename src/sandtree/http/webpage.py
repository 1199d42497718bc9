"""The web page: `/` and its assets under `/ui/`, files of this package (http/static/:
hand-written HTML, CSS and JavaScript; nothing fetched from elsewhere, no build step).

The page holds no data and no logic of its own: it calls /api/v1 with the token the user gives it
(its login form), so a tenant sees in it exactly what its token sees through the API. These paths
are open without a token (http/gate.py's OPEN_PATHS and PAGE_PREFIX); a server without tokens
still answers them only to a loopback Host. The answers forbid framing and any script, style or
connection not from the server itself (Content-Security-Policy; inline styles are allowed, for
xterm.js): what the page shows from the store (commands, outputs, file contents) is put in as
text, never as markup. xterm.js 5.5.0 and its fit addon 0.10.0 (npm's @xterm/xterm and
@xterm/addon-fit, MIT: static/XTERM-LICENSE.txt) are vendored unchanged.
"""

from __future__ import annotations

import os

from fastapi import APIRouter
from fastapi.responses import Response

from ..errors import NotFound

_STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}
_HEADERS = {
    # styles inline too: xterm.js writes its measured cell sizes and colours into <style> elements
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data: blob:; "
                               "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

__all__ = ["webpage_router", "assets"]


def assets() -> dict[str, bytes]:
    """The page's files by name, read once: only these names are ever answered (no path from a
    request reaches the file system)."""
    out = {}
    for name in sorted(os.listdir(_STATIC)):
        if os.path.splitext(name)[1] in _TYPES and os.path.isfile(os.path.join(_STATIC, name)):
            with open(os.path.join(_STATIC, name), "rb") as f:
                out[name] = f.read()
    return out


def webpage_router() -> APIRouter:
    router, files = APIRouter(), assets()

    def answer(name: str) -> Response:
        body = files.get(name)
        if body is None:
            raise NotFound(f"no page asset {name!r}")
        return Response(body, media_type=_TYPES[os.path.splitext(name)[1]], headers=_HEADERS)

    @router.get("/", include_in_schema=False)
    async def index() -> Response:
        return answer("index.html")

    @router.get("/ui/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        return answer(name)

    return router
