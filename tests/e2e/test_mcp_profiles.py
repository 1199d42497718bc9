"""The MCP server an agent meets, through the official `mcp` client against a real `sandtree mcp`: the core
profile by default (at most 12 tools, declared beside the rows, a schema under 10k characters), the full set by
`--tools all` or a list of names (over stdio, streamable HTTP and `--url`); the defaults and argument forms of the
core tools (results kept by run and fork alike, commands as a string or an argv list, shell=false split as a shell
would, lists as one JSON array, lineage without duplicate parents); a live sandbox a session started is stopped
when the session ends."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from sandtree.engine import Engine
from sandtree.mcp import maker
from sandtree.table.mcp import CORE_MAX

from conftest import listening, serve_process

SCHEMA_MAX = 10_000        # characters of the default profile's tools/list answer (JSON), the issue's target


def stdio(home: str | None, *args: str) -> StdioServerParameters:
    head = ["-m", "sandtree"] + (["--home", home] if home else [])
    return StdioServerParameters(command=sys.executable, args=[*head, "mcp", *args], env={**os.environ})


def value(result):
    assert not result.is_error, result.content
    if result.structured_content is not None and "result" in result.structured_content:
        return result.structured_content["result"]
    return json.loads(result.content[0].text)


def schema_chars(listed) -> int:
    """The tools/list answer as JSON, what a client puts in front of a model."""
    return len(json.dumps(listed.model_dump(mode="json", by_alias=True, exclude_none=True)))


async def listing(target):
    async with Client(target) as c:
        return await c.list_tools()


@pytest.fixture
def home(tmp_path, rootfs):
    """A store with the image `bb` (the core profile has no import: a person brings the images)."""
    h = str(tmp_path / "home")
    eng = Engine(h, warm=0)
    try:
        eng.import_path(rootfs, tag="bb")
    finally:
        eng.close()
    return h


def test_core_by_default_the_full_set_on_request(tmp_path):
    core = maker.core()
    assert 0 < len(core) <= CORE_MAX
    every = set(maker.tools()) | {"get_guide"}
    home = str(tmp_path / "home")
    listed = asyncio.run(listing(stdio(home)))
    assert {t.name for t in listed.tools} == set(core)
    size = schema_chars(listed)
    assert size <= SCHEMA_MAX, f"the default MCP profile's schema is {size} characters"
    # a core tool shows the parameters declared beside its row, the rest keep their defaults
    run = next(t for t in listed.tools if t.name == "run")
    assert set(run.input_schema["properties"]) == set(core["run"]) and "tier" not in run.input_schema["properties"]
    assert all("title" not in p for t in listed.tools for p in t.input_schema["properties"].values())

    full = asyncio.run(listing(stdio(home, "--tools", "all")))
    assert {t.name for t in full.tools} == every and schema_chars(full) > size
    assert "tier" in next(t for t in full.tools if t.name == "run").input_schema["properties"]
    named = asyncio.run(listing(stdio(home, "--tools", "core,build,get_guide")))
    assert {t.name for t in named.tools} == set(core) | {"build", "get_guide"}
    just = asyncio.run(listing(stdio(home, "--tools", "run,sandbox_port")))
    assert {t.name for t in just.tools} == {"run", "sandbox_port"}
    assert "tier" in next(t for t in just.tools if t.name == "run").input_schema["properties"]   # named: all of it

    bad = subprocess.run([sys.executable, "-m", "sandtree", "--home", home, "mcp", "--tools", "run,frobnicate"],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert bad.returncode != 0 and "frobnicate" in bad.stderr and "Traceback" not in bad.stderr


def test_profiles_over_http_and_a_remote_engine(tmp_path):
    core = set(maker.core())
    with listening(str(tmp_path / "h1"), "mcp", "--http") as url:
        assert {t.name for t in asyncio.run(listing(f"{url}/mcp")).tools} == core
    with listening(str(tmp_path / "h2"), "mcp", "--http", "--tools", "all") as url:
        assert {t.name for t in asyncio.run(listing(f"{url}/mcp")).tools} >= core | {"import_image", "build"}
    with serve_process(tmp_path / "srv") as url:
        assert {t.name for t in asyncio.run(listing(stdio(None, "--url", url))).tools} == core
        got = {t.name for t in asyncio.run(listing(stdio(None, "--tools", "whoami,run", "--url", url))).tools}
        assert got == {"whoami", "run"}


def test_core_defaults_and_argument_forms(home):
    async def main():
        async with Client(stdio(home)) as c:
            # run keeps what it wrote, as fork does (one default): the result is the next step's image
            r = value(await c.call_tool("run", {"command": "echo hi > /x", "image": "bb"}))
            assert r["exit_code"] == 0 and r["result_image"]
            assert value(await c.call_tool("read_file", {"image": r["result_image"], "path": "/x"}))["content"] == "hi\n"
            gone = value(await c.call_tool("run", {"command": "echo no > /y", "image": "bb", "disposable": True}))
            assert gone["result_image"] is None
            # shell=false splits as a shell would: the quoted script is one word (on spaces: sh got "'echo")
            r = value(await c.call_tool("run", {"command": "sh -c 'echo one; echo \"t  wo\"'", "image": "bb",
                                                "shell": False}))
            assert (r["exit_code"], r["stdout"]) == (0, "one\nt  wo\n"), r
            bad = await c.call_tool("run", {"command": "echo 'unclosed", "image": "bb", "shell": False})
            assert bad.is_error and "shell" in bad.content[0].text
            # a list is the argv, as the description says (for run and for each of fork's commands)
            r = value(await c.call_tool("run", {"command": ["echo", "x  y"], "image": "bb"}))
            assert r["stdout"] == "x  y\n"
            forks = await c.call_tool("fork", {"image": "bb", "commands": ["echo a > /f", ["sh", "-c", "echo b > /f"],
                                                                           "echo a > /f"]})
            # a list answers as one JSON array (text and structured), not one text block per item
            assert len(forks.content) == 1 and json.loads(forks.content[0].text) == value(forks)
            branches = value(forks)
            assert [b["exit_code"] for b in branches] == [0, 0, 0] and all(b["result_image"] for b in branches)
            a, b, same = (x["result_image"] for x in branches)
            assert same == a                     # the same files: the same image (content-addressed)
            d = value(await c.call_tool("diff", {"a": a, "b": b}))
            assert d["changes"] == [{"path": "/f", "kind": "modified"}]
            files = await c.call_tool("list_files", {"image": a})
            assert len(files.content) == 1 and "f" in [e["name"] for e in value(files)]
            hits = await c.call_tool("grep", {"image": a, "pattern": "a", "path": "/f"})
            assert len(hits.content) == 1 and value(hits)[0]["line"] == 1
            imgs = await c.call_tool("list_images", {})
            assert len(imgs.content) == 1 and len(value(imgs)) >= 3
            # lineage: the image two runs made names its parent once
            top = value(await c.call_tool("run", {"command": "echo c > /c", "image": a}))["result_image"]
            ancestry = value(await c.call_tool("lineage", {"image": top}))["ancestry"]
            assert [len(e["parents"]) for e in ancestry] == [1, 1, 0], ancestry
            m = value(await c.call_tool("merge", {"ours": a, "theirs": r["result_image"] if r["result_image"] else a,
                                                  "return_conflicts": True}))
            assert m["conflicts"] == []
    asyncio.run(main())


def sandbox_state(home: str, sid: str) -> str:
    eng = Engine(home, warm=0)
    try:
        return {s["id"]: s["state"] for s in eng.sandbox_list(all=True)}[sid]
    finally:
        eng.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="live sandboxes need root")
def test_a_session_s_sandboxes_stop_when_it_ends(home):
    """The client goes (its stdin closes): what the session started is stopped, not left to its idle timeout;
    a sandbox the agent stopped itself is not touched again, and one started elsewhere keeps running."""
    other = subprocess.run([sys.executable, "-m", "sandtree", "--home", home, "start", "bb", "--json"],
                           capture_output=True, text=True, timeout=120)
    assert other.returncode == 0, other.stderr
    shown = json.loads(other.stdout)
    elsewhere = shown.get("id") or shown["sandbox_id"]
    try:
        async def main():
            async with Client(stdio(home)) as c:
                sid = value(await c.call_tool("sandbox_start", {"image": "bb", "idle_timeout": 3600}))["id"]
                r = value(await c.call_tool("sandbox_exec", {"sandbox_id": sid, "command": "echo up"}))
                assert r["stdout"] == "up\n"
                done = value(await c.call_tool("sandbox_start", {"image": "bb"}))["id"]
                assert value(await c.call_tool("sandbox_stop", {"sandbox_id": done}))["state"] == "stopped"
                return sid
        sid = asyncio.run(main())
        assert sandbox_state(home, sid) == "stopped"
        assert sandbox_state(home, elsewhere) == "running"
    finally:
        subprocess.run([sys.executable, "-m", "sandtree", "--home", home, "stop", elsewhere], capture_output=True,
                       timeout=120)


def test_the_mcp_page_names_the_core_tools_and_its_snippets_parse():
    """docs/mcp.md lists the core profile as the rows declare it, and its client snippets are JSON that start
    `sandtree mcp` with a store named (SANDTREE_HOME) or a server (--url)."""
    import re
    page = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "mcp.md")).read()
    section = page.split("## Profiles", 1)[1].split("\n## ", 1)[0]
    assert set(maker.core()) <= set(re.findall(r"`(\w+)`", section))
    snippets = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", page, re.S)]
    assert snippets
    for s in snippets:
        server = s["mcpServers"]["sandtree"]
        assert server["command"].endswith("/sandtree") and server["args"][0] == "mcp"
        assert "SANDTREE_HOME" in server.get("env", {}) or "--url" in server["args"]


@pytest.mark.skipif(os.geteuid() != 0, reason="live sandboxes need root")
def test_an_http_session_s_sandboxes_stop_when_its_client_deletes_it(home):
    """Over streamable HTTP a client of the session protocol deletes its session when it closes (DELETE with its
    mcp-session-id): the sandboxes that session started stop, others keep running. Spoken with httpx:
    the official client of this SDK version opens no session (its newer protocol has none) and so sends no
    DELETE; those sandboxes stop at their idle timeout."""
    import httpx

    def answer(r):
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            r = next(json.loads(x[5:]) for x in r.text.splitlines() if x.startswith("data:"))
        else:
            r = r.json()
        assert "result" in r and not r["result"].get("isError"), r
        return json.loads(r["result"]["content"][0]["text"])

    def state(sid):
        out = subprocess.run([sys.executable, "-m", "sandtree", "--home", home, "ps", "--all", "--json"],
                             capture_output=True, text=True, timeout=60)
        return {s["id"]: s["state"] for s in json.loads(out.stdout)}[sid]

    def session(c, url):
        h = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        r = c.post(url, headers=h, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}})
        h.update({"mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"})
        c.post(url, headers=h, json={"jsonrpc": "2.0", "method": "notifications/initialized"}).raise_for_status()
        return h

    def start(c, url, h):
        return answer(c.post(url, headers=h, json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "sandbox_start", "arguments": {"image": "bb", "idle_timeout": 3600}}}))["id"]

    started = []
    try:
        with listening(home, "mcp", "--http") as url, httpx.Client(timeout=120) as c:
            one, two = session(c, f"{url}/mcp"), session(c, f"{url}/mcp")
            # one start per server: a second start of the same spec has it start the next one ahead (warm/)
            started.append(start(c, f"{url}/mcp", one))
            other = subprocess.run([sys.executable, "-m", "sandtree", "--home", home, "start", "bb", "--json"],
                                   capture_output=True, text=True, timeout=120)
            started.append(json.loads(other.stdout)["id"])
            assert c.delete(f"{url}/mcp", headers=two).status_code == 200      # a session that started nothing
            assert [state(s) for s in started] == ["running", "running"]
            assert c.delete(f"{url}/mcp", headers=one).status_code == 200      # answered after the stops
            assert [state(s) for s in started] == ["stopped", "running"]
    finally:
        for sid in started:
            subprocess.run([sys.executable, "-m", "sandtree", "--home", home, "stop", sid], capture_output=True,
                           timeout=120)
        # the one the server started ahead for the next start is reaped by a list, its starter gone
        if started:
            state(started[0])
