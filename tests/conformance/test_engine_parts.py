"""The engine's parts (issue 13 item 3): each made from what it needs, none importing the engine;
refs written by store/refs.py alone, operation rows by engine/runs/records.py alone; fork and
pool_and_wait as engine operations."""

from __future__ import annotations

import ast
import os
import re
import time
import uuid

import pytest

import sandtree
from sandtree.engine import Engine
from sandtree.engine.runs.records import Records
from sandtree.engine.runs.spec import RunSpecs
from sandtree.errors import ImageNotFound, InvalidInput, NotFound
from sandtree.runtime.base import Limits
from sandtree.store import refs
from sandtree.store.store import Store

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src", "sandtree")
ENGINE = os.path.join(SRC, "engine")


def _sources():
    for d, _, files in os.walk(SRC):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(d, f)
                with open(p) as fh:
                    yield os.path.relpath(p, SRC), fh.read()


def _imported(tree: ast.AST, package: tuple[str, ...] = ("sandtree", "engine")) -> set[str]:
    """Absolute names a module of the engine package imports (every import, also inside
    functions): `from . import x` names <package>.x only. package: the module's own package (a part
    in engine/runs/ is in sandtree.engine.runs)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = list(package)[:max(0, len(package) + 1 - node.level)] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            if node.module or not node.level:
                out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _parts():
    """(path under engine/, its package as a tuple, full path) of every module of the engine package
    but core.py and the package's own __init__.py, in its folders too."""
    for d, _, files in sorted(os.walk(ENGINE)):
        package = ("sandtree", "engine") + tuple(os.path.relpath(d, ENGINE).split(os.sep)) if d != ENGINE \
            else ("sandtree", "engine")
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(d, f), ENGINE)
            if f.endswith(".py") and rel not in ("core.py", "__init__.py"):
                yield rel, package, os.path.join(d, f)


def test_no_part_imports_the_engine():
    """Only the engine's package file and core.py itself may name engine/core.py; a part that
    did would close the circle the issue counted (engine <-> operations, sandboxes, pools)."""
    offenders = {}
    for f, package, path in _parts():
        with open(path) as fh:
            tree = ast.parse(fh.read())
        bad = {n for n in _imported(tree, package) if n in ("sandtree.engine.core", "sandtree.engine.Engine")
               or n == "sandtree.engine" or n.startswith("sandtree.tenancy")}
        if bad:
            offenders[f] = sorted(bad)
    assert offenders == {}


def test_the_import_check_sees_every_import():
    """_imported finds a part naming the engine at the top, inside a function, or through the
    tenancy layer (else the test above proves nothing)."""
    found = _imported(ast.parse("from . import commit\nfrom ..tenancy.tenants import T\n"
                                "def f():\n    from .core import RunRecord\n"))
    assert {"sandtree.engine.commit", "sandtree.tenancy.tenants", "sandtree.engine.core"} <= found
    assert "sandtree.engine" not in found                 # `from . import commit` names commit only
    # a part in a folder of the engine: its relative imports resolve from that folder
    found = _imported(ast.parse("from .. import core\nfrom ..core import Engine\nfrom . import spec\n"),
                      ("sandtree", "engine", "runs"))
    assert {"sandtree.engine.core", "sandtree.engine.runs.spec"} <= found


def test_parts_hold_no_engine():
    """The parts get store, run-spec builder, records, committer, live runtime: none keeps the
    engine to reach into it (`self.engine`, `eng._limits`, ...)."""
    offenders = []
    for f, _, path in _parts():
        with open(path) as fh:
            for node in ast.walk(ast.parse(fh.read())):
                if isinstance(node, ast.Attribute) and node.attr == "engine" and \
                        isinstance(node.value, ast.Name) and node.value.id == "self":
                    offenders.append((f, node.lineno, "self.engine"))
                if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                        not node.attr.startswith("__") and isinstance(node.value, ast.Name) and \
                        node.value.id in ("eng", "engine", "host"):
                    offenders.append((f, node.lineno, f"{node.value.id}.{node.attr}"))
    assert offenders == []


REF_WRITE = re.compile(r"(INSERT[A-Z ]* INTO|DELETE FROM|UPDATE) (refs|reflog)\b")
OP_WRITE = re.compile(r"(INSERT[A-Z ]* INTO|UPDATE|DELETE FROM) (operations|edges)\b")


def test_one_module_writes_refs_and_one_writes_operation_rows():
    ref_writers = sorted(p for p, src in _sources() if REF_WRITE.search(src))
    op_writers = sorted(p for p, src in _sources() if OP_WRITE.search(src))
    assert ref_writers == ["store/refs.py"]
    assert op_writers == ["engine/runs/records.py"]


