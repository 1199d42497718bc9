"""The MCP tools are the table's (issue 34): every row on MCP (table/, `via("mcp", Off(why))` says otherwise) has
its tool, and each tool parameter that stands for a row's parameter has the row's name (or the rename declared
beside the row), kind (required or not), JSON type and default (or the default declared beside the row, from
defaults.py). Checked on the tools as the official `mcp` client lists them from a real server, not on the code
that makes them. MCP errors carry the error classes' own codes, and no code string is typed in mcp/. Each check
has a self-test that plants the drift it must catch (a row with no tool, a renamed, retyped or now-required
parameter, a default that moved). The tools checked are the full set (`--tools all`); the default profile (core)
is declared beside the rows (Mcp(core=...)), each of its tools the full one with fewer parameters, its tools/list
answer at most 10,000 characters, and no list of tool names is typed in mcp/."""

from __future__ import annotations

import ast
import asyncio
import copy
import inspect
import json
import pathlib
import re
import types
import typing

import pytest
from mcp.client.client import Client

from sandtree import errors, table
from sandtree.engine import Engine
from sandtree.mcp import maker
from sandtree.mcp.server import build_server
from sandtree.table import rows
from sandtree.table.mcp import Mcp, tools_of

EMPTY = inspect.Parameter.empty
MCP_DIR = pathlib.Path(__file__).resolve().parents[2] / "src" / "sandtree" / "mcp"
JSON_OF = {str: {"string"}, bytes: {"string"}, int: {"integer"}, float: {"number", "integer"}, bool: {"boolean"},
           type(None): {"null"}, dict: {"object"}, list: {"array"}, tuple: {"array"}}


@pytest.fixture(scope="module")
def listed(tmp_path_factory):
    """Tool name -> its input schema, as the real MCP client lists them from a real server."""
    eng = Engine(str(tmp_path_factory.mktemp("mcp") / "home"), warm=0)

    async def main():
        async with Client(build_server(eng, tools="all")) as c:
            return {t.name: t.input_schema for t in (await c.list_tools()).tools}
    try:
        return asyncio.run(main())
    finally:
        eng.close()


def json_types(t) -> set[str] | None:
    """The JSON types a Python type allows (None: it says nothing checkable, e.g. an untyped parameter)."""
    if t is EMPTY or t is typing.Any:
        return None
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        out = set()
        for a in typing.get_args(t):
            j = json_types(a)
            if j is None:
                return None
            out |= j
        return out
    return JSON_OF.get(typing.get_origin(t) or (type(None) if t is None else t))


def schema_types(prop: dict) -> set[str]:
    if "anyOf" in prop:
        return set().union(*(schema_types(p) for p in prop["anyOf"]))
    t = prop.get("type")
    return set(t) if isinstance(t, list) else {t} if t else set()


