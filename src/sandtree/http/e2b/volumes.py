"""E2B's volumes under /e2b: the control plane's routes (Volume.create / list / get_info / destroy:
POST, GET /volumes, GET, DELETE /volumes/{volumeID}) and the volume content API (Volume's own client:
/volumecontent/{volumeID}/dir, /file, /path), each declared as data (ROUTES: the rows of the operation table,
table/volumes.py, it runs, with which of its parameters, and its answer's shape) and served by one dispatcher
(_endpoint), on the engine as the caller's tenant sees it. A volume's E2B ID is its name (names are per
tenant, as sandtree's are).

The content API's URL is E2B_VOLUME_API_URL (the SDK defaults it to https://api.<domain>), so a
client sets it to the same http://HOST:PORT/e2b as E2B_API_URL. The volume token E2B hands out is sent
back as `Authorization: Bearer`; sandtree has no per-volume tokens, so it is the caller's own API key
(the key that asked), which the server's gate accepts: it gives no one more than they had.

Sandbox.create's `volume_mounts` ([{name, path}]): the control plane passes it through start_volumes()
onto sandbox_start's `volumes`; wire.listed() answers a sandbox's back as volumeMounts.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ...errors import InvalidInput, SandtreeError
from ..gate import engine_for
from .wire import error_response
from ...table.calls import call_row

__all__ = ["PREFIX", "ROUTES", "Route", "Step", "volumes_router", "start_volumes"]

PREFIX = "/e2b"


def start_volumes(mounts) -> list[dict] | None:
    """E2B's NewSandbox.volumeMounts ([{name, path}]) as sandbox_start's `volumes` (read-write, as E2B's)."""
    if not mounts:
        return None
    if not isinstance(mounts, list) or not all(isinstance(m, dict) for m in mounts):
        raise InvalidInput("volumeMounts is a list of {name, path}")
    return [{"name": m.get("name"), "path": m.get("path"), "readonly": False} for m in mounts]


def _token(request: Request) -> str:
    """The key the caller presented (its volume token: see the module doc)."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key", "") or "none"


def _volume(info: dict, request: Request | None = None) -> dict:
    out = {"volumeID": info["name"], "name": info["name"]}
    return {**out, "token": _token(request)} if request is not None else out


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def _entry(e: dict) -> dict:
    """A volume entry (engine/volumes.py stat) as E2B's VolumeEntryStat."""
    out = {"name": e["name"], "type": e["type"] if e["type"] in ("file", "directory", "symlink") else "unknown",
           "path": e["path"], "size": e["size"], "mode": e["mode"], "uid": e["uid"], "gid": e["gid"],
           "atime": _time(e["atime"]), "mtime": _time(e["mtime"]), "ctime": _time(e["ctime"])}
    if e.get("target") is not None:
        out["target"] = e["target"]
    return out


def _answer(fn, status: int = 200):
    try:
        out = fn()
    except SandtreeError as exc:
        return error_response(exc)
    if status == 204:
        return Response(status_code=204)
    if isinstance(out, Response):
        return out
    return JSONResponse(out, status_code=status)


@dataclass(frozen=True)
class Step:
    """One row a route runs: its key, the route's parameters given it by position (in the row's order) and by
    keyword (the same name on both sides)."""
    row: str
    args: tuple[str, ...]
    kwargs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Route:
    """One of E2B's volume routes as data: its method and path (under PREFIX; `{volume_id}` is a parameter), its
    query parameters (name -> (type, default); `...`: required), `body` ("json": the JSON object's `name`; "raw":
    the request's bytes as `data`), the rows it runs in order (Steps) and `answer(last row's result, request)`:
    the JSON answered (None: an empty 204)."""
    method: str
    path: str
    steps: tuple[Step, ...]
    answer: Callable | None = None
    status: int = 200
    query: dict = field(default_factory=dict)
    body: str | None = None


_VOLUME, _CONTENT = "/volumes/{volume_id}", "/volumecontent/{volume_id}"
_OWNER = {"uid": (int, 0), "gid": (int, 0)}
_ID = ("volume_id",)
_AT = ("volume_id", "path")
_STAT = Step("volume_stat", _AT)

# E2B's volume API, route by route: which rows answer it, with what (E2B's openapi.yml and its Volume client).
ROUTES = (
    # ---- the control plane (E2B_API_URL) --------------------------------------------------------------
    Route("POST", "/volumes", (Step("volume_create", ("name",)),), lambda v, rq: _volume(v, rq), 201, body="json"),
    Route("GET", "/volumes", (Step("volume_list", ()),), lambda vs, rq: [_volume(v) for v in vs]),
    Route("GET", _VOLUME, (Step("volume_info", _ID),), lambda v, rq: _volume(v, rq)),
    Route("DELETE", _VOLUME, (Step("volume_delete", _ID),), status=204),
    # ---- the volume content API (E2B_VOLUME_API_URL) ----------------------------------------------------
    Route("GET", _CONTENT + "/dir", (Step("volume_ls", _AT, ("depth",)),), lambda es, rq: [_entry(e) for e in es],
          query={"path": (str, ...), "depth": (int, 1)}),
    Route("POST", _CONTENT + "/dir", (Step("volume_mkdir", _AT, ("mode", "uid", "gid")), _STAT),
          lambda e, rq: _entry(e), 201, query={"path": (str, ...), **_OWNER, "mode": (int, 0o755), "force": (bool, True)}),
    Route("GET", _CONTENT + "/path", (_STAT,), lambda e, rq: _entry(e), query={"path": (str, ...)}),
    Route("DELETE", _CONTENT + "/path", (Step("volume_remove", _AT),), status=204, query={"path": (str, ...)}),
    Route("GET", _CONTENT + "/file", (Step("volume_read", _AT),),
          lambda data, rq: Response(data, media_type="application/octet-stream"), query={"path": (str, ...)}),
    Route("PUT", _CONTENT + "/file", (Step("volume_write", _AT + ("data",), ("mode", "uid", "gid")), _STAT),
          lambda e, rq: _entry(e), 201, query={"path": (str, ...), **_OWNER, "mode": (int, 0o644), "force": (bool, True)},
          body="raw"),
)


def _run(route: Route, eng, given: dict, request: Request):
    """The route's rows, one after another, on the caller's engine; the last one's answer shaped."""
    out = None
    for step in route.steps:
        out = call_row(eng, step.row, *(given[a] for a in step.args), **{k: given[k] for k in step.kwargs})
    return route.answer(out, request) if route.answer is not None else out


def _endpoint(route: Route):
    """A FastAPI endpoint for a Route: its path and query parameters typed as declared (FastAPI checks them),
    the rows run in the thread pool, errors in E2B's shape (_answer)."""
    async def endpoint(request: Request, eng, **given):
        if route.body == "json":
            body = given.pop("body")
            given["name"] = body.get("name") if isinstance(body, dict) else None
        elif route.body == "raw":
            given["data"] = await request.body()
        return await run_in_threadpool(_answer, lambda: _run(route, eng, given, request), route.status)

    P = inspect.Parameter
    params = [P(n, P.KEYWORD_ONLY, annotation=str) for n in re.findall(r"{(\w+)}", route.path)]
    params += [P(n, P.KEYWORD_ONLY, annotation=t, default=Query(...) if d is ... else d)
               for n, (t, d) in route.query.items()]
    if route.body == "json":
        params.append(P("body", P.KEYWORD_ONLY, annotation=dict))
    params += [P("request", P.KEYWORD_ONLY, annotation=Request), P("eng", P.KEYWORD_ONLY, default=Depends(engine_for))]
    endpoint.__signature__ = inspect.Signature(params)
    endpoint.__name__ = route.steps[0].row
    return endpoint


def volumes_router() -> APIRouter:
    """Every Route of ROUTES (not in sandtree's OpenAPI: these are E2B's routes, with E2B's statuses and shapes)."""
    router = APIRouter(prefix=PREFIX, tags=["e2b"], include_in_schema=False)
    for route in ROUTES:
        router.add_api_route(route.path, _endpoint(route), methods=[route.method], status_code=route.status)
    return router
