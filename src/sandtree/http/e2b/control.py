"""E2B's control plane under /e2b (E2B_API_URL=http://HOST:PORT/e2b): the routes the `e2b` package's
REST client calls (e2b/api/client/api/), each one engine call (or a few) by its row's name, as the
caller's tenant sees it (the gate chose the view: an E2B API key is a sandtree token). Shapes and
errors are wire.py's.

    POST /sandboxes, /v2/sandboxes           sandbox_start (template: an image ID or tag; timeout:
                                             its lifetime; metadata: labels; envVars: env;
                                             network options: a policy)
    GET /sandboxes, /v2/sandboxes            sandbox_list (metadata: labels; state, template,
                                             startedAfter, order, limit, nextToken / x-next-token)
    GET /sandboxes/{id}                      sandbox_info
    DELETE /sandboxes/{id}                   sandbox_stop (kill)
    POST /sandboxes/{id}/timeout             sandbox_set_timeout
    PUT /sandboxes/{id}/network              sandbox_set_network
    POST /sandboxes/{id}/pause               sandbox_hibernate (processes and memory kept)
    POST /sandboxes/{id}/resume, .../connect sandbox_resume (connect: also of a running one)
    GET /sandboxes/{id}/metrics              sandbox_metrics; GET /sandboxes/metrics: the latest of each
    POST /sandboxes/{id}/snapshots           sandbox_commit (an image; its name a tag)
    GET /snapshots                           the caller's commits of sandboxes
    DELETE /templates/{id}                   untag (a snapshot's or template's names)
    templates (Template.build)               templates.py: a build of the steps as a Dockerfile
    secrets                                  secrets.py: stored secrets (with their hosts)

A sandbox that has ended (killed, timed out) is one E2B no longer knows: 404, as for one that never
was or is another tenant's."""

from __future__ import annotations

import asyncio
import datetime
import time

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from ... import config
from ...errors import Conflict, InvalidInput, NotFound, RuntimeUnavailable
from ..gate import ACCESS_PURPOSE, TRAFFIC_PURPOSE, engine_for
from . import secrets, templates, volumes, wire

PREFIX = "/e2b"


def _call(fn, *a, **k):
    return asyncio.to_thread(fn, *a, **k)


def access_tokens(engine, sid: str) -> dict:
    """envdAccessToken, which E2B's clients send as X-Access-Token to this sandbox's envd, and
    trafficAccessToken, sent as E2B-Traffic-Access-Token to its other ports (the code interpreter):
    each for this sandbox alone (http/gate.py). Every E2B sandbox is secured here; `secure` is
    accepted and ignored, as E2B does."""
    ports = getattr(engine, "engine", engine).ports
    return {"envdAccessToken": ports.access_token(sid, ACCESS_PURPOSE),
            "trafficAccessToken": ports.access_token(sid, TRAFFIC_PURPOSE)}


def _known(engine, sid: str) -> dict:
    """The sandbox's info if E2B would know it (running or paused), else NotFound in E2B's words."""
    try:
        info = engine.sandbox_info(sid)
    except NotFound:
        raise wire.gone(sid) from None
    if info["state"] not in wire.E2B_STATES:
        raise wire.gone(sid)
    return info


