"""Who is calling, for every HTTP request of `sandtree serve`; and the JSON-lines request log.

One ASGI middleware (TenantGate) resolves `Authorization: Bearer <token>` to the engine as that
tenant sees it (tenancy/) and hands it on two ways:

* `engine_for(request)`: a FastAPI dependency any router can take (`Depends(engine_for)`);
* `RequestEngine`: what build_app's routes call `engine.X` on; it forwards to the same per-request
  view through a context variable, so those routes need no per-route plumbing. Outside a request
  it fails closed (never falls back to the unscoped engine).

With no token ever created, every request gets the whole engine, audited as the operator "local"
(the server then listens on loopback only: see server.serve). Once one exists, every request but the open paths needs a valid
token, and a bad one is 401 with one message for every reason.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
import sys
import threading
import time

from http.cookies import SimpleCookie
from urllib.parse import parse_qs

from starlette.requests import Request

from .. import table
from ..errors import Forbidden, NotFound, SandtreeError, Unauthorized
from ..tenancy.tenant import Tenant

CURRENT: contextvars.ContextVar = contextvars.ContextVar("sandtree_engine", default=None)
STATE_KEY = "sandtree_engine"
# Open without a token: liveness, the API's own description and the web page's fixed assets
# (http/webpage.py: files of the package, no data in any; the page asks for a token itself).
OPEN_PATHS = {"/api/v1/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/"}
PAGE_PREFIX = "/ui/"
OP_IN_PATH = re.compile(r"/operations/([0-9a-f]{32})")
OP_IN_BODY = re.compile(rb'^\{"id":\s*"([0-9a-f]{32})"')
LOOPBACK_HOST = re.compile(r"^(127\.0\.0\.1|localhost|\[::1\])(:\d{1,5})?$", re.IGNORECASE)
# A preview's host name under `localhost` (engine/sandboxes/previews.py): browsers resolve every *.localhost
# name to loopback themselves, so no DNS rebinding can point one elsewhere.
LOCAL_PREVIEW_HOST = re.compile(r"^p\d{1,5}-[0-9a-f]{32}\.localhost(:\d{1,5})?$", re.IGNORECASE)
# An exposed port served under the server (http/ports.py); a signed URL may stand for a token there.
PORT_PATH = re.compile(r"^/api/v1/sandboxes/([0-9a-f]{32})/ports/(\d{1,5})/")
PORT_COOKIE = "st_port"
PREVIEW_KEY = "sandtree.preview"    # scope: (sid, port) a preview's host name named (http/listeners.py)


def engine_for(request: Request):
    """FastAPI dependency: the engine as the caller of this request sees it (a tenant's view, or
    the engine itself on a server without tokens). `Depends(engine_for)` in any router."""
    engine = request.scope.get("state", {}).get(STATE_KEY)
    if engine is None:
        raise RuntimeError("no TenantGate in front of this app: refusing to serve unscoped")
    return engine


def current_engine():
    engine = CURRENT.get()
    if engine is None:
        raise RuntimeError("engine used outside a request that passed the TenantGate")
    return engine


class RequestEngine:
    """Stands for the current request's engine view (see the module doc)."""

    def __getattr__(self, name):
        return getattr(current_engine(), name)

    @property
    def operations(self):
        return _RequestOperations()


class _RequestOperations:
    def __getattr__(self, name):
        return getattr(current_engine().operations, name)


