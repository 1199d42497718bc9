"""The operation table is the vocabulary (issue 13): Engine, the tenant and admin views and the
remote client expose exactly the table's operations, with the table's signatures, and every HTTP
binding names a route the server has. A method added to one surface and not the table, or a
parameter that drifts, fails here."""

import inspect
import operator
import re

import pytest

from sandtree import table
from sandtree.client.remote import RemoteEngine, RemoteOperations
from sandtree.engine import Engine
from sandtree.engine.passthrough import passthroughs, through
from sandtree.engine.runs.operations import Operations
from sandtree.tenancy import AdminView, TenantOperations, TenantView

# What an engine has beside its operations: its own lifecycle, the tenancy entry point, and the
# operation-level entries its parts and the tenant view use (a given operation id, a check-only
# run, a tenant's import limits and registry check, a build as a tenant's guard): never reached from a surface.
PLUMBING = {"close", "tier", "as_tenant", "run_operation", "pull_operation", "import_limited", "build_as",
            "build_context_as", "annotate_as", "annotations_as",
            # a live state a live fork keeps after returning: the cluster's fork and the tenancy's image_info wait for it
            "wait_live_state", "has_live_state"}


def shape(fn) -> list[tuple]:
    """A signature as the caller sees it: names, kinds and defaults (annotations are spelling); keyword-only
    parameters in any order (a caller names them: a row's shared RunOptions come after its own)."""
    sig = fn if isinstance(fn, inspect.Signature) else inspect.signature(fn)
    params = [(p.name, p.kind.name, None if p.default is p.empty else repr(p.default))
              for p in sig.parameters.values() if p.name != "self"]
    kw = sorted(p for p in params if p[1] == "KEYWORD_ONLY")
    rest = [p for p in params if p[1] != "KEYWORD_ONLY"]
    tail = [p for p in rest if p[1] == "VAR_KEYWORD"]
    return [p for p in rest if p not in tail] + kw + tail


def public_methods(cls) -> set[str]:
    return {n for n, v in inspect.getmembers(cls) if not n.startswith("_") and callable(v)
            and not inspect.isclass(v) and not isinstance(inspect.getattr_static(cls, n), property)}


def test_engine_has_exactly_the_table():
    assert public_methods(Engine) - PLUMBING == set(table.ENGINE_OPS)


