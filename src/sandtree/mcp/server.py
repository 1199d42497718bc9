"""`sandtree mcp`: the engine as MCP tools, resources and prompts (official `mcp` SDK, MCPServer).

An adapter like the CLI: every tool is a few lines over engine.Engine (embedded, same process, or
a `sandtree serve` elsewhere with --url), and every engine error comes back as a tool error with
its message. The tools are in groups, one module each, composed here: runs.py (run, fork,
operations), sandboxes.py (live sandboxes), images.py (images, their files, uploads, registries),
builds.py (build, image_config), branching.py (diff, merge, lineage, branches); guide.py holds
what the server says about itself (guide, whoami, resources, prompts). What they share (registering
a tool with every parameter described, the recent runs' output) is toolkit.py.

Profiles: `--tools` chooses the tools listed: core (the default: the everyday tools, a small schema; declared
beside the rows, Mcp(core=...)), all, or a comma list of names (maker.select).

Transports: stdio (default) or streamable HTTP (`--http --port P`, transport.py). Over HTTP the
server is `sandtree serve`'s equal: the same tokens and tenancy, a non-loopback bind without tokens
is refused, and the tools that touch the *server's* filesystem are off, since the caller is not the
server's user.
"""

from __future__ import annotations

import logging
import signal

from mcp.server.mcpserver import MCPServer

from ..engine import Engine
from ..http.gate import RequestEngine
from . import branching, builds, guide, images, maker, runs, sandboxes
from .guide import GUIDE
from .toolkit import Server, Toolkit, described  # noqa: F401 - described: every tool parameter's description
from .transport import PerRequestServer, serve_http

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def build_server(engine: Engine, *, host_paths: bool = True, per_request: bool = False,
                 remote: bool = False, tools: str | None = None) -> MCPServer:
    """host_paths: whether tools may read and write paths of this machine (stdio: the caller is
    the server's own user; HTTP: off). per_request: `engine` is a RequestEngine, set per call
    from the HTTP request (see transport.PerRequestServer). remote: `engine` is a RemoteEngine
    (a `sandtree serve` elsewhere), as whoami says. tools: the profile (maker.select: None or "core",
    the default; "all"; a comma list of tool names)."""
    cls = PerRequestServer if per_request else Server
    server = cls("sandtree", instructions=GUIDE["workflow"] + "\n\n" + GUIDE["branching"])
    toolkit = server.toolkit = Toolkit(server, engine, host_paths=host_paths, remote=remote)
    for group in (runs, sandboxes, images, builds, branching, guide):
        group.register(toolkit)           # the composite tools' bodies (handlers) and the guide's own
    maker.make(toolkit, tools)            # every row's tool (table/mcp.py), derived or by its handler
    return server


def stdio(server: Server) -> None:
    """Serve one session over stdio; when it ends (stdin closed: the client quit or died; or SIGTERM, which
    a client sends when we are slow to go) the live sandboxes it started are stopped (Toolkit.end_session)."""
    def terminated(signum, frame):
        raise SystemExit(128 + signum)
    old = signal.signal(signal.SIGTERM, terminated)
    try:
        server.run("stdio")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)       # a second SIGTERM does not cut the stops short
        try:
            server.toolkit.end_session()
        finally:
            signal.signal(signal.SIGTERM, old)


def main(home: str, *, http: bool = False, host: str = "127.0.0.1", port: int = 8765, url: str | None = None,
         token: str | None = None, server_options: dict | None = None, tools: str | None = None) -> None:
    """url: use the engine of a `sandtree serve` there instead of one in this process.
    server_options: uvicorn's, over HTTP (the CLI's: `serve`'s connection limits). tools: the profile
    (build_server)."""
    if url:
        # httpx and the remote client, only for --url: 0.1-0.2 s of every other start-up here
        from ..client.remote import RemoteEngine
        if http and host not in LOOPBACK:
            # every HTTP caller would act with this process's one token: loopback only
            raise SystemExit(f"sandtree mcp --http --url: listens on loopback only (asked for {host})")
        logging.getLogger("httpx").setLevel(logging.WARNING)   # not a log line per engine call
        engine = RemoteEngine(url, token)
    else:
        engine = Engine(home)
    try:
        if not http:
            stdio(build_server(engine, remote=bool(url), tools=tools))
        elif url:
            serve_http(build_server(engine, host_paths=False, remote=True, tools=tools), None, host, port, server_options)
        else:
            tokens = engine.tenancy.configured()
            if host not in LOOPBACK and not tokens:
                raise SystemExit("sandtree mcp --http: no tokens are configured, so it listens on loopback only "
                                 f"(asked for {host}); create one with `sandtree token create --tenant NAME`")
            server = build_server(RequestEngine(), host_paths=False, per_request=True, tools=tools)
            serve_http(server, engine, host, port, server_options)
    finally:
        engine.close()