def drift(tools: dict[str, dict], ops=None) -> list[str]:
    """Where the listed tools differ from the rows: (a) a row on MCP with no tool; (b) a tool parameter that is
    neither a row's (under its declared rename) nor the tool's own (Mcp.extra), one whose JSON type the row's
    type does not allow, one required where the row has a default or optional where it has none, a derived
    tool lacking a row parameter; (c) a default that is not the row's (nor declared beside the row)."""
    ops = table.OPS if ops is None else ops
    out = []
    served: dict[str, list] = {}
    for row in ops.values():
        for m in tools_of(row):
            served.setdefault(m.tool(row), []).append((row, m))
            if m.tool(row) not in tools:
                out.append(f"row {row.name}: no MCP tool {m.tool(row)} (or say via('mcp', Off(why)) beside it)")
    for name, pairs in served.items():
        schema = tools.get(name)
        if schema is None:
            continue
        props, required = schema.get("properties", {}), set(schema.get("required", []))
        for p, prop in props.items():
            claimed = False
            for row, m in pairs:
                if p in m.extras():
                    claimed = True
                    continue
                rp = {v: k for k, v in m.rename.items()}.get(p, p)
                if (rp == p and p in m.rename) or rp not in maker.row_params(row) or (m.params is not None and rp not in m.params):
                    continue
                claimed = True
                want = json_types(maker.row_type(row, m, rp))
                got = schema_types(prop)
                if want is not None and not got <= want:
                    out.append(f"{name}.{p}: JSON type {sorted(got)} is not row {row.name}'s {rp} ({sorted(want)})")
                default = maker.row_default(row, m, rp)
                if (default is EMPTY) != (p in required):
                    out.append(f"{name}.{p}: {'required' if p in required else 'optional'}, but row {row.name}'s "
                               f"{rp} {'has no default' if default is EMPTY else 'has a default'}")
                elif default is not EMPTY and prop.get("default") != json.loads(json.dumps(default)):
                    out.append(f"{name}.{p}: default {prop.get('default')!r} is not row {row.name}'s {rp} "
                               f"({default!r})")
            if not claimed:
                out.append(f"{name}.{p}: neither a parameter of its row(s) ({', '.join(r.name for r, _ in pairs)}) "
                           "under the rename declared beside it, nor the tool's own (Mcp.extra)")
        for row, m in pairs:
            if m.handler is None:            # a derived tool takes every row parameter it names
                for rp in (m.params if m.params is not None else maker.row_params(row)):
                    if m.rename.get(rp, rp) not in props:
                        out.append(f"{name}: lacks row {row.name}'s parameter {rp}")
    return out


# ---- the checks ---------------------------------------------------------------------------------------
def test_every_row_on_mcp_has_its_tool_with_the_row_s_parameters_and_defaults(listed):
    found = drift(listed)
    assert not found, "\n".join(found)


def test_coverage_is_data_every_row_is_a_tool_or_says_why_not(listed):
    """Every row reaches MCP unless it says Off with a reason; merge_preview (REST only before) is a tool now."""
    for row in table.OPS.values():
        o = row.via.get("mcp")
        if isinstance(o, rows.Off):
            assert o.why.strip(), row.name
        else:
            assert o is None or isinstance(o, (Mcp, tuple)), row.name
    assert "merge_preview" in listed


def test_the_tools_are_the_rows_and_the_guide(listed):
    """No tool of no row, but the guide (what the server says about itself)."""
    assert set(listed) - set(maker.tools()) == {"get_guide"}


def test_merge_preview_through_the_client(tmp_path):
    """The tool made from merge_preview's row answers through the real client: tags resolved to IDs, nothing
    made; a conflict shows with its markers."""
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        def image(tag, files):
            d = tmp_path / tag
            d.mkdir()
            for k, v in files.items():
                (d / k).write_text(v)
            return eng.import_path(str(d), tag=tag)
        base = image("base", {"f": "a\n"})
        ours, theirs = image("ours", {"f": "b\n", "o": "1"}), image("theirs", {"f": "c\n"})
        before = len(eng.images())

        async def main():
            async with Client(build_server(eng, tools="all")) as c:
                r = await c.call_tool("merge_preview", {"base": "base", "ours": "ours", "theirs": "theirs"})
                assert not r.is_error, r.content
                return json.loads(r.content[0].text)
        got = asyncio.run(main())
        assert got["base"] == base and not got["clean"] and [c["path"] for c in got["conflicts"]] == ["/f"]
        assert len(eng.images()) == before and ours != theirs
    finally:
        eng.close()


def test_tool_errors_carry_the_error_classes_codes(tmp_path):
    eng = Engine(str(tmp_path / "home"), warm=0)

    async def main():
        async with Client(build_server(eng, tools="all")) as c:
            return [(await c.call_tool(n, a)) for n, a in (("get_image", {"image": "nope"}),
                                                           ("merge_preview", {"ours": "nope", "theirs": "nope"}),
                                                           ("get_guide", {"section": "nope"}))]
    try:
        got = asyncio.run(main())
    finally:
        eng.close()
    assert all(r.is_error for r in got)
    said = [r.content[0].text.split(": ", 1)[1] for r in got]        # after the SDK's "Error executing tool X: "
    assert said[0].startswith(f"{errors.ImageNotFound.code}: ") and said[1].startswith(f"{errors.ImageNotFound.code}: ")
    assert said[2].startswith(f"{errors.InvalidInput.code}: ")


