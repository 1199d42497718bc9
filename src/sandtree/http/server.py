"""`sandtree serve`: the engine over HTTP (FastAPI on uvicorn), under /api/v1, with OpenAPI.

An adapter: each route translates one request into one engine call, and engine errors into HTTP
statuses through one table (errors.ERRORS: each class carries its status). derived.py makes a route of
each row of the operation table (sandtree/table/) that is on REST; the rows whose route needs more than a
call name a hand-written one, in the module of their concept: images.py (streamed reads, exports,
imports), runs.py (runs, waits; an operation's events), sandboxes.py (start, exec, file writes), ports.py
(signed URLs; the exposed ports themselves), branching.py (the lineage tree), builds.py (builds, image
configs), files.py (uploads, downloads); admin.py has health and metrics; contree/ is Contree's own API under /v1;
webpage.py serves the web page at / (it calls only /api/v1); terminal.py is a live sandbox's
terminal over a WebSocket (the engine's sandbox_popen with a pty).
What they share (the caller's engine, calls in threads, the error shape) is plumbing.py; the
request bodies are models.py. quickruns.py answers a well-formed POST /runs (the busiest route)
before FastAPI's routing; anything else goes on to it. Without tokens the server only listens on loopback.

Tenants: gate.TenantGate turns each request's bearer token into the engine as that
tenant sees it (tenancy/tenants.py); routes call `engine.X` on a RequestEngine that forwards to it,
and other routers take the same view with `Depends(engine_for)`.
"""

from __future__ import annotations

import signal
import sys

from fastapi import FastAPI

from .. import defaults as D
from ..engine import Engine, RecipeWatch, dockerfile_recipe, parse_size
from .gate import JsonLog, TenantGate, engine_for  # noqa: F401 - engine_for: for routers
from .admin import admin_router
from .bodylimit import DEFAULT_MAX_UPLOAD, BodyLimit
from .connlimits import ConnLimits, limited_protocol  # noqa: F401 - ConnLimits: for `sandtree serve`'s options
from .contree.routes import contree_router
from .derived import rest_router
from .e2b import e2b_router
from .e2b.volumes import volumes_router as e2b_volumes_router
from .e2b.dispatch import SandboxDispatch, addressed
# the rows' hand-written routes register themselves when their modules load (derived.handler)
from . import branching, builds, files, images, sandboxes  # noqa: F401
from .listeners import Listeners, bind
from .plumbing import Plumbing, add_error_handlers, error_responses, lifespan
from .ports import ports_router
from .quickruns import QuickRuns
from .runs import run_answer, runs_router
from .terminal import terminal_router
from .webpage import webpage_router

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def build_app(engine: Engine, *, log: JsonLog | None = None, max_upload: int = DEFAULT_MAX_UPLOAD,
              ports_port: int | None = None, preview_base: str | None = None,
              e2b_domain: str | None = None) -> FastAPI:
    """log: where the JSON-lines request log goes (None: no request log). max_upload: the
    largest upload or image tar a request may send, unless its tenant's max_upload says otherwise.
    ports_port: the local port of the listener that serves exposed ports (http/listeners.py; None:
    none is served). preview_base: where each exposed port's own origin is reached (engine/sandboxes/previews.py;
    None: http://*.localhost:<ports_port>, for a browser on this machine). e2b_domain: the domain under
    which E2B's clients address a sandbox as <port>-<id>.<domain> (http/e2b/; None: only by headers)."""
    app = FastAPI(title="sandtree", version="0.1.0", lifespan=lifespan,
                  description="Sandboxes for AI agents with git-like, content-addressed images.")
    # The engine has no public methods for these two yet: uploads and exports are staged on the
    # store's disk (never memory), and downloads stream from the blob's own file.
    p = Plumbing(stage=engine.store.layers.stage, blob_path=engine.store.blobs.path)
    app.add_middleware(QuickRuns, answer=run_answer(p))           # innermost: a valid POST /runs, answered
    app.add_middleware(SandboxDispatch, domain=e2b_domain)      # E2B's requests to one sandbox: its port's app
    app.add_middleware(BodyLimit, max_upload=max_upload)       # inside the gate: it knows the tenant
    app.add_middleware(TenantGate, engine=engine, log=log, addressed=lambda scope: addressed(scope, e2b_domain))
    listeners = Listeners(None, ports_port, preview_base)       # (checks the base before anything is served)
    app.add_middleware(Listeners, ports_port=ports_port, preview_base=preview_base)   # outermost: who serves what
    app.state.ports_port = ports_port
    engine.ports.preview_base = listeners.base                 # the signed URLs every surface hands out
    add_error_handlers(app)
    # The operation table's routes (derived.py, in an order it keeps: a {ref:path} route takes any suffix),
    # then what is no row of it: an operation's events, health and metrics, the exposed ports themselves.
    for router in (rest_router, runs_router, admin_router, ports_router):
        app.include_router(router(p), responses=error_responses())         # (each route's errors, in OpenAPI)
    app.include_router(contree_router(engine_for, p.stage), responses=error_responses(contree=True))  # Contree's own clients, under /v1
    app.include_router(e2b_router())                                     # E2B's clients, under /e2b
    app.include_router(e2b_volumes_router())                             # E2B's volumes (http/e2b/volumes.py)
    app.include_router(terminal_router())                                # a live sandbox's terminal (WebSocket)
    app.include_router(webpage_router())                                 # the web page: / and /ui/
    return app