def test_the_write_checks_catch_a_writer():
    """The patterns above find the SQL as the code writes it (else the test above proves nothing)."""
    assert REF_WRITE.search('con.execute("INSERT OR REPLACE INTO refs(name, kind, image) ...")')
    assert REF_WRITE.search('"DELETE FROM refs WHERE kind=?"') and REF_WRITE.search('"INSERT INTO reflog(kind"')
    assert OP_WRITE.search('"INSERT OR IGNORE INTO operations(id, kind"') and OP_WRITE.search('"UPDATE operations SET"')
    assert OP_WRITE.search('"INSERT OR IGNORE INTO edges(parent"')
    assert not OP_WRITE.search('"SELECT id FROM operations WHERE kind=\'run\'"')


# ---- the writers themselves ---------------------------------------------------------------------
@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "home"), sandtree.engine.default_idmap())
    with s.db.tx() as con:
        for image in ("a" * 64, "b" * 64):
            Store.insert_image(con, image, [], {}, 0, 0)
    yield s
    s.close()


def test_records_queue_then_complete_with_an_edge(store):
    rec = Records(store)
    op = uuid.uuid4().hex
    rec.queue(op, "run", "a" * 64, {"command": "true"})
    assert rec.get(op)["finished"] is None
    assert [o for o, _ in rec.unfinished()] == [op]
    rec.record(op, "a" * 64, {"command": "true"}, time.time(), "b" * 64, {"exit_code": 0})
    row = rec.get(op)
    assert row["finished"] is not None and row["result"] == "b" * 64 and row["outcome"] == {"exit_code": 0}
    assert [(e["parent"], e["op"], e["kind"], e["command"]) for e in rec.parents("b" * 64)] == \
        [("a" * 64, op, "run", "true")]
    assert rec.children("a" * 64)[0]["child"] == "b" * 64
    assert rec.unfinished() == []


def test_records_no_edge_to_itself_and_interrupt_only_unfinished(store):
    rec = Records(store)
    same, queued, done = (uuid.uuid4().hex for _ in range(3))
    rec.record(same, "a" * 64, {"command": "ls"}, time.time(), "a" * 64, {"exit_code": 0})
    assert rec.parents("a" * 64) == []                    # a run that changed nothing makes no edge
    rec.queue(queued, "run", "a" * 64, {})
    rec.queue(done, "run", "a" * 64, {})
    rec.finish(done, {"cancelled": True})
    rec.interrupt([queued, done], {"error": "interrupted"})
    assert rec.get(queued)["outcome"] == {"error": "interrupted"}
    assert rec.get(done)["outcome"] == {"cancelled": True}     # finished before: left as it was
    with pytest.raises(NotFound):
        rec.get("nope")


def test_refs_log_each_move_once(store):
    refs.tag(store, "a" * 64, "t")
    refs.tag(store, "a" * 64, "t")                       # already there: no move
    refs.tag(store, "b" * 64, "t")
    assert [(m["old"], m["new"], m["reason"]) for m in store.tag_history("t")] == \
        [(None, "a" * 64, "tag"), ("a" * 64, "b" * 64, "tag")]
    with pytest.raises(ImageNotFound):
        refs.tag(store, "c" * 64, "t")
    assert store.tags() == {"t": "b" * 64}
    with pytest.raises(NotFound):
        refs.untag(store, "missing")
    assert len(store.tag_history("t")) == 2               # a refused write changes nothing


def test_release_image_removes_its_tags_and_branches(store):
    refs.tag(store, "a" * 64, "t")
    refs.create(store, "br", "a" * 64)
    refs.tag(store, "b" * 64, "other")
    with store.db.tx() as con:
        assert sorted(refs.naming(con, "a" * 64)) == ["br", "t"]
        assert sorted(refs.release_image(con, "a" * 64, "image rm")) == ["br", "t"]
    assert store.tags() == {"other": "b" * 64} and refs.branches(store) == {}
    assert refs.reflog(store, "br")[-1]["reason"] == "image rm"
    assert refs.branch_named(store, "branch:x") == "x" and refs.branch_named(store, "other") is None