def codes_typed(sources: dict[str, str]) -> list[str]:
    """String constants (docstrings too) in the given sources that spell an error class's code: a code is
    the class's own (errors.X.code), never typed again. Codes of one English word (conflict, forbidden)
    are left out: only the snake_case ones are unmistakably codes."""
    codes = {c.code for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.SandtreeError)
             and "_" in c.code}
    out = []
    for where, src in sources.items():
        for n in ast.walk(ast.parse(src)):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                out += [f"{where}:{n.lineno}: {c}" for c in sorted(codes) if re.search(rf"\b{c}\b", n.value)]
    return out


def test_no_error_code_is_typed_in_mcp():
    """Nor in vocabulary.py, whose meanings are the tools' parameter descriptions."""
    found = codes_typed({p.name: p.read_text() for p in [*sorted(MCP_DIR.glob("*.py")), MCP_DIR.parent / "vocabulary.py"]})
    assert not found, "\n".join(found)


def literal_defaults(sources: dict[str, str]) -> list[str]:
    """Numbers typed as a tool's default in mcp/ (a handler's or a guide tool's own parameters): a default is
    the row's or one of defaults.py (D.MCP_...), never a literal (0, an offset's start, excepted)."""
    out = []
    for where, src in sources.items():
        for n in ast.walk(ast.parse(src)):
            if isinstance(n, ast.FunctionDef) and any(isinstance(d, ast.Attribute) and d.attr in ("handler", "tool")
                                                      for d in n.decorator_list):
                args = n.args.posonlyargs + n.args.args
                pairs = list(zip(args[len(args) - len(n.args.defaults):], n.args.defaults))
                pairs += [(a, d) for a, d in zip(n.args.kwonlyargs, n.args.kw_defaults) if d is not None]
                out += [f"{where}:{d.lineno}: {n.name}({a.arg}={d.value!r})" for a, d in pairs
                        if isinstance(d, ast.Constant) and type(d.value) in (int, float) and d.value != 0]
    return out


def test_no_literal_default_in_mcp():
    found = literal_defaults({p.name: p.read_text() for p in sorted(MCP_DIR.glob("*.py"))})
    assert not found, "\n".join(found)


# ---- self-tests: each check sees a planted drift ---------------------------------------------------------
def test_selftest_a_row_with_no_tool_is_caught(listed):
    @rows.op("list", http=rows.Http("GET", "/planted"))
    def planted_mcp_row(image: str) -> dict:
        """A planted row: on MCP (no via), and no tool has been made for it."""
    try:
        assert any("row planted_mcp_row: no MCP tool planted_mcp_row" in f for f in drift(listed))
    finally:
        del rows.OPS["planted_mcp_row"]
    assert not drift(listed)


def test_selftest_an_off_row_is_not_asked_for(listed):
    @rows.op("list", http=rows.Http("GET", "/planted"))
    @rows.via("mcp", rows.Off("planted: not an agent's"))
    def planted_off_row(image: str) -> dict:
        """A planted row, off MCP."""
    try:
        assert not drift(listed)
    finally:
        del rows.OPS["planted_off_row"]


def test_selftest_a_tool_without_a_row_s_tool_is_caught(listed):
    tools = {k: v for k, v in listed.items() if k != "merge_preview"}
    assert any("no MCP tool merge_preview" in f for f in drift(tools))


