"""Type stubs (.pyi) of the Python API, written from the classes as they are at run time, so that static tools
(mypy, Pyright/Pylance, an IDE's completion) see what help() and inspect see: the SDK's methods are made from
the operation table's rows (client/derive.py), and their parameters exist only once the rows are read.

    PYTHONPATH=src .venv/bin/python scripts/stubs.py          # rewrites the stubs
    PYTHONPATH=src .venv/bin/python scripts/stubs.py --check  # exit 1 if one is out of date

tests/conformance/test_stubs.py checks that the committed stubs are these, and that mypy reads a call with a
misspelled option as an error. A stub covers the whole module it stands beside: what the module exports
(__all__), with each class's public methods, properties, fields and the attributes its __init__ sets.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import inspect
import os
import re
import sys
import textwrap
import typing

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
MODULES = ("sandtree.client.objects", "sandtree.client.sdk", "sandtree.client.aio")
HEADER = "# Written by scripts/stubs.py from the classes as they run (their methods come from the operation table): do not edit.\n"
_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)*")
_TYPING = set(typing.__all__)
# the sync types a coroutine of an async twin returns as its async twin (client/aio.py _wrap)
_ASYNC = {"Image": "AsyncImage", "RunResult": "AsyncRunResult", "Branch": "AsyncBranch", "Sandbox": "AsyncSandbox",
          "SandboxProcess": "AsyncSandboxProcess", "Sandtree": "AsyncSandtree"}


class _Stub:
    def __init__(self, module):
        self.module = module
        self.imports: dict[str, set[str]] = {}
        self.defined = set(getattr(module, "__all__", ()))
        self.lines: list[str] = []

    # ---- annotations ------------------------------------------------------------------------------------
    def annotation(self, value, twin: bool = False) -> str | None:
        if value is inspect.Parameter.empty or value is inspect.Signature.empty:
            return None
        text = value if isinstance(value, str) else inspect.formatannotation(value)
        text = text.strip().strip("'\"")
        if twin:
            text = _NAME.sub(lambda m: _ASYNC.get(m.group(0), m.group(0)), text)
        for name in _NAME.findall(text):
            if not self._known(name.split(".")[0]):
                return "Any"                 # a name nothing here can import: better Any than a wrong stub
        return text

    def _known(self, name: str) -> bool:
        if name in self.defined or hasattr(builtins, name) or name in ("None", "Any"):
            return True
        if name in _TYPING:
            self.imports.setdefault("typing", set()).add(name)
            return True
        value = getattr(self.module, name, None)
        if value is None and name in _public():
            value = getattr(importlib.import_module("sandtree"), name)     # (a name the package exports)
        if value is None:
            return False
        where = getattr(value, "__module__", None)
        if inspect.ismodule(value):
            self.imports.setdefault("", set()).add(value.__name__)
            return True
        if where and where != self.module.__name__:
            self.imports.setdefault(where, set()).add(name)
            return True
        return False

    def signature(self, fn, *, twin: bool = False, drop_self: bool = False) -> str:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return "(self, *args: Any, **kwargs: Any) -> Any"
        params, star = [], False
        items = list(sig.parameters.values())
        for i, p in enumerate(items):
            if drop_self and i == 0:
                continue
            if p.kind is p.KEYWORD_ONLY and not star:
                params.append("*")
                star = True
            if p.kind is p.VAR_POSITIONAL:
                star = True
            prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
            ann = self.annotation(p.annotation, twin=twin)
            text = prefix + p.name + (f": {ann}" if ann else "")
            if p.default is not p.empty:
                text += " = ..." if ann else "=..."
            params.append(text)
            if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(items) or items[i + 1].kind is not p.POSITIONAL_ONLY):
                params.append("/")
        ret = self.annotation(sig.return_annotation, twin=twin)
        return f"({', '.join(params)})" + (f" -> {ret}" if ret else "")

    # ---- members --------------------------------------------------------------------------------------
    def klass(self, cls) -> None:
        bases = [b.__name__ for b in cls.__bases__ if b is not object and self._known(b.__name__)]
        self.lines.append(f"class {cls.__name__}{'(' + ', '.join(bases) + ')' if bases else ''}:")
        body: list[str] = []
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        annotations = cls.__dict__.get("__annotations__", {})
        for name, ann in annotations.items():
            if not name.startswith("_"):
                body.append(f"    {name}: {self.annotation(ann) or 'Any'}")
        for name in _init_attributes(cls):
            if name not in annotations and name not in fields and not name.startswith("_") and name not in vars(cls):
                body.append(f"    {name}: Any")
        twin = cls.__name__.startswith("Async")
        # dunders first, then by name: the same stub whatever order the class got its members in (a test's
        # monkeypatch re-adds one at the end)
        for name, value in sorted(vars(cls).items(), key=lambda kv: (not kv[0].startswith("__"), kv[0])):
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                continue
            if name in ("__dict__", "__weakref__", "__module__", "__doc__", "__annotations__", "__dataclass_fields__",
                        "__dataclass_params__", "__match_args__", "__hash__", "__qualname__", "__slots__"):
                if name == "__hash__" and callable(value):
                    body.append(f"    def __hash__(self) -> int: ...")
                continue
            if isinstance(value, property):
                ret = self.annotation(inspect.signature(value.fget).return_annotation, twin=twin) \
                    if value.fget is not None else None
                body += ["    @property", f"    def {name}(self) -> {ret or 'Any'}: ..."]
            elif isinstance(value, classmethod):
                body += ["    @classmethod", f"    def {name}{self.signature(value.__func__)}: ..."]
            elif isinstance(value, staticmethod):
                body += ["    @staticmethod", f"    def {name}{self.signature(value.__func__)}: ..."]
            elif inspect.isfunction(value):
                kind = "async def" if inspect.iscoroutinefunction(value) else "def"
                body.append(f"    {kind} {name}{self.signature(value, twin=kind == 'async def')}: ...")
        self.lines += body or ["    ..."]
        self.lines.append("")

    def exported(self) -> list[str]:
        """__all__, or (a module without one) the classes and functions it defines."""
        if hasattr(self.module, "__all__"):
            return list(self.module.__all__)
        return [n for n, v in vars(self.module).items() if not n.startswith("_") and
                (inspect.isclass(v) or inspect.isfunction(v)) and v.__module__ == self.module.__name__]

    def render(self) -> str:
        self.defined = set(self.exported())
        for name in self.exported():
            value = getattr(self.module, name)
            if inspect.isclass(value) and value.__module__ == self.module.__name__:
                self.klass(value)
            elif inspect.isfunction(value) and value.__module__ == self.module.__name__:
                kind = "async def" if inspect.iscoroutinefunction(value) else "def"
                self.lines += [f"{kind} {name}{self.signature(value)}: ...", ""]
            else:
                where = getattr(value, "__module__", None)
                self.lines += [f"from {where} import {name} as {name}", ""]
        self.imports.setdefault("typing", set()).add("Any")
        head = [HEADER, "from __future__ import annotations", ""]
        for where in sorted(self.imports):
            names = sorted(self.imports[where] - self.defined)
            if not names:
                continue
            if where == "":
                head += [f"import {n}" for n in names]
            else:
                head.append(f"from {where} import {', '.join(names)}")
        all_ = self.exported()
        head += ["", f"__all__ = {list(all_)!r}", "", ""]
        return "\n".join(head + self.lines).rstrip() + "\n"


def _public() -> set[str]:
    return set(importlib.import_module("sandtree").__all__)


def _init_attributes(cls) -> list[str]:
    """Names its __init__ assigns on self (a stub declares an instance's attributes in the class body)."""
    init = cls.__dict__.get("__init__")
    if init is None or not inspect.isfunction(init):
        return []
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except (OSError, SyntaxError):
        return []
    out = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self" \
                        and e.attr not in out:
                    out.append(e.attr)
    return out


def top_level() -> str:
    """sandtree/__init__.pyi: what `import sandtree` exports, each from where it is defined (the package loads
    most of them lazily, which static tools cannot follow)."""
    import sandtree
    lines = [HEADER, "from __future__ import annotations", ""]
    for name in sandtree.__all__:
        value = getattr(sandtree, name)
        lines.append(f"from {value.__module__} import {name} as {name}")
    lines += ["", f"__all__ = {list(sandtree.__all__)!r}", f"__version__: str", ""]
    return "\n".join(lines)


def stubs() -> dict[str, str]:
    """path relative to src/ -> the stub's text."""
    out = {"sandtree/__init__.pyi": top_level()}
    for name in MODULES:
        out[name.replace(".", "/") + ".pyi"] = _Stub(importlib.import_module(name)).render()
    return out


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for rel, text in stubs().items():
        path = os.path.join(ROOT, rel)
        old = open(path).read() if os.path.exists(path) else None
        if old != text:
            stale.append(rel)
            if not check:
                with open(path, "w") as f:
                    f.write(text)
    if check and stale:
        print("out of date: " + ", ".join(stale) + " (PYTHONPATH=src .venv/bin/python scripts/stubs.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
