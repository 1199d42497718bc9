"""Hand restatements of operations outside the table, held under a ceiling that only goes down: a reference to a
row's name on an engine-like object (`engine.sandbox_exec`, `view.run`, `ops.get`) in a surface's files (http/ with
contree/ and e2b/, mcp/, cli/, client/), counted by scripts/restatements.py. What lowers it is a surface derived
from the rows, or a foreign protocol's routes declared as data that name the rows they run (http/e2b/volumes.py
ROUTES, served by one dispatcher through table/calls.py's call_row). Rewriting a hand-written handler's
`engine.x(...)` as `call_row(engine, "x", ...)` would lower the count and derive nothing: that is not the way. Every
call by row is checked here without running it: its row exists, its keywords are the row's parameters, it passes no
more positionals than the row takes. Each check has a self-test on a planted tree."""

from __future__ import annotations

import importlib.util
import pathlib

from sandtree.table import OPS

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("restatements", ROOT / "scripts" / "restatements.py")
restatements = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(restatements)

# The count reached; lower it when a change removes restatements (never raise it: derive the new surface instead).
CEILING = 268


def _listing(per: dict) -> str:
    return "\n".join(f"{len(v):4d} {f}: " + ", ".join(e for _, e in v[:6]) for f, v in
                     sorted(per.items(), key=lambda kv: -len(kv[1])))


def test_restatements_stay_under_the_ceiling():
    per = restatements.count()
    total = sum(len(v) for v in per.values())
    assert total <= CEILING, (f"{total} hand restatements of operations in the surfaces (ceiling {CEILING}): call "
                              f"derive the surface from the row, or declare the route as data (http/e2b/volumes.py ROUTES)\n{_listing(per)}")


def call_drift(root: pathlib.Path, surfaces=restatements.SURFACES) -> list[str]:
    """Surfaces' calls by row whose row does not exist, or whose arguments its signature cannot take."""
    out = []
    for surface in surfaces:
        for p in sorted((root / surface).rglob("*.py")):
            for line, key, npos, keywords in restatements.checked_calls(p.read_text()):
                where = f"{p.relative_to(root)}:{line}"
                row = OPS.get(key)
                if row is None:
                    out.append(f"{where}: no table row {key!r}")
                    continue
                params = row.signature.parameters.values()
                if not any(q.kind is q.VAR_KEYWORD for q in params):
                    names = {q.name for q in params if q.kind is not q.POSITIONAL_ONLY}
                    out += [f"{where}: {key} has no parameter {k!r}" for k in keywords if k not in names]
                positional = [q for q in params if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
                if not any(q.kind is q.VAR_POSITIONAL for q in params) and npos > len(positional):
                    out.append(f"{where}: {key} takes {len(positional)} positional arguments, given {npos}")
    return out


def test_every_call_by_row_fits_its_row():
    assert not call_drift(restatements.ROOT), "\n".join(call_drift(restatements.ROOT))


def test_the_call_path_binds_to_the_row():
    from sandtree.table.calls import call_row

    class Target:
        def tag(self, *a, **k):
            return a, k
    assert call_row(Target(), "tag", "img", "v1") == (("img", "v1"), {})
    try:
        call_row(Target(), "tag", "img", label="v1")            # the row says `name`: refused before the call
    except TypeError as e:
        assert "tag:" in str(e)
    else:
        raise AssertionError("a call that does not fit its row ran")


# ---- self-tests: planted trees ----------------------------------------------------------------------------------
PLANTED = '''
def route(engine, view, client, d, st):
    engine.sandbox_exec("sb", "ls")          # counted
    view.operations.get("op")                # counted: on the ledger of a view
    getattr(client, "run")                   # counted: a literal name is a restatement too
    st.engine.resolve("x")                   # counted
    d.get("key")                             # not: a dict
    getattr(engine, row.name)                # not: derived from the row
    call_row(engine, "sandbox_exec", "sb", "ls") # not: a call by row
'''


def test_selftest_a_planted_restatement_is_counted(tmp_path):
    (tmp_path / "http").mkdir()
    (tmp_path / "http" / "planted.py").write_text(PLANTED)
    per = restatements.count(tmp_path)
    assert [e for _, e in per["http/planted.py"]] == [
        "engine.sandbox_exec", "view.operations.get", "getattr(client, 'run')", "st.engine.resolve"]


def test_selftest_a_planted_call_drift_is_caught(tmp_path):
    (tmp_path / "mcp").mkdir()
    (tmp_path / "mcp" / "planted.py").write_text(
        'call_row(engine, "sandbox_exec", "sb", "ls")\n'            # fits
        'call_row(engine, "no_such_row")\n'
        'call_row(engine, "tag", "img", label="v1")\n'               # the row's parameter is `name`
        'calling_row(engine, "resolve")\n'                          # fits
        'call_row(engine, "resolve", "a", "b")\n'                  # one positional too many
        'await call(calling_row(engine, "tag"), "img", label="v1")\n')   # handed to a thread hop: checked the same
    assert call_drift(tmp_path) == [
        "mcp/planted.py:2: no table row 'no_such_row'",
        "mcp/planted.py:3: tag has no parameter 'label'",
        "mcp/planted.py:5: resolve takes 1 positional arguments, given 2",
        "mcp/planted.py:6: tag has no parameter 'label'"]


# ---- foreign routes declared as data (E2B's volumes: http/e2b/volumes.py ROUTES) --------------------------------
def route_drift(routes) -> list[str]:
    """Declared routes whose steps name no row, or give a row arguments its signature cannot take."""
    out = []
    for route in routes:
        for step in route.steps:
            row = OPS.get(step.row)
            if row is None:
                out.append(f"{route.method} {route.path}: no table row {step.row!r}")
                continue
            try:
                row.signature.bind(*step.args, **{k: None for k in step.kwargs})
            except TypeError as e:
                out.append(f"{route.method} {route.path}: {step.row}: {e}")
    return out


def test_e2b_volume_routes_fit_their_rows():
    from sandtree.http.e2b import volumes
    assert not route_drift(volumes.ROUTES), "\n".join(route_drift(volumes.ROUTES))
    given = {n for r in volumes.ROUTES for s in r.steps for n in s.args + s.kwargs}
    declared = {n for r in volumes.ROUTES for n in [*r.query, "volume_id", "name", "data"]}
    assert given <= declared, given - declared          # each argument is one the route takes


def test_selftest_a_planted_route_drift_is_caught():
    from sandtree.http.e2b.volumes import Route, Step
    planted = (Route("GET", "/x", (Step("volume_ls", ("volume_id", "path"), ("deep",)),)),
               Route("GET", "/y", (Step("volume_gone", ()),)))
    assert route_drift(planted) == ["GET /x: volume_ls: got an unexpected keyword argument 'deep'",
                                    "GET /y: no table row 'volume_gone'"]
