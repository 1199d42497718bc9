"""Issue 12, review of the merged hardening: a tenant may not take more of the host than the
operator allows. Without per-tenant caps a token got any memory, pids, disk and output it asked
(pids=1000000 against a pid_max of 32768; output=4G held in the server; disk=6G of sparse file
written into the store), because the tenant view capped only timeout and output, and only where
the operator had set max_timeout / max_output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import sandtree
from sandtree.engine import Engine
from sandtree.tenancy import Tenant

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (cgroup limits)")

@pytest.fixture
def eng(tmp_path, rootfs):
    e = Engine(str(tmp_path / "home"), warm=0)
    e.import_path(rootfs, tag="x")
    yield e
    e.close()

@pytest.mark.parametrize("key", ["memory", "pids", "disk", "output"])
def test_without_caps_a_tenant_gets_at_most_the_engines_defaults(eng, rootfs, key):
    t = eng.as_tenant(Tenant("t", limits={"max_runs": 1}))
    t.import_path(rootfs, tag="mine")
    default = getattr(eng.default_limits, key)
    with pytest.raises(sandtree.LimitExceeded) as exc:
        t.run("mine", "true", **{key: default * 4})
    assert exc.value.details["limit"] == f"max_{key}"
    rec = t.run("mine", "true", **{key: default})                  # the default itself is fine
    assert t.operation(rec.op)["spec"]["limits"][key] == default
    with pytest.raises(sandtree.LimitExceeded):                    # and a live sandbox likewise
        t.sandbox_start("mine", **{key: default * 4})

def test_an_operator_sets_resource_caps_per_tenant(eng, rootfs):
    eng.tenancy.set_limits("t", max_memory="256M", max_pids=64, max_disk="64M", max_cpus=1)
    t = eng.as_tenant(Tenant("t", limits=eng.tenancy.limits("t")))
    t.import_path(rootfs, tag="mine")
    rec = t.run("mine", "true")                                    # asked nothing: gets the caps
    got = t.operation(rec.op)["spec"]["limits"]
    assert (got["memory"], got["pids"], got["disk"], got["cpus"]) == (256 << 20, 64, 64 << 20, 1)
    for ask in ({"memory": "512M"}, {"pids": 65}, {"disk": "65M"}, {"cpus": 2}):
        with pytest.raises(sandtree.LimitExceeded):
            t.run("mine", "true", **ask)
    assert t.whoami()["limits"]["memory"] == 256 << 20
    # raised above the engine's default, a tenant may ask for more
    eng.tenancy.set_limits("t", max_pids=4096)
    t = eng.as_tenant(Tenant("t", limits=eng.tenancy.limits("t")))
    rec = t.run("mine", "true", pids=2048)
    assert t.operation(rec.op)["spec"]["limits"]["pids"] == 2048

def test_token_cli_sets_resource_caps(tmp_path):
    home = str(tmp_path / "home")
    out = subprocess.run([sys.executable, "-m", "sandtree", "--home", home, "token", "create", "--tenant", "ci",
                          "--max-memory", "512M", "--max-pids", "128", "--max-disk", "100M", "--max-cpus", "0.5",
                          "--json"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["tenant"] == "ci"
    eng = Engine(home, warm=0)
    try:
        assert eng.tenancy.limits("ci") == {"max_memory": 512 << 20, "max_pids": 128, "max_disk": 100 << 20,
                                           "max_cpus": 0.5}
    finally:
        eng.close()


def test_all_sandboxes_together_leave_the_host_pids(eng):
    """Each run stays within its own `pids`, but many at once could take the host's whole pid
    space (pid_max 32768 here): our parent group caps them together at three quarters of it."""
    from sandtree.runtime import cgroups
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    parent = "/sys/fs/cgroup/pids/sandtree" if cgroups.detect() == "v1" else "/sys/fs/cgroup/sandtree"
    with open(os.path.join(parent, "pids.max")) as f:
        got = f.read().strip()
    assert got != "max" and int(got) <= pid_max * 3 // 4, got


def test_a_sparse_file_costs_the_store_what_it_cost_the_run(eng, tmp_path):
    """A run's `truncate -s 900M` costs its tmpfs 4 KiB; committed, it cost the store 900 MB of
    disk (a tenant could fill the store's disk that way at no cost to its own limits)."""
    home = str(tmp_path / "home")

    def used() -> int:
        total = 0
        for d, _, files in os.walk(home):
            for f in files:
                p = os.path.join(d, f)
                if not os.path.islink(p):
                    total += os.lstat(p).st_blocks * 512
        return total
    before = used()
    rec = eng.run("x", ["/bin/sh", "-c", "truncate -s 900M /big && echo tail >> /big"])
    assert rec.exit_code == 0 and rec.image
    grown = used() - before
    assert grown < 64 << 20, f"a 900 MB sparse file took {grown >> 20} MB of the store"
    back = eng.run(rec.image, ["/bin/sh", "-c", "tail -c 5 /big; wc -c < /big"])   # whole, holes read as zeros
    assert back.stdout == b"tail\n" + str((900 << 20) + 5).encode() + b"\n"


def test_a_deep_lineage_is_drawn_without_recursion(eng, rootfs):
    """1,050 runs in a chain (seconds to make) made the lineage tree raise RecursionError in the
    engine and the tenant view alike (one recursive call per generation), and nested JSON that
    deep cannot be encoded: the walk is iterative and nesting is cut at MAX_TREE_DEPTH."""
    from sandtree.branching.lineage import MAX_TREE_DEPTH
    from sandtree.render import render_text
    t = eng.as_tenant(Tenant("t", limits={"max_runs": 1}))
    img = t.import_path(rootfs, tag="mine")
    first = img
    for i in range(1050):
        img = t.run(img, ["/bin/sh", "-c", f"echo {i} > /n"]).image
    for view in (eng, t):
        tree = view.lineage_tree(first)
        depth, n = 0, tree
        while n["children"]:
            n = n["children"][0]
            depth += 1
        assert depth == MAX_TREE_DEPTH and n.get("cut"), (depth, n)
        assert json.loads(json.dumps(tree))["image"] == first
        assert render_text(tree).count("\n") >= MAX_TREE_DEPTH
    assert len(t.log(img, limit=5)) == 5
