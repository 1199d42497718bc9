"""/api/v1 exposed ports of live sandboxes: expose, unexpose, list, signed URLs, and the port itself,
on its preview's own origin (http/listeners.py routes `p<port>-<id>.<domain>/x` here as
/api/v1/sandboxes/{sid}/ports/{port}/x): HTTP of any method, streamed both ways, and WebSocket,
relayed to the exposed port's listener on the host's loopback (the egress daemon's, which relays
into the sandbox through its link).

Who may: the caller's engine view (TenantGate: a tenant reaches only its own sandboxes' exposed
ports; the rows' scope) or, without a token, a valid signed URL (TenantGate's PortGrant: that one
port). A browser's signed GET is exchanged for a cookie of the preview's host only (HttpOnly,
SameSite=Lax, Path=/) and redirected to the same address less the signature, so the signature
never stays in the address bar, the history or a Referer. A port that is not exposed answers 404;
a hibernated sandbox is resumed first (E2B's habit).

What the sandbox answers is passed on less the headers that would reach past its own origin
(sandbox_headers)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx
from fastapi import APIRouter, Query, Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from .. import defaults as D
from ..errors import NotFound, RuntimeUnavailable, SandtreeError
from ..tasks import until_first
from .gate import PORT_COOKIE, STATE_KEY, TOKEN_SUBPROTOCOL, PortGrant
from .derived import handler
from .plumbing import Plumbing

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# Hop-by-hop headers (RFC 9110 7.6.1) and what only this server reads are not passed on.
# A request's Content-Length is kept: its body is streamed on unchanged (many servers, busybox
# httpd's CGI among them, take no chunked request body); so is an answer's.
HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
       "transfer-encoding", "upgrade", "host", "authorization", "cookie"}
HOP_BACK = HOP - {"host", "authorization", "cookie"}
SIGNED = ("st_exp", "st_sig")
# Answer headers of the sandbox's server that act beyond its own preview: a service worker's scope
# (the browser keeps a worker to its origin already, and a preview needs no wider one), wiping
# the data of the whole registrable domain (every sibling preview's grant cookie with it), and
# alternative services (other endpoints for the host name, chosen by the sandbox).
DROPPED = {"service-worker-allowed", "clear-site-data", "alt-svc"}


def sandbox_headers(items) -> list[tuple[str, str]]:
    """The sandbox's answer headers as passed on: hop-by-hop and DROPPED left out; a Set-Cookie
    loses its Domain attribute (a cookie of the preview's host only, never its siblings') and one
    that would replace this server's grant cookie is left out."""
    out = []
    for k, v in items:
        low = k.lower()
        if low in HOP_BACK or low in DROPPED:
            continue
        if low == "set-cookie":
            name = v.split("=", 1)[0].strip()
            if name == PORT_COOKIE or name.lower().startswith("__host-" + PORT_COOKIE):
                continue
            v = ";".join(a for a in v.split(";") if a.strip().split("=", 1)[0].strip().lower() != "domain")
        out.append((k, v))
    return out


def _forward_cookies(raw: str) -> str:
    """The request's cookies less this server's own (the sandbox never sees the grant)."""
    parts = [c for c in raw.split(";") if c.strip() and c.strip().split("=", 1)[0] != PORT_COOKIE]
    return ";".join(parts).strip()


def _query(request_query: str) -> str:
    return "&".join(p for p in request_query.split("&") if p and p.split("=", 1)[0] not in SIGNED)


async def target(view, call, sid: str, port: int) -> str:
    """The loopback URL of exposed port `port` of `sid` as `view` sees it (NotFound: not exposed,
    or not the caller's), resuming a hibernated sandbox first."""
    entry = next((p for p in await call(view.sandbox_ports, sid) if p["port"] == port), None)
    if entry is None:
        raise NotFound(f"port {port} of sandbox {sid} is not exposed", sandbox=sid, port=port)
    if entry["url"] is None:
        if (await call(view.sandbox_info, sid))["state"] == "hibernated":
            await call(view.sandbox_resume, sid)
        entry = next((p for p in await call(view.sandbox_ports, sid) if p["port"] == port), entry)
        if entry["url"] is None:
            raise NotFound(f"sandbox {sid} is not running, so port {port} answers nothing", sandbox=sid, port=port)
    return entry["url"]


def _grant_cookie(response, view, secure: bool) -> None:
    """The signed URL's grant as a cookie of the preview's host only (no Domain: never sent to
    another preview), for all its paths; HttpOnly (the page's scripts never read it)."""
    if isinstance(view, PortGrant) and view.from_query:
        response.set_cookie(PORT_COOKIE, view.cookie, max_age=max(0, int(view.expires - time.time())),
                            path="/", httponly=True, samesite="lax", secure=secure)


@handler("port_url")
def port_url(p: Plumbing):
    engine, call = p.engine, p.call

    async def port_url(sid: str, port: int, request: Request,
                       ttl: float = Query(D.PORT_URL_TTL, description="seconds until the URL stops working")) -> dict:
        """A signed URL of the exposed port on its preview's origin (works without a token until it expires)."""
        if request.app.state.ports_port is None:
            raise RuntimeUnavailable("this server serves no exposed ports (they need a listener of their own)")
        return {"url": await call(engine.sandbox_port_url, sid, port, ttl=ttl)}
    return port_url


