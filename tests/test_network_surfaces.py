"""network= (and secrets=) on the surfaces (issue 14): every surface accepts a policy and records
it (the run's operation spec, so the lineage edge joining it shows it; the sandbox's info), bad
values are typed errors that change nothing, "inherit" takes the policy of the run that made the
image, and real networked runs through the egress daemon reach an allowed netlab server and are
refused for another, with usage counters in the record.

Real things only: the engine on a temporary store, the real egress daemon (root, nft) whose
upstream is a netlab internet this test made (tests/netlab.py); no packet leaves namespaces made
here. The daemon is stopped at teardown."""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest

from conftest import make_rootfs
from netlab import NetLab
from sandtree.client.sdk import Sandtree
from sandtree.engine import Engine
from sandtree.errors import Conflict, InvalidInput, RuntimeUnavailable
from sandtree.network.client import Egress

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nft")
SECRET = "s3cr3t-value-never-stored-9f1c"


@pytest.fixture(scope="module")
def lab():
    if os.geteuid() != 0:
        pytest.skip("the netlab needs root")
    lab = NetLab()
    yield lab
    lab.close()


@pytest.fixture(scope="module")
def eng(tmp_path_factory, lab):
    home = str(tmp_path_factory.mktemp("netsurf"))
    e = Engine(os.path.join(home, "st"), warm=0)
    # the engine's Egress, pointed at the netlab's upstream namespace, DNS and CA
    e._egress = Egress(e.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                       upstream_ca=lab.ca_file)
    yield e
    e._egress.stop_daemon()
    e.close()


@pytest.fixture(scope="module")
def img(eng, tmp_path_factory):
    root = make_rootfs(str(tmp_path_factory.mktemp("netsurf-root") / "root"))
    with open(os.path.join(root, "etc", "resolv.conf"), "w") as f:
        f.write("nameserver 192.0.2.53\n")
    return eng.import_path(root)


def count_ops(eng) -> int:
    return eng.store.db.one("SELECT count(*) FROM operations")[0]


# busybox's wget (static) cannot resolve names here: its own nslookup and nc speak for it; the Host
# header names the destination (the proxy's check), the address is what the resolver answered.
def get(name: str, ip: str) -> str:
    return (f"nslookup {name} >/dev/null 2>&1; printf 'GET /hello HTTP/1.0\\r\\nHost: {name}\\r\\n\\r\\n' "
            f"| nc -w 5 {ip} 80; echo --")


# ---- values and records (no daemon needed for refusals) ----------------------------------------------

@pytest.mark.parametrize("bad", ["exa mple.org", {"allow_out": "x", "bogus": 1}, 42, ["*.*.x:99999"],
                                 ["ok.org:0"]])
def test_bad_policy_values_are_invalid_input_and_change_nothing(eng, img, bad):
    before = count_ops(eng)
    with pytest.raises(InvalidInput):
        eng.run(img, "true", network=bad)
    with pytest.raises(InvalidInput):
        eng.sandbox_start(img, network=bad)
    assert count_ops(eng) == before
    assert eng.sandbox_list() == []


def test_secrets_need_a_policy(eng, img):
    before = count_ops(eng)
    with pytest.raises(InvalidInput, match="network policy"):
        eng.run(img, "true", secrets={"TOKEN": {"value": SECRET, "hosts": ["allowed.test"]}})
    assert count_ops(eng) == before


def test_off_is_hermetic_and_records_no_policy(eng, img):
    rec = eng.run(img, "echo hi > /x", network="off")
    spec = eng.operation(rec.op)["spec"]
    assert "network" not in spec and "hermetic" not in spec
    assert "network" not in rec.usage


# ---- real networked runs ------------------------------------------------------------------------------

def test_gvisor_refuses_a_policy_it_cannot_enforce_with_the_reason(eng, img):
    try:
        eng.tier("gvisor")
    except Exception as exc:
        pytest.skip(f"tier gvisor unavailable: {exc}")
    before = count_ops(eng)
    with pytest.raises(RuntimeUnavailable, match="namespaces tier"):
        eng.run(img, "true", network="all", tier="gvisor")
    assert count_ops(eng) == before


