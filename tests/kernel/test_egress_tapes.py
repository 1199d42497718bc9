"""Egress tapes (design.md, "Egress tapes"): a run records what it fetched through the egress path,
and the same run replayed from the tape, with the test-made internet gone, gives the same stdout,
exit code and image every time.

Real things only: the store's real egress daemon, whose upstream is a netlab internet made here
(tests/netlab.py: HTTP and HTTPS with the lab's CA on several names, a redirect, chunked and gzip
bodies, DNS, a TCP echo); real runs of a busybox image with a static OpenSSL client (tlsget)
trusting the image's bundle, to which the link's CA is added as for secrets. Every packet stays
in namespaces this test made. The daemon is stopped at teardown."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess

import pytest

import sandtree
from netlab import NetLab
from sandtree.engine import Engine
from sandtree.errors import InvalidInput, NotFound, TapeMiss
from sandtree.network.client import Egress
from sandtree.network.policy import Grant
from sandtree.tenancy import Tenant

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nft")

SECRET = "tape-REAL-secret-9c41f7e2"
POLICY = ["allowed.test", "www.allowed.test", "other.test", "11.1.1.10:7"]
# HTTPS on two names (a redirect from one to the other followed by hand), chunked and gzip bodies, a
# DNS-only lookup, plain HTTP on another host, one TCP exchange with the echo port; a file written
# from what came back (the image).
SCRIPT = r"""
nslookup other.test 2>&1 | grep -c 11.1.1.11
tlsget 11.1.1.10 443 allowed.test /tls-one; echo; echo --
loc=$(tlsget 11.1.1.10 443 allowed.test /redirect | sed -n 's/^Location: https:\/\/\([^/]*\)\(.*\)/\1 \2/p' | tr -d '\r')
echo "redirect: $loc"
tlsget 11.1.1.10 443 $loc; echo; echo --
tlsget 11.1.1.10 443 allowed.test /chunked; echo; echo --
tlsget 11.1.1.10 443 allowed.test /gzip | md5sum
printf 'GET /plain HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n' | nc -w 5 11.1.1.11 80; echo; echo --
printf 'ping-over-tcp\n' | nc -w 2 11.1.1.10 7
tlsget 11.1.1.10 443 allowed.test /tls-one | md5sum > /fetched
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    lab = NetLab()
    root_dir = tmp_path_factory.mktemp("tapes-root")
    from test_secret_store import make_tls_rootfs
    root = make_tls_rootfs(root_dir, lab.ca_file)
    e = Engine(str(tmp_path_factory.mktemp("tapes") / "st"), warm=0)
    e._egress = Egress(e.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                       upstream_ca=lab.ca_file)
    img = e.import_path(root)
    state = {"lab": lab}
    try:
        yield e, img, state
    finally:
        e._egress.stop_daemon()
        e.close()
        if state["lab"] is not None:
            state["lab"].close()


@pytest.fixture(scope="module")
def recorded(world):
    e, img, state = world
    before = dict(state["lab"].hits)
    rec = e.run(img, ["sh", "-c", SCRIPT], network=POLICY, record=True)
    assert rec.exit_code == 0, rec.stderr
    assert state["lab"].hits != before                   # (recording went out)
    return rec


def test_a_recorded_run_keeps_every_exchange(world, recorded):
    e, img, _ = world
    out = recorded.stdout.decode("latin-1")
    assert out.startswith("1\n")                                     # the DNS-only lookup answered
    assert '"path": "/tls-one"' in out and "redirect: www.allowed.test /final" in out
    assert '"path": "/final"' in out and "6\r\nchunk-\r\n3\r\none" in out and '"path": "/plain"' in out
    assert "ping-over-tcp" in out
    tid = recorded.usage["tape"]
    shown = e.tape_show(tid)
    assert shown["op"] == recorded.op
    rows = {(r["kind"], r["host"], r["method"], r["path"]) for r in shown["exchanges"]}
    for want in [("https", "allowed.test", "GET", "/tls-one"), ("https", "allowed.test", "GET", "/redirect"),
                 ("https", "www.allowed.test", "GET", "/final"), ("https", "allowed.test", "GET", "/chunked"),
                 ("https", "allowed.test", "GET", "/gzip"), ("http", "other.test", "GET", "/plain"),
                 ("tcp", "11.1.1.10", "", ":7"), ("dns", "other.test", "A", "")]:
        assert want in rows, want
    redirect = next(r for r in shown["exchanges"] if r["path"] == "/redirect")
    assert redirect["status"] == 302
    gz = next(r for r in shown["exchanges"] if r["path"] == "/gzip")
    assert gz["status"] == 200 and gz["response_bytes"] > 0
    # in the record and the lineage edge's operation (trace export reads the record's usage)
    assert e.store.db.one("SELECT outcome FROM operations WHERE id=?", (recorded.op,))[0].count(tid) == 1
    assert any(edge.get("tape") == tid for edge in e.parents(recorded.image))
    assert e.store.blobs.has(tid)                              # the tape is a blob named by its ID
    from sandtree.exploration.traces import trace_rows
    row = next(r for r in trace_rows(e, img) if r["image"] == recorded.image)
    assert json.loads(row["usage"])["tape"] == tid               # trace export's rows name it


