"""REST conformance: the OpenAPI document the server serves holds every row of the operation table that is on REST
(row.on("rest")), each at its Http's method and path, each argument where Http puts it (path, query, JSON body),
with the row's type and the row's default (or the one Http.defaults declares beside the row). The routes made by
http/derived.py and the hand-written ones a row names (Http.handler) are held to the same rows. And http/ states
no default of its own: no numeric literal as a parameter's default (they come from the rows, i.e. defaults.py).

Each check is also run on planted drift (a fake row added to the table and removed in `finally`, or a copy of the
document changed) to see it catch a missing route, a parameter that differs and a default that differs.
"""

from __future__ import annotations

import ast
import copy
import inspect
import os
import re
import tempfile
from dataclasses import replace

import httpx
import pytest

from sandtree.engine import Engine
from sandtree.http.derived import route_path
from sandtree.http.server import build_app
from sandtree.table import OPS, rows

HTTP_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "src", "sandtree", "http")
# JSON Schema's type for each Python type a row's annotation names (bytes go as text: JSON has none).
JSON = {"str": "string", "bytes": "string", "int": "integer", "float": "number", "bool": "boolean",
        "list": "array", "tuple": "array", "dict": "object", "None": "null"}


@pytest.fixture(scope="module")
def doc():
    with tempfile.TemporaryDirectory() as home:
        eng = Engine(home, warm=0)
        try:
            return build_app(eng).openapi()
        finally:
            eng.close()


def _json_types(annotation: str) -> set[str] | None:
    """The JSON types an annotation allows (None: it names one the map does not know, e.g. Literal)."""
    out = set()
    for part in annotation.split("|"):
        base = part.strip().split("[")[0]
        if base not in JSON:
            return None
        out.add(JSON[base])
    return out


def _schema_types(schema: dict, doc: dict) -> set[str]:
    if "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in schema:
        return set().union(*(_schema_types(s, doc) for s in schema["anyOf"]))
    if "enum" in schema or "const" in schema:
        return {schema.get("type", "string")}
    return {schema["type"]} if "type" in schema else ({"object"} if "properties" in schema else set())


