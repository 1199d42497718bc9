"""Networked runs start warm (issue 14's start-cost target): the namespaces tier keeps helpers
started ahead inside egress links with nothing allowed (runtime/warm.py, a linked pool); a run
with a policy takes one, the engine sets the link's policy (one round trip), and the run starts
as fast as one without network. What must hold: the policy the run asked for is the one
enforced (not the empty one the helper was born with, nor the previous run's), resolv.conf is
the link's, runs without a policy never get a linked helper (no eth0), runs with secrets start
cold (their placeholders and CA belong to a link from its start), and a closing engine gives
its waiting links back.

Real things only: the engine on a temporary store with its warm pools, the real egress daemon
(root, nft) whose upstream is a netlab internet this test made (tests/netlab.py); no packet
leaves namespaces made here. The daemon is stopped at teardown."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from conftest import make_rootfs
from netlab import NetLab
from sandtree.engine import Engine
from sandtree.network.client import Egress

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nft")


def get(name: str, ip: str) -> str:
    """A GET through the transparent proxy (busybox's nslookup and nc; the Host header names it)."""
    return (f"nslookup {name} >/dev/null 2>&1; printf 'GET /hello HTTP/1.0\\r\\nHost: {name}\\r\\n\\r\\n' "
            f"| nc -w 5 {ip} 80; echo --; ")


@pytest.fixture(scope="module")
def lab():
    lab = NetLab()
    yield lab
    lab.close()


def lab_engine(lab, home: str) -> Engine:
    e = Engine(home, warm=2)
    e._egress = Egress(e.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                       upstream_ca=lab.ca_file)
    return e


@pytest.fixture(scope="module")
def eng(tmp_path_factory, lab):
    e = lab_engine(lab, str(tmp_path_factory.mktemp("netwarm") / "st"))
    yield e
    e._egress.stop_daemon()
    e.close()


@pytest.fixture(scope="module")
def img(eng, tmp_path_factory):
    root = make_rootfs(str(tmp_path_factory.mktemp("netwarm-root") / "root"))
    with open(os.path.join(root, "etc", "resolv.conf"), "w") as f:
        f.write("nameserver 192.0.2.53\n")
    return eng.import_path(root)


def warm_links(eng) -> set[str]:
    return {x["key"] for x in eng.egress.list() if x["key"].startswith("warm-")}


def wait_linked(eng, n: int = 2) -> set[str]:
    """The linked pool's helpers, once n wait (each in a link of the daemon's, nothing allowed)."""
    end = time.monotonic() + 20
    while time.monotonic() < end:
        pool = eng.runtime._linked
        if pool is not None and len(pool.ready) >= n:
            keys = warm_links(eng)
            assert {w.key for w in pool.ready} <= keys
            return {w.key for w in pool.ready}
        time.sleep(0.05)
    raise AssertionError("the linked pool did not fill")


def taken_by(eng, monkeypatch) -> list:
    """Record the helpers the runtime hands to runs (None: the run started cold)."""
    seen = []
    real = eng.runtime.take_linked

    def spy(provide, retire, fits=None, layers=()):
        w = real(provide, retire, fits, layers)
        seen.append(w and w.key)
        return w
    monkeypatch.setattr(eng.runtime, "take_linked", spy)
    return seen


def test_a_networked_run_takes_a_linked_helper_and_its_own_policy_holds(eng, img, lab, monkeypatch):
    eng.run(img, "true", network=["allowed.test"], disposable=True)    # the first starts the pool
    waiting = wait_linked(eng)
    seen = taken_by(eng, monkeypatch)
    script = "cat /etc/resolv.conf; ip -4 -o addr show eth0; " + get("allowed.test", "11.1.1.10") + \
        get("other.test", "11.1.1.11")
    rec = eng.run(img, script, network=["allowed.test"], disposable=True)
    out = rec.stdout.decode()
    assert seen and seen[0] in waiting, seen                           # warm, in a link made ahead
    assert "nameserver 192.0.2.53" not in out and "nameserver 100.64." in out, out
    parts = out.split("--")
    assert "200 OK" in parts[0] and "allowed.test" in parts[0], out + rec.stderr.decode()
    assert "200 OK" not in parts[1], out
    net = rec.usage["network"]
    assert net["allowed_hosts"] == ["allowed.test"], net
    assert {r["host"] for r in net["refused_hosts"]} == {"other.test"}, net
    assert seen[0] not in warm_links(eng)                             # its link went with the run
    assert lab.trap_hits() == {}


def test_the_next_run_on_a_linked_helper_has_its_own_policy_not_the_last(eng, img, lab, monkeypatch):
    eng.run(img, "true", network=["allowed.test"], disposable=True)
    wait_linked(eng)
    seen = taken_by(eng, monkeypatch)
    script = get("allowed.test", "11.1.1.10") + get("other.test", "11.1.1.11")
    rec = eng.run(img, script, network=["other.test"], disposable=True)
    parts = rec.stdout.decode().split("--")
    assert seen and seen[0] is not None
    assert "200 OK" not in parts[0] and "200 OK" in parts[1], rec.stdout.decode()
    assert {r["host"] for r in rec.usage["network"]["refused_hosts"]} == {"allowed.test"}


def test_runs_without_a_policy_never_get_a_linked_helper(eng, img, monkeypatch):
    eng.run(img, "true", network=["allowed.test"], disposable=True)
    before = wait_linked(eng)
    seen = taken_by(eng, monkeypatch)
    for _ in range(3):
        rec = eng.run(img, "ip -o link", disposable=True)
        assert b"eth0" not in rec.stdout and b"lo" in rec.stdout
        assert "network" not in rec.usage
    assert seen == [] and before <= warm_links(eng)


def test_a_run_with_secrets_starts_cold_on_a_link_of_its_own(eng, img, monkeypatch):
    eng.run(img, "true", network=["allowed.test"], disposable=True)
    before = wait_linked(eng)
    seen = taken_by(eng, monkeypatch)
    rec = eng.run(img, 'echo "$TOKEN"; test -s /dev/sandtree/ca.pem && echo ca', network=["allowed.test"],
                  secrets={"TOKEN": {"value": "value-never-seen-7d1", "hosts": ["allowed.test"]}},
                  disposable=True)
    out = rec.stdout.decode()
    assert "value-never-seen-7d1" not in out and "ca" in out, out
    assert seen == [] and before <= warm_links(eng)


def test_a_closing_engine_gives_its_waiting_links_back(lab, tmp_path):
    e = lab_engine(lab, str(tmp_path / "st"))
    try:
        image = e.import_path(make_rootfs(str(tmp_path / "root")))
        e.run(image, "true", network=["allowed.test"], disposable=True)
        waiting = wait_linked(e)
        eg = e.egress
        e.close()
        assert not waiting & warm_links_of(eg)
    finally:
        e._egress.stop_daemon()


def warm_links_of(eg: Egress) -> set[str]:
    return {x["key"] for x in eg.list() if x["key"].startswith("warm-")}


def test_a_run_refused_after_taking_a_linked_helper_leaves_the_connection_in_step(eng, img, monkeypatch):
    """A helper taken and then given back unused (the runtime refused the spec) reads its pending
    policy answer first, so the next request of this thread gets its own answer."""
    from sandtree.errors import InvalidInput
    eng.run(img, "true", network=["allowed.test"], disposable=True)
    wait_linked(eng)
    seen = taken_by(eng, monkeypatch)
    real = eng.runtime.run

    def refuse(spec):
        spec.runtime_files = {"/etc/passwd": b"x"}     # a path the runtime refuses (validate_spec)
        return real(spec)
    monkeypatch.setattr(eng.runtime, "run", refuse)
    with pytest.raises(InvalidInput):
        eng.run(img, "true", network=["allowed.test"], disposable=True)
    monkeypatch.undo()
    assert seen and seen[0] not in warm_links(eng)             # given back
    rec = eng.run(img, get("allowed.test", "11.1.1.10"), network=["allowed.test"], disposable=True)
    assert "200 OK" in rec.stdout.decode() and rec.usage["network"]["connections"] == 1
