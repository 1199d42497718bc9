"""Architecture rules of issue 13, measured from the source with ast (dulwich's habit: the layering
is a test, not a paragraph in docs/design.md).

Each rule is a checker over a package's source tree, returning its offenders, and one test that runs
it on src/sandtree and lists them. Each checker also has a self-test on a tiny synthetic tree (in
tmp_path) with one violation planted, so a checker that stopped seeing anything would fail there.

The rules (issue 13, "Deliver" 3-5):
  a. no import cycle among sandtree modules (imports inside functions count; `from pkg import
     submodule` is an edge to the submodule only);
  b. no cross-module use of a `_private` name (importing `_x` from another module, or `obj._x`
     where obj is not self/cls and this module defines no `_x` of its own);
  c. only sandtree/config.py reads the environment;
  d. `__all__` equals what a module exports (and a package __init__ that re-exports has one);
  e. adapter packages import only errors, config, table, defaults, engine, tenancy and their own
     package; the remote client loads no runtime and at most 6 sandtree modules;
  f. a module holds one concept: it opens with a docstring saying what that concept is, and it
     stays under 800 lines (a cap that says "split by concept", not one that rewards compacting);
  g. at most 10 imports inside functions, each with a comment (its line or the line above) saying
     why it is not at the top;
  h. a module imports only from its own layer or below (working rules: errors/config/table ->
     store -> branching -> runtime -> engine -> tenancy -> adapters), and every module is in one.
  i. adapters reach the engine only through its public face (`sandtree.engine`, its __init__), never
     a module inside it, so the engine's folders can move without touching a surface;
  j. integrations/ (other frameworks' plug-ins) use only the SDK's face: client/, errors, config,
     defaults, never the engine, the runtime or the server;
  k. the egress daemon (root, outside every sandbox, reading what sandboxes send) loads only the
     modules listed in DAEMON_MAY_LOAD;
  l. an import through a variable (import_module(name)) is seen: the checker takes every string of the
     module that names one of the package's modules as a possible target (so a, h and e see it), and
     a module that imports through a variable naming none must be listed in VARIABLE_IMPORTERS with
     its reason.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = "sandtree"

ADAPTERS = ("client", "http", "mcp", "cli")
# The bottom layer's shared vocabulary, the engine and the tenancy; never another adapter, except
# the three edges below (each the entry point of another adapter, not its logic).
# recipe: a build's values and the Python builder (no I/O but listing a context), which a connect()ed
# SDK builds too (issue 15: it sends them to the server).
ADAPTER_MAY_IMPORT = ("errors", "config", "table", "defaults", "vocabulary", "values", "hostfiles", "accounts", "render", "tasks",
                      "engine", "tenancy", "recipe", "evaluation", "exploration")
ADAPTER_ENTRY_POINTS = {
    ("cli", "sandtree.http.server"),    # `sandtree serve` starts the REST server
    ("cli", "sandtree.mcp.server"),     # `sandtree mcp` starts the MCP server
    ("mcp", "sandtree.client.remote"),  # `sandtree mcp --url`: the engine over HTTP is an engine
    ("cli", "sandtree.client.remote"),  # `sandtree build --server`: the same
    ("mcp", "sandtree.http.gate"),      # MCP over HTTP is served through the REST server's token gate
}
MAX_LINES = 800
# The root egress daemon's whole world: its own package, the leaf vocabulary and the run files'
# names. Anything more (the engine, the store, a parser of images) would be code a sandbox's traffic
# could reach in a root process.
DAEMON_MAY_LOAD = ("sandtree", "sandtree.config", "sandtree.defaults", "sandtree.errors", "sandtree.tasks",
                   "sandtree.network", "sandtree.network.*", "sandtree.runtime", "sandtree.runtime.runfiles")
INTEGRATIONS_MAY_IMPORT = ("client", "errors", "config", "defaults", "accounts")
# Modules that import through a variable naming no module of the package, and why.
VARIABLE_IMPORTERS = {
    "sandtree.optional": "loads an optional third-party package by the name its caller passes",
}
MAX_INNER_IMPORTS = 22      # 10 before rule l saw the four lazy imports through variables; +4: the CLI loads the
                            # engine, the remote client, the evaluation harness and `ui`'s browser when a verb runs
                            # (start-up time); +4 (start-up time again, issue 35): the verb modules a command line
                            # needs (cli/parser.builder), tempfile for --output, httpx for registries and
                            # cryptography for secrets' CAs, none of which every engine or --help uses
# sandtree, client, remote, defaults, errors, table; table's own modules (rows, options, sandboxes and each
# surface's override types) are not counted: data, importing only the standard library and defaults.
REMOTE_MAX_MODULES = 6
CONFIG_MODULES = ("config",)
# Layers, bottom first; the package itself (sandtree/__init__.py: the SDK's names) and __main__
# sit on top of everything.
# tenancy sits below the engine: the engine makes its Tenancy, which wraps the engine object it is
# given and imports none of it (dependency inversion), so the views add no import cycle.
# evaluation (the SWE-bench-style harness) and exploration (annotations, trace export, tree search) are
# logic over the engine's operations: they take an engine-like object (Engine or the remote client)
# and import none of it, so they work in-process and against a server alike; the adapters expose them.
# integrations (inspect-ai, mini-swe-agent, LangChain) plug the SDK into other frameworks: on top.
# cluster (the Ray fabric: node actors, the scheduler) sits below the engine for the tenancy's reason:
# the engine makes its Fabric and hands it the function that builds a node's engine, so the node
# actor runs an Engine without cluster/ importing one; adapters never see it (engine/clustered.py).
LAYERS = [("errors", "config", "defaults", "table", "vocabulary", "values", "secrets_mask", "procid", "hostfiles", "accounts", "tasks", "optional",
           "render"), ("store",), ("branching",), ("runtime",), ("network",), ("recipe",), ("tenancy",), ("cluster",), ("engine",),
          ("evaluation", "exploration"), ADAPTERS, ("integrations",), ("__main__",)]
# Underscore names that are public API of the standard library (os._exit, namedtuple's methods).
STDLIB_UNDERSCORE = {"_exit", "_replace", "_asdict", "_fields", "_make", "_field_defaults", "_getframe"}
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


# ---- the model: modules and their imports ------------------------------------------------------

@dataclass
class Module:
    name: str
    path: Path
    source: str
    tree: ast.Module
    is_package: bool

    @property
    def lines(self) -> int:
        return len(self.source.splitlines())


@dataclass
class Import:
    module: str                      # the importing module
    targets: list[str]               # sandtree modules it names (edges of the import graph)
    names: list[str]                 # the names taken (`from m import a, b`), [] for `import m`
    source_module: str | None        # m of `from m import ...` (resolved), None for `import m`
    lineno: int
    inner: bool                      # inside a function body
    node: ast.AST = field(repr=False, default=None)


def load(src: Path = SRC, pkg: str = PKG) -> dict[str, Module]:
    """Every module of package `pkg` under src/, by dotted name."""
    mods = {}
    for p in sorted((src / pkg).rglob("*.py")):
        rel = p.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        text = p.read_text()
        mods[".".join(parts)] = Module(".".join(parts), p, text, ast.parse(text, str(p)), is_package)
    return mods


def _resolve_from(mod: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.name.split(".")
    if not mod.is_package:
        base = base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _inner_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a function body (nested functions included)."""
    inner = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) or _dynamic_import(node):
                    inner.add(id(node))
    return inner