def ports_router(p: Plumbing) -> APIRouter:
    """The exposed ports themselves (HTTP and WebSocket relayed); expose, unexpose, list and the signed URL are
    the table's rows (http/derived.py)."""
    router, call = APIRouter(), p.call
    clients: list[httpx.AsyncClient] = []

    def client() -> httpx.AsyncClient:
        if not clients:          # one pool of upstream connections; never the environment's proxies
            # nor a cookie jar: every sandbox's server is at 127.0.0.1 (cookies ignore the port), so a
            # jar would hand one sandbox's Set-Cookie to every other sandbox's server
            clients.append(httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(None, connect=10.0),
                                             cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[]))))
        return clients[0]

    @router.api_route("/api/v1/sandboxes/{sid}/ports/{port}/{path:path}", methods=METHODS,
                      include_in_schema=False)
    async def proxy_http(sid: str, port: int, path: str, request: Request):
        """The exposed port itself: the request goes to the sandbox's server as it came (streamed)."""
        view = request.scope["state"][STATE_KEY]
        base = await target(view, call, sid, port)
        query = _query(request.url.query)
        secure = request.url.scheme == "https"
        if isinstance(view, PortGrant) and view.from_query and request.method in ("GET", "HEAD"):
            # the exchange: the grant as the host's cookie, the same address less the signature
            raw = request.scope.get("raw_path", b"").decode("latin-1").split("?", 1)[0]
            prefix = f"/api/v1/sandboxes/{sid}/ports/{port}"
            at = raw[len(prefix):] if raw.startswith(prefix + "/") else f"/{path}"
            at = "/" + at.lstrip("/\\")           # (never //host: a redirect to another site)
            out = Response(status_code=303, headers={"location": at + (f"?{query}" if query else ""),
                                                     "referrer-policy": "no-referrer", "cache-control": "no-store"})
            _grant_cookie(out, view, secure)
            return out
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
        if cookies := _forward_cookies(request.headers.get("cookie", "")):
            headers.append(("cookie", cookies))
        headers += [("x-forwarded-host", request.headers.get("host", "")), ("x-forwarded-proto", request.url.scheme)]
        has_body = request.method not in ("GET", "HEAD", "OPTIONS") or "content-length" in request.headers
        up = client().build_request(request.method, f"{base}/{path}" + (f"?{query}" if query else ""),
                                    headers=headers, content=request.stream() if has_body else None)
        try:
            resp = await client().send(up, stream=True)
        except httpx.HTTPError as exc:
            return JSONResponse({"error": "bad_gateway", "message": f"nothing answered on port {port} of sandbox "
                                 f"{sid} ({type(exc).__name__}: is a server listening there?)"}, status_code=502)

        async def body():
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            except httpx.HTTPError:
                pass                        # the sandbox's server hung up mid-answer: end ours
            finally:
                await resp.aclose()
        out = StreamingResponse(body(), status_code=resp.status_code)
        out.raw_headers = [(k.encode("latin-1"), v.encode("latin-1"))
                           for k, v in sandbox_headers(resp.headers.multi_items())]
        _grant_cookie(out, view, secure)
        return out

    @router.websocket("/api/v1/sandboxes/{sid}/ports/{port}/{path:path}")
    async def proxy_ws(websocket: WebSocket, sid: str, port: int, path: str):
        """The exposed port's WebSocket: the handshake is made with the sandbox's server first, then
        messages are relayed both ways until either side closes."""
        view = websocket.scope["state"][STATE_KEY]
        try:
            base = await target(view, call, sid, port)
        except SandtreeError as exc:
            return await _refuse(websocket, exc.http_status, exc.to_dict())
        query = _query(websocket.url.query)
        url = "ws" + base[4:] + f"/{path}" + (f"?{query}" if query else "")
        # (a token offered as a subprotocol, http/gate.py's bearer.<token>, never reaches the sandbox)
        protocols = [s.strip() for s in websocket.headers.get("sec-websocket-protocol", "").split(",")
                     if s.strip() and not s.strip().startswith(TOKEN_SUBPROTOCOL)]
        try:
            upstream = await ws_connect(url, subprotocols=protocols or None, proxy=None, max_size=None,
                                        compression=None, open_timeout=10)
        except (OSError, WebSocketException, asyncio.TimeoutError) as exc:
            status = exc.response.status_code if isinstance(exc, InvalidStatus) else 502
            return await _refuse(websocket, status, {"error": "bad_gateway", "message": f"the WebSocket handshake "
                                 f"with port {port} of sandbox {sid} failed ({type(exc).__name__})"})
        await websocket.accept(subprotocol=upstream.subprotocol)

        async def down():
            with contextlib.suppress(ConnectionClosed):     # either side closing ends the relay
                async for msg in upstream:
                    if isinstance(msg, bytes):
                        await websocket.send_bytes(msg)
                    else:
                        await websocket.send_text(msg)

        async def up():
            while True:
                msg = await websocket.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                with contextlib.suppress(ConnectionClosed):
                    await upstream.send(msg["bytes"] if msg.get("bytes") is not None else msg.get("text", ""))
        async def close_both():
            await upstream.close()
            with contextlib.suppress(Exception):
                await websocket.close()
        await until_first(down(), up(), closing=close_both)

    return router


async def _refuse(websocket: WebSocket, status: int, body: dict) -> None:
    """Refuse a WebSocket before its handshake with an HTTP answer (the ASGI extension), else a close."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse(body, status_code=status))
    else:
        await websocket.close(code=1008, reason=body.get("message", "")[:120])