@NEEDS_ROOT
@pytest.mark.parametrize("tier", ["namespaces"])   # gvisor: refused until runsc joins the link (above)
def test_a_run_reaches_an_allowed_server_and_is_refused_another(eng, img, lab, tier):
    script = "echo x > /marker; " + get("allowed.test", "11.1.1.10") + "; " + get("other.test", "11.1.1.11")
    rec = eng.run(img, script, network=["allowed.test"], tier=tier)
    out = rec.stdout.decode()
    assert "allowed.test" in out and "200" in out.split("--")[0], out + rec.stderr.decode()
    assert "200 OK" not in out.split("--", 1)[1], out
    spec = eng.operation(rec.op)["spec"]
    assert spec["network"] == {"allow_out": ["allowed.test"]} and spec["hermetic"] is False
    net = eng.operation(rec.op)["outcome"]["usage"]["network"]
    assert net and any(v for v in net.values() if isinstance(v, int)), net
    # the lineage edge joins its operation, which shows the policy
    edge = next(p for p in eng.parents(rec.image) if p["op"] == rec.op)
    assert edge["network"] == {"allow_out": ["allowed.test"]} and edge["hermetic"] is False
    assert eng.log(rec.image)[0]["network"] == {"allow_out": ["allowed.test"]}
    assert "network" not in eng.log(img)[0]


def test_inherit_takes_the_policy_of_the_run_that_made_the_image(eng, img):
    rec = eng.run(img, "echo a > /a", network=["allowed.test:80"])
    child = eng.run(rec.image, "cat /etc/resolv.conf", network="inherit")
    assert eng.operation(child.op)["spec"]["network"] == {"allow_out": ["allowed.test:80"]}
    assert child.stdout.startswith(b"nameserver 100.64.")
    hermetic = eng.run(img, "echo b > /b")                  # an image no networked run made: off
    off = eng.run(hermetic.image, "cat /etc/resolv.conf", network="inherit")
    assert "network" not in eng.operation(off.op)["spec"] and off.stdout == b"nameserver 192.0.2.53\n"


def test_secrets_are_recorded_by_name_and_hosts_never_the_value(eng, img):
    rec = eng.run(img, "echo $TOKEN; ls /dev/sandtree; echo $SSL_CERT_FILE", network=["allowed.test"],
                  secrets={"TOKEN": {"value": SECRET, "hosts": ["allowed.test"]}})
    out = rec.stdout.decode()
    assert out.startswith("sandtree-secret-TOKEN-") and SECRET not in out
    assert "ca.pem" in out and "/dev/sandtree/ca.pem" in out
    spec = eng.operation(rec.op)["spec"]
    assert spec["secrets"] == {"TOKEN": {"hosts": ["allowed.test"]}}
    for name in os.listdir(eng.store.home):
        path = os.path.join(eng.store.home, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                assert SECRET.encode() not in f.read(), path
    assert SECRET not in str(eng.operation(rec.op))


def test_a_live_sandbox_with_a_policy(eng, img, lab):
    info = eng.sandbox_start(img, network={"allow_out": ["allowed.test"], "deny_out": ["other.test"]})
    try:
        assert info["network"] == {"allow_out": ["allowed.test"], "deny_out": ["other.test"]}
        r = eng.sandbox_exec(info["id"], get("allowed.test", "11.1.1.10"))
        assert b"200" in r.stdout, r.stdout + r.stderr
        with pytest.raises(Conflict, match="network policy"):
            eng.sandbox_hibernate(info["id"])
    finally:
        eng.sandbox_stop(info["id"])
    assert info["id"] not in {l["key"] for l in eng.egress.list()}
    with pytest.raises(Conflict, match="network policy"):
        eng.sandbox_start(img, network="all", idle_action="hibernate")
