"""Two listeners, and an origin per preview: the API (and the web page) on one port; the exposed
ports of live sandboxes (http/ports.py's proxy) on another, each port of each sandbox under a host
name of its own (engine/sandboxes/previews.py: `p<port>-<id>.<preview domain>`).

Why: a page that a sandbox serves is written by whatever runs in the sandbox. Served under the API's
own origin it would run as the API's page: on a server without tokens it could call the whole API
from the user's browser, and under any server it could register a service worker over the API's
paths and read the token typed into the web page. Served under an origin shared with the other
sandboxes' pages, it could do the same to them (a worker over that origin answers every preview
opened later, and reads their signed URLs). So each preview is its own origin (E2B's and
Daytona's habit), and this middleware routes a request on the ports' listener by its Host alone:
`p8000-<id>.<domain>/x` is path /x of port 8000 of that sandbox (to the routers it is the port's
path, /api/v1/sandboxes/<id>/ports/8000/x, so the gate's rules and the proxy are one for both).

Anything else on the ports' listener is not served: the port's path there (the form before
previews had host names) and on the API's listener is redirected to the preview's origin (307: a
browser follows with its method and body), and a WebSocket to one is refused with the address to
use. A preview's host name on the API's listener is refused. An app built without a ports
listener serves no exposed port at all (404 saying so)."""

from __future__ import annotations

import re
import socket

from starlette.responses import JSONResponse, RedirectResponse
from starlette.websockets import WebSocketClose

from ..engine import base_domain, check_base, parse_host, port_path, preview_url
from ..errors import NotFound
from .gate import OPEN_PATHS, PAGE_PREFIX, PORT_PATH, PREVIEW_KEY

__all__ = ["Listeners", "bind", "default_base", "PROXY_ROUTE"]

# What the router would send to the proxy (http/ports.py's route: any segment for the sandbox and the
# port, which it reads as an integer and a sandbox ID prefix). The gate's PORT_PATH is stricter (32 hex
# digits, 1-5 digits): deciding by it alone let `/ports/008000/`, `/ports/+8000/` or an ID prefix reach
# the proxy on the API's listener -- a sandbox's page served on the API's origin.
PROXY_ROUTE = re.compile(r"^/api/v1/sandboxes/[^/]+/ports/[^/]+/")


def bind(host: str, port: int, ports_port: int | None = None) -> list[socket.socket]:
    """Listening sockets of the API (`port`) and of the exposed ports (`ports_port`; None: the
    API's port + 1, or any free port when that is 0; 0: any free port). OSError: one is taken."""
    if ports_port is None:
        ports_port = port + 1 if port else 0
    family = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
    api = socket.create_server((host, port), family=family)
    try:
        return [api, socket.create_server((host, ports_port), family=family)]
    except BaseException:
        api.close()
        raise


def default_base(ports_port: int) -> str:
    """Previews under `localhost` on the ports' listener: for a browser on this machine."""
    return f"http://*.localhost:{ports_port}"


class Listeners:
    """ASGI middleware (outermost): which listener and host name serves what (the module's docstring).
    preview_base: where previews are reached (engine/sandboxes/previews.py; None: the default on ports_port)."""

    def __init__(self, app, ports_port: int | None, preview_base: str | None = None):
        self.app, self.ports_port = app, ports_port
        self.base = check_base(preview_base or default_base(ports_port)) if ports_port is not None else None
        self.domain = base_domain(self.base) if self.base else None

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        server = scope.get("server") or (None, None)
        on_ports = self.ports_port is not None and server[1] == self.ports_port
        host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        named = parse_host(host, self.domain) if self.domain else None
        if on_ports and named:
            sid, port = named
            prefix = port_path(sid, port)[:-1].encode()
            raw = scope.get("raw_path") or scope.get("path", "").encode("utf-8")
            scope = {**scope, "path": prefix.decode() + scope.get("path", ""), "raw_path": prefix + raw,
                     PREVIEW_KEY: named}
            return await self.app(scope, receive, send)
        proxied = PORT_PATH.match(scope.get("path", ""))
        routed = PROXY_ROUTE.match(scope.get("path", "")) is not None
        if not on_ports and not named and not routed:
            if scope["type"] == "http" and not _page(scope.get("path", "")):
                send = _no_document(send)
            return await self.app(scope, receive, send)
        if not on_ports and named:
            why = "this host name is a preview's: previews are served on the exposed ports' listener only"
        elif on_ports and not proxied:
            why = ("this listener serves the exposed ports of sandboxes only, each under a host name of its own "
                   f"({preview_url(self.base, '<sandbox id>', 0).replace('p0-', 'p<port>-')})")
        elif self.ports_port is None:
            why = "this server serves no exposed ports (they need a listener of their own: `sandtree serve`)"
        elif not proxied:
            why = "not an exposed port's path (/api/v1/sandboxes/<sandbox id>/ports/<port>/...)"
        else:
            sid, port = proxied.group(1), int(proxied.group(2))
            where = preview_url(self.base, sid, port) + "/" + scope["path"][proxied.end():]
            if scope["type"] == "http":
                query = scope.get("query_string", b"").decode("latin-1")
                return await RedirectResponse(where + (f"?{query}" if query else ""), status_code=307)(
                    scope, receive, send)
            why = f"exposed ports are served on origins of their own: {where}"
        if scope["type"] == "websocket":
            return await WebSocketClose(code=1008, reason=why[:120])(scope, receive, send)
        return await JSONResponse(NotFound(why).to_dict(), status_code=404)(scope, receive, send)


def _page(path: str) -> bool:
    """The web page's and the API docs' own paths (documents this server wrote)."""
    return path in OPEN_PATHS or path.startswith(PAGE_PREFIX)


_NO_DOCUMENT = ((b"x-content-type-options", b"nosniff"), (b"content-security-policy", b"sandbox"))


def _no_document(send):
    """`send` adding to an API answer what keeps a browser from running it as a page of the API's
    origin: no type sniffing, and CSP `sandbox` (an opaque origin: none of the API's storage, no
    same-origin calls). Its bodies are data the store and sandboxes hold (a file a sandbox wrote, a
    command's output); defence in depth behind their own types (octet-stream, text/plain, JSON)."""
    async def wrapped(message):
        if message["type"] == "http.response.start":
            headers = list(message.get("headers") or [])
            have = {k.lower() for k, _ in headers}
            headers += [(k, v) for k, v in _NO_DOCUMENT if k not in have]
            message = {**message, "headers": headers}
        await send(message)
    return wrapped
