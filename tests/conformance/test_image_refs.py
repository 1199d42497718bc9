"""An image argument may be any reference, on every row and for every caller (table/imagerefs.py):
the engine and a tenant's view resolve a row's `images` themselves, after the tenant's scope check,
so no surface resolves before calling. Each read-only row is called with a tag, a prefix and a
branch, and answers exactly as with the image's ID; a tenant's references are only its own."""

import pytest

import sandtree
from sandtree import table
from sandtree.engine import Engine
from sandtree.tenancy import Tenant

from test_tenancy_table import method_of, placeholder_args

# Read-only rows with image arguments (GET over HTTP): safe to call three times over (the exports
# write to a stream the caller gives: their references are the same code path, exercised by the rest).
READS = sorted(k for k, r in table.ENGINE_OPS.items() if r.images and r.http is not None and r.http.method == "GET"
               and not r.admin and k not in ("export_tar", "export_oci"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("refs")
    eng = Engine(str(tmp / "home"), warm=0)
    for name, text in (("a", "one"), ("b", "two")):
        d = tmp / name
        d.mkdir()
        (d / "f.txt").write_text(text)
    alice = eng.as_tenant(Tenant("alice", token="t-alice"))
    a = alice.import_path(str(tmp / "a"), tag="base")
    b = alice.import_path(str(tmp / "b"))
    alice.branch_create("main", b)
    eng_a = eng.import_path(str(tmp / "a"), tag="op-base")
    try:
        yield {"eng": eng, "alice": alice, "bob": eng.as_tenant(Tenant("bob", token="t-bob")), "a": a, "b": b,
               "op_a": eng_a}
    finally:
        eng.close()


def outcome(fn, *a, **k):
    try:
        return ("answer", fn(*a, **k))
    except sandtree.SandtreeError as exc:
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("key", READS)
@pytest.mark.parametrize("who", ["engine", "tenant"])
def test_a_tag_prefix_or_branch_answers_as_the_id(world, key, who):
    caller = world["eng"] if who == "engine" else world["alice"]
    row = table.ENGINE_OPS[key]
    ids = {n: world["a"] for n in row.images}
    by_id = outcome(method_of(caller, key), *placeholder_args(row, **ids)[0], **placeholder_args(row, **ids)[1])
    tag = "op-base" if who == "engine" else "base"     # alice's tags are hers; the operator's are the store's
    for ref in (tag, world["a"][:12], f"tag:{tag}"):
        refs = {n: ref for n in row.images}
        pos, kw = placeholder_args(row, **refs)
        got = outcome(method_of(caller, key), *pos, **kw)
        assert got == by_id, f"{who}.{key}({ref!r}) answered {got!r}, by ID {by_id!r}"
    if who == "tenant":                             # the tenant's branch is a reference too
        heads = {n: world["b"] for n in row.images}
        branch = {n: "main" for n in row.images}
        assert outcome(method_of(caller, key), *placeholder_args(row, **branch)[0], **placeholder_args(row, **branch)[1]) \
            == outcome(method_of(caller, key), *placeholder_args(row, **heads)[0], **placeholder_args(row, **heads)[1])


def test_a_tenant_resolves_only_its_own_names(world):
    bob = world["bob"]
    for ref in ("base", "main", world["a"][:12], "op-base"):
        with pytest.raises(sandtree.ImageNotFound):
            bob.image_info(ref)
    with pytest.raises(sandtree.ImageNotFound):
        world["alice"].image_info("op-base")       # the operator's tag names nothing alice sees
    assert world["eng"].image_info("op-base")["id"] == world["op_a"]


def test_a_token_without_the_scope_learns_nothing_of_a_name(world):
    carol = world["eng"].as_tenant(Tenant("carol", ("list",)))
    with pytest.raises(sandtree.Forbidden):
        carol.tag("no-such-tag", "x")               # Forbidden before the reference is looked at


def test_a_full_id_is_passed_as_it_is(world):
    nowhere = "0" * 64
    with pytest.raises(sandtree.ImageNotFound):
        world["eng"].image_info(nowhere)