class JsonLog:
    """One JSON object per line (ts, event, then fields) on a stream; None fields left out."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.lock = threading.Lock()

    def __call__(self, event: str, **fields) -> None:
        rec = {"ts": round(time.time(), 3), "event": event, **{k: v for k, v in fields.items() if v is not None}}
        line = json.dumps(rec, default=str) + "\n"
        with self.lock:
            try:
                self.stream.write(line)
                self.stream.flush()
            except (OSError, ValueError):
                pass                     # a closed log must never fail a request


class TenantGate:
    """ASGI middleware: authenticate, pick the engine view, log the request."""

    def __init__(self, app, engine, log: JsonLog | None = None, addressed=None):
        """addressed(scope): (sandbox id, port, path) of a request addressed to a sandbox, else None
        (http/e2b/dispatch.py's; None: no request is)."""
        self.app, self.engine, self.log = app, engine, log
        self.addressed = addressed or (lambda scope: None)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):            # (lifespan)
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            send = _WebSocketRefusal(send)       # a refusal before the handshake is an HTTP answer
        t0 = time.monotonic()
        info = {"status": None, "op": None, "tenant": None, "token": None}
        path = scope.get("path", "")
        m = OP_IN_PATH.search(path)
        info["op"] = m.group(1) if m else None

        async def send_logged(message):
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                info["status"] = message["status"]
            elif message["type"] == "websocket.accept":
                info["status"] = 101
            elif message["type"] == "http.response.body" and info["op"] is None and path.endswith("/runs"):
                m = OP_IN_BODY.match(message.get("body", b"")[:64])
                if m:
                    info["op"] = m.group(1).decode()
            await send(message)

        try:
            try:
                view = await self._authenticate(scope, path)
            except (Unauthorized, Forbidden, NotFound) as exc:
                return await _reply(send_logged, exc.http_status, refusal(exc, path))
            who = getattr(view, "tenant", None)
            if who is not None:
                info["tenant"], info["token"] = who.name, who.token
            scope.setdefault("state", {})[STATE_KEY] = view
            token = CURRENT.set(view)
            try:
                await self.app(scope, receive, send_logged)
            finally:
                CURRENT.reset(token)
        finally:
            if self.log is not None:
                self.log("request", method=scope.get("method"), path=path, status=info["status"] or 500,
                         duration_ms=round((time.monotonic() - t0) * 1000, 2), tenant=info["tenant"],
                         token=info["token"], op=info["op"],
                         client=(scope.get("client") or [None])[0])

    async def _authenticate(self, scope, path: str):
        tenancy = self.engine.tenancy
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        given = header[7:].strip() if header[:7].lower() == "bearer " else None
        if given is None:
            # E2B's clients send their API key here (http/e2b/): the key is a sandtree token
            given = dict(scope.get("headers") or []).get(b"x-api-key", b"").decode("latin-1").strip() or None
        if given is None and scope["type"] == "websocket":
            given = subprotocol_token(scope)
        where = self.addressed(scope)                   # a request to one sandbox (E2B's envd, interpreter)
        # one indexed read of a WAL database (never blocked by writers): cheaper here than a
        # thread hop, on every request
        if not tenancy.configured():
            # No tokens exist: the server is loopback-only and single-user. A token sent anyway is
            # ignored, not refused: Contree's clients always send one (their quick start uses
            # "fake-token"), and so does a client with $SANDTREE_TOKEN set for another server.
            # Loopback is not enough on its own: a web page in a local browser can reach it by
            # DNS rebinding (its own name, resolved to 127.0.0.1), so the Host must name loopback.
            headers = dict(scope.get("headers") or [])
            host = headers.get(b"host", b"").decode("latin-1")
            if not LOOPBACK_HOST.match(host) and not (scope.get(PREVIEW_KEY) and LOCAL_PREVIEW_HOST.match(host)):
                raise Forbidden(f"this server has no tokens and answers only to a loopback Host, not {host!r} "
                                "(create a token with `sandtree token create --tenant NAME` to serve other names)")
            # Nor may a page of another origin use it from the local browser (a "simple" cross-site
            # POST needs no preflight: it would import, run, stop): a browser names the page's origin
            # (Origin, Sec-Fetch-Site); only this server's own page, and clients that are no browser, pass.
            origin = headers.get(b"origin", b"").decode("latin-1")
            site = headers.get(b"sec-fetch-site", b"").decode("latin-1")
            # A preview (its own origin, never the API's) may be opened by a link from anywhere
            # (the web page's "open" button among them): a GET navigation to it, not a frame or a form.
            opened = scope.get(PREVIEW_KEY) is not None and scope.get("method") in ("GET", "HEAD") and \
                headers.get(b"sec-fetch-dest", b"") == b"document"
            if ((origin and origin not in (f"http://{host}", f"https://{host}")) or
                    site not in ("", "same-origin", "none")) and not opened:
                raise Forbidden(f"this server has no tokens: it answers no web page but its own (origin {origin!r})")
            return tenancy.operator_view()          # the whole engine, its changes audited as "local"
        if where is not None:
            return await self._sandbox_grant(scope, where[0], where[1], given)
        if (path in OPEN_PATHS or path.startswith(PAGE_PREFIX)) and not given:
            return self.engine.as_tenant(_ANONYMOUS)
        if not given and (grant := signed_grants(scope, path)) is not None:
            sid, port, offered = grant
            refused = None
            for exp, sig, from_query in offered:
                try:
                    await asyncio.to_thread(self.engine.ports.verify, sid, port, exp, sig)
                except Forbidden as exc:
                    refused = refused or exc
                    continue
                return PortGrant(self.engine, sid, port, exp, sig, from_query=from_query)
            raise refused                           # (why the first was refused)
        if not given:
            raise Unauthorized("this server needs a token: Authorization: Bearer <token> "
                               "(`sandtree token create --tenant NAME` on the server)")
        tenant = await asyncio.to_thread(tenancy.authenticate, given)
        return self.engine.as_tenant(tenant)


    async def _sandbox_grant(self, scope, sid: str, port: int, given: str | None):
        """A request addressed to port `port` of sandbox `sid` (http/e2b/dispatch.py) on a server with
        tokens: its access token (X-Access-Token: ports.access_token(sid, ACCESS_PURPOSE), what E2B's
        control plane hands out as envdAccessToken) grants that one sandbox as its owner sees it;
        its traffic token (E2B-Traffic-Access-Token: trafficAccessToken, what E2B's clients send to
        the sandbox's other ports, the code interpreter's among them) grants the same, but not on
        envd's port; a tenant's token (Bearer or X-API-Key) grants the tenant's view, in which
        another tenant's sandbox does not exist. Nothing else reaches a sandbox, E2B's insecure ones
        included: E2B leaves those open to whoever knows the id, sandtree never (docs/e2b.md)."""
        headers = dict(scope.get("headers") or [])
        access = headers.get(b"x-access-token", b"").decode("latin-1").strip()
        if access:
            return await asyncio.to_thread(self._access_grant, sid, access, ACCESS_PURPOSE)
        traffic = headers.get(b"e2b-traffic-access-token", b"").decode("latin-1").strip()
        if traffic and port != ENVD_PORT:
            return await asyncio.to_thread(self._access_grant, sid, traffic, TRAFFIC_PURPOSE)
        if not given:
            raise Unauthorized("a request to a sandbox needs its access token (X-Access-Token: E2B's "
                               "envdAccessToken; E2B-Traffic-Access-Token: its trafficAccessToken, on a port "
                               "other than envd's) or a token of its tenant (Authorization: Bearer <token>)")
        tenant = await asyncio.to_thread(self.engine.tenancy.authenticate, given)
        return self.engine.as_tenant(tenant)

    def _access_grant(self, sid: str, access: str, purpose: str) -> "SandboxGrant":
        ports, tenancy = self.engine.ports, self.engine.tenancy
        # the sandbox by its full id (a prefix answers as nothing: the token is made on the full id),
        # and one answer for a wrong token and an unknown sandbox (no probing which ids exist)
        rows = tenancy.db.query("SELECT tenant FROM tenant_blobs WHERE kind='sandbox' AND id=?", (sid,))
        if not ports.check_access_token(sid, purpose, access) or not self._exists(sid):
            raise Unauthorized(f"invalid access token for sandbox {sid[:32]!r}")
        owner = tenancy.view(Tenant(rows[0][0], limits=tenancy.limits(rows[0][0]))) if rows else tenancy.operator_view()
        return SandboxGrant(owner, sid)

    def _exists(self, sid: str) -> bool:
        try:
            return self.engine.sandbox_info(sid)["id"] == sid
        except NotFound:
            return False