def control_router() -> APIRouter:
    router = APIRouter(prefix=PREFIX, tags=["e2b"], route_class=wire.E2BRoute, include_in_schema=False)
    router.include_router(templates.templates_router(""))
    router.include_router(secrets.secrets_router(""))

    # ---- sandboxes ----------------------------------------------------------------------------
    def start(engine, body: wire.NewSandboxIn) -> dict:
        if body.auto_pause:
            raise InvalidInput("autoPause is not supported here: a sandbox ends at its timeout "
                               "(pause it yourself, or hibernate on idle with sandtree's own API)")
        if body.mcp:
            raise InvalidInput("mcp: MCP gateways are not supported here")
        if body.network is not None and body.network.allow_public_traffic is False:
            raise InvalidInput("network.allowPublicTraffic=false: sandboxes' ports are reached with the "
                               "sandbox's access token here, never publicly")
        if body.network is not None and (body.network.rules or body.network.egress_proxy):
            raise InvalidInput("network.rules and network.egressProxy are not supported here: a secret reaches "
                               "its hosts through an environment variable (envVars={NAME: Secret.fill(name)})")
        # nothing said is E2B's default, the internet: the server's default policy, or none for a tenant
        # whose token may ask for no network (a create that asked for nothing is not refused for it)
        default = config.network_default() if engine.whoami().get("network", "any") is not None else "off"
        net = wire.network_option(body.allow_internet_access, body.network, default)
        env, stored = secrets.env_secrets(body.env_vars or {})
        info = engine.sandbox_start(body.template_id, env=env, labels=body.metadata or {}, network=net,
                                    secrets=stored or None, lifetime=body.timeout, idle_timeout=0,
                                    volumes=volumes.start_volumes(body.volume_mounts))
        try:
            templates.start_commands(engine, info)          # a template's start and ready commands
        except BaseException:
            engine.sandbox_stop(info["id"])
            raise
        return wire.sandbox(info, access_tokens(engine, info["id"]))

    @router.post("/sandboxes", status_code=201)
    @router.post("/v2/sandboxes", status_code=201)
    async def create(body: wire.NewSandboxIn, request: Request) -> JSONResponse:
        return JSONResponse(await _call(start, engine_for(request), body), status_code=201)

    def listing(engine, *, metadata, state, template, started_after, order, limit, next_token) -> tuple[list, str | None]:
        labels = wire.metadata_filter(metadata)
        states = wire.states_filter(state)
        image = engine.resolve(template) if template else None
        if order not in (None, "asc", "desc"):
            raise InvalidInput(f"order must be asc or desc, not {order!r}")
        rows = [s for s in engine.sandbox_list(labels=labels)
                if wire.E2B_STATES.get(s["state"]) in states and (image is None or s["image"] == image)
                and (started_after is None or s["created"] >= started_after)]
        key = lambda s: (s["created"], s["id"])                       # noqa: E731
        rows.sort(key=key, reverse=order == "desc")
        if next_token:
            after = wire.from_page_token(next_token)
            rows = [s for s in rows if (key(s) < after if order == "desc" else key(s) > after)]
        page = rows[:limit]
        more = wire.page_token(*key(page[-1])) if len(rows) > limit else None
        return [wire.listed(s) for s in page], more

    def _started_after(text: str | None) -> float | None:
        if not text:
            return None
        try:
            return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise InvalidInput(f"startedAfter must be an RFC 3339 time, not {text[:40]!r}") from None

    @router.get("/v2/sandboxes")
    async def list_v2(request: Request, metadata: str | None = None, state: str | None = None,
                      template: str | None = None, startedAfter: str | None = None, order: str | None = None,
                      limit: int = Query(wire.MAX_PAGE, ge=1, le=wire.MAX_PAGE), nextToken: str | None = None):
        items, more = await _call(listing, engine_for(request), metadata=metadata, state=state, template=template,
                                  started_after=_started_after(startedAfter), order=order, limit=limit,
                                  next_token=nextToken)
        return JSONResponse(items, headers={"x-next-token": more} if more else {})

    @router.get("/sandboxes")
    async def list_v1(request: Request, metadata: str | None = None):
        items, _ = await _call(listing, engine_for(request), metadata=metadata, state="running", template=None,
                               started_after=None, order=None, limit=1 << 30, next_token=None)
        return items

    @router.get("/sandboxes/metrics")
    async def latest_metrics(request: Request, sandbox_ids: str = Query(...)) -> dict:
        engine = engine_for(request)
        ids = [s for s in sandbox_ids.split(",") if s.strip()]
        if len(ids) > wire.MAX_PAGE:
            raise InvalidInput(f"at most {wire.MAX_PAGE} sandbox_ids")

        def latest() -> dict:
            out = {}
            for sid in ids:
                info = _known(engine, sid)
                samples = engine.sandbox_metrics(info["id"])
                if samples:
                    out[info["id"]] = wire.metric(samples[-1])
            return {"sandboxes": out}
        return await _call(latest)

    @router.get("/sandboxes/{sid}")
    async def get_info(sid: str, request: Request) -> dict:
        engine = engine_for(request)
        info = await _call(_known, engine, sid)
        return wire.detail(info, access_tokens(engine, info["id"]))

    @router.delete("/sandboxes/{sid}", status_code=204)
    async def kill(sid: str, request: Request) -> Response:
        engine = engine_for(request)

        def stop():
            engine.sandbox_stop(_known(engine, sid)["id"])
        await _call(stop)
        return Response(status_code=204)

    @router.post("/sandboxes/{sid}/timeout", status_code=204)
    async def set_timeout(sid: str, body: wire.TimeoutIn, request: Request) -> Response:
        engine = engine_for(request)

        def retime():
            engine.sandbox_set_timeout(_known(engine, sid)["id"], body.timeout)
        await _call(retime)
        return Response(status_code=204)

    @router.put("/sandboxes/{sid}/network", status_code=204)
    async def update_network(sid: str, body: wire.NetworkUpdateIn, request: Request) -> Response:
        """sandbox_set_network: the new policy cuts what it no longer allows (a sandbox started
        without network is given it; none takes it away again)."""
        engine = engine_for(request)
        if body.rules or body.egress_proxy:
            raise InvalidInput("network.rules and network.egressProxy are not supported here")

        def replace():
            info = _known(engine, sid)
            net = wire.network_option(body.allow_internet_access, body, config.network_default())
            engine.sandbox_set_network(info["id"], net if net is not None else {"allow_out": []})
        await _call(replace)
        return Response(status_code=204)

    @router.post("/sandboxes/{sid}/pause", status_code=204)
    async def pause(sid: str, request: Request) -> Response:
        engine = engine_for(request)

        def hibernate():
            info = _known(engine, sid)
            if info["state"] == "hibernated":
                raise Conflict(f"sandbox {sid!r} is already paused", sandbox=sid)
            try:
                engine.sandbox_hibernate(info["id"])
            except Conflict as exc:
                # E2B's SDK reads 409 as "already paused" (pause() answers False): a sandbox that
                # cannot be paused now (a command entered from outside still runs) is a retry later
                raise RuntimeUnavailable(f"sandbox {sid!r} cannot be paused now: {exc.message}") from None
        await _call(hibernate)
        return Response(status_code=204)

    def resumed(engine, sid: str, timeout: int | None, *, running_ok: bool) -> tuple[dict, int]:
        """Resume a paused sandbox (201), or answer a running one (200) when running_ok (connect);
        `timeout`: its end moves to that many seconds from now (connect only ever extends a
        running one's)."""
        info = _known(engine, sid)
        if info["state"] == "running":
            if not running_ok:
                raise Conflict(f"sandbox {sid!r} is already running", sandbox=sid)
            if timeout is not None and time.time() + timeout > info["expires"]:
                info = engine.sandbox_set_timeout(info["id"], timeout)
            return info, 200
        if timeout is not None:
            engine.sandbox_set_timeout(info["id"], timeout)        # (a paused one gets it once resumed)
        return engine.sandbox_resume(info["id"]), 201

    async def _resume(sid: str, body: wire.ConnectIn | None, request: Request, running_ok: bool) -> JSONResponse:
        engine = engine_for(request)
        info, status = await _call(resumed, engine, sid, body.timeout if body else None, running_ok=running_ok)
        return JSONResponse(wire.sandbox(info, access_tokens(engine, info["id"])), status_code=status)

    @router.post("/sandboxes/{sid}/connect")
    @router.post("/v2/sandboxes/{sid}/connect")
    async def connect(sid: str, body: wire.ConnectIn, request: Request) -> JSONResponse:
        return await _resume(sid, body, request, running_ok=True)

    @router.post("/sandboxes/{sid}/resume", status_code=201)
    async def resume(sid: str, request: Request, body: wire.ConnectIn | None = None) -> JSONResponse:
        return await _resume(sid, body, request, running_ok=False)

    @router.get("/sandboxes/{sid}/metrics")
    async def metrics(sid: str, request: Request, start: int | None = None, end: int | None = None) -> list:
        engine = engine_for(request)

        def samples():
            info = _known(engine, sid)
            return [wire.metric(s) for s in engine.sandbox_metrics(info["id"], start=start, end=end)]
        return await _call(samples)

    # ---- snapshots ----------------------------------------------------------------------------
    @router.post("/sandboxes/{sid}/snapshots", status_code=201)
    async def create_snapshot(sid: str, request: Request, body: wire.SnapshotIn | None = None) -> JSONResponse:
        engine = engine_for(request)
        name = body.name if body else None

        def commit():
            info = _known(engine, sid)
            if info["state"] != "running":
                raise Conflict(f"sandbox {sid!r} is paused: resume it to snapshot it", sandbox=sid)
            return engine.sandbox_commit(info["id"], tag=name)
        image = await _call(commit)
        return JSONResponse(wire.snapshot(image, [name] if name else []), status_code=201)

    def snapshots(engine, sandbox: str | None, name: str | None) -> list[dict]:
        """The caller's snapshots (commits of its sandboxes), newest first, with their tags."""
        tags: dict[str, list[str]] = {}
        for tag, image in engine.tags().items():
            tags.setdefault(image, []).append(tag)
        out, seen = [], set()
        for rec in engine.operations.list(kind="commit", status="done", limit=1000):
            spec, image = rec.get("spec") or {}, rec.get("result")
            if not image or image in seen or not str(spec.get("command", "")).startswith("commit of"):
                continue
            if sandbox and spec.get("sandbox") != sandbox:
                continue
            names = sorted(tags.get(image, []))
            if name and name not in names:
                continue
            seen.add(image)
            out.append(wire.snapshot(image, names))
        return out

    @router.get("/snapshots")
    async def list_snapshots(request: Request, sandboxID: str | None = None, name: str | None = None,
                             limit: int = Query(wire.MAX_PAGE, ge=1, le=wire.MAX_PAGE),
                             nextToken: str | None = None) -> JSONResponse:
        items = await _call(snapshots, engine_for(request), sandboxID, name)
        start = 0
        if nextToken:
            try:
                start = int(nextToken)
            except ValueError:
                raise InvalidInput("nextToken is not one this server gave") from None
        page = items[start:start + limit]
        more = str(start + limit) if len(items) > start + limit else None
        return JSONResponse(page, headers={"x-next-token": more} if more else {})

    @router.delete("/templates/{template_id:path}", status_code=204)
    async def delete_template(template_id: str, request: Request) -> Response:
        """A snapshot's (or template's) names go; the image is collected once nothing uses it."""
        engine = engine_for(request)

        def forget():
            names = [tag for tag, image in engine.tags().items() if template_id in (tag, image)]
            if not names:
                raise NotFound(f"template or snapshot {template_id!r} not found")
            for n in names:
                engine.untag(n)
        await _call(forget)
        return Response(status_code=204)

    return router
