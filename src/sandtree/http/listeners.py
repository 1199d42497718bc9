"""Two listeners, two origins: the API (and the web page) on one port, the exposed ports of live
sandboxes (http/ports.py's proxy) on another.

Why: a page that a sandbox serves is written by whatever runs in the sandbox. Served under the API's
own origin it would run as the API's page: on a server without tokens it could call the whole API
from the user's browser (the gate lets this server's own pages in), and under any server it could
register a service worker over the API's paths (a `Service-Worker-Allowed: /` answer) and read the
token typed into the web page. On a port of its own the page is another origin (scheme, host and
port): the browser keeps it away from the API's storage and workers, and the gate refuses its calls
(its Origin is not the API's). E2B and Daytona give each preview a host name of its own for the
same reason; one more port needs no DNS.

So: on the ports listener only the proxy's paths are served (anything else 404); on the API's
listener a proxy path is redirected there (307: a browser follows with its method and body) and a
WebSocket to one is refused with the address to use. An app built without a ports listener serves
no exposed port at all (404 saying so)."""

from __future__ import annotations

import re
import socket

from starlette.responses import JSONResponse, RedirectResponse
from starlette.websockets import WebSocketClose

from ..errors import NotFound
from ..tenancy.gate import OPEN_PATHS, PAGE_PREFIX

__all__ = ["Listeners", "bind", "ports_base", "HOST_NAME", "PROXY_ROUTE"]

# What the router would send to the proxy (http/ports.py's route: any segment for the sandbox and the
# port, which it reads as an integer and a sandbox ID prefix): the gate's PORT_PATH is stricter (32 hex
# digits, 1-5 digits), and deciding by it let `/ports/008000/`, `/ports/+8000/` or an ID prefix reach the
# proxy on the API's listener -- a sandbox's page on the API's origin (attack review of issue 33).
PROXY_ROUTE = re.compile(r"^/api/v1/sandboxes/[^/]+/ports/[^/]+/")
HOST_NAME = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,252}))$")


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


def ports_base(scope, ports_port: int) -> str:
    """scheme://host:ports_port as the client named this server (its Host header's name)."""
    headers = dict(scope.get("headers") or [])
    host = headers.get(b"host", b"").decode("latin-1")
    name = host[:host.index("]") + 1] if host.startswith("[") and "]" in host else host.split(":", 1)[0]
    if not HOST_NAME.match(name):       # a Host that is no host name (it would steer the URL's path): ours
        local = (scope.get("server") or ("127.0.0.1",))[0]
        name = f"[{local}]" if ":" in local else local
    scheme = {"https": "https", "wss": "https"}.get(scope.get("scheme", "http"), "http")
    return f"{scheme}://{name}:{ports_port}"


class Listeners:
    """ASGI middleware (outermost): which paths each listener serves (the module's docstring)."""

    def __init__(self, app, ports_port: int | None):
        self.app, self.ports_port = app, ports_port

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        server = scope.get("server") or (None, None)
        on_ports = self.ports_port is not None and server[1] == self.ports_port
        proxied = PROXY_ROUTE.match(scope.get("path", "")) is not None
        if on_ports == proxied:
            if not on_ports and scope["type"] == "http" and not _page(scope.get("path", "")):
                send = _no_document(send)
            return await self.app(scope, receive, send)
        if on_ports:
            why = "this listener serves the exposed ports of sandboxes only; the API is on the server's other port"
        elif self.ports_port is None:
            why = "this server serves no exposed ports (they need a listener of their own: `sandtree serve`)"
        else:
            where = ports_base(scope, self.ports_port) + scope["path"]
            if scope["type"] == "http":
                query = scope.get("query_string", b"").decode("latin-1")
                return await RedirectResponse(where + (f"?{query}" if query else ""), status_code=307)(
                    scope, receive, send)
            why = f"exposed ports are served on their own origin: {where}"
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