def _wire(doc: dict, row) -> dict | None:
    """name -> (where, schema, required) of the route a row's Http names, or None when there is no such route."""
    op = doc["paths"].get(_openapi_path(row), {}).get(row.http.method.lower())
    if op is None:
        return None
    out = {p["name"]: (p["in"], p["schema"], p.get("required", False)) for p in op.get("parameters", [])}
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body is not None:
        if "anyOf" in body:                                    # an optional body: model | None
            body = next(s for s in body["anyOf"] if "$ref" in s)
        if "$ref" in body:
            model = doc["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
            required = set(model.get("required", []))
            out.update({k: ("body", s, k in required) for k, s in model.get("properties", {}).items()})
    return out


def _expected(row) -> dict:
    """name on the wire -> (where, the row's annotation, required, default) for each argument Http sends."""
    h, sig = row.http, row.signature.parameters
    params = {p.name: p for p in row.keyword_options()} | dict(sig)
    out = {}
    placed = [(a, "path") for a in _path_args(h.path)] + [(a, "query") for a in h.query] + \
             [(a, "body") for a in h.body]
    for arg, where in placed:
        p = params.get(arg)
        if p is None:
            out[arg] = (where, None, None, None)             # the wire takes what the row does not
            continue
        wire = h.names.get(arg, arg) if where == "path" else h.rename.get(arg, arg)
        annotation = h.types.get(arg) or ("" if p.annotation is p.empty else str(p.annotation))
        default = h.defaults.get(arg, p.default)
        out[wire] = (where, annotation, default is p.empty, None if default is p.empty else default)
    return out


def _openapi_path(row) -> str:
    return re.sub(r":path}", "}", route_path(row.http))        # OpenAPI names {x:path} {x}


def _path_args(path: str) -> list[str]:
    return [seg.split("}")[0].split(":")[0] for seg in path.split("{")[1:]]


def rest_drift(doc: dict, ops: dict | None = None) -> list[str]:
    """Where the served document differs from the rows on REST: a row without its route, an argument missing or
    somewhere else (path, query, body), of another type, required or not otherwise, or with another default."""
    found = []
    for key, row in (ops or OPS).items():
        if not row.on("rest"):
            continue
        wire = _wire(doc, row)
        if wire is None:
            found.append(f"{key}: no route {row.http.method} {_openapi_path(row)}")
            continue
        for name, (where, annotation, required, default) in _expected(row).items():
            if annotation is None:
                found.append(f"{key}: {name} ({where}) is no argument of the row")
                continue
            if name not in wire:
                found.append(f"{key}: {name} ({where}) is not a parameter of {row.http.method} {_openapi_path(row)}")
                continue
            w_where, schema, w_required = wire[name]
            if w_where != where:
                found.append(f"{key}: {name} is sent in the {w_where}, the row's Http puts it in the {where}")
            if w_required != required:
                found.append(f"{key}: {name} is {'' if w_required else 'not '}required on the wire, "
                             f"{'' if required else 'not '}by the row")
            want = _json_types(annotation) if annotation else None
            if want is not None:
                if where == "query" and "object" in want:       # NAME=VALUE pairs, repeatable
                    want = (want - {"object"}) | {"array"}
                if where != "body" and "null" in want and w_where == where:
                    want = want if "null" in _schema_types(schema, doc) else want - {"null"}
                got = _schema_types(schema, doc)
                if "array" in got and want <= {"array", "null"}:
                    pass
                elif got != want:
                    found.append(f"{key}: {name} is {sorted(got)} on the wire, the row's is {annotation}")
            if not required and schema.get("default") != default and not (default is None and "default" not in schema):
                none = default is None or (isinstance(default, dict | tuple | list) and not default)
                if not (none and schema.get("default") in ([], {})):          # [] of NAME=VALUE pairs: none
                    found.append(f"{key}: {name}'s default is {schema.get('default')!r} on the wire, "
                                 f"the row's {default!r}")
    return found


def literal_defaults(sources: dict[str, str]) -> list[str]:
    """Numeric literals (other than 0) as a route parameter's default in http/: Query(100), Field(50), `= 1000`.
    Defaults come from the rows (which take them from defaults.py)."""
    found = []
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            values = []
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("Query", "Field", "Body", "Path"):
                values = node.args[:1]
            elif isinstance(node, ast.AsyncFunctionDef):               # a route's function (serve() is no route)
                values = node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
            for v in values:
                if isinstance(v, ast.Constant) and type(v.value) in (int, float) and v.value != 0:
                    found.append(f"{name}:{v.lineno}: literal default {v.value!r}")
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


def _http_sources() -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(HTTP_DIR)):
        if name.endswith(".py") and not name.startswith("contree"):   # Contree's wire is Contree's own
            with open(os.path.join(HTTP_DIR, name)) as f:
                out[name] = f.read()
    return out


# ---- the checks on the real server ---------------------------------------------------------------------------
# What REST does otherwise than its row, each with why (the check still sees every other difference).
KNOWN = {"operations.wait: op (path) is no argument of the row":
         "POST /operations/{op}/wait waits for the one operation its path names; the row takes a list (ops)"}


def test_every_rest_row_is_served_as_its_row_says(doc):
    found = [f for f in rest_drift(doc) if f not in KNOWN]
    assert not found, "REST differs from the operation table:\n" + "\n".join(found)


def test_rest_states_no_default_of_its_own():
    found = literal_defaults(_http_sources())
    assert not found, "literal defaults in http/ (take them from the rows / defaults.py):\n" + "\n".join(found)


def test_merge_preview_is_on_rest(doc):
    """The drift the issue names: merge_preview is on every surface (REST had it first)."""
    assert OPS["merge_preview"].on("rest") and _wire(doc, OPS["merge_preview"]) is not None


# ---- the checks catch planted drift ----------------------------------------------------------------------------
def _plant(fn_src: str, http: rows.Http, scope: str = "list"):
    """Add a fake row to the table (the caller removes it); returns its key."""
    ns: dict = {}
    exec(fn_src, ns)                                            # noqa: S102 - a planted row's signature
    fn = next(v for k, v in ns.items() if inspect.isfunction(v))
    rows.op(scope, http=http)(fn)
    return fn.__name__


def test_plant_missing_route_is_caught(doc):
    key = _plant("def planted_missing(x: str) -> dict: ...", rows.Http("GET", "/planted/{x}"))
    try:
        assert [f for f in rest_drift(doc) if f not in KNOWN] == [f"{key}: no route GET /api/v1/planted/{{x}}"]
    finally:
        del OPS[key]
    assert set(rest_drift(doc)) <= set(KNOWN)


def test_plant_missing_route_off_rest_is_not_required(doc):
    key = _plant("def planted_off(x: str) -> dict: ...", rows.Http("GET", "/planted/{x}"))
    try:
        OPS[key] = replace(OPS[key], via={"rest": rows.Off("planted: not on REST")})
        assert set(rest_drift(doc)) <= set(KNOWN)
    finally:
        del OPS[key]


