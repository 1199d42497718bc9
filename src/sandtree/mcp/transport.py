"""`sandtree mcp --http`: the MCP server over streamable HTTP, `sandtree serve`'s equal, not a side
door: the same tokens and tenancy (http.gate.TenantGate turns each HTTP
request's bearer token into that tenant's view of the engine, and every tool call runs as the
caller of the request that carried it: PerRequestServer); a session belongs to the tenant that
opened it (SessionOwners)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections import OrderedDict

import anyio.to_thread
from mcp.server.mcpserver import MCPServer

from ..engine import Engine
from ..http.gate import CURRENT, STATE_KEY, JsonLog, TenantGate, engine_for
from .toolkit import SESSION, Server

TOOL_THREADS = 256                # sync tool calls at once over HTTP (anyio's default: 40, shared)


class PerRequestServer(Server):
    """Over HTTP: each tool call and resource read runs as the caller of the HTTP request that
    carried it. The tool runs in the session's task, not the request's, so the view TenantGate
    put on that request's scope is set as the current engine here (fails closed without one)."""

    @contextlib.contextmanager
    def _as_caller(self, context):
        try:
            request = getattr(context.request_context, "request", None)
        except ValueError:                          # a Context made outside any request
            request = None
        if request is None:
            raise RuntimeError("an MCP HTTP call without its HTTP request: refusing to serve unscoped")
        view = engine_for(request)
        token = CURRENT.set(view)
        session = SESSION.set((request.headers.get("mcp-session-id"), view))
        try:
            yield
        finally:
            SESSION.reset(session)
            CURRENT.reset(token)

    async def call_tool(self, name, arguments, context=None):
        if context is None:                         # nested call: already inside a caller's context
            return await super().call_tool(name, arguments, context)
        with self._as_caller(context):
            return await super().call_tool(name, arguments, context)

    async def read_resource(self, uri, context=None):
        if context is None:
            return await super().read_resource(uri, context)
        with self._as_caller(context):
            return await super().read_resource(uri, context)


def serve_http(server: MCPServer, engine: Engine | None, host: str, port: int, options: dict | None = None) -> None:
    """engine: the one the TenantGate authenticates against (None: a remote engine, no gate).
    options: uvicorn's (the connection limits `sandtree serve` has: http/connlimits.py)."""

    import uvicorn                  # the ASGI server: loaded only to serve over HTTP
    app = server.streamable_http_app(host=host)
    if engine is not None:
        app = TenantGate(SessionOwners(app, server.toolkit.end_session), engine, JsonLog(sys.stderr))
        auth = "tokens" if engine.tenancy.configured() else "none: no tokens configured, loopback only"
        print(f"sandtree mcp: http://{host}:{port}/mcp (auth: {auth})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", **(options or {}))


class SessionOwners:
    """ASGI middleware behind TenantGate: an MCP session belongs to the tenant that opened it.
    A request naming another tenant's session id gets the answer an unknown session gets (404),
    so a leaked or guessed session id is worth nothing to another token. A session its client deletes (DELETE,
    as a client does when it closes) ends: `on_end(session id)` stops the live sandboxes it started."""

    MAX = 10000                              # sessions remembered (the SDK caps live ones lower)

    def __init__(self, app, on_end=None):
        self.app = app
        self.on_end = on_end
        self.owners: OrderedDict[bytes, str] = OrderedDict()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            # sync tools run on anyio's thread limiter (40 tokens): 40 callers waiting on runs
            # would stall every tenant's tools; the limit is per event loop, set here in it
            anyio.to_thread.current_default_thread_limiter().total_tokens = TOOL_THREADS
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        view = engine_for_scope(scope)
        who = getattr(getattr(view, "tenant", None), "name", None) or "-"
        sid = dict(scope.get("headers") or []).get(b"mcp-session-id")
        if sid is not None and self.owners.get(sid, who) != who:
            body = json.dumps({"jsonrpc": "2.0", "id": None,
                               "error": {"code": -32600, "message": "Session not found"}}).encode()
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            return await send({"type": "http.response.body", "body": body})

        async def send_owned(message):
            if message["type"] == "http.response.start":
                for k, v in message.get("headers") or []:
                    if k.lower() == b"mcp-session-id" and v not in self.owners:
                        self.owners[v] = who
                        while len(self.owners) > self.MAX:
                            self.owners.popitem(last=False)
            await send(message)
        if sid is not None and scope.get("method") == "DELETE" and self.on_end is not None:
            # before the SDK answers: a client that closed and goes on finds the sandboxes stopped
            await anyio.to_thread.run_sync(self.on_end, sid.decode("latin-1"))
        await self.app(scope, receive, send_owned)


def engine_for_scope(scope):
    view = scope.get("state", {}).get(STATE_KEY)
    if view is None:
        raise RuntimeError("no TenantGate in front of the MCP app: refusing to serve unscoped")
    return view
