"""/api/v1 routes made from the operation table: one route per row on REST (row.on("rest")), its path and method
from the row's Http, its query parameters and body model from the row's signature (types from the annotations,
defaults from the row, descriptions from sandtree.vocabulary), image arguments resolved once, the engine called
through Plumbing.call (in a thread, errors mapped by the app's handlers), the answer shaped by Http's result,
echo, data and raw.

Rows that share a method and path are one route (diff and patch, share and unshare, the two pool rows): the
rows' `const` fields are its parameters, and the rows whose const values match the request answer (their
`result` keys joined, else the most specific one's answer). A row whose route needs more than a call (a
streamed body or download, a spooled upload, Server-Sent Events) names a hand-written route of http/
(Http.handler; registered with @handler in its module): its path, method, name and status still come from
the row. The routes come in an order that keeps a `{x:path}` parameter at a path's end from taking a longer
path of another route: those routes go last.
"""

from __future__ import annotations

import base64
import functools
import inspect
from typing import Any, Literal

from fastapi import APIRouter, Body, Path, Query, Request
from fastapi.responses import Response
from pydantic import Field, create_model

from .. import vocabulary
from ..errors import InvalidInput
from ..table import OPS
from ..values import name_values
from .models import FileIn, In, NetworkIn, SecretsIn
from .plumbing import Plumbing

__all__ = ["API", "HANDLERS", "WIRE", "body_model", "handler", "resolved", "rest_router", "rest_routes",
           "route_path", "wire_type"]

API = "/api/v1"

# Hand-written routes by name (Http.handler): name -> make(p: Plumbing) -> the endpoint function.
HANDLERS: dict[str, Any] = {}
# The modules that register them import this one; the server imports them before it makes the router
# (server.py), so this module imports none of them (no cycle).

# What the wire takes for the vocabulary's arguments the rows leave unannotated or type for in-process callers
# (JSON has no bytes: `bytes | str` is text, with a `<name>_base64` field beside it for bytes that are not UTF-8).
WIRE = {"command": "str | list[str]", "network": "NetworkIn", "secrets": "SecretsIn", "memory": "str | int | None",
        "disk": "str | int | None", "output": "str | int | None", "files": "list[FileIn]",
        "env": "dict[str, str] | None", "labels": "dict[str, str] | None"}
_NAMES = {"NetworkIn": NetworkIn, "SecretsIn": SecretsIn, "FileIn": FileIn, "Literal": Literal, "Any": Any}


async def resolved(p: Plumbing, ref: str) -> str:
    """An image reference (ID, prefix, tag, branch:NAME) as the image's full ID, as the caller may see it: the
    one place REST resolves one (the derived routes for the rows' `images`, the hand-written ones for theirs)."""
    return await p.call(p.engine.resolve, ref)


def handler(name: str):
    """Register a hand-written route (make(p) -> endpoint) under the name a row's Http.handler gives."""
    def deco(make):
        HANDLERS[name] = make
        return make
    return deco


def _param(row, arg: str) -> inspect.Parameter:
    """A row's argument: its own, or one its **options take (kwargs_of: fork's are run's)."""
    p = row.signature.parameters.get(arg)
    return p if p is not None else next(k for k in row.keyword_options() if k.name == arg)


def _row_annotation(row, arg: str) -> str:
    p = _param(row, arg)
    return "" if p.annotation is p.empty else str(p.annotation)


def wire_type(row, arg: str):
    """The type of an argument on the wire: Http.types', else the vocabulary's wire type, else the row's."""
    text = row.http.types.get(arg) or WIRE.get(arg) or _row_annotation(row, arg) or "Any"
    text = text.replace("bytes | str", "str").replace("bytes", "str")
    return eval(text, {"__builtins__": __builtins__, **_NAMES})      # noqa: S307 - the table's own annotations


def _bytes(row, arg: str) -> bool:
    return "bytes" in _row_annotation(row, arg) and not row.http.types.get(arg)


def _default(row, arg: str):
    """The wire's default: the row's; an optional argument without one is left out (None: clients leave None
    values out, so None is what the row gets); Http.defaults for the few the wire defaults and the row does not."""
    p = _param(row, arg)
    if arg in row.http.defaults:
        return row.http.defaults[arg]
    if p.default is not p.empty:
        return p.default
    return None if "None" in _row_annotation(row, arg) else ...


def _path_args(h) -> list[str]:
    return [seg.split("}")[0].split(":")[0] for seg in h.path.split("{")[1:]]


def route_path(h) -> str:
    """The route's path: the row's under /api/v1, its arguments named as Http.names says."""
    out = h.path
    for arg, name in h.names.items():
        out = out.replace("{" + arg + "}", "{" + name + "}").replace("{" + arg + ":", "{" + name + ":")
    return API + out