def test_the_sdks_show_a_tape(world, recorded):
    e, _, _ = world
    tid = recorded.usage["tape"]
    with sandtree.Sandtree(e.store.home, warm=0) as st:
        assert st.tape(tid[:12])["id"] == tid                   # (a unique prefix names it)

    async def show():
        async with sandtree.AsyncSandtree(e.store.home, warm=0) as ast:
            return await ast.tape(tid)
    assert asyncio.run(show())["exchanges"] == e.tape_show(tid)["exchanges"]


@pytest.mark.parametrize("kw", [{"record": "yes", "network": POLICY}, {"replay": 42, "network": POLICY},
                                {"replay": {"tape": "ab" * 32, "bogus": 1}, "network": POLICY},
                                {"replay": {"tape": "ab" * 32, "ignore_headers": "x"}, "network": POLICY},
                                {"record": True}, {"replay": "0123456789abcdef", "network": POLICY}])
def test_bad_tape_options_are_typed_errors_and_change_nothing(world, kw):
    e, img, _ = world
    ops = e.store.db.one("SELECT count(*) FROM operations")[0]
    with pytest.raises((InvalidInput, NotFound)):
        e.run(img, ["true"], **kw)
    assert e.store.db.one("SELECT count(*) FROM operations")[0] == ops
    left = os.path.join(e.store.home, "network", "tapes")
    assert not os.path.isdir(left) or not [f for f in os.listdir(left) if f.startswith("replay-")]


def test_a_request_not_on_the_tape_fails_naming_it(world, recorded):
    e, img, state = world
    hits = sum(state["lab"].hits.values())
    with pytest.raises(TapeMiss) as err:
        e.run(img, ["sh", "-c", SCRIPT + "tlsget 11.1.1.10 443 allowed.test /not-recorded\n"],
              network=POLICY, replay=recorded.usage["tape"])
    assert "GET https://allowed.test/not-recorded" in err.value.message
    assert err.value.details["missed"] == ["GET https://allowed.test/not-recorded"]
    assert sum(state["lab"].hits.values()) == hits                 # nothing went out


def test_replay_or_record_extends_the_tape(world, recorded):
    e, img, state = world
    old = recorded.usage["tape"]
    script = SCRIPT + "tlsget 11.1.1.10 443 allowed.test /later; echo\n"
    hits = dict(state["lab"].hits)
    rec = e.run(img, ["sh", "-c", script], network=POLICY, record=True, replay=old)
    assert rec.exit_code == 0 and b'"path": "/later"' in rec.stdout
    new = rec.usage["tape"]
    assert new != old
    grown = state["lab"].hits
    assert grown[("11.1.1.10", 443)] == hits[("11.1.1.10", 443)] + 1      # only the miss went out
    shown = e.tape_show(new)
    assert shown["parent"] == old
    paths = [r["path"] for r in shown["exchanges"]]
    assert "/later" in paths and "/tls-one" in paths
    state["extended"] = (new, script, rec.stdout)


