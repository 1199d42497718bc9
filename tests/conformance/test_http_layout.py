"""The REST server's request bodies (issue 13 item 2): every JSON body of /api/v1 is a model that
refuses a field it does not name, and the refusal is the one error shape naming that field. The
routes are found from the app itself, so a route added with a lenient body fails here."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from sandtree.engine import Engine
from sandtree.http.models import In
from sandtree.http.server import build_app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    eng = Engine(str(tmp_path_factory.mktemp("layout-home")), warm=0)
    try:
        yield build_app(eng)
    finally:
        eng.close()


def body_routes(app) -> list[tuple[str, str, dict]]:
    """(method, path, JSON schema of the body) of every /api/v1 route that takes a JSON body, from
    the app's own OpenAPI document (what a client is told to send)."""
    doc = app.openapi()
    out = []
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if path.startswith("/api/v1") and schema is not None:
                out.append((method.upper(), path, schema))
    return out


def objects_of(schema: dict, doc: dict) -> list[dict]:
    """The object schemas a body schema names ($ref, anyOf with null, an array's items)."""
    if "$ref" in schema:
        return objects_of(doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]], doc)
    if "anyOf" in schema:
        return [o for s in schema["anyOf"] if s.get("type") != "null" for o in objects_of(s, doc)]
    if schema.get("type") == "array":
        return objects_of(schema["items"], doc)
    return [schema]


def test_every_body_is_a_strict_model(app):
    routes, doc = body_routes(app), app.openapi()
    assert len(routes) >= 13, routes                  # runs, sandboxes, exec, merge, branches, tags...
    lenient = [(m, p) for m, p, s in routes
               if not all(o.get("type") == "object" and o.get("additionalProperties") is False
                          for o in objects_of(s, doc))]
    assert not lenient, lenient


def test_an_unknown_field_is_refused_on_every_body_route(app):
    client = TestClient(app, base_url="http://127.0.0.1")       # loopback Host: no tokens configured
    for method, path, schema in body_routes(app):
        url = re.sub(r"\{[^}]+\}", "x", path)
        body = [{"path": "/a", "frobnicate": 1}] if schema.get("type") == "array" else {"frobnicate": 1}
        r = client.request(method, url, json=body)
        assert r.status_code == 422, (method, path, r.status_code, r.text)
        answer = r.json()
        assert answer["error"] == "invalid_input" and "frobnicate" in answer["message"], (method, path, answer)
        assert any(f["field"].endswith("frobnicate") for f in answer["fields"]), (method, path, answer)


class ProbeLenient(BaseModel):
    image: str


class ProbeStrict(In):
    image: str


def test_the_check_catches_a_lenient_body():
    """The check itself: a body model that ignores unknown fields is found, and In's are not."""
    probe = FastAPI()

    @probe.post("/api/v1/lenient")
    def lenient(body: ProbeLenient | None = None) -> dict:
        return {}

    @probe.post("/api/v1/strict")
    def strict(body: list[ProbeStrict]) -> dict:
        return {}
    doc = probe.openapi()
    shapes = {p: [o.get("additionalProperties") for o in objects_of(s, doc)] for _, p, s in body_routes(probe)}
    assert shapes == {"/api/v1/lenient": [None], "/api/v1/strict": [False]}
