"""A live fork of a sandbox that has a network policy (issue 38, deliverable 3): each child gets a
link of its own with the source's policy and secrets (the same placeholders, which its restored
processes hold, and the same CA, which they trust: the egress daemon's attach_like) and a new
address; a policy given later is given again, on each child's own namespace; the source keeps
its link and its exposed ports, the children have none; gVisor refuses, as for a hibernation.

Real things only: real CRIU, the store's real egress daemon (started here with a short GC grace,
so a test can see GC leave the children's links alone), whose upstream is a netlab internet this
test made (tests/netlab.py): every packet stays in namespaces made here or on loopback. The
daemon is stopped at teardown."""

from __future__ import annotations

import os
import time

import httpx
import pytest

import sandtree
from conftest import tier_or_skip
from sandtree.errors import Conflict, RuntimeUnavailable

SECRET = "f0rked-s3cret-value-5be2c9"
TLS = "tlsget 11.1.1.10 443 allowed.test /s"        # through the link's CA (tests/e2e/test_secret_store.py)
# the networked world hibernation's tests run in: a netlab internet, the store's daemon with a short
# GC grace (so a test can see GC leave the children's links alone), a busybox image serving MEMVAL
from test_network_hibernate import GRACE, SERVE, get, world  # noqa: E402,F401 (world: a fixture)


def _links(st) -> dict:
    return {entry["key"]: entry for entry in st.engine.egress.list()}


def _netns(st, sid: str) -> int:
    h = st.engine.sandboxes._row(sid)["handle"]
    return os.stat(f"/proc/{h.init_pid}/ns/net").st_ino


def _reach(sb) -> tuple[str, str]:
    out = sb.exec(get("allowed.test", "11.1.1.10") + get("other.test", "11.1.1.11")).stdout.decode()
    allowed, other = out.split("--", 1)
    return allowed, other


def _address(sb) -> str:
    out = sb.exec("ip -4 -o addr show eth0").stdout.decode()
    return out.split(" inet ")[1].split("/")[0]


def _sent(sb, lab) -> tuple[str, bytes]:
    """(the Authorization the test server got from `sb`'s request, what the sandbox read back)."""
    n = len(lab.requests)
    r = sb.exec(TLS)
    assert r.ok, r.stdout + r.stderr
    got = [q["headers"].get("authorization") for q in lab.requests[n:] if q["headers"].get("host") == "allowed.test"]
    assert len(got) == 1, lab.requests[n:]
    return got[0], r.stdout


def _get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=10, trust_env=False)