def test_no_secret_value_reaches_the_store(world, recorded):
    e, img, _ = world
    script = "tlsget 11.1.1.10 443 allowed.test /with-secret; echo\n"
    rec = e.run(img, ["sh", "-c", script], network=POLICY, record=True,
                secrets={"TOKEN": {"value": SECRET, "hosts": ["allowed.test"]}})
    assert rec.exit_code == 0 and b"/with-secret" in rec.stdout
    assert SECRET.encode() not in rec.stdout                    # (masked in the echo, as without a tape)
    found = subprocess.run(["grep", "-rl", "-a", SECRET, e.store.home], capture_output=True, text=True)
    assert found.stdout == "", found.stdout
    tape = e.tape_show(rec.usage["tape"])
    assert [r["path"] for r in tape["exchanges"] if r["kind"] == "https"] == ["/with-secret"]
    with e.store.blobs.open(rec.usage["tape"]) as f:
        assert b"sandtree-secret-TOKEN" in f.read()             # the placeholder, spelled the same every run
    # and it replays with a new placeholder
    again = e.run(img, ["sh", "-c", script], network=POLICY, replay=rec.usage["tape"],
                  secrets={"TOKEN": {"value": SECRET, "hosts": ["allowed.test"]}})
    assert again.stdout == rec.stdout


def test_another_tenant_can_neither_show_nor_replay_a_tape(world, recorded):
    e, img, _ = world
    grant = Grant.parse(POLICY)
    alice = e.as_tenant(Tenant("alice", token="t-alice", network=grant))
    bob = e.as_tenant(Tenant("bob", token="t-bob", network=grant))
    e.tenancy.share(img)                                     # (the operator's image, visible to both)
    rec = alice.run(img, ["sh", "-c", "tlsget 11.1.1.10 443 allowed.test /alice; echo"], network=POLICY,
                    record=True)
    tid = rec.usage["tape"]
    assert alice.tape_show(tid)["exchanges"]
    with pytest.raises(NotFound):
        bob.tape_show(tid)
    with pytest.raises(NotFound):
        bob.run(img, ["true"], network=POLICY, replay=tid)
    with pytest.raises(NotFound):
        alice.tape_show(recorded.usage["tape"])                 # the operator's tape is not alice's


LIVE = "tlsget 11.1.1.10 443 allowed.test /live; echo; printf 'live-tcp\\n' | nc -w 2 11.1.1.10 7"


def test_a_live_sandbox_records_until_it_stops(world, recorded):
    e, img, state = world
    info = e.sandbox_start(img, network=POLICY, record=True)
    try:
        first = e.sandbox_exec(info["id"], ["sh", "-c", LIVE])
        assert first.exit_code == 0 and b'"path": "/live"' in first.stdout and b"live-tcp" in first.stdout
    finally:
        stopped = e.sandbox_stop(info["id"])
    tid = stopped["tape"]
    assert e.tape_show(tid)["op"] == info["id"]
    state["live"] = (tid, first.stdout)


def test_gc_keeps_the_tapes_records_name(world, recorded):
    e, img, _ = world
    e.tag(img, "tapes-base")
    e.gc(retention=0, grace=0)
    shown = e.tape_show(recorded.usage["tape"])            # named by its run's record: kept, bodies too
    assert all(e.store.blobs.has(d) for d in __import__("sandtree.store.tapes", fromlist=["x"]).digests(
        __import__("sandtree.store.tapes", fromlist=["x"]).load(e.store, shown["id"])))


def test_offline_replays_are_identical(world, recorded):
    """Last: the test-made internet is removed first."""
    e, img, state = world
    state["lab"].close()
    state["lab"] = None
    tid = recorded.usage["tape"]
    outs = set()
    for _ in range(10):
        rec = e.run(img, ["sh", "-c", SCRIPT], network=POLICY, replay=tid)
        outs.add((rec.stdout, rec.exit_code, rec.image))
        assert "tape" not in rec.usage                              # a replay alone records nothing new
    assert len(outs) == 1, [o[0][:200] for o in outs]
    stdout, code, image = outs.pop()
    assert (stdout, code) == (recorded.stdout, 0) and image == recorded.image
    if "extended" in state:
        new, script, stdout = state["extended"]
        assert e.run(img, ["sh", "-c", script], network=POLICY, replay=new).stdout == stdout
    if "live" in state:                                          # a live sandbox replays too
        live_tape, stdout = state["live"]
        info = e.sandbox_start(img, network=POLICY, replay=live_tape)
        try:
            assert e.sandbox_exec(info["id"], ["sh", "-c", LIVE]).stdout == stdout
        finally:
            e.sandbox_stop(info["id"])
