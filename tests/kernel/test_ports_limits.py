"""Exposed ports cannot exhaust the store's one egress daemon, which every tenant's networked runs
share: caps per sandbox and per tenant (defaults.py; a tenant's max_ports), the daemon's
descriptor limit raised to its hard limit at start, and a reserve of descriptors per link (a new
exposure is refused, typed, rather than starving the connections of existing links).

Real things only: live sandboxes, the store's real daemon, `sandtree serve`'s app on loopback
(served.py) and a test-made internet (netlab.py) for the networked run, so nothing leaves
namespaces the test made."""

from __future__ import annotations

import contextlib
import os
import resource

import httpx
import pytest

from sandtree import defaults as D
from sandtree.engine import Engine
from sandtree.errors import LimitExceeded, SandtreeError
from sandtree.network.client import Egress

from conftest import make_rootfs
from served import serving
from test_ports import tenants, world  # noqa: F401 - the fixtures: a store, alice's and bob's tokens


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_exposing_past_a_sandboxs_cap_is_refused_and_changes_nothing(tenants):
    eng, sid, alice, _ = tenants
    with serving(eng) as srv, httpx.Client(trust_env=False, timeout=60, headers=_auth(alice)) as c:
        def expose(port: int) -> httpx.Response:
            return c.post(f"{srv.api}/api/v1/sandboxes/{sid}/ports/{port}")
        for port in range(8000, 8000 + D.SANDBOX_PORTS):
            assert expose(port).status_code == 201, port
        before = c.get(f"{srv.api}/api/v1/sandboxes/{sid}/ports").json()
        daemon = [l["ports"] for l in eng.egress.list() if l["key"] == sid]
        r = expose(9999)
        assert r.status_code == 429 and r.json()["error"] == "limit_exceeded", r.text
        assert "exposed ports" in r.json()["message"]
        assert c.get(f"{srv.api}/api/v1/sandboxes/{sid}/ports").json() == before
        assert [l["ports"] for l in eng.egress.list() if l["key"] == sid] == daemon
        again = expose(8000)                                  # the same port again: no new exposure
        assert again.status_code == 201 and again.json() == before[0]
        assert c.delete(f"{srv.api}/api/v1/sandboxes/{sid}/ports/8000").status_code == 204
        assert expose(9999).status_code == 201               # room again after an unexpose
        for _ in range(3):                                    # expose/unexpose cycles leave nothing behind
            assert c.delete(f"{srv.api}/api/v1/sandboxes/{sid}/ports/9999").status_code == 204
            assert expose(9999).status_code == 201
        assert len([p for l in eng.egress.list() if l["key"] == sid for p in l["ports"]]) == D.SANDBOX_PORTS


def test_a_tenants_max_ports_counts_all_its_sandboxes(tenants):
    eng, sid, alice, _ = tenants
    carol = eng.tenancy.create_token("carol", max_ports=3)["token"]
    view = eng.as_tenant(eng.tenancy.authenticate(carol))
    image = eng.sandbox_info(sid)["image"]
    mine = [view.sandbox_start(image)["id"] for _ in range(2)]
    try:
        with serving(eng) as srv, httpx.Client(trust_env=False, timeout=60, headers=_auth(carol)) as c:
            for s, port in ((mine[0], 8000), (mine[0], 8001), (mine[1], 8000)):
                assert c.post(f"{srv.api}/api/v1/sandboxes/{s}/ports/{port}").status_code == 201
            r = c.post(f"{srv.api}/api/v1/sandboxes/{mine[1]}/ports/8001")
            assert r.status_code == 429 and r.json()["error"] == "limit_exceeded" and "max_ports" in r.json()["message"]
            assert [p["port"] for p in view.sandbox_ports(mine[1])] == [8000]
            assert c.post(f"{srv.api}/api/v1/sandboxes/{mine[1]}/ports/8000").status_code == 201   # (the same one)
            view.sandbox_stop(mine[0])                        # a stopped sandbox's ports count no more
            assert c.post(f"{srv.api}/api/v1/sandboxes/{mine[1]}/ports/8001").status_code == 201
        # another tenant's exposures are not carol's: alice exposes on
        assert eng.as_tenant(eng.tenancy.authenticate(alice)).sandbox_expose(sid, 8000)["port"] == 8000
    finally:
        for s in mine:
            with contextlib.suppress(Exception):
                eng.sandbox_stop(s)


# busybox's wget (static) cannot resolve names here: its own nslookup and nc speak for it
FETCH = ("nslookup allowed.test >/dev/null 2>&1; printf 'GET /bytes/200000 HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n' "
         "| nc -w 10 11.1.1.10 80 | wc -c")


def test_exposures_never_starve_another_sandboxs_networked_run(tmp_path):
    """The reported exhaustion: one sandbox without network exposes port after port. The daemon
    started with a shell's soft descriptor limit runs with its hard one; with the soft limit
    then lowered (as a smaller host's would be) the daemon refuses new exposures with
    LimitExceeded before its descriptors run out, and another sandbox's networked run still
    moves its bytes. The upstream is a netlab this test made."""
    from netlab import NetLab
    if os.geteuid() != 0:
        pytest.skip("the egress daemon and the netlab need root")
    lab = NetLab()
    eng = Engine(str(tmp_path / "home"), warm=0)
    eng._egress = Egress(eng.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                         upstream_ca=lab.ca_file)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        root = make_rootfs(str(tmp_path / "root"))
        with open(os.path.join(root, "etc", "resolv.conf"), "w") as f:
            f.write("nameserver 192.0.2.53\n")
        img = eng.import_path(root)
        if hard > 1024:                             # the daemon inherits a shell's soft limit
            resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        try:
            pid = eng.egress.ping()["pid"]
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert resource.prlimit(pid, resource.RLIMIT_NOFILE) == (hard, hard)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (400, hard))
        networked = eng.sandbox_start(img, network={"allow_out": ["allowed.test"]})["id"]
        bare = eng.sandbox_start(img)["id"]
        eng.sandbox_expose(bare, 1)                 # its link, by adopt
        key, refused = bare, None
        for port in range(2, 1000):                 # past the engine's cap: the daemon's own answer
            try:
                eng.egress.expose(key, port)
            except SandtreeError as exc:
                refused = exc
                break
        assert isinstance(refused, LimitExceeded), refused
        assert "file descriptors" in refused.message and port > 100, (port, refused.message)
        with pytest.raises(LimitExceeded):
            eng.egress.expose(key, 5000)
        out = eng.sandbox_exec(networked, FETCH)
        assert out.stdout.decode().strip().isdigit() and int(out.stdout.decode().strip()) > 200000, out
        assert eng.egress.ping()["pid"] == pid      # (the same daemon, still answering)
    finally:
        for s in eng.sandbox_list():
            with contextlib.suppress(Exception):
                eng.sandbox_stop(s["id"])
        eng.egress.stop_daemon()
        eng.close()
        lab.close()