@pytest.mark.parametrize("plant, expect", [
    # name: the row's sid is the tool's sandbox_id (declared); another name is a drift
    (lambda t: t["sandbox_exec"]["properties"].update(sid=t["sandbox_exec"]["properties"].pop("sandbox_id")),
     "sandbox_exec.sid: neither a parameter"),
    # a derived tool lost a row parameter
    (lambda t: t["set_tag"]["properties"].pop("tag"), "set_tag: lacks row tag's parameter name"),
    # type: run's timeout is a number
    (lambda t: t["run"]["properties"]["timeout"].update(type="string"), "run.timeout: JSON type ['string']"),
    (lambda t: t["grep"]["properties"]["pattern"].update(type="integer"), "grep.pattern: JSON type ['integer']"),
    # kind: now required where the row has a default; optional where it has none
    (lambda t: t["list_files"]["required"].append("path"), "list_files.path: required"),
    (lambda t: t["get_image"]["required"].remove("image"), "get_image.image: optional"),
], ids=["renamed", "lost", "retyped-handler", "retyped-derived", "now-required", "now-optional"])
def test_selftest_a_parameter_drift_is_caught(listed, plant, expect):
    tools = copy.deepcopy(listed)
    plant(tools)
    found = drift(tools)
    assert any(expect in f for f in found), found


@pytest.mark.parametrize("tool, param, value", [("run", "timeout", 31.0), ("grep", "path", "/etc"),
                                                ("sandbox_start", "idle_timeout", 1), ("read_file", "limit", 1)])
def test_selftest_a_default_drift_in_the_tool_is_caught(listed, tool, param, value):
    tools = copy.deepcopy(listed)
    tools[tool]["properties"][param]["default"] = value
    assert any(f.startswith(f"{tool}.{param}: default {value!r}") for f in drift(tools))


def test_selftest_a_default_drift_in_the_row_is_caught(listed, monkeypatch):
    """The row's default moves (as defaults.py would move it) and the tool, made before, no longer agrees."""
    row = table.OPS["grep"]
    sig = row.signature
    moved = sig.replace(parameters=[p.replace(default="/srv") if p.name == "path" else p
                                    for p in sig.parameters.values()])
    monkeypatch.setitem(rows.OPS, "grep", rows.replace(row, signature=moved))
    assert any(f.startswith("grep.path: default '/'") for f in drift(listed))


def test_selftest_the_maker_refuses_a_handler_that_drifts():
    """At build time too: a hand-written body whose parameter drifts from its row's is refused (maker.check)."""
    def sandbox_exec(sandbox_id: str, command: str, timeout: float | None = 5.0, cwd: int | None = None,
                     frobnicate: bool = False) -> dict:
        """A drifted body."""
    row = table.OPS["sandbox_exec"]
    made = maker.Made("sandbox_exec", inspect.signature(sandbox_exec, eval_str=True), [(row, row.override("mcp"))],
                      True)
    found = maker.check(made)
    assert any("timeout: default 5.0" in f for f in found), found
    assert any("cwd: type" in f for f in found), found
    assert any("frobnicate: neither" in f for f in found), found


def test_selftest_an_error_code_typed_in_mcp_is_caught():
    code = errors.MergeConflict.code
    planted = {"planted.py": f'def f():\n    """Fails with {code} naming them."""\n    raise X("{errors.InvalidInput.code}: bad")\n'}
    assert [f.split(": ")[-1] for f in codes_typed(planted)] == [code, errors.InvalidInput.code]
    assert codes_typed({"ok.py": 'x = f"{MergeConflict.code}: conflict markers"\n'}) == []


def test_selftest_a_literal_default_in_mcp_is_caught():
    planted = {"planted.py": "def register(t):\n    @t.handler\n    def tool(a: int = 0, b: int = 8000, *, c: float = 2.5,"
                             " d: int = D.MCP_WAIT, e: bool = True) -> dict:\n        ...\n"
                             "    def plain(x=5):\n        ...\n"}
    assert [f.split(": ", 1)[1] for f in literal_defaults(planted)] == ["tool(b=8000)", "tool(c=2.5)"]