def test_run_spec_builder(store):
    sets = {"s1": [{"path": "/a", "content": "set"}]}
    specs = RunSpecs(store, Limits(timeout=5), lambda d: "/nowhere", lambda s: sets[s])
    lim = specs.limits({"memory": "64M", "timeout": None})
    assert (lim.memory, lim.timeout) == (64 << 20, 5)
    with pytest.raises(InvalidInput, match="timout"):
        specs.limits({"timout": 5})
    files = specs.files([{"path": "/a", "content": "own"}], "s1")
    assert [(f.path, f.content) for f in files] == [("/a", b"set"), ("/a", b"own")]   # own ones last: they win


# ---- fork and pool_and_wait -------------------------------------------------------------------------
@pytest.fixture
def eng(tmp_path, rootfs):
    e = Engine(str(tmp_path / "home"), warm=0, max_runs=2)
    e.import_path(rootfs, tag="bb")
    yield e
    e.close()


def test_fork_runs_every_command_as_an_operation_in_order(eng):
    before = {o["id"] for o in eng.operations.list(limit=1000)}
    recs = eng.fork("bb", ["sleep 0.3; echo one > /f; echo one", "echo two > /f; echo two",
                           ["/bin/sh", "-c", "echo three > /f; echo three"]])
    assert [r.stdout for r in recs] == [b"one\n", b"two\n", b"three\n"]
    assert len({r.image for r in recs}) == 3 and all(r.source == eng.resolve("bb") for r in recs)
    assert [eng.read(r.image, "/f") for r in recs] == [b"one\n", b"two\n", b"three\n"]
    ops = {o["id"]: o for o in eng.operations.list(limit=1000)}
    assert {r.op for r in recs} == set(ops) - before      # each one an operation, listed
    assert all(ops[r.op]["status"] == "done" for r in recs)


def test_fork_keeps_at_most_parallel_running(eng):
    t0 = time.monotonic()
    recs = eng.fork("bb", ["sleep 0.5"] * 2, parallel=1, disposable=True)
    assert time.monotonic() - t0 >= 1.0                   # one after the other
    assert [r.exit_code for r in recs] == [0, 0] and all(r.image is None for r in recs)


def test_fork_refuses_bad_input_before_anything_runs(eng):
    before = eng.operations.list(limit=1000)
    for commands, kw in ((["echo ok", ""], {}), (["echo ok"], {"timout": 3}), (["echo ok"], {"parallel": 0}),
                         ([], {}), ("echo ok", {}), (["echo ok"], {"on_output": print}),
                         (["echo ok"] * 257, {})):
        with pytest.raises(InvalidInput):
            eng.fork("bb", commands, **kw)
    assert eng.operations.list(limit=1000) == before


def test_fork_raises_a_failed_run_after_the_others_end(eng):
    with pytest.raises(InvalidInput, match="apparent size"):
        eng.fork("bb", ["echo fine > /ok", "truncate -s 20G /sparse"], disk="64M")
    runs = [eng.operations.get(o["id"]) for o in eng.operations.list(limit=10)]
    assert sorted(r["status"] for r in runs) == ["done", "failed"]    # nothing left running


def test_fork_interrupted_cancels_what_it_started(eng, monkeypatch):
    submit = eng.operations.submit_run
    started = []

    def flaky(ref, command, **options):
        if started:
            raise KeyboardInterrupt               # as a caller's Ctrl-C during the second submit
        started.append(submit(ref, command, **options))
        return started[-1]
    monkeypatch.setattr(eng.operations, "submit_run", flaky)
    with pytest.raises(KeyboardInterrupt):
        eng.fork("bb", ["sleep 30", "true"])
    eng.operations.wait(started, timeout=20)
    assert eng.operations.get(started[0])["status"] == "cancelled"     # not left running


def test_fork_on_a_branch_leaves_the_branch(eng):
    head = eng.resolve("bb")
    eng.branch_create("work", head)
    recs = eng.fork("branch:work", ["echo a > /a", "echo b > /b"])
    assert eng.branch_head("work") == head                # no run moved it (each is its own branch)
    assert all(r.source == head for r in recs)


def test_pool_and_wait(eng):
    ok, why = eng.sandboxes.live.available()
    if not ok:
        pytest.skip(f"warm pools need live sandboxes: {why}")
    stats = eng.pool_and_wait("bb", 1, wait_timeout=60)
    assert (stats["image"], stats["size"], stats["ready"]) == (eng.resolve("bb"), 1, 1)
    r = eng.run("bb", "echo pooled > /p; cat /p")
    assert r.stdout == b"pooled\n" and r.usage.get("pool") is True
    assert eng.read(r.image, "/p") == b"pooled\n"
    with pytest.raises(InvalidInput):
        eng.pool_and_wait("bb", -1)
    assert [p["size"] for p in eng.pool_list()] == [1]   # a refused resize changes nothing