@pytest.mark.parametrize("cls", [Engine, TenantView, RemoteEngine], ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", sorted(table.ENGINE_OPS))
def test_signature_is_the_table_s(cls, name):
    row = table.ENGINE_OPS[name]
    assert hasattr(cls, name), f"{cls.__name__} has no {name}"
    assert shape(getattr(cls, name)) == shape(row.signature), \
        f"{cls.__name__}.{name}{inspect.signature(getattr(cls, name))} is not the table's {name}{row.signature}"


@pytest.fixture(scope="module")
def plain_engine(tmp_path_factory):
    eng = Engine(str(tmp_path_factory.mktemp("passthrough")), warm=0)
    yield eng
    eng.close()


def passthrough_drifts(eng, cls=Engine) -> list[str]:
    """Pass-through methods whose target (the part's method that runs) does not take exactly the row's
    parameters and defaults: the method shows the row's signature, so a drift there would be silent."""
    out = []
    for name, (part, method) in sorted(passthroughs(cls).items()):
        target = inspect.signature(getattr(operator.attrgetter(part)(eng), method))
        row = table.OPS[name].signature
        if not takes_the_row(target, row):
            out.append(f"{name} -> {part}.{method}{target} does not take the row's {row}")
    return out


def takes_the_row(target: inspect.Signature, row: inspect.Signature) -> bool:
    """The pass-through hands on the row's positional parameters by position and its keyword-only ones
    by name, each with the row's default filled in: the target must take them so (the same kind, or
    its **kwargs; no other default: a second default would mislead its reader), and need nothing more."""
    E = inspect.Parameter
    rpos = [p for p in row.parameters.values() if p.name != "self" and p.kind is not E.KEYWORD_ONLY]
    tpos = [p for p in target.parameters.values() if p.kind in (E.POSITIONAL_ONLY, E.POSITIONAL_OR_KEYWORD)]
    if any(p.kind in (E.VAR_POSITIONAL, E.VAR_KEYWORD) for p in rpos) or len(tpos) < len(rpos):
        return False
    for r, t in zip(rpos, tpos):
        if t.default is not E.empty and t.default != r.default:
            return False
    rkw = [p for p in row.parameters.values() if p.kind is E.KEYWORD_ONLY]
    absorbs = any(p.kind is E.VAR_KEYWORD for p in target.parameters.values())   # **limits: takes any name
    for r in rkw:
        t = target.parameters.get(r.name)
        if t is None and absorbs:
            continue
        if t is None or t.kind not in (E.KEYWORD_ONLY, E.POSITIONAL_OR_KEYWORD) or \
                (t.default is not E.empty and t.default != r.default):
            return False
    taken = {p.name for p in tpos[:len(rpos)]} | {r.name for r in rkw}
    return all(p.default is not E.empty or p.kind in (E.VAR_POSITIONAL, E.VAR_KEYWORD)
               for p in target.parameters.values() if p.name not in taken)


def test_every_pass_through_runs_a_method_with_the_row_s_signature(plain_engine):
    made = passthroughs(Engine)
    assert len(made) >= 30, sorted(made)                 # the facade of live sandboxes, refs, tenancy, secrets
    assert not passthrough_drifts(plain_engine), "\n".join(passthrough_drifts(plain_engine))


def test_a_planted_pass_through_drift_is_caught(plain_engine):
    class Part:
        def stop(self, sid, grace=5):                    # an internal extra, with its default: fine
            return sid, grace

        def port_url(self, sid, port, *, ttl=60.0):      # the row's ttl default is another: a drift
            return ttl

        def commit(self, sid, now):                      # needs what the row never passes: a drift
            return sid

    class Planted:
        part = Part()
        sandbox_stop = through("part", "stop")
        sandbox_port_url = through("part", "port_url")
        sandbox_commit = through("part", "commit")

    assert Planted().sandbox_stop("s1") == ("s1", 5)      # the call reaches the part
    with pytest.raises(TypeError):
        Planted().sandbox_stop("s1", grace=1)             # the row names no grace: refused, not passed on
    assert Planted().sandbox_port_url("s1", 80) == table.OPS["sandbox_port_url"].signature.parameters["ttl"].default
    assert inspect.signature(Planted.sandbox_stop).parameters.keys() == {"self", "sid"}
    found = passthrough_drifts(Planted(), Planted)
    assert [f.split(" ")[0] for f in found] == ["sandbox_commit", "sandbox_port_url"], found
    with pytest.raises((TypeError, RuntimeError)) as typo:    # 3.11 wraps __set_name__'s error in a RuntimeError
        type("Typo", (), {"sandbox_stpo": through("part", "stop")})
    assert "no table row named 'sandbox_stpo'" in str(typo.value.__cause__ or typo.value)


@pytest.mark.parametrize("cls", [Operations, TenantOperations, RemoteOperations], ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", sorted(table.OPERATIONS_OPS))
def test_operations_signature_is_the_table_s(cls, name):
    row = table.OPERATIONS_OPS[name]
    assert hasattr(cls, name), f"{cls.__name__} has no {name}"
    assert shape(getattr(cls, name)) == shape(row.signature), \
        f"{cls.__name__}.{name}{inspect.signature(getattr(cls, name))} is not the table's {name}{row.signature}"


def test_every_http_binding_is_a_server_route(tmp_path):
    from sandtree.http.server import build_app
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        paths = build_app(eng).openapi()["paths"]
    finally:
        eng.close()
    routes = {(m.upper(), re.sub(r"\{[^}]*\}", "{}", p)) for p, ms in paths.items() for m in ms}
    missing = [(row.name, row.http.method, row.http.path) for row in table.OPS.values() if row.http is not None
               and (row.http.method, re.sub(r"\{[^}]*\}", "{}", "/api/v1" + row.http.path)) not in routes]
    assert not missing, missing


def test_every_argument_has_a_place_in_its_http_binding():
    """A row's HTTP binding names each argument (path, query, body, content or dropped): the remote
    client could not send one it does not (checked here, not at import: the table stays declarations)."""
    for row in table.OPS.values():
        h = row.http
        if h is None or row.custom_remote:
            continue
        named = set(h.query) | set(h.body) | {h.content, h.whole_body} | set(h.drop)
        named |= {seg.split("}")[0].split(":")[0] for seg in h.path.split("{")[1:]}
        lost = [p.name for p in row.signature.parameters.values() if p.kind is not p.VAR_KEYWORD and p.name not in named]
        assert not lost, f"{row.name}: argument(s) {lost} have no place in its HTTP binding"


def test_rows_are_complete():
    """Every row says its scope or that it is admin-only, and either binds to HTTP or says why not."""
    for row in table.OPS.values():
        assert row.doc, row.name
        assert (row.http is None) != (row.local is None), f"{row.name}: an HTTP binding or a reason it has none"
        assert row.scope in (None, "list", "run", "import", "tag", "cancel"), row.name
        assert row.scope is not None or row.admin or row.name in ("whoami", "doctor", "audit", "registry_host"), row.name


def test_every_mcp_parameter_is_described(tmp_path):
    """A model reads each tool parameter's description (issue 13: 0 of 106 had one)."""
    import asyncio

    from sandtree.mcp.server import build_server
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        tools = asyncio.run(build_server(eng, tools="all").list_tools())
    finally:
        eng.close()
    bare = [(t.name, p) for t in tools for p, s in t.input_schema.get("properties", {}).items()
            if not s.get("description")]
    assert len(tools) >= 35 and not bare, bare


def test_a_parameter_without_a_description_is_refused():
    from sandtree.mcp.server import described

    def tool(image: str, frobnicate: int = 1) -> dict:
        """A tool."""
    with pytest.raises(AssertionError, match="frobnicate"):
        described(tool)


def test_run_options_are_declared_once():
    """run, sandbox_start and the pools take the shared options from RunOptions (table/options.py), with its
    defaults; fork's and submit_run's **options are run's."""
    names = table.RunOptions.names()
    assert len(names) == 17
    for n in ("run", "sandbox_start"):
        assert table.OPS[n].options == names, n
    for n in ("pool_create", "pool_and_wait"):
        assert set(table.OPS[n].options) == set(table.RunOptions.LIMITS), n
    for n in ("fork", "operations.submit_run"):
        assert {p.name for p in table.OPS[n].keyword_options()} >= set(names), n
    defaults = table.RunOptions()
    for n in names:
        assert table.OPS["run"].signature.parameters[n].default == getattr(defaults, n), n


def test_a_keyword_only_parameter_s_order_is_not_a_drift_but_its_default_is():
    def a(x, *, p=1, q=2): ...
    def b(x, *, q=2, p=1): ...
    def c(x, *, q=2, p=3): ...
    assert shape(a) == shape(b) and shape(a) != shape(c)


def test_via_declares_a_surface_s_override_or_absence_beside_the_row():
    """Above or below @op, via() records a surface's override (or Off) on the row; every row reaches every
    derived surface unless it says Off (REST also needs an HTTP binding)."""
    from sandtree.table import rows

    @rows.via("cli", "above")
    @rows.op("list", http=rows.Http("GET", "/planted"))
    @rows.via("mcp", rows.Off("no tool"))
    def planted_row(x: int) -> int:
        """A planted row."""
    try:
        row = rows.OPS["planted_row"]
        assert row.override("cli") == "above" and row.on("cli")
        assert not row.on("mcp") and row.override("mcp") is None
        assert row.on("rest") and row.on("sdk")
    finally:
        del rows.OPS["planted_row"]
    assert not table.OPS["bootstrap"].on("rest")          # no HTTP binding: not on REST