def connection_options(limits: ConnLimits | None = None) -> dict:
    """uvicorn's options for connections under these limits (http/connlimits.py; None: the
    defaults): `serve`'s, and `sandtree mcp --http`'s, which the CLI hands them to."""
    limits = limits or ConnLimits()
    return {"http": limited_protocol(limits), "timeout_keep_alive": limits.keep_alive}


def serve(home: str, *, host: str = "127.0.0.1", port: int = 8080, max_runs: int = 4,
          access_log: str = "json", pools: dict[str, int] | None = None,
          max_upload: int | str = DEFAULT_MAX_UPLOAD, recipe_pools: list[dict] | None = None,
          watch: float | None = None, ports_port: int | None = None, preview_url: str | None = None,
          conn_limits: ConnLimits | None = None) -> None:
    """access_log: "json" (one JSON object per request on stderr) or "off". pools: image -> size,
    warm pools kept by this server (runs through it on those images skip setup). recipe_pools:
    {dockerfile, context, tag, size}, each built before the server listens and pooled under its
    tag; watch: every so many seconds each is rebuilt and its pool rolled over when the ID
    changed (engine/warm/rollover.py). max_upload: the largest upload or image tar (a tenant's
    max_upload limit replaces it). ports_port: where exposed ports are served (their own origin:
    http/listeners.py; None: port + 1). preview_url: where each exposed port's own origin is reached,
    http(s)://*.DOMAIN[:PORT] (engine/sandboxes/previews.py; None: http://*.localhost:<ports_port>).
    conn_limits: header sizes, timeouts and connections per client (http/connlimits.py; None:
    defaults.py's)."""

    import uvicorn                  # the ASGI server: loaded only to serve, not to build the app

    max_upload = parse_size(max_upload)
    engine = Engine(home, max_runs=max_runs)
    watchers = []
    try:
        tokens = engine.tenancy.configured()
        if host not in LOOPBACK and not tokens:
            raise SystemExit("sandtree serve: no tokens are configured, so it listens on loopback only "
                             f"(asked for {host}); create one with `sandtree token create --tenant NAME`")
        log = JsonLog(sys.stderr) if access_log == "json" else None
        try:
            sockets = bind(host, port, ports_port)
        except OSError as exc:
            raise SystemExit(f"sandtree serve: cannot listen on {host} port {port} and its exposed ports' "
                             f"port {ports_port if ports_port is not None else port + 1} ({exc.strerror or exc}); "
                             "choose others with --port / --ports-port") from None
        port, ports_port = (s.getsockname()[1] for s in sockets)
        auth = "tokens" if tokens else "none: no tokens configured, listening on loopback only"
        previews = preview_url or f"http://*.localhost:{ports_port}"
        print(f"sandtree serve: http://{host}:{port} (auth: {auth}; exposed ports on http://{host}:{ports_port}, "
              f"reached as {previews})",
              file=sys.stderr, flush=True)
        if log is not None:
            log("start", host=host, port=port, ports_port=ports_port, auth="tokens" if tokens else "none",
                loopback_only=not tokens)
        engine.sandboxes.reap_every(5.0)          # idle timeouts hold with nobody listing
        engine.sandboxes.sample_every()           # each live sandbox's CPU, memory, disk over time
        for image, size in (pools or {}).items():
            engine.pool_create(engine.resolve(image), size)
        say = log if log is not None else (lambda event, **kv: print(f"sandtree serve: {event} {kv}", file=sys.stderr))
        for rp in recipe_pools or []:
            def make(rp=rp):
                return dockerfile_recipe(engine, rp["context"], dockerfile=rp["dockerfile"])
            got = engine.pool_recipe(make(), rp["size"], tag=rp["tag"], wait=True)
            say("pool", tag=got["tag"], image=got["image"], ready=got["ready"], steps=got["steps"],
                cached=got["cached"], dockerfile=rp["dockerfile"])
            if watch:
                watchers.append(RecipeWatch(engine.pool_recipe, make, rp["size"], tag=rp["tag"], interval=watch,
                                            on_event=lambda ev: say(ev.pop("event"), **ev)))
        # uvicorn re-raises SIGTERM after its graceful shutdown: as SystemExit, so the engine is
        # closed below (its operations end, a live run's sandbox stops) rather than left running
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        app = build_app(engine, log=log, max_upload=max_upload, ports_port=ports_port, preview_base=preview_url)
        # a request waiting on a run (POST /runs) would hold the shutdown for the run's whole timeout
        uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=D.SHUTDOWN_GRACE,
                                      **connection_options(conn_limits))).run(sockets=sockets)
    finally:
        for w in watchers:
            w.close()
        engine.close()