_ANONYMOUS = Tenant("-", ())
ACCESS_PURPOSE = "e2b-envd"          # ports.access_token's purpose for E2B's envdAccessToken
TRAFFIC_PURPOSE = "e2b-traffic"      # ... and for its trafficAccessToken (any port but envd's)
ENVD_PORT = 49983                    # (E2B's; http/e2b/dispatch.py serves envd there)
TOKEN_SUBPROTOCOL = "bearer."


def subprotocol_token(scope) -> str | None:
    """A browser cannot set a WebSocket's Authorization header: the web page offers its token as
    a subprotocol `bearer.<token>` instead (token characters are all valid there). The server
    never names it in its answer (http/terminal.py accepts only its own protocol name)."""
    for proto in scope.get("subprotocols") or ():
        if proto.startswith(TOKEN_SUBPROTOCOL):
            return proto[len(TOKEN_SUBPROTOCOL):].strip() or None
    return None


def signed_grants(scope, path: str):
    """(sid, port, [(exp, sig, from_query)]) a request to an exposed port's path carries in its
    query (st_exp, st_sig) or, after one signed request, in its cookies (every st_port cookie: a
    sibling preview's page could add one of its own under the parent domain); else None."""
    m = PORT_PATH.match(path)
    if m is None:
        return None
    q = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if "st_sig" in q:
        return m.group(1), int(m.group(2)), [(q.get("st_exp", [""])[0], q["st_sig"][0], True)]
    headers = dict(scope.get("headers") or [])
    site = headers.get(b"sec-fetch-site", b"").decode("latin-1")
    if site in ("same-site", "cross-site") and headers.get(b"sec-fetch-dest", b"") != b"document":
        # a browser's request another site's page (a sibling preview among them: every preview is
        # same-site under a shared domain) made: a frame, a fetch, an image. The cookie is the
        # preview's own page's, and a navigation's to it: never another page's way into it
        return None
    raw = headers.get(b"cookie", b"").decode("latin-1")
    found = []
    for part in raw.split(";"):
        name, eq, value = part.strip().partition("=")
        if eq and name == PORT_COOKIE and "." in value:
            exp, _, sig = value.strip('"').partition(".")
            found.append((exp, sig, False))
    return (m.group(1), int(m.group(2)), found[:8]) if found else None