def _describe(row, arg: str) -> str | None:
    """The wire's description of an argument: Http.describe's (what REST says of it), else the vocabulary's."""
    return row.http.describe.get(arg) or vocabulary.describe(row.name, arg)


def _query_param(row, arg: str) -> inspect.Parameter:
    wire = row.http.rename.get(arg, arg)
    tp, default = wire_type(row, arg), _default(row, arg)
    if "dict" in str(tp):                      # NAME=VALUE pairs, repeatable (as the remote client sends a dict)
        text = row.http.describe.get(arg) or f"NAME=VALUE (repeatable): {_describe(row, arg)}"
        return inspect.Parameter(wire, inspect.Parameter.KEYWORD_ONLY, annotation=list[str],
                                 default=Query([], description=text))
    return inspect.Parameter(wire, inspect.Parameter.KEYWORD_ONLY, annotation=tp,
                             default=Query(default, description=_describe(row, arg), **row.http.bounds.get(arg, {})))



def _body_model(rows: list, h):
    """The body's pydantic model: the rows' `body` arguments (and their const fields, when rows share the route),
    each with its wire type, the row's default and the vocabulary's description."""
    fields: dict[str, Any] = {}
    for row in rows:
        for arg in row.http.body:
            wire = row.http.rename.get(arg, arg)
            if wire in fields:
                continue
            default = _default(row, arg)
            fields[wire] = (wire_type(row, arg), Field(default, description=_describe(row, arg),
                                                       **row.http.bounds.get(arg, {})))
            if _bytes(row, arg):
                fields[wire + "_base64"] = (str | None, Field(None, description=f"{wire} as base64, for bytes that "
                                                                                "are not UTF-8"))
    for key, value in _consts(rows).items():
        text = next((r.http.describe[key] for r in rows if key in r.http.describe), None)
        fields[key] = (type(value), Field(value, description=text))
    if not fields and not h.optional_body and not h.const:
        return None
    name = h.model or "".join(w.title() for w in rows[0].name.split("_")) + "In"
    # named as the hand-written models were (their module: OpenAPI names a clashing model by it)
    return create_model(name, __base__=In, __module__="sandtree.http.models",
                        __doc__=h.model_doc or rows[0].doc.split("\n")[0], **fields)


@functools.cache
def body_model(key: str):
    """The body model of a row whose route is written by hand (Http.handler): made from the row as a derived
    route's is, once (one class per name in OpenAPI)."""
    row = OPS[key]
    return _body_model([row], row.http)


def _consts(rows: list) -> dict:
    """The const fields of rows sharing a route, each with its default: the first row's value when every row
    sets it, else the value a row that does not set it stands for (False)."""
    out: dict[str, Any] = {}
    for row in rows:
        for key, value in row.http.const.items():
            if key not in out:
                out[key] = value if all(key in r.http.const for r in rows) else type(value)()
    return out


def _answer_model(rows: list):
    """The answer's model for OpenAPI: an object for a result/echo or a dict, a list as the row returns."""
    row, h = rows[0], rows[0].http
    if h.raw or h.handler:
        return None
    if h.result or h.echo or len(rows) > 1:
        return dict
    ret = str(row.signature.return_annotation)
    if ret.startswith("list[str]"):
        return list[str]
    if ret.startswith("list"):
        return list[dict]
    if ret.startswith("dict"):
        return dict
    return None


def _shape(row, args: dict, value):
    h = row.http
    if h.data:
        value = [v.to_dict() for v in value] if isinstance(value, list) else value.to_dict()
    if h.raw:
        return Response(value, media_type="application/octet-stream")
    if h.result is None and not h.echo:
        return Response(status_code=204) if value is None else value
    out = {key: args.get(arg) for arg, key in h.echo.items()}
    if h.result is not None:
        out[h.result] = value
    return out


