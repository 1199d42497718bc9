"""The SDK's suite, run twice: on the in-process engine and over HTTP (`sandtree.connect` to a
real `sandtree serve` on loopback). Same names, same results, same errors."""

from __future__ import annotations

import asyncio
import io
import tarfile
import time

import pytest

import sandtree
from sandtree.runtime import criu




@pytest.fixture(scope="module")
def base(sdk, rootfs):
    return sdk.import_image(rootfs, tag="sdk/base")


def test_run_and_inspect(sdk, base):
    r = base.run("echo hi > /x; printf '\\377' >&2; exit 4", env={"A": "1"})
    assert (r.stdout, r.stderr, r.exit_code) == (b"", b"\xff", 4)
    img = r.image
    assert img.read("/x") == b"hi\n" and img.read("/x", offset=1, limit=1) == b"i"
    assert "x" in [e["name"] for e in img.ls("/")]
    assert img.stat("/x")["size"] == 3
    assert img.grep("hi", "/x")[0]["line"] == 1
    assert base in img.parents() and img in base.children()
    assert img.log()[0]["command"].startswith("echo hi")
    buf = io.BytesIO()
    img.export(buf, "/x")
    buf.seek(0)
    with tarfile.open(fileobj=buf) as t:
        assert t.getnames() == ["x"]
    r = base.run(["cat"], stdin=b"in", cwd="/etc", files=[{"path": "/f", "content": "c"}])
    assert r.stdout == b"in" and r.image.read("/f") == b"c"
    chunks = []
    base.run("echo one; echo two >&2", on_output=lambda s, c: chunks.append((s, c)), disposable=True)
    assert ("stdout", b"one\n") in [(s, c) for s, c in chunks] or any(b"one" in c for s, c in chunks if s == "stdout")


def test_whoami(sdk):
    who = sdk.whoami()
    assert who["tenant"] == "local" and "run" in who["scopes"]
    assert who["limits"]["timeout"] > 0 and who["limits"]["concurrent_runs"] >= 1


def test_same_errors(sdk, base):
    with pytest.raises(sandtree.ImageNotFound):
        sdk.image("no/such:tag")
    with pytest.raises(sandtree.PathEscape):
        base.read("/../etc/passwd")
    with pytest.raises(sandtree.PathNotFound):
        base.read("/nope")
    with pytest.raises(sandtree.InvalidInput):
        base.run("true", timeout=-1)
    with pytest.raises(sandtree.CommandNotFound):
        base.run(["/no/such/binary"])


def test_tags_branches_diff_merge(sdk, base):
    a = base.run("echo a > /a").image.tag("sdk/a")
    assert sdk.image("sdk/a") == a and "sdk/a" in a.tags
    b = base.run("echo b > /b").image
    assert [c["path"] for c in a.diff(b)] == ["/a", "/b"]
    assert "+b" in a.patch(b)
    m = sdk.merge(None, a, b)
    assert m.ok and m.base == base and m.image.read("/a") == b"a\n" and m.image.read("/b") == b"b\n"
    assert sdk.common_ancestor(a, b) == base
    br = sdk.branch("sdk-work", from_=base)
    r = br.run("echo 1 > /one")
    assert br.head == r.image
    assert br.rollback(steps=1) == base
    assert [x["reason"].split()[0] for x in br.log()][:2] == ["create", "run"]
    br.delete()
    assert "sdk-work" not in sdk.branches()


def test_operations(sdk, base):
    op = sdk.submit(base, "sleep 0.2; echo done > /d")
    slow = sdk.submit(base, "sleep 30")
    time.sleep(0.4)
    sdk.cancel(slow)
    got = {r["id"]: r for r in sdk.wait([op, slow], timeout=30)}
    assert got[op]["status"] == "done" and sdk.image(got[op]["result"]).read("/d") == b"done\n"
    assert got[slow]["status"] == "cancelled"