def test_children_of_a_source_with_a_secret(world):
    """Each child: the source's placeholder and CA (its processes' own), the value put in place by
    its own link (the server sees it, the child never), the policy enforced, an address of its
    own; the source goes on; stopping a child releases its link alone."""
    st, img, lab, home = world
    sb = img.start(network=["allowed.test"], idle_timeout=300, lifetime=600,
                   secrets={"TOKEN": {"value": SECRET, "hosts": ["allowed.test"]}})
    kids = []
    try:
        assert sb.exec(SERVE).ok
        mem = sb.exec("nc 127.0.0.1 7000 </dev/null").stdout
        assert mem.startswith(b"mem=") and len(mem) > 10, mem
        placeholder = sb.exec("echo $TOKEN").stdout
        assert placeholder.startswith(b"sandtree-secret-TOKEN-")
        ca = sb.exec("cat /dev/sandtree/ca.pem").stdout
        assert b"BEGIN CERTIFICATE" in ca
        assert _sent(sb, lab)[0] == f"Bearer {SECRET}"
        addr = _address(sb)
        before = set(_links(st))

        t0 = time.monotonic()
        kids = sb.fork(2)
        took = time.monotonic() - t0
        print(f"\nfork(2) in a link with a secret: stall {kids[0].info()['forked_from']['stall_ms']} ms, "
              f"{took * 1000:.0f} ms in all")
        assert len(kids) == 2
        links = _links(st)
        assert set(links) == before | {k.id for k in kids}      # one link each, nothing else made
        time.sleep(GRACE + 2 * 2 + 0.5)            # past the grace and two GC sweeps: the children are in them
        assert set(_links(st)) == set(links)
        addresses = {addr}
        for k in kids:
            info = k.info()
            assert info["network"] == {"allow_out": ["allowed.test"]}
            assert info["forked_from"]["sandbox"] == sb.id
            assert _netns(st, k.id) not in (_netns(st, sb.id), os.stat("/proc/self/ns/net").st_ino)
            assert links[k.id]["address"] == _address(k) and links[k.id]["held"] is False
            addresses.add(_address(k))
            # the processes' own state, the placeholder and CA they hold
            assert k.exec("nc 127.0.0.1 7000 </dev/null").stdout == mem
            assert k.exec("echo $TOKEN").stdout == placeholder
            assert k.exec("cat /dev/sandtree/ca.pem").stdout == ca
            env = k.exec("cat /proc/[0-9]*/environ").stdout
            assert placeholder.strip() in env and SECRET.encode() not in env
            # its link puts the value in (the server sees it), the child reads back only the placeholder
            auth, seen = _sent(k, lab)
            assert auth == f"Bearer {SECRET}"
            assert SECRET.encode() not in seen
            allowed, other = _reach(k)
            assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
            # counted on its own link, DNS included (its resolv.conf names the source's gateway: the
            # router sends every DNS packet to the resolver at the link's own)
            usage = st.engine.egress.usage(k.id)
            assert usage["connections"] >= 2 and usage["refused"] >= 1 and usage["dns_queries"] >= 2, usage
        assert len(addresses) == 3, addresses                  # the source's and one of each child's own
        # root in a child holds no capability over its link, as after a start
        r = kids[0].exec("ip route del default; echo rc=$?; ip link set eth0 down; echo rc=$?; ip route")
        assert r.stdout.count(b"rc=0") == 0 and b"default via 100.64." in r.stdout, r.stdout + r.stderr

        # the source goes on in its own link, as it was
        assert _address(sb) == addr
        assert _sent(sb, lab)[0] == f"Bearer {SECRET}"
        allowed, other = _reach(sb)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)

        # a child stopped: its link alone goes
        kids[0].stop()
        assert set(_links(st)) == set(links) - {kids[0].id}
        assert _sent(kids[1], lab)[0] == f"Bearer {SECRET}" and _sent(sb, lab)[0] == f"Bearer {SECRET}"
        # a child forks in turn: the copy of a copy
        [grandchild] = kids[1].fork()
        assert grandchild.exec("echo $TOKEN").stdout == placeholder
        assert _sent(grandchild, lab)[0] == f"Bearer {SECRET}"
        assert _address(grandchild) not in addresses
        grandchild.stop()
    finally:
        for s in (sb, *kids):
            s.stop()
    left = set(_links(st))
    assert not left & {sb.id, *(k.id for k in kids)}, left


def test_a_policy_change_in_a_child_is_its_own(world):
    """A child's link is a copy, not the source's: replacing the policy of one leaves the other's."""
    st, img, lab, home = world
    sb = img.start(network=["allowed.test"], idle_timeout=300, lifetime=600)
    kid = None
    try:
        [kid] = sb.fork()
        kid.set_network(["other.test"])
        allowed, other = _reach(kid)
        assert "200 OK" not in allowed and "200 OK" in other, (allowed, other)
        allowed, other = _reach(sb)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
        assert sb.info()["network"] == {"allow_out": ["allowed.test"]}
    finally:
        if kid is not None:
            kid.stop()
        sb.stop()


def test_exposed_ports_stay_the_sources(world):
    """The source's exposed port answers after the fork on the same host port; a child has none
    (it may expose its own)."""
    st, img, lab, home = world
    sb = img.start(network=["allowed.test"], idle_timeout=300, lifetime=600)
    kid = None
    try:
        assert sb.exec(SERVE).ok
        entry = sb.expose(8000)
        assert _get(entry["url"] + "/index.html").text == "hello from the sandbox\n"
        [kid] = sb.fork()
        assert sb.ports() == [entry]
        assert _get(entry["url"] + "/index.html").text == "hello from the sandbox\n"
        assert kid.ports() == []
        own = kid.expose(8000)                 # its listener restored, its own exposure
        assert own["url"] != entry["url"]
        assert _get(own["url"] + "/index.html").text == "hello from the sandbox\n"
    finally:
        if kid is not None:
            kid.stop()
        sb.stop()