def _endpoint(p: Plumbing, rows: list):
    """The route's function: its signature is what FastAPI reads (path, query, body, request)."""
    h = rows[0].http
    params, path_args = [], _path_args(h)
    for arg in path_args:
        tp = wire_type(rows[0], arg)
        params.append(inspect.Parameter(h.names.get(arg, arg), inspect.Parameter.KEYWORD_ONLY,
                                        annotation=tp, default=Path(description=_describe(rows[0], arg))))
    seen = set(path_args)
    for row in rows:
        for arg in row.http.query:
            if arg not in seen:
                seen.add(arg)
                params.append(_query_param(row, arg))
    if h.method == "GET":
        for key, value in _consts(rows).items():
            params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=type(value),
                                            default=Query(value if all(key in r.http.const for r in rows)
                                                          else type(value)())))
    model = None if h.method == "GET" else _body_model(rows, h)
    if h.whole_body:
        model = list[FileIn]
    if model is not None:
        params.append(inspect.Parameter("body", inspect.Parameter.KEYWORD_ONLY,
                                        annotation=model | None if h.optional_body else model,
                                        default=Body(None) if h.optional_body else Body()))
    if h.content:
        params.append(inspect.Parameter("request", inspect.Parameter.KEYWORD_ONLY, annotation=Request))
    engine, ops = p.engine, p.ops

    async def endpoint(**kw):
        args: dict[str, Any] = {arg: kw[h.names.get(arg, arg)] for arg in path_args}
        for row in rows:
            for arg in row.http.query:
                value = kw[row.http.rename.get(arg, arg)]
                args[arg] = (name_values(value, row.http.rename.get(arg, arg)) or None) if isinstance(value, list) \
                    and "dict" in str(wire_type(row, arg)) else value
        consts = {k: kw[k] for k in _consts(rows)} if h.method == "GET" else {}
        body = kw.get("body")
        if h.whole_body:
            args[h.whole_body] = [f.model_dump(exclude_none=True) for f in body]
        elif body is not None:
            for row in rows:
                for arg in row.http.body:
                    wire = row.http.rename.get(arg, arg)
                    args[arg] = _from_body(body, wire, _bytes(row, arg))
            consts = {k: getattr(body, k) for k in _consts(rows)}
        elif model is not None and h.method != "GET":
            consts = dict(_consts(rows))
        if h.content:
            args[h.content] = await kw["request"].body()
        for arg in {a for row in rows for a in row.images}:
            if args.get(arg) is not None:
                args[arg] = await resolved(p, args[arg])
        chosen = [r for r in rows if all(consts.get(k) == v for k, v in r.http.const.items())]
        if not chosen:
            raise InvalidInput("no operation takes these values: " + ", ".join(f"{k}={v}" for k, v in consts.items()))
        if any(r.http.result is None for r in chosen):
            chosen = [max(chosen, key=lambda r: len(r.http.const))]       # the most specific one answers
        out = None
        for row in chosen:
            value = _shape(row, args, await p.call(functools.partial(_method(engine, ops, row), **_own(row, args))))
            out = value if out is None else {**out, **value}
        return out

    endpoint.__signature__ = inspect.Signature(params)
    return endpoint


def _from_body(body, wire: str, is_bytes: bool):
    value = getattr(body, wire)
    if isinstance(value, list) and value and isinstance(value[0], FileIn):
        return [f.model_dump(exclude_none=True) for f in value]
    if not is_bytes:
        return value
    b64 = getattr(body, wire + "_base64")
    if b64 is not None:
        if value is not None:
            raise InvalidInput(f"give {wire} or {wire}_base64, not both")
        try:
            return base64.b64decode(b64, validate=True)
        except ValueError:
            raise InvalidInput(f"{wire}_base64 is not valid base64") from None
    return value.encode("utf-8", "surrogateescape") if value is not None else None


def _own(row, args: dict) -> dict:
    """The arguments the row takes, as the wire gave them (a wider wire type narrowed to the row's str)."""
    out = {}
    for name, p in row.signature.parameters.items():
        if name in args:
            value = args[name]
            if _row_annotation(row, name) == "str" and isinstance(value, int) and not isinstance(value, bool):
                value = str(value)
            out[name] = value
    return out


def _method(engine, ops, row):
    return getattr(ops if row.group == "operations" else engine, row.name)


def rest_routes() -> list[list]:
    """The rows on REST grouped by route (method and path), in the order they are registered: the table's,
    with routes whose path ends in a `{x:path}` parameter after all others (it would take their paths)."""
    groups: dict[tuple[str, str], list] = {}
    for row in OPS.values():
        if row.on("rest"):
            groups.setdefault((row.http.method, row.http.path), []).append(row)
    return sorted(groups.values(), key=lambda rows: rows[0].http.path.endswith(":path}"))


def rest_router(p: Plumbing) -> APIRouter:
    missing = sorted({rows[0].http.handler for rows in rest_routes()} - set(HANDLERS) - {None})
    if missing:
        raise RuntimeError(f"hand-written routes not registered (their module not imported): {missing}")
    router = APIRouter()
    for rows in rest_routes():
        h = rows[0].http
        name = h.name or rows[0].name
        if h.handler:
            make = HANDLERS[h.handler]
            router.add_api_route(route_path(h), make(p), methods=[h.method], name=name, status_code=h.status)
            continue
        router.add_api_route(route_path(h), _endpoint(p, rows), methods=[h.method], name=name,
                             status_code=h.status, response_model=_answer_model(rows),
                             description=h.doc or rows[0].doc.split("\n")[0])
    return router