# ---- profiles: the core set by default, declared beside the rows (Mcp(core=...)), its schema bounded ------------
CORE_SCHEMA_MAX = 10_000       # characters of the default profile's tools/list answer as JSON (a size, not a time)


@pytest.fixture(scope="module")
def core_listed(tmp_path_factory):
    """The default profile's tools/list answer, as the real MCP client gets it from a real server."""
    eng = Engine(str(tmp_path_factory.mktemp("mcp") / "home"), warm=0)

    async def main():
        async with Client(build_server(eng)) as c:
            return await c.list_tools()
    try:
        return asyncio.run(main())
    finally:
        eng.close()


def test_the_core_profile_is_declared_beside_the_rows(core_listed, listed):
    from sandtree.table.mcp import CORE_MAX
    core = {t.name: t.input_schema for t in core_listed.tools}
    assert 0 < len(core) <= CORE_MAX
    assert set(core) == set(maker.core())
    served = maker.tools()
    for name, schema in core.items():
        assert any(m.core for _, m in served[name]), f"{name}: in the core profile, but no row of it says Mcp(core=...)"
        full = listed[name]
        # a core tool is the full tool with fewer parameters: each shown as in the full set, none required hidden
        assert all(full["properties"][p] == s for p, s in schema["properties"].items()), name
        assert set(full.get("required", [])) <= set(schema["properties"]), name


def test_the_core_profile_s_schema_is_small(core_listed):
    size = len(json.dumps(core_listed.model_dump(mode="json", by_alias=True, exclude_none=True)))
    assert size <= CORE_SCHEMA_MAX, f"the default MCP profile's tools/list is {size} characters"


def tool_lists_typed(sources: dict[str, str], names: set[str]) -> list[str]:
    """Collections of tool names typed in mcp/ (a profile is data beside the rows, not a list kept there)."""
    out = []
    for where, src in sources.items():
        for n in ast.walk(ast.parse(src)):
            if isinstance(n, (ast.List, ast.Tuple, ast.Set)) and len(n.elts) >= 2 and all(
                    isinstance(e, ast.Constant) and e.value in names for e in n.elts):
                out.append(f"{where}:{n.lineno}: {[e.value for e in n.elts]}")
    return out


def test_no_tool_list_is_typed_in_mcp():
    names = set(maker.tools()) | {"get_guide"}
    found = tool_lists_typed({p.name: p.read_text() for p in sorted(MCP_DIR.glob("*.py"))}, names)
    assert not found, "\n".join(found)


def test_selftest_a_tool_list_typed_in_mcp_is_caught():
    planted = {"planted.py": 'CORE = ("run", "fork", "diff")\nOK = ("run", "x")\nKEYS = ("image", "path")\n'}
    assert len(tool_lists_typed(planted, set(maker.tools()))) == 1


def test_selftest_a_profile_drift_is_caught(monkeypatch):
    """Rows of one tool that disagree on its core parameters, and a core profile past CORE_MAX, are refused."""
    import dataclasses
    row = table.OPS["stat"]                         # read_file's second row: says nothing of the core profile
    monkeypatch.setitem(rows.OPS, "stat", rows.replace(row, via={**row.via, "mcp": dataclasses.replace(
        row.override("mcp"), core=("image", "path"))}))
    with pytest.raises(AssertionError, match="disagree on its core profile"):
        maker.core()
    monkeypatch.setitem(rows.OPS, "stat", row)
    extra = [served[0] for served in maker.tools().values()
             if not any(m.core for _, m in served) and not isinstance(served[0][0].override("mcp"), tuple)][:3]
    for r, m in extra:
        monkeypatch.setitem(rows.OPS, r.name, rows.replace(r, via={**r.via, "mcp": dataclasses.replace(m, core=True)}))
    with pytest.raises(AssertionError, match="at most 12"):
        maker.core()