class PortGrant:
    """What a valid signed URL grants: reaching one exposed port of one sandbox (its list entry,
    its state, resuming it to answer); any other engine call is Forbidden."""
    tenant = None

    def __init__(self, engine, sid: str, port: int, exp: str, sig: str, *, from_query: bool = False):
        self.engine, self.sid, self.port, self.cookie = engine, sid, port, f"{exp}.{sig}"
        self.expires, self.from_query = int(exp), from_query    # from_query: to be exchanged for the cookie

    def _mine(self, sid: str) -> None:
        if sid != self.sid:
            raise Forbidden("a signed URL grants one port of one sandbox")

    def sandbox_ports(self, sid: str) -> list[dict]:
        self._mine(sid)
        return [p for p in self.engine.sandbox_ports(sid) if p["port"] == self.port]

    def sandbox_info(self, sid: str) -> dict:
        self._mine(sid)
        return self.engine.sandbox_info(sid)

    def sandbox_resume(self, sid: str) -> dict:
        self._mine(sid)
        return self.engine.sandbox_resume(sid)

    def __getattr__(self, name):
        raise Forbidden(f"a signed URL grants one port of one sandbox, not {name}")


class SandboxGrant:
    """What a sandbox's access token grants: the operations of the table on that one sandbox (its
    processes, files, state), as its owner sees it; any other call is Forbidden, and the same
    operations on another sandbox too."""
    tenant = None

    def __init__(self, view, sid: str):
        self.view, self.sid = view, sid

    def __getattr__(self, name):
        row = table.OPS.get(name)
        params = list(row.signature.parameters) if row is not None else []
        if not params or params[0] != "sid":
            raise Forbidden(f"a sandbox's access token grants operations on that sandbox, not {name}")
        call = getattr(self.view, name)

        def on_this_sandbox(*args, **kwargs):
            sid = args[0] if args else kwargs.get("sid")
            if not isinstance(sid, str) or not sid or not self.sid.startswith(sid):
                raise Forbidden("a sandbox's access token grants only that sandbox")
            return call(*args, **kwargs)
        return on_this_sandbox


class _WebSocketRefusal:
    """A WebSocket's `send` through which the gate's HTTP refusal (401/403 with the error object)
    goes as the handshake's answer (ASGI's websocket.http.response), or as a close where the server
    lacks that extension. Everything else passes on unchanged."""

    def __init__(self, send):
        self.send = send

    async def __call__(self, message):
        kind = message["type"]
        if kind == "http.response.start":
            message = {**message, "type": "websocket.http.response.start"}
        elif kind == "http.response.body":
            message = {**message, "type": "websocket.http.response.body"}
        await self.send(message)


def refusal(exc, path: str) -> dict:
    """The body of a refused request: Contree's shape {"error": message, "status"} under /v1 (its
    clients show `error`), E2B's {"code", "message"} under /e2b, sandtree's elsewhere. A Contree client's token that is not one of this
    server's (the quick start's "fake-token") is told what to use instead."""
    if path == "/e2b" or path.startswith("/e2b/"):
        return {"code": exc.http_status, "message": exc.message}       # E2B's clients' error shape
    if not (path == "/v1" or path.startswith("/v1/")):
        return exc.to_dict()
    message = exc.message
    if isinstance(exc, Unauthorized):
        message += (": this sandtree server has tokens, so a Contree client needs one of them as its token "
                    "(`sandtree token create --tenant NAME` on the server), not a placeholder")
    return {"error": message, "status": exc.http_status}


async def _reply(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": data})
