"""Count the hand restatements of operations outside the table: references to an operation's (a row's) name on an
engine-like object (the engine, a tenant view, the operations ledger, the SDK's st, a client) inside a surface's
files (http/ with http/contree/ and http/e2b/, mcp/, cli/, client/). A surface derived from the rows calls
`getattr(engine, row.name)` and is not counted; `engine.sandbox_exec(...)` written in a handler is. Run it to see
the count per file and in total; tests/conformance/test_restatements.py holds the total under a ceiling.

    PYTHONPATH=src python scripts/restatements.py [--lines]
"""

from __future__ import annotations

import ast
import collections
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "src" / "sandtree"
SURFACES = ("http", "mcp", "cli", "client")
# What an engine-like object is called in the surfaces' code: the rightmost name of the expression a row's name is
# looked up on (engine.operations.get: "operations"; self.engine.run: "engine"), or the function called for it
# (current_engine().run, _server(args).sandbox_processes).
ENGINE_LIKE = frozenset({"engine", "eng", "view", "tenant_view", "ops", "operations", "st", "client", "target",
                         "current_engine", "_server", "server_of"})


def row_names() -> frozenset[str]:
    from sandtree.table import OPS
    return frozenset(o.name for o in OPS.values())


def _head(node: ast.AST) -> str | None:
    """The name an object expression ends in (engine, self.engine, current_engine(), st.engine.operations)."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def restatements(source: str, names: frozenset[str]) -> list[tuple[int, str]]:
    """(line, expression) of every `<engine-like>.<row name>` in a module's source, and every
    getattr(<engine-like>, "<row name>") (a literal name is a restatement too)."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Attribute) and n.attr in names and _head(n.value) in ENGINE_LIKE:
            out.append((n.lineno, ast.unparse(n)))
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
              and len(n.args) >= 2 and _head(n.args[0]) in ENGINE_LIKE and isinstance(n.args[1], ast.Constant)
              and n.args[1].value in names):
            out.append((n.lineno, ast.unparse(n)))
    return sorted(out)


# Functions that call their first argument with the rest (a thread hop): `await call(calling_row(engine, "ls"), i, p)`
# is a call of the row `ls` with (i, p).
HOPS = frozenset({"call", "wait_call", "to_thread", "run_in_threadpool", "do", "run_in_executor"})


def _by_row(n: ast.AST) -> str | None:
    """The row key of a call_row(target, "key", ...) / calling_row(target, "key") node."""
    if (isinstance(n, ast.Call) and _head(n.func) in ("call_row", "calling_row") and len(n.args) >= 2
            and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)):
        return n.args[1].value
    return None


def _arguments(args: list, keywords: list) -> tuple[int, tuple[str, ...]]:
    npos = -1 if any(isinstance(a, ast.Starred) for a in args) else len(args)      # *args: not counted
    return npos, tuple(k.arg for k in keywords if k.arg)


def checked_calls(source: str) -> list[tuple[int, str, int, tuple[str, ...]]]:
    """(line, row key, positional arguments, keywords) of every call by row in a module's source (table/calls.py):
    call_row(target, "key", ...), and calling_row(target, "key") handed to a thread hop with its arguments
    (`call(calling_row(engine, "key"), a, b=1)`); a calling_row kept for later: its key only (-1, ()). These are not
    restatements; test_restatements.py checks each key is a row and each keyword one of its parameters."""
    out, hopped = [], set()
    tree = ast.parse(source)
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and _head(n.func) in HOPS and n.args and _by_row(n.args[0]) is not None:
            hopped.add(id(n.args[0]))
            out.append((n.lineno, _by_row(n.args[0]), *_arguments(n.args[1:], n.keywords)))
    for n in ast.walk(tree):
        key = _by_row(n)
        if key is None or id(n) in hopped:
            continue
        if _head(n.func) == "call_row":
            out.append((n.lineno, key, *_arguments(n.args[2:], n.keywords)))
        else:
            out.append((n.lineno, key, -1, ()))
    return sorted(out)


def count(root: pathlib.Path = ROOT) -> dict[str, list[tuple[int, str]]]:
    """Surface file (relative to sandtree/) -> its restatements."""
    names = row_names()
    per = {}
    for surface in SURFACES:
        for p in sorted((root / surface).rglob("*.py")):
            found = restatements(p.read_text(), names)
            if found:
                per[str(p.relative_to(root))] = found
    return per


def main(argv: list[str]) -> int:
    per = count()
    by_surface: collections.Counter = collections.Counter()
    for f, found in per.items():
        print(f"{len(found):4d}  {f}")
        if "--lines" in argv:
            for line, expr in found:
                print(f"        {line}: {expr}")
        parts = f.split("/")
        by_surface["/".join(parts[:2]) if parts[1] in ("contree", "e2b") else parts[0]] += len(found)
    print()
    for s, n in sorted(by_surface.items()):
        print(f"{n:4d}  {s}/")
    print(f"{sum(by_surface.values()):4d}  total")
    calls = sum(len(checked_calls(p.read_text())) for s in SURFACES for p in (ROOT / s).rglob("*.py"))
    print(f"({calls} calls by row through table/calls.py, checked against their rows: not restatements)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