VARIABLE = "<variable>"


def _dynamic_import(node: ast.AST) -> str | None:
    """importlib.import_module("x") / __import__("x"): an import too. Its name if constant, else VARIABLE."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    if not ((isinstance(f, ast.Attribute) and f.attr == "import_module") or
            (isinstance(f, ast.Name) and f.id in ("import_module", "__import__"))):
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return VARIABLE


def _variable_targets(mods: dict[str, Module], mod: Module) -> list[str]:
    """The package's modules an import through a variable in `mod` may load: every string constant of
    the module (a lazy-export table's values, a module name kept in a constant) read as an absolute
    name, or relative to the module's package (`import_module(f".{where}", __name__)`)."""
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    out = set()
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
            name = node.value.lstrip(".")
            for candidate in (node.value, f"{package}.{name}"):
                if candidate in mods and candidate != mod.name:
                    out.add(candidate)
    return sorted(out)


def imports(mods: dict[str, Module], mod: Module) -> list[Import]:
    inner = _inner_nodes(mod.tree)
    out = []
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.ImportFrom):
            name = _resolve_from(mod, node)
            subs = [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in mods]
            # `from pkg import submodule`: an edge to the submodule only (the package is its parent)
            targets = subs if len(subs) == len(node.names) else [name] + subs
            out.append(Import(mod.name, [t for t in targets if t in mods], [a.name for a in node.names],
                              name, node.lineno, id(node) in inner, node))
        elif isinstance(node, ast.Import):
            out.append(Import(mod.name, [a.name for a in node.names if a.name in mods], [], None,
                              node.lineno, id(node) in inner, node))
        else:
            name = _dynamic_import(node)
            if name == VARIABLE:
                out.append(Import(mod.name, _variable_targets(mods, mod), [], VARIABLE, node.lineno,
                                  id(node) in inner, node))
            elif name is not None:
                out.append(Import(mod.name, [name] if name in mods else [], [], None, node.lineno,
                                  id(node) in inner, node))
    return out