def test_plant_parameter_drift_is_caught(doc):
    # a row on an existing route (GET /sandboxes/{sid}/ls) whose `path` is an int, and one whose argument the
    # route does not take
    typed = _plant("def planted_type(sid: str, path: int = 0) -> list: ...",
                   rows.Http("GET", "/sandboxes/{sid}/ls", query=("path",)))
    named = _plant("def planted_name(sid: str, where: str = '/') -> list: ...",
                   rows.Http("GET", "/sandboxes/{sid}/ls", query=("where",)))
    try:
        found = rest_drift(doc)
        assert any(f.startswith(f"{typed}: path is ['string'] on the wire") for f in found), found
        assert f"{named}: where (query) is not a parameter of GET /api/v1/sandboxes/{{sid}}/ls" in found, found
    finally:
        del OPS[typed], OPS[named]
    # and the served document changed instead of the table: a body field of another type, a query parameter moved
    bad = copy.deepcopy(doc)
    bad["components"]["schemas"]["TimeoutIn"]["properties"]["timeout"] = {"type": "string"}
    for p in bad["paths"]["/api/v1/operations"]["get"]["parameters"]:
        if p["name"] == "status":
            p["in"] = "header"
    found = rest_drift(bad)
    assert "sandbox_set_timeout: timeout is ['string'] on the wire, the row's is float" in found, found
    assert "operations.list: status is sent in the header, the row's Http puts it in the query" in found, found


def test_plant_default_drift_is_caught(doc):
    key = _plant("def planted_default(sid: str, path: str = '/tmp') -> list: ...",
                 rows.Http("GET", "/sandboxes/{sid}/ls", query=("path",)))
    try:
        assert [f for f in rest_drift(doc) if f not in KNOWN] == [f"{key}: path's default is '/' on the wire, the row's '/tmp'"]
    finally:
        del OPS[key]
    bad = copy.deepcopy(doc)
    for p in bad["paths"]["/api/v1/operations"]["get"]["parameters"]:
        if p["name"] == "limit":
            p["schema"]["default"] = 100
    assert [f for f in rest_drift(bad) if f not in KNOWN] == ["operations.list: limit's default is 100 on the wire, the row's 50"]


def test_plant_literal_default_is_caught():
    planted = {"planted.py": "from fastapi import Query\n"
                             "async def audit(limit: int = Query(100, ge=1)): ...\n"
                             "async def log(limit: int = 1000): ...\n"
                             "async def ls(offset: int = Query(0)): ...\n"
                             "def serve(port: int = 8080): ...\n"}
    assert literal_defaults(planted) == ["planted.py:2: literal default 100", "planted.py:3: literal default 1000"]


# ---- the bodies made from the rows, over a real server on loopback ----------------------------------------------
def test_run_start_exec_bodies_from_the_rows_work(tmp_path, rootfs):
    """POST /runs, /sandboxes and /sandboxes/{sid}/exec take the bodies derived from their rows (RunOptions, stdin
    as text or base64, the wire's {} defaults) and refuse a field the row does not name."""
    from served import serving                                # (tests/served.py: uvicorn on loopback)
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        img = eng.import_path(rootfs)
        with serving(eng) as srv, httpx.Client(base_url=srv.api + "/api/v1", timeout=60) as c:
            r = c.post("/runs", json={"image": img, "command": "cat; echo $V", "stdin_base64": "aGk=",
                                      "env": {"V": "v"}})
            assert r.status_code == 201 and r.json()["stdout"] == "hiv\n", r.text
            bad = c.post("/runs", json={"image": img, "command": "true", "no_such_option": 1})
            assert bad.status_code == 422 and "no_such_option" in bad.text
            sb = c.post("/sandboxes", json={"image": img, "labels": {"k": "v"}})
            assert sb.status_code == 201, sb.text
            sid = sb.json()["id"]
            try:
                assert c.post(f"/sandboxes/{sid}/exec", json={"command": "cd /tmp"}).status_code == 200
                out = c.post(f"/sandboxes/{sid}/exec", json={"command": "pwd; cat", "stdin": "x"}).json()
                assert out["stdout"] == "/tmp\nx" and out["outcome"]["exit_code"] == 0
                assert [s["id"] for s in c.get("/sandboxes", params={"label": "k=v"}).json()] == [sid]
            finally:
                c.post(f"/sandboxes/{sid}/stop")
    finally:
        eng.close()
