"""Adding one operation with one new parameter reaches every surface from three places: its row (table/), the
engine's code (a method of the row's name), and a test. Here a row is planted at test time (the decorator a row of
table/ is written with) and the engine given its method; nothing in http/, mcp/, cli/ or client/ is edited, and the
operation is then on REST (the OpenAPI document, and a call over a real HTTP server on loopback), in MCP's tool list
(a real MCP client), on the CLI's parser, and a method of the SDK (called in process). docs/design.md, "Adding an
operation", says the same for a real one. The Python faces the rows are installed on at import (the tenant and
admin views, the remote client) are given the planted row by the same installers here."""

from __future__ import annotations

import asyncio
import inspect

import httpx
import pytest
from mcp.client.client import Client

from sandtree.cli.parser import build_parser
from sandtree.client import derive, objects, remote, sdk
from sandtree.engine import Engine
from sandtree.mcp.server import build_server
from sandtree.table import rows
from sandtree.tenancy import view as tenant_view

from served import serving
from test_conformance_cli import verbs

KEY = "planted_echo"


@pytest.fixture
def planted(monkeypatch):
    """The planted row (file 1: its row) and its engine method (file 2: the engine's code)."""

    @rows.op("list", http=rows.Http("GET", "/planted/{word}", query=("times",)))
    def planted_echo(word: str, *, times: int = 2) -> dict:
        """Say a word again (a planted operation).
        word: the word said
        times: how many times"""

    def engine_planted_echo(self, word: str, *, times: int = 2) -> dict:
        return {"echo": " ".join([word] * times)}
    monkeypatch.setattr(Engine, KEY, engine_planted_echo, raising=False)
    row = rows.OPS[KEY]
    # what the modules do at import for each row of table/ (the test plants after they are imported)
    for cls, install in ((remote.RemoteEngine, lambda c: remote._install(c, {KEY: row})),
                         (tenant_view.TenantView, lambda c: tenant_view.install(c, {KEY: row}))):
        install(cls)
    try:
        yield row
    finally:
        del rows.OPS[KEY]
        for cls in (remote.RemoteEngine, tenant_view.TenantView, sdk.Sandtree):
            if KEY in cls.__dict__:
                delattr(cls, KEY)


def test_a_new_row_reaches_rest(planted, tmp_path):
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        with serving(eng) as srv:
            doc = httpx.get(srv.api + "/openapi.json", timeout=120).json()
            op = doc["paths"]["/api/v1/planted/{word}"]["get"]
            assert {p["name"]: p["in"] for p in op["parameters"]} == {"word": "path", "times": "query"}
            times = next(p for p in op["parameters"] if p["name"] == "times")
            assert times["schema"]["type"] == "integer" and times["schema"]["default"] == 2
            r = httpx.get(srv.api + "/api/v1/planted/hi", params={"times": 3}, timeout=120)
            assert r.status_code == 200 and r.json() == {"echo": "hi hi hi"}
    finally:
        eng.close()


def test_a_new_row_reaches_mcp(planted, tmp_path):
    eng = Engine(str(tmp_path / "home"), warm=0)

    async def main():
        async with Client(build_server(eng, tools="all")) as c:
            listed = {t.name: t for t in (await c.list_tools()).tools}
            got = await c.call_tool(KEY, {"word": "hi", "times": 3})
            return listed, got
    try:
        listed, got = asyncio.run(main())
    finally:
        eng.close()
    schema = listed[KEY].input_schema
    assert schema["required"] == ["word"] and schema["properties"]["times"]["default"] == 2
    assert "hi hi hi" in str(got)


def test_a_new_row_reaches_the_cli(planted):
    x = verbs(build_parser())[("planted-echo",)]
    acts = {a.dest: a for a in x._actions}
    assert acts["word"].option_strings == [] and acts["times"].option_strings == ["--times"]
    assert acts["times"].default == 2 and x.get_default("row") == KEY


def test_a_new_row_reaches_the_sdk(planted, tmp_path):
    placed = derive.place_rest(sdk.Sandtree, (sdk.Sandtree, objects.Image, objects.Sandbox, objects.SandboxProcess,
                                              objects.Branch))
    assert placed == [KEY]                  # what sdk.py's import does for every row no method stands for
    sig = inspect.signature(sdk.Sandtree.planted_echo)
    assert list(sig.parameters) == ["self", "word", "times"] and sig.parameters["times"].default == 2
    st = sdk.Sandtree(str(tmp_path / "home"), warm=0)
    try:
        assert st.planted_echo("hi", times=3) == {"echo": "hi hi hi"}
    finally:
        st.close()