def test_a_policy_given_later(world):
    """A sandbox started offline and given a policy since: the source's veth is released for the
    dump and given back (its exposed port answers again), each child is given the policy on its own
    namespace, with an address of its own."""
    st, img, lab, home = world
    sb = img.start(idle_timeout=300, lifetime=600)
    kids = []
    try:
        assert sb.exec(SERVE).ok
        mem = sb.exec("nc 127.0.0.1 7000 </dev/null").stdout
        entry = sb.expose(8000)
        assert sb.set_network(["allowed.test"])["network"] == {"allow_out": ["allowed.test"]}
        allowed, other = _reach(sb)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
        addr = _address(sb)
        before = set(_links(st))

        t0 = time.monotonic()
        kids = sb.fork(2)
        took = time.monotonic() - t0
        print(f"\nfork(2) with a policy given later: stall {kids[0].info()['forked_from']['stall_ms']} ms, "
              f"{took * 1000:.0f} ms in all")
        links = _links(st)
        assert set(links) == before | {k.id for k in kids}
        addresses = {addr}
        for k in kids:
            assert k.info()["network"] == {"allow_out": ["allowed.test"]}
            assert k.exec("nc 127.0.0.1 7000 </dev/null").stdout == mem
            allowed, other = _reach(k)
            assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
            assert links[k.id]["adopted"] is True and links[k.id]["address"] == _address(k)
            addresses.add(_address(k))
            assert k.ports() == []
        assert len(addresses) == 3, addresses

        # the source: its policy again on a new veth, its exposed port made again when asked for
        assert sb.info()["network"] == {"allow_out": ["allowed.test"]}
        allowed, other = _reach(sb)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
        [port] = sb.ports()
        assert _get(port["url"] + "/index.html").text == "hello from the sandbox\n"
        assert port["port"] == entry["port"]

        kids[0].stop()
        assert set(_links(st)) == set(links) - {kids[0].id}
        allowed, _ = _reach(kids[1])
        assert "200 OK" in allowed
        # taken away in a child: that child's alone
        kids[1].set_network(None)
        assert "200 OK" not in _reach(kids[1])[0]
        assert "200 OK" in _reach(sb)[0]
    finally:
        for s in (sb, *kids):
            s.stop()


def test_a_child_that_cannot_be_restored_leaves_the_source_and_no_link(world):
    """A listener bound to the source's own address cannot come back on a child's (another): the
    fork fails, the children restored so far are stopped, every child's link is released, and the
    source runs on in its link."""
    st, img, lab, home = world
    sb = img.start(network=["allowed.test"], idle_timeout=300, lifetime=600)
    try:
        assert sb.exec(f"httpd -p {_address(sb)}:9000 -h /www; netstat -tln | grep -q :9000").ok
        ids, links = {s.id for s in st.sandboxes()}, set(_links(st))
        with pytest.raises(sandtree.SandtreeError, match="criu restore failed.*assign requested address"):
            sb.fork(2)
        assert {s.id for s in st.sandboxes()} == ids and set(_links(st)) == links
        allowed, other = _reach(sb)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
        assert sb.exec(f"wget -qO- http://{_address(sb)}:9000/index.html").stdout == b"hello from the sandbox\n"
    finally:
        sb.stop()


def test_a_lost_link_with_secrets_is_refused_without_secrets_forked(world):
    """The daemon restarted since the source started (its link and the secrets' values are gone):
    a source with secrets is refused, nothing started or frozen; one without is forked onto new
    links with its recorded policy. (Last: it stops the daemon.)"""
    st, img, lab, home = world
    plain = img.start(network=["allowed.test"], idle_timeout=300, lifetime=600)
    secret = img.start(network=["allowed.test"], idle_timeout=300, lifetime=600,
                       secrets={"TOKEN": {"value": SECRET, "hosts": ["allowed.test"]}})
    try:
        st.engine.egress.stop_daemon()
        head = secret.info()["head"]
        ids = {s.id for s in st.sandboxes()}
        with pytest.raises(Conflict, match="secrets"):
            secret.fork()
        assert {s.id for s in st.sandboxes()} == ids and secret.info()["head"] == head
        assert secret.exec("echo alive").stdout == b"alive\n"
        [kid] = plain.fork()
        allowed, other = _reach(kid)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
        kid.stop()
    finally:
        plain.stop()
        secret.stop()


def test_a_gvisor_source_with_a_policy_is_refused(world, request):
    """gVisor checkpoints no sandbox on host networking (how it joins a link): refused with the
    reason, nothing committed, no link made, and the source runs on."""
    st, img, lab, home = world
    tier_or_skip(request, st, "gvisor")
    sb = img.start(network=["allowed.test"], idle_timeout=300, lifetime=600, tier="gvisor")
    try:
        assert sb.exec(SERVE).ok
        head, ids, links = sb.info()["head"], {s.id for s in st.sandboxes()}, set(_links(st))
        with pytest.raises(RuntimeUnavailable, match="live fork.*host networking"):
            sb.fork(2)
        assert sb.info()["head"] == head and {s.id for s in st.sandboxes()} == ids
        assert set(_links(st)) == links
        allowed, other = _reach(sb)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
    finally:
        sb.stop()
