"""What every surface exposes, as plain data: the Python API (names and signatures), the REST and
Contree OpenAPI document, the MCP tools with their input schemas, and every CLI verb's arguments.

tests/conformance/test_surface.py compares it with tests/surface/*.json, written before issue 13 moved the
code around: whatever existed must still exist with the same shape (additions are allowed, and
new parameters must be optional). `python tests/surface.py --write` records a new snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SNAPSHOT = os.path.join(HERE, "surface")


def _sig(fn) -> dict:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    out = {}
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        out[p.name] = {"kind": p.kind.name,
                       "default": None if p.default is p.empty else repr(p.default),
                       "required": p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return out


def python_api() -> dict:
    import sandtree
    out = {"__all__": sorted(sandtree.__all__), "callables": {}}
    for name in sandtree.__all__:
        obj = getattr(sandtree, name)
        if inspect.isclass(obj):
            if issubclass(obj, BaseException):
                out["callables"][name] = {"code": getattr(obj, "code", None)}
                continue
            members = {}
            for attr, val in inspect.getmembers(obj):
                if attr.startswith("_") and attr != "__init__":
                    continue
                if isinstance(inspect.getattr_static(obj, attr), property):
                    members[attr] = "property"
                elif callable(val):
                    members[attr] = _sig(val)
            out["callables"][name] = members
        elif callable(obj):
            out["callables"][name] = _sig(obj)
    return out


def openapi(engine) -> dict:
    """Component names that clash carry their module's path (sandtree__server__TagIn): written as
    they were before the modules moved into packages, since the path is no part of the wire."""
    from sandtree.http.server import build_app
    text = json.dumps(build_app(engine).openapi())
    text = text.replace("sandtree__http__models__", "sandtree__http__server__")   # the REST bodies' new module
    text = text.replace("sandtree__http__contree__wire__", "sandtree__http__contree_wire__")  # http/contree/ a folder
    return json.loads(re.sub(r"sandtree__(?:http|mcp|client|engine|tenancy)__", "sandtree__", text))


def mcp_tools(engine) -> dict:
    from sandtree.mcp.server import build_server
    server = build_server(engine, tools="all")        # the full set (`sandtree mcp --tools all`)
    tools = asyncio.run(server.list_tools())
    return {t.name: {"inputSchema": t.input_schema, "description": t.description} for t in tools}


def _parser_shape(p: argparse.ArgumentParser) -> dict:
    args, subs = {}, {}
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                subs[name] = _parser_shape(sp)
            continue
        if isinstance(a, argparse._HelpAction):
            continue
        key = "/".join(a.option_strings) or a.dest
        args[key] = {"dest": a.dest, "nargs": repr(a.nargs), "choices": sorted(map(str, a.choices or [])),
                     "required": bool(a.required), "type": getattr(a.type, "__name__", repr(a.type)),
                     "action": type(a).__name__,
                     "default": None if a.default is argparse.SUPPRESS else repr(a.default)}
    return {"args": args, "commands": subs}


def cli() -> dict:
    from sandtree.cli import build_parser
    return _parser_shape(build_parser())


def collect() -> dict:
    from sandtree.engine import Engine
    with tempfile.TemporaryDirectory() as home:
        eng = Engine(home, warm=0)
        try:
            return {"python": python_api(), "openapi": openapi(eng), "mcp": mcp_tools(eng), "cli": cli()}
        finally:
            eng.close()


def contains(old, new, path="") -> list[str]:
    """Where `new` lost or changed something `old` had (additions are fine)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k, v in old.items():
            if k not in new:
                out.append(f"{path}/{k}: gone")
            else:
                out += contains(v, new[k], f"{path}/{k}")
        return out
    if isinstance(old, list) and isinstance(new, list):
        if path.endswith("/required"):                      # a newly required field breaks old callers
            return [] if sorted(map(str, old)) == sorted(map(str, new)) else [f"{path}: {old} -> {new}"]
        if all(not isinstance(x, (dict, list)) for x in old):
            gone = [x for x in old if x not in new]
            return [f"{path}: lost {gone}"] if gone else []
        out = []
        for i, x in enumerate(old):
            if not any(not contains(x, y) for y in new):
                out.append(f"{path}[{i}]: no counterpart for {json.dumps(x)[:120]}")
        return out
    return [] if old == new else [f"{path}: {old!r} -> {new!r}"]


def new_required(old: dict, new: dict) -> list[str]:
    """Python parameters and CLI arguments added as required (they break every old caller)."""
    out = []
    for cls, members in new["python"]["callables"].items():
        before = old["python"]["callables"].get(cls)
        if not isinstance(members, dict) or not isinstance(before, dict):
            continue
        for m, sig in members.items():
            if not isinstance(sig, dict) or m not in before or not isinstance(before[m], dict):
                continue
            for p, d in sig.items():
                if isinstance(d, dict) and d.get("required") and p not in before[m]:
                    out.append(f"python {cls}.{m}: new required parameter {p}")
    return out


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
    data = collect()
    if "--write" in sys.argv:
        os.makedirs(SNAPSHOT, exist_ok=True)
        for k, v in data.items():
            with open(os.path.join(SNAPSHOT, f"{k}.json"), "w") as f:
                json.dump(v, f, indent=1, sort_keys=True)
                f.write("\n")
    else:
        json.dump(data, sys.stdout, indent=1, sort_keys=True)
