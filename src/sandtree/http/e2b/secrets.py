"""E2B's secrets under /e2b as sandtree's stored secrets (docs/network.md, "Stored secrets"): the
caller's own (a tenant's, or the operator's on a server without tokens), their values never
answered.

sandtree sends a secret's value only to the hosts it names, so a secret is stored with its hosts:
E2B's metadata {"hosts": "api.example.com,*.example.org"} names them (a secret without is refused).
A sandbox uses one through an environment variable whose value is E2B's placeholder,
envVars={"OPENAI_API_KEY": Secret.fill("openai")}: the variable holds sandtree's placeholder, which
the egress path replaces in HTTPS requests to those hosts (the sandbox's network policy must reach
them). E2B's header-injecting network rules are not supported (control.py refuses them).

    GET /secrets, POST /secrets, GET|POST|DELETE /secrets/{name}"""

from __future__ import annotations

import asyncio
import re

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from ...errors import Conflict, InvalidInput, NotFound
from ..gate import engine_for
from . import wire

PLACEHOLDER = re.compile(r"^\$\{e2b\.secrets\.([^{}\x00-\x1f]+)\}$")     # Secret.fill(name)


def env_secrets(env: dict[str, str]) -> tuple[dict[str, str], dict[str, dict]]:
    """envVars split into plain variables and stored secrets: a variable whose value is E2B's
    placeholder of a secret is that stored secret under the variable's name."""
    plain, secrets = {}, {}
    for k, v in env.items():
        m = PLACEHOLDER.match(v) if isinstance(v, str) else None
        if m:
            secrets[k] = {"stored": m.group(1)}
        else:
            plain[k] = v
    return plain, secrets


def _hosts(metadata) -> list[str]:
    text = (metadata or {}).get("hosts") if isinstance(metadata, dict) else None
    hosts = [h.strip() for h in str(text or "").split(",") if h.strip()]
    if not hosts:
        raise InvalidInput('a secret is sent only to the hosts it names here: give them in its metadata, '
                           '{"hosts": "api.example.com,*.example.org"}')
    return hosts


def _secret(info: dict) -> dict:
    return {"secretID": info["name"], "name": info["name"], "currentVersion": 1,
            "metadata": {"hosts": ",".join(info["hosts"])}, "createdAt": wire.when(info["created"]),
            "updatedAt": wire.when(info["updated"] or info["created"])}


def secrets_router(prefix: str) -> APIRouter:
    router = APIRouter(prefix=prefix, tags=["e2b"], route_class=wire.E2BRoute, include_in_schema=False)

    def mine(engine) -> list[dict]:
        # the caller's own: a tenant's, not the operator's shared with it (E2B's secrets are a team's
        # own); on a server without tokens, the operator's ("global")
        who = getattr(getattr(engine, "tenant", None), "name", None) or "local"
        own = "global" if who == "local" else who
        return [s for s in engine.secret_list() if s.get("owner") == own]

    def one(engine, name: str) -> dict:
        for s in mine(engine):
            if s["name"] == name:
                return s
        raise NotFound(f"secret {name!r} not found")

    async def body_of(request: Request) -> dict:
        try:
            body = await request.json()
        except ValueError:
            raise InvalidInput("the body is not JSON") from None
        if not isinstance(body, dict) or not isinstance(body.get("value"), str):
            raise InvalidInput("a secret's body is {name, value, metadata}")
        return body

    @router.get("/secrets")
    async def list_secrets(request: Request, limit: int = Query(wire.MAX_PAGE, ge=1, le=wire.MAX_PAGE),
                           nextToken: str | None = None) -> JSONResponse:
        items = sorted(await asyncio.to_thread(mine, engine_for(request)), key=lambda s: s["name"])
        if nextToken:
            items = [s for s in items if s["name"] > nextToken]
        page = items[:limit]
        more = page[-1]["name"] if len(items) > limit else None
        return JSONResponse([_secret(s) for s in page], headers={"x-next-token": more} if more else {})

    @router.post("/secrets", status_code=201)
    async def create(request: Request) -> JSONResponse:
        engine, body = engine_for(request), await body_of(request)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput("a secret needs a name")

        def store():
            if any(s["name"] == name for s in mine(engine)):
                raise Conflict(f"secret {name!r} exists (update it)")
            return engine.secret_set(name, body["value"], _hosts(body.get("metadata")))
        return JSONResponse(_secret(await asyncio.to_thread(store)), status_code=201)

    @router.get("/secrets/{name}")
    async def get(name: str, request: Request) -> dict:
        return _secret(await asyncio.to_thread(one, engine_for(request), name))

    @router.post("/secrets/{name}")
    async def update(name: str, request: Request) -> dict:
        engine, body = engine_for(request), await body_of(request)

        def store():
            old = one(engine, name)
            hosts = _hosts(body["metadata"]) if body.get("metadata") is not None else old["hosts"]
            return engine.secret_set(name, body["value"], hosts)
        return _secret(await asyncio.to_thread(store))

    @router.delete("/secrets/{name}", status_code=204)
    async def delete(name: str, request: Request) -> Response:
        engine = engine_for(request)

        def forget():
            one(engine, name)
            engine.secret_remove(name)
        await asyncio.to_thread(forget)
        return Response(status_code=204)

    return router
