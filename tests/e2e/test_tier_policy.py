"""A tier forced per token (issue 18: `sandtree token create --tier gvisor`): every run, fork, build
step and live sandbox of that token runs on gVisor whatever it asks, asking for the host-kernel tier
is refused with 403, and whoami shows the tier. Against a real `sandtree serve` on loopback, through
the SDK and plain REST, and in process (engine.as_tenant)."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import serve_process
from test_tenants import token

import sandtree
from sandtree.engine import Engine
from sandtree.tenancy import Tenant


@pytest.fixture(scope="module")
def world(tmp_path_factory, rootfs):
    home = tmp_path_factory.mktemp("tier-policy")
    toks = {"g": token(home, "g", "--tier", "gvisor"), "n": token(home, "n"),
            "ops": token(home, "ops", "--scopes", "admin")}
    with serve_process(home) as url:
        clients = {k: sandtree.connect(url, token=t["token"]) for k, t in toks.items()}
        tiers = {r["tier"]: r for r in clients["n"].doctor()}
        if not tiers["gvisor"]["available"]:
            pytest.skip(f"tier gvisor unavailable here: {tiers['gvisor']['reason']}")
        base = clients["g"].import_image(rootfs, tag="base")
        clients["n"].import_image(rootfs, tag="base")
        clients["ops"].import_image(rootfs, tag="base")
        yield {"url": url, "home": home, "tokens": toks, "st": clients, "base": base}
        for c in clients.values():
            c.close()


def tier_of(st, op: str) -> str:
    return st.operation(op)["spec"]["tier"]


def test_whoami_and_the_token_list_show_the_tier(world):
    assert world["st"]["g"].whoami()["tier"] == "gvisor"
    assert world["st"]["n"].whoami()["tier"] is None
    assert world["tokens"]["g"]["tier"] == "gvisor"
    from test_tenants import cli
    rows = {r["tenant"]: r for r in json.loads(cli(world["home"], "token", "list", "--json"))}
    assert rows["g"]["tier"] == "gvisor" and rows["n"]["tier"] is None


def test_runs_forks_and_submissions_run_on_gvisor(world):
    g, n = world["st"]["g"], world["st"]["n"]
    rec = g.image("base").run("echo hi > /f; cat /proc/version 2>/dev/null || true")
    assert rec.exit_code == 0 and tier_of(g, rec.operation) == "gvisor"
    assert rec.image.read("/f") == b"hi\n"
    assert tier_of(g, g.image("base").run("true", tier="gvisor").operation) == "gvisor"       # asking for it: fine
    for r in g.image("base").fork(["echo a > /a", "echo b > /b"]):
        assert tier_of(g, r.operation) == "gvisor"
    op = g.submit("base", "true")
    g.wait([op])
    assert tier_of(g, op) == "gvisor"
    assert tier_of(n, n.image("base").run("true").operation) == "namespaces"                  # other tokens: the default


def test_asking_for_the_host_kernel_tier_is_refused(world):
    g = world["st"]["g"]
    with pytest.raises(sandtree.Forbidden, match="only on the gvisor tier"):
        g.image("base").run("true", tier="namespaces")
    with pytest.raises(sandtree.Forbidden):
        g.image("base").fork(["true"], tier="namespaces")
    with pytest.raises(sandtree.Forbidden):
        g.image("base").start(tier="namespaces")
    r = httpx.post(world["url"] + "/api/v1/runs", json={"image": "base", "command": "true", "tier": "namespaces"},
                   headers={"Authorization": f"Bearer {world['tokens']['g']['token']}"}, timeout=30)
    assert r.status_code == 403, r.text
    assert "gvisor" in r.text


def test_live_sandboxes_never_fall_back_to_the_host_kernel(world):
    """A start of a forced tenant is a gVisor start: its sandbox reports the tier and runs on gVisor's
    kernel; asking for the host kernel's is refused and starts nothing."""
    g = world["st"]["g"]
    before = g.sandboxes(all=True)
    with pytest.raises(sandtree.Forbidden, match="only on the gvisor tier"):
        g.image("base").start(tier="namespaces")
    assert g.sandboxes(all=True) == before
    with g.image("base").start() as sb:
        assert sb.info()["tier"] == "gvisor"
        assert b"gVisor" in sb.exec("dmesg 2>/dev/null | head -1").stdout
        assert sb.commit().read("/etc/greeting")