def graph(mods: dict[str, Module]) -> dict[str, set[str]]:
    g = {m: set() for m in mods}
    for mod in mods.values():
        for imp in imports(mods, mod):
            g[mod.name].update(t for t in imp.targets if t != mod.name)
    return g


# ---- the checkers: each returns its offenders as readable lines -------------------------------

def cycles(mods: dict[str, Module]) -> list[str]:
    """Strongly connected groups of the import graph (Tarjan, iterative)."""
    g = graph(mods)
    index, low, on, stack, groups = {}, {}, set(), [], []
    counter = 0
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    group = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        group.append(w)
                        if w == v:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    out = []
    for group in groups:
        inside = set(group)
        edges = sorted(f"{a} -> {b}" for a in group for b in g[a] if b in inside)
        out.append(f"cycle among {', '.join(group)}: {'; '.join(edges)}")
    return out


def _own_private_names(tree: ast.AST) -> set[str]:
    """`_x` names this module defines: functions, classes, methods, fields, attributes it assigns
    on self/cls. Setting `_x` on another object (`out._x = ...`) or passing it as a keyword
    (`f(_x=...)`) reaches into that object's class as much as reading it does."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
            names.add(node.attr)         # self._x = ...: an attribute of this module's own classes
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)    # a dataclass field
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if _private(n)}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_self(node: ast.AST) -> bool:
    if isinstance(node, ast.Name) and node.id in ("self", "cls"):
        return True
    # super()._x and type(self)._x: the object's own class
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("super", "type")


def private_uses(mods: dict[str, Module]) -> list[str]:
    out = []
    for mod in mods.values():
        for imp in imports(mods, mod):
            if imp.source_module and (imp.source_module in mods) and imp.source_module != mod.name:
                for n in imp.names:
                    if _private(n):
                        out.append(f"{mod.name}:{imp.lineno}: imports {n} from {imp.source_module}")
        own = _own_private_names(mod.tree)
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and not _is_self(node.value) \
                    and node.attr not in own and node.attr not in STDLIB_UNDERSCORE:
                out.append(f"{mod.name}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Call):
                for k in node.keywords:
                    if k.arg and _private(k.arg) and k.arg not in own:
                        out.append(f"{mod.name}:{node.lineno}: {ast.unparse(node.func)}({k.arg}=...)")
    return out


def env_reads(mods: dict[str, Module], allowed=CONFIG_MODULES, pkg: str = PKG) -> list[str]:
    allowed = {f"{pkg}.{a}" for a in allowed}
    out = []
    for mod in mods.values():
        if mod.name in allowed:
            continue
        from_os = set()
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.ImportFrom) and node.module in ("os", "posix"):
                for a in node.names:
                    if a.name in ENV_NAMES:
                        from_os.add(a.asname or a.name)
                        out.append(f"{mod.name}:{node.lineno}: from {node.module} import {a.name}")
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Attribute) and node.attr in ENV_NAMES and isinstance(node.value, ast.Name) \
                    and node.value.id in ("os", "posix"):
                out.append(f"{mod.name}:{node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Name) and node.id in from_os and isinstance(node.ctx, ast.Load):
                out.append(f"{mod.name}:{node.lineno}: {node.id}")
    return out


def _all_value(mod: Module) -> tuple[list[str] | None, int]:
    for node in mod.tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            try:
                return list(ast.literal_eval(node.value)), node.lineno
            except ValueError:
                return [], node.lineno       # not a literal: the checker cannot vouch for it
    return None, 0


def exports(mods: dict[str, Module], mod: Module) -> set[str]:
    """Public names a module binds at top level: its definitions; for a package __init__ also the
    names it imports from the package (its re-exports), submodules excepted."""
    names = set()
    lazy = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in mod.tree.body)

    def bind(target):
        for n in ast.walk(target):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(d, ast.Call) and getattr(d.func, "id", None) == "op" for d in node.decorator_list):
                continue                 # a row of the operation table: a declaration, not an export
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    bind(t)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                bind(node.target)
            elif isinstance(node, ast.ImportFrom) and mod.is_package:
                src = _resolve_from(mod, node)
                if src.split(".")[0] == mod.name.split(".")[0]:
                    for a in node.names:
                        if f"{src}.{a.name}" not in mods:
                            names.add(a.asname or a.name)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
    visit(mod.tree.body)
    if lazy:                             # PEP 562: names the module's lazy table (_LAZY) binds on first use
        for node in mod.tree.body:
            if any(isinstance(n, ast.Name) and n.id == "_LAZY" for n in ast.walk(node)) and not isinstance(
                    node, ast.FunctionDef):
                names |= {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)
                          and isinstance(c.value, str) and c.value.isidentifier() and "." not in c.value}
    return {n for n in names if not n.startswith("_")}


def all_mismatches(mods: dict[str, Module]) -> list[str]:
    out = []
    for mod in mods.values():
        declared, line = _all_value(mod)
        public = exports(mods, mod)
        if declared is None:
            reexports = mod.is_package and any(isinstance(n, ast.ImportFrom) for n in mod.tree.body) and public
            if reexports:
                out.append(f"{mod.name}: re-exports {sorted(public)} without __all__")
            continue
        missing, extra = sorted(public - set(declared)), sorted(set(declared) - public)
        dup = sorted({n for n in declared if declared.count(n) > 1})
        if missing or extra or dup:
            out.append(f"{mod.name}:{line}: __all__ lacks {missing}, names unbound {extra}, repeats {dup}")
    return out


def adapter_imports(mods: dict[str, Module], pkg: str = PKG) -> list[str]:
    allowed = [f"{pkg}.{a}" for a in ADAPTER_MAY_IMPORT]
    out = []
    for mod in mods.values():
        parts = mod.name.split(".")
        if len(parts) < 2 or parts[1] not in ADAPTERS:
            continue
        own = f"{pkg}.{parts[1]}"
        for imp in imports(mods, mod):
            for t in imp.targets:
                ok = any(t == a or t.startswith(a + ".") for a in allowed + [own])
                if not ok and pkg == PKG and (parts[1], t) in ADAPTER_ENTRY_POINTS:
                    ok = True
                if not ok:
                    out.append(f"{mod.name}:{imp.lineno}: imports {t}")
    return out


def loaded_modules(module: str, src: Path = SRC, pkg: str = PKG) -> list[str]:
    """The modules of `pkg` that importing `module` loads, in a fresh interpreter."""
    code = (f"import json, sys; import {module}; "
            f"print(json.dumps(sorted(m for m in sys.modules if m == {pkg!r} or m.startswith({pkg!r} + '.'))))")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(src)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def remote_client_offences(loaded: list[str], pkg: str = PKG) -> list[str]:
    out = [f"loads {m}" for m in loaded if m.startswith(f"{pkg}.runtime")]
    counted = [m for m in loaded if not m.startswith(f"{pkg}.table.")]
    if len(counted) > REMOTE_MAX_MODULES:
        out.append(f"loads {len(counted)} {pkg} modules besides table's (at most {REMOTE_MAX_MODULES}): "
                   f"{', '.join(counted)}")
    return out


def heavy_table_imports(mods: dict[str, Module], pkg: str = PKG) -> list[str]:
    """Imports of the table's modules beyond the standard library and the package's leaves: the remote
    client loads every table module, so each must stay data (no pydantic, fastapi, argparse, httpx)."""
    out = []
    for mod in mods.values():
        if mod.name != f"{pkg}.table" and not mod.name.startswith(f"{pkg}.table."):
            continue
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            out += [f"{mod.name}:{node.lineno}: imports {n}" for n in names
                    if n.split(".")[0] not in sys.stdlib_module_names and n.split(".")[0] != pkg
                    or n.split(".")[0] in ("argparse",)]
    return out


def oversized(mods: dict[str, Module]) -> list[str]:
    return [f"{m.name}: {m.lines} lines" for m in sorted(mods.values(), key=lambda m: -m.lines)
            if m.lines > MAX_LINES]


def unnamed_concepts(mods: dict[str, Module]) -> list[str]:
    """Modules whose docstring does not open by saying what they hold (a first line of a few words)."""
    out = []
    for m in mods.values():
        doc = ast.get_docstring(m.tree)
        first = doc.strip().splitlines()[0] if doc and doc.strip() else ""
        if len(first.split()) < 3:
            out.append(f"{m.name}: no docstring naming its concept")
    return out


def engine_internals(mods: dict[str, Module], pkg: str = PKG) -> list[str]:
    """Adapter imports of a module inside the engine package (not its public face)."""
    out = []
    for mod in mods.values():
        parts = mod.name.split(".")
        if len(parts) < 2 or parts[1] not in ADAPTERS:
            continue
        for imp in imports(mods, mod):
            out += [f"{mod.name}:{imp.lineno}: imports {t}" for t in imp.targets if t.startswith(f"{pkg}.engine.")]
    return out


def integration_imports(mods: dict[str, Module], pkg: str = PKG) -> list[str]:
    allowed = [f"{pkg}.{a}" for a in INTEGRATIONS_MAY_IMPORT] + [f"{pkg}.integrations"]
    out = []
    for mod in mods.values():
        if not mod.name.startswith(f"{pkg}.integrations"):
            continue
        for imp in imports(mods, mod):
            out += [f"{mod.name}:{imp.lineno}: imports {t}" for t in imp.targets
                    if not any(t == a or t.startswith(a + ".") for a in allowed)]
    return out


def daemon_offences(loaded: list[str], may_load=DAEMON_MAY_LOAD) -> list[str]:
    def listed(m):
        return any(m == a or (a.endswith(".*") and m.startswith(a[:-1])) for a in may_load)
    return [f"loads {m}" for m in loaded if not listed(m)]


def unseen_variable_imports(mods: dict[str, Module], listed=None) -> list[str]:
    """Imports through a variable that name no module of the package, in a module not listed."""
    listed = VARIABLE_IMPORTERS if listed is None else listed
    out = []
    for mod in mods.values():
        for imp in imports(mods, mod):
            if imp.source_module == VARIABLE and not imp.targets and mod.name not in listed:
                out.append(f"{mod.name}:{imp.lineno}: imports through a variable naming no module")
    return out


def inner_imports(mods: dict[str, Module]) -> tuple[list[str], list[str]]:
    """(every import inside a function, those with no comment saying why)."""
    every, bare = [], []
    for mod in mods.values():
        lines = mod.source.splitlines()
        for imp in imports(mods, mod):
            if not imp.inner:
                continue
            where = f"{mod.name}:{imp.lineno}: {lines[imp.lineno - 1].strip()}"
            every.append(where)
            here = lines[imp.lineno - 1]
            above = lines[imp.lineno - 2].strip() if imp.lineno > 1 else ""
            if "#" not in here and not above.startswith("#"):
                bare.append(where)
    return every, bare


def _where(line: str):
    mod, _, rest = line.partition(":")
    num = rest.split(":", 1)[0]
    return (mod, int(num) if num.isdigit() else 0, line)


def layer_of(name: str, pkg: str = PKG) -> int | None:
    parts = name.split(".")
    if parts == [pkg]:
        return len(LAYERS) - 1
    return next((i for i, names in enumerate(LAYERS) if parts[1] in names), None)


def upward_imports(mods: dict[str, Module], pkg: str = PKG) -> list[str]:
    out = []
    for mod in mods.values():
        mine = layer_of(mod.name, pkg)
        if mine is None:
            out.append(f"{mod.name}: in no layer (add it to LAYERS)")
            continue
        for imp in imports(mods, mod):
            for t in imp.targets:
                theirs = layer_of(t, pkg)
                if theirs is not None and theirs > mine:
                    out.append(f"{mod.name}:{imp.lineno}: imports {t} (a layer above)")
    return out


def _listing(title: str, offenders: list[str]) -> str:
    return f"{title} ({len(offenders)}):\n  " + "\n  ".join(sorted(offenders, key=_where))


# ---- the rules on sandtree ---------------------------------------------------------------------

MODS = load()


def test_rule_a_no_import_cycle():
    found = cycles(MODS)
    assert not found, _listing("import cycles (imports inside functions count)", found)


def test_rule_b_no_cross_module_private_use():
    found = private_uses(MODS)
    assert not found, _listing("private names used across modules", found)


def test_rule_c_only_config_reads_the_environment():
    found = env_reads(MODS)
    assert not found, _listing("environment reads outside sandtree/config.py", found)


def test_rule_d_all_equals_exports():
    found = all_mismatches(MODS)
    assert not found, _listing("__all__ differs from the exports", found)


def test_rule_e_adapters_import_only_the_allowed_layers():
    found = adapter_imports(MODS)
    found += [f"{PKG}.client.remote: {o}" for o in remote_client_offences(loaded_modules(f"{PKG}.client.remote"))]
    found += heavy_table_imports(MODS)
    assert not found, _listing("adapter imports outside errors/config/table/defaults/engine/tenancy", found)


def test_rule_f_a_module_holds_one_named_concept():
    found = oversized(MODS) + unnamed_concepts(MODS)
    assert not found, _listing(f"modules over {MAX_LINES} lines or with no docstring naming their concept", found)


def test_rule_g_few_imports_inside_functions_each_said_why():
    every, bare = inner_imports(MODS)
    listed = [f"{w}{'   <- no comment saying why' if w in bare else ''}" for w in every]
    assert len(every) <= MAX_INNER_IMPORTS and not bare, \
        _listing(f"imports inside functions (at most {MAX_INNER_IMPORTS}, each commented)", listed)


def test_rule_h_imports_go_down_the_layers():
    found = upward_imports(MODS)
    assert not found, _listing("imports from a layer above", found)


def test_rule_i_adapters_reach_the_engine_through_its_public_face():
    found = engine_internals(MODS)
    assert not found, _listing("adapter imports of a module inside sandtree.engine", found)


def test_rule_j_integrations_use_only_the_sdk():
    found = integration_imports(MODS)
    assert not found, _listing(f"integrations importing beyond {INTEGRATIONS_MAY_IMPORT}", found)


def test_rule_k_the_egress_daemon_loads_only_what_is_listed():
    found = daemon_offences(loaded_modules(f"{PKG}.network.daemon"))
    assert not found, _listing("the root egress daemon loads modules not in DAEMON_MAY_LOAD", found)


def test_rule_l_imports_through_variables_are_seen():
    found = unseen_variable_imports(MODS)
    assert not found, _listing("imports through a variable the checker cannot follow", found)
    lazy = [imp for imp in imports(MODS, MODS[PKG]) if imp.source_module == VARIABLE]
    assert lazy and f"{PKG}.client.sdk" in lazy[0].targets, "sandtree/__init__'s lazy exports are edges"


# ---- self-tests: each checker on a tiny tree with one planted violation -----------------------

def tree(tmp_path: Path, files: dict[str, str], pkg: str = "pkg") -> dict[str, Module]:
    for rel, text in files.items():
        p = tmp_path / pkg / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    for d in [tmp_path / pkg, *(p for p in (tmp_path / pkg).rglob("*") if p.is_dir())]:
        (d / "__init__.py").touch()
    return load(tmp_path, pkg)


def test_selftest_cycles_count_function_imports(tmp_path):
    mods = tree(tmp_path, {"a.py": "from . import b\n",
                           "b.py": "def f():\n    from .a import x\n"})
    found = cycles(mods)
    assert len(found) == 1 and "pkg.a -> pkg.b" in found[0] and "pkg.b -> pkg.a" in found[0], found
    clean = tree(tmp_path / "clean", {"a.py": "from . import b\n", "b.py": "import os\n"})
    assert cycles(clean) == []


def test_selftest_cycles_from_package_import_submodule_is_an_edge_to_the_submodule(tmp_path):
    # were `from . import c` an edge to the package, pkg -> pkg.a -> pkg would be a cycle
    mods = tree(tmp_path, {"__init__.py": "from .a import A\n", "a.py": "from . import c\nA = 1\n", "c.py": ""})
    assert cycles(mods) == []
    mods = tree(tmp_path / "two", {"__init__.py": "from .a import A\n", "a.py": "from . import c, A0\nA = 1\n",
                                   "c.py": ""})
    assert len(cycles(mods)) == 1          # A0 is no submodule: the package is imported too


def test_selftest_cycles_see_dynamic_imports(tmp_path):
    mods = tree(tmp_path, {"a.py": "import pkg.b\n",
                           "b.py": "import importlib\ndef f():\n    return importlib.import_module('pkg.a')\n"})
    assert len(cycles(mods)) == 1


def test_selftest_private_uses(tmp_path):
    mods = tree(tmp_path, {"a.py": "_hidden = 1\nclass A:\n    def _m(self):\n        return self._m\n",
                           "b.py": """\
                               from .a import _hidden, A
                               import os
                               def f(eng, x):
                                   os._exit(0)
                                   super()._init()
                                   return eng._m(), x._own
                               class B:
                                   def __init__(self):
                                       self._own = 1
                               def g(out, close):
                                   out._close = close
                                   return A(_secret=1), B(_own=2)
                               """})
    found = private_uses(mods)
    assert sorted(found, key=_where) == ["pkg.b:1: imports _hidden from pkg.a", "pkg.b:6: eng._m",
                                         "pkg.b:11: out._close", "pkg.b:12: A(_secret=...)"], found


def test_selftest_env_reads(tmp_path):
    mods = tree(tmp_path, {"config.py": "import os\nHOME = os.environ.get('HOME')\n",
                           "a.py": "import os\nX = os.getenv('X')\n",
                           "b.py": "from os import environ\ndef f():\n    return environ['Y']\n",
                           "c.py": "import os\nos.environ\n",
                           "d.py": "import subprocess\nsubprocess.run(['true'], env={})\n"})
    found = env_reads(mods, pkg="pkg")
    assert sorted(found) == ["pkg.a:2: os.getenv", "pkg.b:1: from os import environ", "pkg.b:3: environ",
                             "pkg.c:2: os.environ"], found


def test_selftest_all_equals_exports(tmp_path):
    mods = tree(tmp_path, {"good.py": "import os\n__all__ = ['f', 'C']\ndef f(): pass\nclass C: pass\n_x = 1\n",
                           "bad.py": "__all__ = ['f', 'gone']\ndef f(): pass\ndef g(): pass\n",
                           "sub/__init__.py": "from .leaf import thing\n",
                           "sub/leaf.py": "thing = 1\n",
                           "ok/__init__.py": "from .leaf import thing\n__all__ = ['thing']\n",
                           "ok/leaf.py": "thing = 1\n"})
    found = all_mismatches(mods)
    assert len(found) == 2, found
    assert any(f.startswith("pkg.bad:") and "['g']" in f and "['gone']" in f for f in found), found
    assert any(f.startswith("pkg.sub:") and "without __all__" in f for f in found), found


def test_selftest_adapter_imports(tmp_path):
    files = {f"{a}/x.py": "" for a in ("errors", "engine", "runtime", "http", "client")}
    files.update({"errors.py": "", "cli/main.py": """\
        from ..errors import E
        from ..engine import core
        from . import helpers
        from ..runtime import seccomp
        def f():
            from ..http import server
        """, "cli/helpers.py": ""})
    files.pop("errors/x.py")
    mods = tree(tmp_path, files)
    found = adapter_imports(mods, pkg="pkg")
    assert sorted(found) == ["pkg.cli.main:4: imports pkg.runtime", "pkg.cli.main:6: imports pkg.http"], found


def test_selftest_remote_client_module_count(tmp_path):
    tree(tmp_path, {"client/remote.py": "from ..runtime import seccomp\n", "runtime/seccomp.py": ""}, pkg="fakepkg")
    loaded = loaded_modules("fakepkg.client.remote", tmp_path, "fakepkg")
    found = remote_client_offences(loaded, pkg="fakepkg")
    assert found == ["loads fakepkg.runtime", "loads fakepkg.runtime.seccomp"], found
    many = [f"fakepkg.m{i}" for i in range(REMOTE_MAX_MODULES + 1)]
    assert len(remote_client_offences(many, pkg="fakepkg")) == 1
    assert remote_client_offences(many[:REMOTE_MAX_MODULES], pkg="fakepkg") == []


def test_selftest_heavy_table_imports(tmp_path):
    mods = tree(tmp_path, {"table/rows.py": "import inspect\nfrom dataclasses import field\n",
                           "table/rest.py": "import argparse\nfrom pydantic import BaseModel\n"})
    assert heavy_table_imports(mods, pkg="pkg") == ["pkg.table.rest:1: imports argparse",
                                                    "pkg.table.rest:2: imports pydantic"]


def test_selftest_oversized(tmp_path):
    mods = tree(tmp_path, {"big.py": "x = 1\n" * (MAX_LINES + 1), "fine.py": "x = 1\n" * MAX_LINES})
    assert oversized(mods) == [f"pkg.big: {MAX_LINES + 1} lines"]


def test_selftest_unnamed_concepts(tmp_path):
    mods = tree(tmp_path, {"named.py": '"""The thing this module holds."""\n', "bare.py": "x = 1\n",
                           "terse.py": '"""Stuff."""\n'})
    found = [f for f in unnamed_concepts(mods) if not f.startswith("pkg:")]   # the package's own __init__
    assert sorted(found) == ["pkg.bare: no docstring naming its concept", "pkg.terse: no docstring naming its concept"]


def test_selftest_engine_internals(tmp_path):
    mods = tree(tmp_path, {"engine/runs/runs.py": "", "http/x.py": "from ..engine import Engine\n"
                           "from ..engine.runs import runs\n"})
    assert engine_internals(mods, pkg="pkg") == ["pkg.http.x:2: imports pkg.engine.runs.runs"]


def test_selftest_integration_imports(tmp_path):
    mods = tree(tmp_path, {"client/sdk.py": "", "engine/core.py": "", "errors.py": "",
                           "integrations/a.py": "from ..client.sdk import S\nfrom ..errors import E\n"
                                                "from ..engine.core import Engine\n"})
    assert integration_imports(mods, pkg="pkg") == ["pkg.integrations.a:3: imports pkg.engine.core"]


def test_selftest_daemon_offences():
    loaded = ["sandtree", "sandtree.network", "sandtree.network.proxy", "sandtree.engine.core", "sandtree.errors"]
    assert daemon_offences(loaded) == ["loads sandtree.engine.core"]


def test_selftest_variable_imports_are_edges(tmp_path):
    mods = tree(tmp_path, {"engine.py": "", "lazy.py": """\
        import importlib
        _WHERE = {"Engine": "engine"}
        def __getattr__(name):
            return getattr(importlib.import_module(f".{_WHERE[name]}", __package__), name)
        """, "opaque.py": """\
        import importlib
        def load(name):
            return importlib.import_module(name)
        """})
    lazy = [imp for imp in imports(mods, mods["pkg.lazy"]) if imp.source_module == VARIABLE]
    assert lazy[0].targets == ["pkg.engine"]
    assert unseen_variable_imports(mods, listed={}) == ["pkg.opaque:3: imports through a variable naming no module"]
    assert unseen_variable_imports(mods, listed={"pkg.opaque": "why"}) == []


def test_selftest_inner_imports(tmp_path):
    mods = tree(tmp_path, {"a.py": """\
        import os
        def f():
            import json
            import zlib  # optional: only some callers need it
            # a heavy dependency, loaded on first use
            import sqlite3
            def g():
                import csv
        """})
    every, bare = inner_imports(mods)
    assert len(every) == 4, every
    assert [b.split(":")[1] for b in bare] == ["3", "8"], bare


def test_selftest_upward_imports(tmp_path):
    mods = tree(tmp_path, {"errors.py": "", "store/x.py": "from ..errors import E\nfrom ..runtime import y\n",
                           "runtime/y.py": "from ..store import x\n", "stray.py": ""})
    assert sorted(upward_imports(mods, pkg="pkg")) == ["pkg.store.x:2: imports pkg.runtime.y (a layer above)",
                                                       "pkg.stray: in no layer (add it to LAYERS)"]
