"""The Python SDK against the operation table: every row on the SDK surface (row.on("sdk")) has a method or a
property of Sandtree, Image, Sandbox, SandboxProcess or Branch made from it (client/derive.py), whose parameters
are the row's (names, kinds, types, defaults) as the row's `@via("sdk", Sdk(...))` override and the method's
own spec show them; every override names parameters its row has; and the async face (client/aio.py) has the
sync face's methods with the same signatures (one implementation). Each check is planted with a drift below
and seen to catch it."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from sandtree import table
from sandtree.client import aio, derive, objects, sdk
from sandtree.table import rows
from sandtree.table.sdk import Sdk

CLASSES = (sdk.Sandtree, objects.Image, objects.Sandbox, objects.SandboxProcess, objects.Branch)
TWINS = {sdk.Sandtree: aio.AsyncSandtree, objects.Image: aio.AsyncImage, objects.Sandbox: aio.AsyncSandbox,
         objects.SandboxProcess: aio.AsyncSandboxProcess, objects.Branch: aio.AsyncBranch}


def made_methods(classes=CLASSES) -> dict[str, list[tuple[str, object]]]:
    """row key -> [(Class.attr, the function or property made from it)]."""
    out: dict[str, list] = {}
    for cls in classes:
        for attr, value in vars(cls).items():
            spec = getattr(value, "__sdk__", None)
            if spec is not None:
                out.setdefault(spec.row, []).append((f"{cls.__name__}.{attr}", value))
    return out


def missing_rows(classes=CLASSES) -> list[str]:
    """Rows on the SDK surface that no SDK method stands for."""
    made = made_methods(classes)
    return [key for key, row in table.OPS.items() if row.on("sdk") and key not in made]


def _params(sig: inspect.Signature) -> list[inspect.Parameter]:
    return [p for p in sig.parameters.values() if p.name != "self"]


def _describe(p: inspect.Parameter) -> tuple:
    return (p.name, p.kind.name, None if p.annotation is p.empty else str(p.annotation),
            None if p.default is p.empty else repr(p.default))


def drift(classes=CLASSES) -> list[str]:
    """Methods whose signature is not the one their row makes now (a hand-written signature, a row changed
    after the method was made, a method replaced): name, kind, type or default, parameter by parameter."""
    out = []
    for key, methods in made_methods(classes).items():
        if key not in table.OPS:
            out.extend(f"{where}: row {key} is not in the table" for where, _ in methods)
            continue
        for where, value in methods:
            fn = value.fget if isinstance(value, property) else value
            want = [_describe(p) for p in derive.sdk_parameters(fn.__sdk__)]
            have = [_describe(p) for p in _params(inspect.signature(fn))]
            for i in range(max(len(want), len(have))):
                w = want[i] if i < len(want) else None
                h = have[i] if i < len(have) else None
                if w != h:
                    field = ("parameter" if w is None or h is None or w[0] != h[0] else
                             "kind" if w[1] != h[1] else "type" if w[2] != h[2] else "default")
                    out.append(f"{where}: {field} differs from row {key}: row {w}, SDK {h}")
    return out


def override_errors() -> list[str]:
    """Sdk overrides beside a row that name parameters the row does not have (left behind by a row's change)."""
    out = []
    for key, row in table.OPS.items():
        o = row.override("sdk")
        if o is None:
            continue
        if not isinstance(o, Sdk):
            out.append(f"{key}: the SDK's override is a {type(o).__name__}, not an Sdk")
            continue
        if not o.why:
            out.append(f"{key}: Sdk(...) says no why")
        named = set(o.defaults) | set(o.keyword) | ({o.spread} if o.spread else set())
        for name in sorted(named - set(row.signature.parameters)):
            out.append(f"{key}: Sdk names {name!r}, which the row does not take")
        if o.kw and not any(p.kind is p.VAR_KEYWORD for p in row.signature.parameters.values()):
            out.append(f"{key}: Sdk(kw=...) for a row without **kw")
    return out


def async_drift(twins=TWINS) -> list[str]:
    """The async face: every public sync method has a coroutine twin of the same signature (made by aio._twin
    from the sync one, or written with the same parameters), every property a property."""
    out = []
    for sync_cls, async_cls in twins.items():
        for name, value in inspect.getmembers(sync_cls):
            if name.startswith("_"):
                continue
            if isinstance(inspect.getattr_static(sync_cls, name), property):
                if not isinstance(inspect.getattr_static(async_cls, name, None), property):
                    out.append(f"{async_cls.__name__}.{name}: not a property as {sync_cls.__name__}.{name} is")
                continue
            if not inspect.isfunction(value):
                continue
            twin = getattr(async_cls, name, None)
            if twin is None or not inspect.iscoroutinefunction(twin):
                out.append(f"{async_cls.__name__}.{name}: no coroutine twin of {sync_cls.__name__}.{name}")
                continue
            shape = lambda fn: [_describe(p)[:2] + _describe(p)[3:] for p in _params(inspect.signature(fn))]
            if shape(twin) != shape(value):                # (types: an async one may name the Async classes)
                out.append(f"{async_cls.__name__}.{name}: signature differs from {sync_cls.__name__}.{name}")
    return out


# ---- the rules ---------------------------------------------------------------------------------------

def test_every_row_on_the_sdk_has_a_method():
    assert not missing_rows(), missing_rows()


def test_every_method_made_from_a_row_has_the_rows_parameters():
    assert not drift(), "\n".join(drift())


def test_every_sdk_override_names_the_rows_parameters():
    assert not override_errors(), override_errors()


def test_the_async_face_has_the_sync_faces_methods():
    assert not async_drift(), async_drift()


def test_no_hand_typed_run_options_left():
    """The 15 shared run options reach Image.run, Image.start, Sandbox.exec and st.pool from the rows (and
    RunOptions), not from a list typed in client/: no method of the SDK spells one as its own parameter."""
    import ast
    shared = {f.name for f in dataclasses.fields(table.RunOptions)}
    hand = []
    for mod in (objects, sdk):
        for node in ast.walk(ast.parse(inspect.getsource(mod))):
            if isinstance(node, ast.FunctionDef):
                names = {a.arg for a in node.args.args + node.args.kwonlyargs}
                if len(names & shared) >= 3 and node.name != "eval":   # eval: an evaluation's test-run limits
                    hand.append(f"{mod.__name__}.{node.name}: {sorted(names & shared)}")
    assert not hand, hand


def test_methods_are_inspectable_and_documented():
    """help(), IDEs and inspect see each made method's own signature and the row's doc."""
    sig = inspect.signature(objects.Image.run)
    assert "command" in sig.parameters and "memory" in sig.parameters and "on_stdout" in sig.parameters
    assert sig.parameters["memory"].kind is inspect.Parameter.KEYWORD_ONLY
    assert objects.Image.run.__doc__.startswith(table.OPS["run"].doc.splitlines()[0])
    assert objects.Image.run.__qualname__ == "Image.run"
    assert inspect.signature(aio.AsyncImage.run) == sig
    assert "merge_preview" in dir(sdk.Sandtree)           # the drift this issue fixed: it reached REST only


def test_a_call_is_checked_as_a_python_call():
    """A made method binds its arguments against its signature before anything reaches the engine."""
    img = objects.Image(None, "0" * 64)
    with pytest.raises(TypeError):
        img.run("true", memroy="1G")                     # a misspelt option
    with pytest.raises(TypeError):
        img.run()                                        # the command is required


# ---- self-tests: each check catches a planted drift ---------------------------------------------------

def test_selftest_a_missing_row_is_caught():
    @rows.op("list")
    def sdk_selftest_planted(image: str) -> dict:
        """A row planted by the self-test."""
    try:
        assert missing_rows() == ["sdk_selftest_planted"]
        rows.via("sdk", rows.Off("planted: not on the SDK"))(sdk_selftest_planted)
        assert missing_rows() == []
    finally:
        del rows.OPS["sdk_selftest_planted"]
    assert missing_rows() == []


def test_selftest_a_parameter_drift_is_caught(monkeypatch):
    made = objects.Image.__dict__["ls"]

    def ls(self, where: str = "/") -> list[dict]:          # a hand-written method: a renamed parameter
        return made(self, where)
    ls.__sdk__ = made.__sdk__
    monkeypatch.setattr(objects.Image, "ls", ls)
    assert [d for d in drift() if d.startswith("Image.ls: parameter")], drift()
    monkeypatch.undo()

    def ls_kind(self, *, path: str = "/") -> list[dict]:   # the same name, keyword-only where the row says not
        return made(self, path)
    ls_kind.__sdk__ = made.__sdk__
    monkeypatch.setattr(objects.Image, "ls", ls_kind)
    assert [d for d in drift() if d.startswith("Image.ls: kind")], drift()
    monkeypatch.undo()

    row = table.OPS["ls"]                                  # the row's type changes, the method was made before
    params = [p.replace(annotation="bytes") if p.name == "path" else p for p in row.signature.parameters.values()]
    monkeypatch.setitem(table.OPS, "ls", dataclasses.replace(row, signature=row.signature.replace(parameters=params)))
    assert [d for d in drift() if d.startswith("Image.ls: type")], drift()
    monkeypatch.undo()
    assert not drift()


def test_selftest_a_default_drift_is_caught(monkeypatch):
    row = table.OPS["ls"]                                  # the row's default changes after the method was made
    params = [p.replace(default="/etc") if p.name == "path" else p for p in row.signature.parameters.values()]
    monkeypatch.setitem(table.OPS, "ls", dataclasses.replace(row, signature=row.signature.replace(parameters=params)))
    found = drift()
    assert [d for d in found if d.startswith("Image.ls: default")], found
    assert [d for d in found if d.startswith("Sandtree.") or d.startswith("Sandbox.")] == []   # sandbox_ls: its own
    monkeypatch.undo()

    pool = table.OPS["pool_create"]                        # an SDK override's default, changed beside the row
    o = pool.override("sdk")
    monkeypatch.setitem(table.OPS, "pool_create", dataclasses.replace(
        pool, via={**pool.via, "sdk": dataclasses.replace(o, defaults={**o.defaults, "size": o.defaults["size"] + 1})}))
    assert [d for d in drift() if d.startswith("Sandtree.pool: default")], drift()
    monkeypatch.undo()
    assert not drift()


def test_selftest_a_stale_override_is_caught(monkeypatch):
    row = table.OPS["read"]
    monkeypatch.setitem(table.OPS, "read", dataclasses.replace(
        row, via={**row.via, "sdk": Sdk("planted", keyword=("offset", "size"))}))
    assert override_errors() == ["read: Sdk names 'size', which the row does not take"]


def test_selftest_an_async_drift_is_caught(monkeypatch):
    async def ls(self, where="/"):                         # a twin written by hand, its parameter renamed
        return None
    monkeypatch.setattr(aio.AsyncImage, "ls", ls)
    assert async_drift() == ["AsyncImage.ls: signature differs from Image.ls"]
    monkeypatch.delattr(aio.AsyncImage, "ls")
    assert async_drift() == ["AsyncImage.ls: no coroutine twin of Image.ls"]
