"""Requests addressed to one sandbox, E2B's way: under SANDBOX_PREFIX with the E2b-Sandbox-Id and
E2b-Sandbox-Port headers (one sandbox URL for all), or by a host name `<port>-<sandbox id>.<domain>`
(E2B's own addressing, for a deployment that gives sandboxes names). Each port E2B's clients talk
to is served by an ASGI app that registers itself here (`serves(port)`): envd on 49983, the code
interpreter on 49999. The app gets the sandbox and port in scope[SANDBOX_KEY] and the path after
the prefix; it finds its engine with gate.engine_for, as every router does."""

from __future__ import annotations

import re

from starlette.responses import JSONResponse

from ..gate import ENVD_PORT

SANDBOX_PREFIX = "/e2b/sandbox"
SANDBOX_KEY = "sandtree.e2b.sandbox"          # scope key: (sandbox id, port)
INTERPRETER_PORT = 49999
# a sandbox id as sandtree makes them (hex) or names them; the host form needs a DNS label
_HOST = re.compile(r"^(\d{1,5})-([0-9a-zA-Z][0-9a-zA-Z_-]{0,63})\.")
_APPS: dict[int, object] = {}


def serves(port: int):
    """Register the ASGI app (a factory's result or a callable) that answers `port` of a sandbox."""
    def register(app):
        _APPS[port] = app
        return app
    return register


def addressed(scope, domain: str | None = None) -> tuple[str, int, str] | None:
    """(sandbox id, port, path within it) of a request addressed to a sandbox, else None."""
    headers = dict(scope.get("headers") or [])
    path = scope.get("path", "")
    if path == SANDBOX_PREFIX or path.startswith(SANDBOX_PREFIX + "/"):
        sid = headers.get(b"e2b-sandbox-id", b"").decode("latin-1").strip()
        port = headers.get(b"e2b-sandbox-port", b"").decode("latin-1").strip()
        return sid, (int(port) if port.isdigit() and len(port) <= 5 else -1), path[len(SANDBOX_PREFIX):] or "/"
    if domain:
        host = headers.get(b"host", b"").decode("latin-1").split(":")[0].lower()
        m = _HOST.match(host)
        if m and host[m.end():] == domain.lower():
            return m.group(2), int(m.group(1)), path or "/"
    return None


class SandboxDispatch:
    """ASGI middleware: a request addressed to a sandbox goes to the app of its port (with the path
    within the sandbox); anything else goes on. domain: E2B's sandbox domain of this server (None:
    only the one-URL form)."""

    def __init__(self, app, domain: str | None = None):
        self.app, self.domain = app, domain

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        where = addressed(scope, self.domain)
        if where is None:
            return await self.app(scope, receive, send)
        sid, port, path = where
        target = _APPS.get(port)
        if not sid or target is None:
            why = ("no sandbox named (E2b-Sandbox-Id header)" if not sid else
                   f"port {port} of a sandbox is not served here (envd: {ENVD_PORT}, code interpreter: "
                   f"{INTERPRETER_PORT})")
            return await JSONResponse({"code": 404 if sid else 400, "message": why},
                                      status_code=404 if sid else 400)(scope, receive, send)
        inner = {**scope, "path": path, "raw_path": path.encode("utf-8"), "root_path": "",
                 SANDBOX_KEY: (sid, port)}
        return await target(inner, receive, send)