def test_async_twin(sdk, base):
    st = sdk

    async def main():
        a = sandtree.AsyncImage(base)
        results = await asyncio.gather(*(a.run(f"echo {i}") for i in range(3)))
        assert [r.stdout for r in results] == [b"0\n", b"1\n", b"2\n"]
        assert (await a.ls("/etc"))
    asyncio.run(main())
    assert st.image(base.id) == base


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="live sandboxes need root")
def test_live_sandbox(sdk, base):
    if criu.find()[0]:
        with base.start(idle_timeout=60, idle_action="hibernate") as sb:
            assert sb.info()["idle_action"] == "hibernate"
    with pytest.raises(sandtree.InvalidInput):
        base.start(idle_action="pause")
    with base.start(idle_timeout=60) as sb:
        assert sb.exec("cd /tmp; export K=v").ok
        r = sb.exec("pwd; echo $K; echo oops >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr, r.image) == (3, b"/tmp\nv\n", b"oops\n", None)
        assert sb.exec(["cat"], stdin=b"\x00\xffbytes").stdout == b"\x00\xffbytes"
        # output streams while the command runs (over HTTP too: Server-Sent Events), exact bytes
        seen, t0 = [], time.monotonic()
        r = sb.exec("printf 'a\\377'; sleep 0.6; echo b >&2", on_output=lambda n, d: seen.append((n, d, time.monotonic())))
        assert r.stdout == b"a\xff" and r.stderr == b"b\n" and r.exit_code == 0
        assert [(n, d) for n, d, _ in seen] == [("stdout", b"a\xff"), ("stderr", b"b\n")]
        assert seen[0][2] - t0 < 0.5                    # before the command ended
        with pytest.raises(sandtree.CommandNotFound):
            sb.exec(["/nope"], on_output=lambda n, d: None)
        sb.write("/tmp/f", b"\x00binary\xff", mode=0o600)
        assert sb.read("/tmp/f") == b"\x00binary\xff"
        img = sb.commit(tag="sdk/live")
        assert img.read("/tmp/f") == b"\x00binary\xff" and "sdk/live" in img.tags
        assert sb.id in [s.id for s in sdk.sandboxes()]
        assert sdk.sandbox(sb.id[:12]).info()["state"] == "running"
        with pytest.raises(sandtree.CommandNotFound):
            sb.exec(["/nope"])
        with pytest.raises(sandtree.PathNotFound):
            sb.read("/no/such")
        if criu.find()[0]:                  # (the server runs on this machine)
            # a shell variable lives only in the memory of a process that survives hibernation
            assert sb.exec("(n=41; while :; do [ -e /tmp/q ] && { n=$((n+1)); echo $n > /tmp/a; rm /tmp/q; }; "
                           "sleep 0.01; done) >/dev/null 2>&1 &").ok
            assert sb.hibernate()["state"] == "hibernated"
            with pytest.raises(sandtree.Conflict):
                sb.read("/tmp/f")
            assert sb.resume()["state"] == "running"
            assert sb.exec("touch /tmp/q; while [ -e /tmp/q ]; do sleep 0.01; done; cat /tmp/a; pwd").stdout \
                == b"42\n/tmp\n"
    assert sb.state == "stopped"
    with pytest.raises(sandtree.Conflict):
        sb.exec("true")
    with pytest.raises(sandtree.NotFound):
        sdk.sandbox("0123456789ab")


def test_warm_pool(sdk, base):
    """In process the pool is this process's; over HTTP it is the server's (PUT /pools/{image})."""
    stats = sdk.pool(base, size=2, wait=True)
    assert stats["ready"] == 2 and stats["image"] == base.id
    cold = base.run(["sh", "-c", "echo p > /tmp/p"], memory="256M")            # other limits: no pool
    pooled = base.run(["sh", "-c", "echo p > /tmp/p"])
    assert pooled.usage.get("pool") and not cold.usage.get("pool") and pooled.image == cold.image
    assert [p["image"] for p in sdk.pools()] == [base.id]
    assert sdk.pool(base, size=0)["size"] == 0