def test_pools_serve_a_forced_tenant_only_from_its_tier(world):
    """An operator's pool of the image on namespaces is never a forced tenant's; one on gVisor is:
    its runs take a started gVisor sandbox (usage `pool`) and record the tier."""
    g, ops = world["st"]["g"], world["st"]["ops"]
    image = world["base"].id
    ops.pool(image, size=1, wait=True, tier="namespaces")
    try:
        rec = g.image("base").run("echo a > /a")
        assert tier_of(g, rec.operation) == "gvisor" and not rec.usage.get("pool")
        stats = ops.pool(image, size=1, wait=True, tier="gvisor")
        assert stats["tier"] == "gvisor" and stats["ready"] == 1
        rec = g.image("base").run("echo b > /b")
        assert rec.usage.get("pool") and tier_of(g, rec.operation) == "gvisor"
        assert rec.image.read("/b") == b"b\n"
    finally:
        ops.pool(image, size=0)


def test_build_steps_run_on_gvisor(world):
    g = world["st"]["g"]
    img = g.recipe("base").run("echo built > /b").build(tag="built")
    assert img.read("/b") == b"built\n"
    ops = [o for o in img.produced_by() if o["kind"] == "run"]
    assert ops and all(tier_of(g, o["op"]) == "gvisor" for o in ops), ops


def test_admin_tokens_and_unknown_tiers_are_refused(tmp_path):
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        with pytest.raises(sandtree.InvalidInput, match="admin"):
            eng.tenancy.create_token("ops", "admin", tier="gvisor")
        with pytest.raises(sandtree.InvalidInput, match="unknown tier"):
            eng.tenancy.create_token("x", tier="firecracker")
        assert eng.tenancy.tokens() == []                                   # nothing was made
    finally:
        eng.close()


def test_in_process_tenant_view(tmp_path, rootfs):
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        g = eng.as_tenant(Tenant("g", tier="gvisor"))
        if not {r["tier"]: r for r in eng.doctor()}["gvisor"]["available"]:
            pytest.skip("tier gvisor unavailable here")
        image = g.import_path(rootfs)
        rec = g.run(image, "true")
        assert eng.operation(rec.op)["spec"]["tier"] == "gvisor"
        with pytest.raises(sandtree.Forbidden):
            g.run(image, "true", tier="namespaces")
        assert g.whoami()["tier"] == "gvisor"
    finally:
        eng.close()


def test_contree_instances_never_fall_back_to_the_host_kernel(world):
    """A /v1 instance (Contree's API; a live run) of a forced token runs on gVisor: its operation
    succeeds with the command's output and records the tier."""
    import time
    import uuid
    h = {"Authorization": f"Bearer {world['tokens']['g']['token']}"}
    r = httpx.post(f"{world['url']}/v1/instances", headers=h, timeout=30,
                   json={"command": "echo hi", "shell": True, "image": str(uuid.UUID(world["base"].id[:32]))})
    assert r.status_code == 201, r.text
    ops = f"{world['url']}/v1/operations/{r.json()['uuid']}"
    end = time.monotonic() + 30
    while (op := httpx.get(ops, headers=h, timeout=30).json())["status"] in ("PENDING", "EXECUTING", "ASSIGNED") \
            and time.monotonic() < end:
        time.sleep(0.05)
    assert op["status"] == "SUCCESS", op
    spec = world["st"]["g"].operation(r.json()["uuid"].replace("-", ""))["spec"]
    assert spec["tier"] == "gvisor", spec