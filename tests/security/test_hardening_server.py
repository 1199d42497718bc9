"""Hardening of the server, MCP and engine plumbing (issue 12, items 4, 9, 11, 12, 17, 18).

Each test here failed before its fix; the item number is in the test's docstring.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest
from sandtree.engine import Engine
from sandtree.errors import InvalidInput, MergeConflict

from conftest import free_port, listening, serve_process


# ---- item 11: lazily made engine parts ------------------------------------------------------------
def test_engine_parts_made_once_under_a_thread_barrier(tmp_path):
    """Item 11: 30 threads touching `operations` / `sandboxes` first at once get one instance.
    Repeated on fresh engines: one trial loses the race only most of the time."""
    home = str(tmp_path / "home")
    for trial in range(10):
        engine = Engine(home, warm=0)
        try:
            for part in ("operations", "sandboxes"):
                barrier = threading.Barrier(30)
                seen, lock = [], threading.Lock()

                def touch(part=part, barrier=barrier, seen=seen, lock=lock):
                    barrier.wait()
                    obj = getattr(engine, part)
                    with lock:
                        seen.append(obj)
                threads = [threading.Thread(target=touch) for _ in range(30)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert len(seen) == 30
                distinct = len({id(o) for o in seen})      # all kept alive: ids are distinct objects
                assert distinct == 1, f"trial {trial}: {distinct} {part} instances"
                assert getattr(engine, part) is seen[0]
        finally:
            engine.close()


# ---- item 4: MCP over HTTP ----------------------------------------------------------------------
def _mcp_client(url: str, token: str | None):
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return Client(streamable_http_client(f"{url}/mcp", http_client=create_mcp_http_client(headers=headers)))


def _tool_value(result):
    assert not result.is_error, result.content
    if result.structured_content is not None and "result" in result.structured_content:
        return result.structured_content["result"]
    return json.loads(result.content[0].text)


def test_mcp_http_uses_tokens_and_tenancy(tmp_path, rootfs):
    """Item 4: `sandtree mcp --http` authenticates like `serve`: no token is refused, a tenant's
    token sees only its images, a session is its opener's, and tools reaching the server's own
    filesystem are off over HTTP (an image comes in as an upload instead)."""
    home = str(tmp_path / "home")
    engine = Engine(home, warm=0)
    try:
        tok_a = engine.tenancy.create_token("alice")["token"]
        tok_b = engine.tenancy.create_token("bob")["token"]
        img_a = engine.as_tenant(engine.tenancy.authenticate(tok_a)).import_path(rootfs, tag="mine")
    finally:
        engine.close()
    tar_path = tmp_path / "bb.tar"
    subprocess.run(["tar", "-C", rootfs, "-cf", str(tar_path), "."], check=True)
    secret = tmp_path / "host-secret"
    secret.write_text("only the server's user may read this\n")
    os.chmod(secret, 0o600)
    target = tmp_path / "written-by-mcp"

    with listening(home, "mcp", "--http", "--tools", "all") as url:
        # no token, a wrong one: 401 before any MCP handling
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "t", "version": "0"}}}
        hdrs = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        assert httpx.post(f"{url}/mcp", json=init, headers=hdrs).status_code == 401
        assert httpx.post(f"{url}/mcp", json=init,
                          headers={**hdrs, "Authorization": "Bearer stk_0123456789abcdef_wrongwrongwrongwrongwrong"}
                          ).status_code == 401

        async def refused_without_token():
            async with _mcp_client(url, None) as c:
                await c.list_tools()
        with pytest.raises(BaseException):           # noqa: B017 - the SDK wraps the 401 in groups
            asyncio.run(refused_without_token())

        shared: dict = {}

        async def as_alice():
            async with _mcp_client(url, tok_a) as c:
                imgs = _tool_value(await c.call_tool("list_images", {}))
                assert [i["image"] for i in imgs] == [img_a] and imgs[0]["tags"] == ["mine"]
                who = _tool_value(await c.call_tool("whoami", {}))
                assert who["user"] == "alice" and "store" not in who      # no server path to a caller
                r = _tool_value(await c.call_tool("run", {"command": "cat /etc/greeting", "image": "mine"}))
                assert r["stdout"] == "hello from the image\n"
                # host paths: every such tool refused, nothing read or written
                for tool, args in [("import_image", {"source": "/etc"}),
                                   ("import_image", {"source": str(tar_path)}),
                                   ("upload", {"path": str(secret)}),
                                   ("rsync", {"source": str(tmp_path), "destination": "/w"}),
                                   ("download", {"image": "mine", "path": "/etc/greeting",
                                                 "destination": str(target)})]:
                    res = await c.call_tool(tool, args)
                    assert res.is_error and "forbidden" in res.content[0].text, (tool, res.content)
                assert not target.exists()
                # what an HTTP client does instead: upload the tar's bytes, import the upload
                up = _tool_value(await c.call_tool(
                    "upload", {"content_base64": base64.b64encode(tar_path.read_bytes()).decode()}))
                again = _tool_value(await c.call_tool("import_image", {"source": f"upload:{up['sha256']}",
                                                                       "tag": "again"}))
                assert again["image"] == img_a
                shared["upload"] = up["sha256"]
                text = await c.read_resource(f"sandtree://image/{img_a}/read/etc/greeting")
                assert text.contents[0].text == "hello from the image\n"
                # item 17 over MCP: a conflicted merge fails the call naming the conflicts
                one, two = [_tool_value(await c.call_tool("run", {"command": f"echo {n} > /f", "image": "mine",
                                                                  "disposable": False}))["result_image"]
                            for n in (1, 2)]
                res = await c.call_tool("merge", {"ours": one, "theirs": two, "base": img_a})
                assert res.is_error and "merge_conflict" in res.content[0].text and "/f" in res.content[0].text
                back = _tool_value(await c.call_tool("merge", {"ours": one, "theirs": two, "base": img_a,
                                                               "return_conflicts": True}))
                assert back["image"] is None and back["conflicts"][0]["path"] == "/f"

        async def as_bob():
            async with _mcp_client(url, tok_b) as c:
                assert _tool_value(await c.call_tool("list_images", {})) == []
                # alice's upload is no one else's to import
                res = await c.call_tool("import_image", {"source": f"upload:{shared['upload']}"})
                assert res.is_error and "not_found" in res.content[0].text, res.content
                for tool, args in [("get_image", {"image": img_a}), ("get_image", {"image": "mine"}),
                                   ("read_file", {"image": img_a, "path": "/etc/greeting"}),
                                   ("run", {"command": "true", "image": img_a})]:
                    res = await c.call_tool(tool, args)
                    assert res.is_error and "image_not_found" in res.content[0].text, (tool, res.content)
        asyncio.run(as_alice())
        asyncio.run(as_bob())

        # a session is its opener's: bob presenting alice's session id is answered as unknown
        r = httpx.post(f"{url}/mcp", json=init, headers={**hdrs, "Authorization": f"Bearer {tok_a}"})
        assert r.status_code == 200, r.text
        sid = r.headers.get("mcp-session-id")
        assert sid, r.headers
        if sid:
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            own = {**hdrs, "Authorization": f"Bearer {tok_a}", "mcp-session-id": sid,
                   "mcp-protocol-version": "2025-06-18"}
            assert httpx.post(f"{url}/mcp", json=note, headers=own).status_code in (200, 202)
            assert httpx.post(f"{url}/mcp", json=listing, headers={**own, "Authorization": f"Bearer {tok_b}"}
                              ).status_code == 404
            assert httpx.post(f"{url}/mcp", json=listing, headers=own).status_code == 200


def test_mcp_http_refuses_a_non_loopback_bind_without_tokens(tmp_path):
    """Item 4: without tokens, `mcp --http --host 0.0.0.0` refuses to start. Run in a network
    namespace of its own, so even the unfixed code would only have listened on a private `lo`."""
    port = free_port()
    p = subprocess.Popen(["unshare", "--net", sys.executable, "-m", "sandtree", "--home", str(tmp_path / "home"),
                          "mcp", "--http", "--host", "0.0.0.0", "--port", str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("mcp --http --host 0.0.0.0 without tokens kept running (it listened)")
    assert p.returncode != 0
    assert "loopback only" in err


# ---- item 17: merge conflicts are unmistakable; build products never conflict -------------------
def _two_test_runs(st, bb_image):
    """Two branches that each changed the source and ran the "tests": each wrote its own
    __pycache__/*.pyc, .pytest_cache/ and a *.pyc beside the sources."""
    base = bb_image.run("mkdir -p /app; echo 'a = 1' > /app/a.py; echo 'b = 1' > /app/b.py").image
    ours = base.run("echo 'a = 2' > /app/a.py; mkdir -p /app/__pycache__ /app/.pytest_cache; "
                    "echo OURS > /app/__pycache__/a.cpython-311.pyc; echo O > /app/.pytest_cache/v; "
                    "echo O > /app/x.pyc").image
    theirs = base.run("echo 'b = 2' > /app/b.py; mkdir -p /app/__pycache__ /app/.pytest_cache; "
                      "echo THEIRS > /app/__pycache__/a.cpython-311.pyc; echo T > /app/.pytest_cache/v; "
                      "echo T > /app/x.pyc").image
    return base, ours, theirs


def test_merge_ignores_build_products_by_default(st, rootfs):
    """Item 17: __pycache__/, *.pyc, .pytest_cache/ written by tests on both branches no longer
    make the merge conflict: ours is taken there, the sources merge."""
    base, ours, theirs = _two_test_runs(st, st.import_image(rootfs))
    m = st.merge(base, ours, theirs)
    assert m.image is not None and m.conflicts == []
    assert m.image.read("/app/a.py") == b"a = 2\n" and m.image.read("/app/b.py") == b"b = 2\n"
    assert m.image.read("/app/__pycache__/a.cpython-311.pyc") == b"OURS\n"
    assert m.image.read("/app/x.pyc") == b"O\n" and m.image.read("/app/.pytest_cache/v") == b"O\n"
    assert set(m.ignored) == {"/app/__pycache__", "/app/.pytest_cache", "/app/x.pyc"}
    # globs of one's own, and none at all
    with pytest.raises(MergeConflict) as raised:
        st.merge(base, ours, theirs, ignore=[])
    assert {c["path"] for c in raised.value.details["conflicts"]} == {
        "/app/__pycache__/a.cpython-311.pyc", "/app/.pytest_cache/v", "/app/x.pyc"}
    with pytest.raises(MergeConflict) as raised:
        st.merge(base, ours, theirs, ignore=["__pycache__/"])
    assert {c["path"] for c in raised.value.details["conflicts"]} == {"/app/.pytest_cache/v", "/app/x.pyc"}
    m2 = st.merge(base, ours, theirs, ignore=["__pycache__/", "/app/.pytest_cache/", "*.pyc"])
    assert m2.image == m.image
    with pytest.raises(InvalidInput):
        st.merge(base, ours, theirs, ignore="*.pyc")       # a string is not a list of globs


def test_merge_conflict_raises_on_every_surface(st, rootfs, tmp_path):
    """Item 17: a conflicted merge raises MergeConflict (Python API, engine), answers 409
    merge_conflict over REST and through the remote client, fails the MCP tool, and exits 1 from
    the CLI naming the conflicts; on_conflict="return" gives the list back (image None); nothing
    is made either way."""
    from sandtree import MergeConflict as Exported
    from sandtree.http.server import build_app
    from starlette.testclient import TestClient
    img = st.import_image(rootfs, tag="bb")
    base = img.run("echo 0 > /f").image
    ours, theirs = base.run("echo 1 > /f").image, base.run("echo 2 > /f").image
    before = {i.id for i in st.images()}
    with pytest.raises(Exported) as raised:
        st.merge(base, ours, theirs)
    assert raised.value.code == "merge_conflict" and "/f (content)" in raised.value.message
    assert raised.value.details["conflicts"][0]["path"] == "/f"
    with pytest.raises(MergeConflict):
        st._engine.merge(base.id, ours.id, theirs.id)
    assert st.merge(base, ours, theirs, on_conflict="return").image is None
    with pytest.raises(InvalidInput):
        st.merge(base, ours, theirs, on_conflict="maybe")
    assert {i.id for i in st.images()} == before
    with TestClient(build_app(st._engine), base_url="http://127.0.0.1") as c:
        r = c.post("/api/v1/merge", json={"ours": ours.id, "theirs": theirs.id, "base": base.id})
        assert r.status_code == 409 and r.json()["error"] == "merge_conflict"
        assert r.json()["conflicts"][0]["path"] == "/f"
        r = c.post("/api/v1/merge", json={"ours": ours.id, "theirs": theirs.id, "base": base.id,
                                          "on_conflict": "return"})
        assert r.status_code == 200 and r.json()["image"] is None and r.json()["conflicts"][0]["path"] == "/f"
        r = c.post("/api/v1/merge", json={"ours": ours.id, "theirs": theirs.id, "base": base.id,
                                          "strategy": "theirs", "ignore": ["f"]})
        assert r.status_code == 200 and r.json()["ignored"] == ["/f"]
        merged = st.image(r.json()["image"])
        assert merged.read("/f") == b"1\n"                  # ignored: ours, whatever the strategy
    home = st._engine.store.home
    cli = [sys.executable, "-m", "sandtree", "--home", home, "merge", base.id, ours.id, theirs.id]
    p = subprocess.run(cli, capture_output=True, text=True)
    assert p.returncode == 1 and "CONFLICT (content): /f" in p.stderr
    p = subprocess.run(cli + ["--ignore", "f", "--json"], capture_output=True, text=True)
    assert p.returncode == 0 and json.loads(p.stdout)["ignored"] == ["/f"]
    p = subprocess.run(cli + ["--no-default-ignore", "--json"], capture_output=True, text=True)
    assert p.returncode == 1 and json.loads(p.stdout)["conflicts"][0]["path"] == "/f"


# ---- item 18: bootstrap, README ---------------------------------------------------------------
@pytest.mark.skipif(os.geteuid() != 0, reason="bootstrap needs root")
def test_bootstrap_leaves_no_host_network_config(st, rootfs, tmp_path, monkeypatch):
    """Item 18: debootstrap copies the building host's /etc/resolv.conf and /etc/hostname into
    the target (its setup_etc); the image must carry neutral ones. A stand-in `debootstrap` on
    PATH does what the real one does to /etc (with marker contents for the host's files) over the
    busybox tree, so the real bootstrap path runs in milliseconds."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "debootstrap").write_text(
        "#!/bin/sh\n"
        "for a; do case $a in --*) ;; *) set -- \"$@\" \"$a\" ;; esac; shift; done\n"   # keep positionals
        "suite=$1 target=$2\n"
        f"cp -a {rootfs}/. \"$target\"/\n"
        "echo 'nameserver 192.0.2.53  # the host resolver' > \"$target/etc/resolv.conf\"\n"
        "echo build-host-7 > \"$target/etc/hostname\"\n"
        "echo I: Base system installed successfully.\n")
    os.chmod(fake / "debootstrap", 0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    img = st.image(st._engine.bootstrap("debian:bookworm", mirror="http://deb.invalid/debian"))
    assert b"192.0.2.53" not in img.read("/etc/resolv.conf")
    assert img.read("/etc/hostname") == b"sandtree\n"
    from sandtree.store.importers import NEUTRAL_ETC
    assert img.read("/etc/resolv.conf") == NEUTRAL_ETC["resolv.conf"]
    assert img.read("/etc/greeting") == b"hello from the image\n"      # the rest is the tree built
    # a symlinked resolv.conf (as systemd-resolved hosts have) is replaced, never written through
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.write_text("untouched\n")
    os.symlink(str(outside), tree / "etc" / "resolv.conf")
    from sandtree.store.importers import finish_rootfs
    finish_rootfs(str(tree))
    assert outside.read_text() == "untouched\n"
    assert not os.path.islink(tree / "etc" / "resolv.conf")
    assert (tree / "etc" / "resolv.conf").read_bytes() == NEUTRAL_ETC["resolv.conf"]


def test_async_connect_works_awaited_and_not(tmp_path, rootfs):
    """Item 18: the README's `await sandtree.AsyncSandtree.connect(...)` works (it raised
    TypeError: connect is synchronous), and so does the plain call."""
    import sandtree
    from conftest import serve_process
    with serve_process(tmp_path / "srv") as url:
        async def main():
            st = await sandtree.AsyncSandtree.connect(url)
            img = await st.import_image(rootfs, tag="bb")
            r = await img.run("cat /etc/greeting")
            assert r.stdout == b"hello from the image\n"
            async with sandtree.AsyncSandtree.connect(url) as st2:
                assert [i.id for i in await st2.images()] == [img.id]
            async with await sandtree.AsyncSandtree.connect(url) as st3:
                assert (await st3.image("bb")).id == img.id
            await st.close()
        asyncio.run(main())


def _readme_first_python_block() -> str:
    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    text = open(readme).read()
    start = text.index("```python\n") + len("```python\n")
    return text[start:text.index("```", start)]


@pytest.mark.skipif(os.geteuid() != 0, reason="bootstrap needs root")
def test_readme_first_snippet_runs_on_a_fresh_store(tmp_path, rootfs, monkeypatch):
    """Item 18: the README's first Python snippet runs as written on a fresh store (it named a
    tag only `make demo` makes). debootstrap is stood in for by a copy of the busybox tree (as in
    the bootstrap test above), so the snippet's own calls run for real in milliseconds."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "debootstrap").write_text(
        "#!/bin/sh\n"
        "for a; do case $a in --*) ;; *) set -- \"$@\" \"$a\" ;; esac; shift; done\n"
        f"cp -a {rootfs}/. \"$2\"/\n")
    os.chmod(fake / "debootstrap", 0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setenv("SANDTREE_HOME", str(tmp_path / "fresh"))
    monkeypatch.chdir(tmp_path)
    code = _readme_first_python_block()
    env: dict = {}
    exec(compile(code, "README.md", "exec"), env)      # noqa: S102 - our own README
    try:
        assert env["img"].tags == ["debian:bookworm-python"]
        assert env["branch_a"].read("/choice") == b"a\n"
        assert (tmp_path / "a.tar").exists()
    finally:
        env["st"].close()


# ---- item 9 (server half): what the server keeps ------------------------------------------------
def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.slow
def test_server_memory_stays_bounded_after_flooding_runs(tmp_path, rootfs):
    """Item 9: runs whose output floods far past their `output` cap leave the server's memory
    bounded (it kept every chunk as an event, forever: 60 MB -> 3.1 GB). 8 runs of 128 MiB each
    would keep 1 GiB; the SSE stream of a finished run still ends with its end event."""
    home = str(tmp_path / "home")
    Engine(home, warm=0).close()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", home, "serve", "--port", str(port), "--ports-port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from conftest import wait_for_port
        wait_for_port(port, 30)
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=300)
        tar = subprocess.run(["tar", "-C", rootfs, "-cf", "-", "."], capture_output=True, check=True).stdout
        assert api.post("/images/import", params={"tag": "bb"}, content=tar).status_code == 201
        flood = "yes aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa | head -c 134217728"
        r = api.post("/runs", json={"image": "bb", "command": "echo warm", "disposable": True})
        assert r.status_code == 201
        before = _rss_mb(proc.pid)
        ops = []
        for _ in range(8):
            r = api.post("/runs", json={"image": "bb", "command": flood, "output": "1M", "disposable": True})
            assert r.status_code == 201, r.text
            body = r.json()
            # stopped at its cap (runtime: usage.killed_by), so the server never even sees the flood
            assert body["outcome"]["stdout_truncated"] and body["outcome"]["signal"] == 9, body["outcome"]
            ops.append(body["id"])
        after = _rss_mb(proc.pid)
        print(f"server RSS {before:.0f} MB -> {after:.0f} MB after 8 runs of 128 MiB output each")
        assert after < 300, f"server RSS {before:.0f} MB -> {after:.0f} MB after 8 flooding runs"
        # a finished run's event stream: its output up to the cap, then its end (marked cut)
        with api.stream("GET", f"/operations/{ops[-1]}/events") as s:
            text = "".join(s.iter_text())
        assert "event: end" in text and '"events_truncated": true' in text
        assert len(text) < 4 << 20
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_ended_operations_shrink_to_their_end_event(tmp_path, rootfs, monkeypatch):
    """Item 9: a live operation's events stay whole (a stream resuming with Last-Event-ID gets
    the rest); an ended one's shrink to its end event (so a late follower still learns how it
    ended), and its result is dropped past the retention bounds (its row stays)."""
    from sandtree.engine.runs import operations as ops_mod
    engine = Engine(str(tmp_path / "home"), warm=0)
    try:
        engine.import_path(rootfs, tag="bb")
        engine._operations = ops_mod.Operations(engine, workers=2, retain_seconds=3600, retain_bytes=10)
        ops = engine.operations
        slow = ops.submit_run("bb", "echo one; sleep 1; echo two", disposable=True)
        first: list = []
        while not any(k == "stdout" for _, k, _ in first):
            first += ops.events_after(slow, first[-1][0] if first else 0, 10)[0]
        seq, rest, done = first[-1][0], [], False            # resume after what was read
        while not done:
            new, done = ops.events_after(slow, seq, 10)
            rest += new
            seq = new[-1][0] if new else seq
        assert "".join(d for _, k, d in rest if k == "stdout") == "two\n" and rest[-1][1] == "end"
        monkeypatch.setattr(ops_mod, "EVENTS_KEEP", 0.0)     # from now on ended events shrink at once
        fast = ops.submit_run("bb", "seq 1000", disposable=True, output="100")
        ops.wait([fast], 30)
        for op in (fast, slow):
            ended = ops.events_after(op, 0, 1)
            assert ended[1] and len(ended[0]) == 1 and ended[0][0][1] == "end"
        assert json.loads(ops.events_after(fast, 0, 1)[0][0][2])["events_truncated"] is True
        assert ops.result(fast) is None and ops.get(fast)["status"] == "done"    # over 10 bytes: dropped
    finally:
        engine.close()


def _store_leftovers(home: str) -> list[str]:
    tmp = os.path.join(home, "tmp")
    return sorted(os.listdir(tmp)) if os.path.isdir(tmp) else []


def _blob_files(home: str) -> set[str]:
    root = os.path.join(home, "objects", "blobs")
    return {f for d, _, fs in os.walk(root) for f in fs}


@pytest.mark.slow
def test_uploads_stream_to_disk_under_a_cap(tmp_path, rootfs):
    """Item 9: POST /files and /images/import stream to the store's disk (a 400 MiB upload held
    the whole body in memory, twice), under a cap: the server's --max-upload, or a tenant's own
    max_upload; over it: 413 too_large while streaming (or at once from Content-Length), and
    nothing is kept. Other bodies (JSON) have a cap of their own."""
    home = str(tmp_path / "home")
    engine = Engine(home, warm=0)
    try:
        small = engine.tenancy.create_token("small", max_upload="100K")["token"]
        big = engine.tenancy.create_token("big")["token"]
    finally:
        engine.close()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", home, "serve", "--port", str(port), "--ports-port", "0",
                             "--max-upload", "500M"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from conftest import wait_for_port
        wait_for_port(port, 30)
        base = f"http://127.0.0.1:{port}/api/v1"
        as_small = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {small}"})
        as_big = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {big}"})
        blobs = _blob_files(home)

        def stream(n: int, chunk: int = 1 << 20):          # no Content-Length: capped while streaming
            block = b"x" * chunk
            for _ in range(n // chunk):
                yield block

        # the tenant's own cap, announced and streamed
        r = as_small.post("/files", content=b"y" * 200_000)
        assert r.status_code == 413 and r.json()["error"] == "too_large", r.text
        try:
            r = as_small.post("/files", content=stream(4 << 20, 64 << 10))
            assert r.status_code == 413 and r.json()["error"] == "too_large"
        except httpx.HTTPError:
            pass                        # the server may close before the client finished sending
        assert as_small.post("/files", content=b"y" * 50_000).status_code == 201
        tar = subprocess.run(["tar", "-C", rootfs, "-cf", "-", "."], capture_output=True, check=True).stdout
        assert len(tar) > 100_000
        r = as_small.post("/images/import", content=tar)
        assert r.status_code == 413 and as_small.get("/images").json() == []
        # the server's cap for a tenant without one; under it, memory stays flat
        import socket
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:   # announces 600 MiB, sends none
            sock.sendall(f"POST /api/v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {big}\r\n"
                         f"Content-Length: {600 << 20}\r\n\r\n".encode())
            assert sock.recv(4096).startswith(b"HTTP/1.1 413 ")
        before = _rss_mb(proc.pid)
        r = as_big.post("/files", content=stream(400 << 20))
        assert r.status_code == 201 and r.json()["size"] == 400 << 20, r.text
        grown = _rss_mb(proc.pid) - before
        print(f"server RSS grew {grown:.0f} MB for a 400 MiB upload")
        assert grown < 150, f"a 400 MiB upload grew the server by {grown:.0f} MB"
        peak = _hwm_mb(proc.pid)                          # and back out, streamed too
        with as_big.stream("GET", f"/files/{r.json()['sha256']}") as s:
            assert s.status_code == 200 and sum(len(c) for c in s.iter_bytes()) == 400 << 20
        assert _hwm_mb(proc.pid) - peak < 150
        assert as_small.get(f"/files/{r.json()['sha256']}").status_code == 404      # not its upload
        # Contree's /v1/files: the same caps, streamed to disk as well
        contree = f"http://127.0.0.1:{port}/v1/files"
        r = httpx.post(contree, content=b"y" * 200_000, headers={"Authorization": f"Bearer {small}"})
        assert r.status_code == 413, r.text
        before = _rss_mb(proc.pid)
        r = httpx.post(contree, content=stream(300 << 20), timeout=120, headers={"Authorization": f"Bearer {big}"})
        assert r.status_code == 201 and r.json()["size"] == 300 << 20, r.text
        grown = _rss_mb(proc.pid) - before
        assert grown < 150, f"a 300 MiB Contree upload grew the server by {grown:.0f} MB"
        # JSON bodies: capped on their own (32 MiB)
        r = as_big.post("/runs", content=b'{"image": "' + b"a" * (40 << 20) + b'"}',
                        headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert _store_leftovers(home) == []                 # nothing spooled is left
        assert len(_blob_files(home) - blobs) == 3          # the three uploads under their caps
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ---- item 12: a full disk ---------------------------------------------------------------------
def _fill(directory: str) -> str:
    """Fill the filesystem of `directory` to the last block; returns the filler's path."""
    filler = os.path.join(directory, "filler")
    block = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 20, 4096, 512, 1):
            try:
                while True:
                    f.write(block[:size])
            except OSError:
                pass
    return filler


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_disk_full_is_named_and_reads_keep_working(tmp_path, rootfs):
    """Item 12: on a store whose disk fills up, commit raises DiskFull (a raw OSError ENOSPC
    before; the CLI printed a traceback, exit 1), the CLI exits 125 saying "disk full", REST
    answers 507 disk_full; at 100 % full, Sandtree(home), cat and fsck still work (SQLite's
    `PRAGMA journal_mode=WAL` failed with "disk I/O error"); nothing committed is lost."""
    import sandtree
    from sandtree import DiskFull
    from sandtree.http.server import build_app
    from starlette.testclient import TestClient
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m,mode=0700", "h12-server-disk", str(disk)], check=True)
    try:
        home = str(disk / "home")
        cli = [sys.executable, "-m", "sandtree", "--home", home]
        st = sandtree.Sandtree(home, warm=0)
        try:
            img = st.import_image(rootfs, tag="bb")
            kept = img.run("echo kept > /kept").image
            st.tag(kept, "kept")
            images = {i.id for i in st.images()}
            with pytest.raises(DiskFull) as raised:                 # the commit meets ENOSPC
                img.run("dd if=/dev/urandom of=/big bs=1M count=60 2>/dev/null", disk="200M")
            assert "disk full" in raised.value.message
            assert {i.id for i in st.images()} == images and os.listdir(os.path.join(home, "tmp")) == []
        finally:
            st.close()
        p = subprocess.run(cli + ["run", "bb", "--disk", "200M", "--", "sh", "-c",
                                  "dd if=/dev/urandom of=/big bs=1M count=60 2>/dev/null"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 125 and "disk full" in p.stderr and "Traceback" not in p.stderr, p.stderr
        engine = Engine(home, warm=0)
        try:
            with TestClient(build_app(engine), base_url="http://127.0.0.1") as c:
                r = c.post("/api/v1/runs", json={"image": "bb", "disk": "200M",
                                                 "command": "dd if=/dev/urandom of=/big bs=1M count=60"})
                assert r.json()["outcome"]["error"] == "disk_full", r.text      # the run's own record
                filler = _fill(str(disk))
                r = c.post("/api/v1/files", content=b"z" * 100_000)
                assert r.status_code == 507 and r.json()["error"] == "disk_full", r.text
                r = c.post("/api/v1/runs", json={"image": "bb", "command": "true"})
                assert r.status_code == 507 and r.json()["error"] == "disk_full", r.text
                r = c.put("/api/v1/tags/other", json={"image": "kept"})
                assert r.status_code == 507 and r.json()["error"] == "disk_full", r.text
                assert c.get("/api/v1/images/kept/read", params={"path": "/kept"}).content == b"kept\n"
        finally:
            engine.close()
        assert os.statvfs(str(disk)).f_bavail == 0
        # 100 % full, no connection open: reads still work, in process and from the CLI
        st = sandtree.Sandtree(home, warm=0)
        try:
            assert st.image("kept").read("/kept") == b"kept\n"
            assert st.fsck()["ok"] and {i.id for i in st.images()} == images
            with pytest.raises(DiskFull):
                st.tag(kept, "other")
        finally:
            st.close()
        p = subprocess.run(cli + ["cat", "kept", "/kept"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stdout == "kept\n", p.stderr
        p = subprocess.run(cli + ["fsck"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        p = subprocess.run(cli + ["tag", "kept", "other"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and "disk full" in p.stderr and "Traceback" not in p.stderr
        # room again: everything committed is there, and writes work
        os.unlink(filler)
        st = sandtree.Sandtree(home, warm=0)
        try:
            assert {i.id for i in st.images()} == images and st.fsck()["ok"]
            assert st.image("kept").run("cat /kept").stdout == b"kept\n"
            st.tag(kept, "other")
        finally:
            st.close()
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)     # detached even if still busy


# ---- own review: waiting callers starved every other request --------------------------------------
def test_waiting_callers_do_not_starve_the_server(tmp_path, rootfs):
    """Review: every route ran its engine call on asyncio's default pool (cpu_count + 4 threads,
    6 here): 8 callers of POST /operations/ID/wait froze GET /images (any tenant's) for the whole
    run (19 s measured). Waits now have their own pool."""
    with serve_process(tmp_path / "home") as url:
        api = httpx.Client(base_url=f"{url}/api/v1", timeout=60)
        tar = subprocess.run(["tar", "-C", rootfs, "-cf", "-", "."], capture_output=True, check=True).stdout
        assert api.post("/images/import", params={"tag": "bb"}, content=tar).status_code == 201
        op = api.post("/runs", json={"image": "bb", "command": "sleep 6", "wait": False,
                                     "disposable": True}).json()["id"]
        waiters = [threading.Thread(target=lambda: httpx.post(f"{url}/api/v1/operations/{op}/wait",
                                                              params={"timeout": 30}, timeout=60))
                   for _ in range(12)]
        for t in waiters:
            t.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        assert api.get("/images").status_code == 200
        took = time.monotonic() - t0
        # answered while the run (6 s) still ran, not after it (no timing asserted: a loaded
        # machine is slow, a starved server waits for the run's end)
        still = api.get(f"/operations/{op}").json()["status"]
        for t in waiters:
            t.join()
        assert still in ("queued", "running"), f"GET /images took {took:.1f} s: answered after the run ({still})"


def _hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


@pytest.mark.slow
def test_reading_and_exporting_large_files_streams(tmp_path, rootfs):
    """Review: GET /images/ID/read (no limit) and /export built the whole file or tar in memory,
    per request: 3 reads and an export of a 128 MiB file raised the server's peak by > 500 MB.
    They stream now (the export from a file on the store's disk), and the bytes are exact."""
    import hashlib
    home = str(tmp_path / "home")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", home, "serve", "--port", str(port), "--ports-port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from conftest import wait_for_port
        wait_for_port(port, 30)
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=300)
        tar = subprocess.run(["tar", "-C", rootfs, "-cf", "-", "."], capture_output=True, check=True).stdout
        assert api.post("/images/import", params={"tag": "bb"}, content=tar).status_code == 201
        r = api.post("/runs", json={"image": "bb", "disk": "300M", "memory": "1G",
                                    "command": "dd if=/dev/urandom of=/big bs=1M count=128 2>/dev/null; "
                                               "sha256sum /big"})
        big = r.json()["result"]
        want = r.json()["stdout"].split()[0]
        assert big and len(want) == 64, r.text
        before = _hwm_mb(proc.pid)
        got: list = []

        def read_all():
            h = hashlib.sha256()
            with httpx.stream("GET", f"http://127.0.0.1:{port}/api/v1/images/{big}/read",
                              params={"path": "/big"}, timeout=300) as s:
                for chunk in s.iter_bytes():
                    h.update(chunk)
            got.append(h.hexdigest())

        def export():
            with httpx.stream("GET", f"http://127.0.0.1:{port}/api/v1/images/{big}/export",
                              params={"path": "/big"}, timeout=300) as s:
                got.append(sum(len(c) for c in s.iter_bytes()))
        threads = [threading.Thread(target=read_all) for _ in range(3)] + [threading.Thread(target=export)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        grown = _hwm_mb(proc.pid) - before
        assert [g for g in got if isinstance(g, str)] == [want] * 3
        assert next(g for g in got if isinstance(g, int)) > 128 << 20
        # a ranged read is exact too
        part = api.get(f"/images/{big}/read", params={"path": "/big", "offset": (1 << 20) - 3, "limit": 5 << 20})
        assert len(part.content) == 5 << 20
        assert grown < 150, f"3 reads and an export of a 128 MiB file raised the server's peak by {grown:.0f} MB"
        deadline = time.monotonic() + 10                            # removed once the response is sent
        while os.listdir(os.path.join(home, "tmp")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.listdir(os.path.join(home, "tmp")) == []        # the export's file is gone
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_server_without_tokens_answers_only_a_loopback_host(tmp_path):
    """Review: without tokens `serve` (and `mcp --http`) listen on loopback, but a web page in a
    local browser reaches loopback by DNS rebinding (its own name resolving to 127.0.0.1): any
    Host was served as the operator. Now only a loopback Host is."""
    with serve_process(tmp_path / "home") as url:
        port = url.rsplit(":", 1)[1]
        ok = httpx.get(f"{url}/api/v1/images")
        assert ok.status_code == 200
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io"):
            r = httpx.get(f"{url}/api/v1/images", headers={"Host": host})
            assert r.status_code == 403 and r.json()["error"] == "forbidden", (host, r.text)
        for host in (f"localhost:{port}", f"[::1]:{port}", "127.0.0.1"):
            assert httpx.get(f"{url}/api/v1/images", headers={"Host": host}).status_code == 200



def test_a_server_without_tokens_answers_no_other_web_page(tmp_path):
    """Review (stop 29): a page of another origin in a local browser can POST to a token-less
    loopback server without a preflight (a "simple" request: text/plain, no custom header): an
    import was read. A browser names the page's origin; only this server's own page passes, and
    clients that are no browser (no Origin) as before. Nothing is imported on a refusal."""
    with serve_process(tmp_path / "home") as url:
        port = int(url.rsplit(":", 1)[1])
        before = httpx.get(f"{url}/api/v1/images").json()
        plain = {"Content-Type": "text/plain"}
        for h in ({"Origin": "http://attacker.example"}, {"Origin": f"http://127.0.0.1:{port + 1}"},
                  {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
            r = httpx.post(f"{url}/api/v1/images/import", content=b"not a tar", headers={**plain, **h})
            assert r.status_code == 403 and r.json()["error"] == "forbidden", (h, r.text)
            r = httpx.get(f"{url}/api/v1/images", headers=h)
            assert r.status_code == 403, h
        own = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
        r = httpx.post(f"{url}/api/v1/images/import", content=b"not a tar", headers={**plain, **own})
        assert r.status_code == 400 and r.json()["error"] == "bad_archive"      # read, and refused as a tar
        assert httpx.get(f"{url}/api/v1/images").json() == before


def test_metrics_are_for_the_admin_only(tmp_path):
    """Review: /metrics counted every tenant's runs and queue and answered any tenant's token."""
    from sandtree.http.server import build_app
    from starlette.testclient import TestClient
    engine = Engine(str(tmp_path / "home"), warm=0)
    try:
        tenant = engine.tenancy.create_token("t1")["token"]
        admin = engine.tenancy.create_token("ops", "admin")["token"]
        with TestClient(build_app(engine)) as c:
            r = c.get("/metrics", headers={"Authorization": f"Bearer {tenant}"})
            assert r.status_code == 403 and r.json()["error"] == "forbidden"
            r = c.get("/metrics", headers={"Authorization": f"Bearer {admin}"})
            assert r.status_code == 200 and "sandtree_runs_started_total" in r.text
    finally:
        engine.close()


def test_a_tenants_pull_reaches_public_registries_only(tmp_path):
    """Review: a tenant's `POST /images/pull docker://HOST/...` made the server connect to any
    HOST: its own loopback services, private networks, a link-local metadata service. Now a
    tenant's pulls (REST and Contree's import) are refused before any connection unless every
    address of the host is public; the admin may pull from anywhere."""
    import socket

    from sandtree.errors import Forbidden
    from sandtree.http.server import build_app
    from starlette.testclient import TestClient
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    engine = Engine(str(tmp_path / "home"), warm=0)
    try:
        tok = engine.tenancy.create_token("t1")["token"]
        auth = {"Authorization": f"Bearer {tok}"}
        with TestClient(build_app(engine)) as c:
            for registry in (f"127.0.0.1:{port}", f"localhost:{port}"):
                r = c.post("/api/v1/images/pull", headers=auth, json={"reference": f"docker://{registry}/a/b:1"})
                assert r.status_code == 403 and r.json()["error"] == "forbidden", r.text
                r = c.post("/v1/images/import", headers=auth,
                           json={"registry": {"url": f"docker://{registry}/a/b:1"}, "tag": "x"})
                assert r.status_code == 403, r.text
        with pytest.raises(socket.timeout):
            listener.accept()                 # nothing ever connected
    finally:
        engine.close()
        listener.close()
    from sandtree.tenancy import check_public_registry
    for host in ("169.254.169.254", "10.1.2.3:5000", "192.168.0.1", "[fd00::1]:443", "100.64.0.1",
                 "[::ffff:127.0.0.1]:5000", "0.0.0.0"):
        with pytest.raises(Forbidden):
            check_public_registry(host)       # literal addresses: resolved without any traffic


def test_mcp_reads_are_capped_per_call(tmp_path, rootfs):
    """Review: MCP read_file took any `limit` (and the resource read any file) whole into memory
    and into one message; now at most 4 MiB a call, with the offset to go on from."""
    from mcp.client.client import Client
    from sandtree.mcp.server import build_server
    engine = Engine(str(tmp_path / "home"), warm=0)
    try:
        engine.import_path(rootfs, tag="bb")
        big = engine.run("bb", "dd if=/dev/zero bs=1M count=6 2>/dev/null | tr '\\\\0' a > /big",
                         disk="100M").image
        server = build_server(engine, tools="all")

        async def main():
            async with Client(server) as c:
                r = _tool_value(await c.call_tool("read_file", {"image": big, "path": "/big", "limit": 100 << 20}))
                assert len(r["content"]) == 4 << 20 and r["size"] == 6 << 20 and "offset=4194304" in r["truncated"]
                res = await c.read_resource(f"sandtree://image/{big}/read/big")
                assert len(res.contents[0].text) < (4 << 20) + 200 and "cut at 4 MiB" in res.contents[0].text
                bad = await c.call_tool("read_file", {"image": big, "path": "/big", "offset": -1})
                assert bad.is_error
        asyncio.run(main())
    finally:
        engine.close()


def test_mcp_http_waiters_do_not_starve_other_tools(tmp_path, rootfs):
    """Review: sync tools run on anyio's thread limiter, 40 threads for every caller of the MCP
    HTTP server: 45 wait_operations calls on a running run stalled every other tool call."""
    home = str(tmp_path / "home")
    engine = Engine(home, warm=0)
    try:
        engine.import_path(rootfs, tag="bb")
    finally:
        engine.close()
    with listening(home, "mcp", "--http", "--tools", "all") as url:
        async def main():
            async with _mcp_client(url, None) as c:
                op = _tool_value(await c.call_tool("run", {"command": "sleep 6", "image": "bb",
                                                           "wait": False}))["operation_id"]
                waits = [asyncio.ensure_future(c.call_tool("wait_operations", {"operation_ids": [op],
                                                                               "timeout": 20}))
                         for _ in range(45)]
                await asyncio.sleep(1.5)
                t0 = time.monotonic()
                imgs = _tool_value(await c.call_tool("list_images", {}))
                took = time.monotonic() - t0
                # answered while the run (6 s) still ran, not after it (no timing asserted)
                still = _tool_value(await c.call_tool("get_operation", {"operation_id": op}))["status"]
                done = await asyncio.gather(*waits)
                assert imgs and all(not d.is_error for d in done)
                assert still in ("queued", "running"), f"list_images took {took:.1f} s: answered after the run"
        asyncio.run(main())


def test_an_upload_cut_by_kill_9_leaves_nothing_after_the_next_start(tmp_path):
    """Review: an upload is spooled to the store's tmp/; the server killed mid-upload left the
    file there forever (its name carried no owner, so clean_stale never took it)."""
    import signal
    import socket
    home = str(tmp_path / "home")
    Engine(home, warm=0).close()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", home, "serve", "--port", str(port), "--ports-port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        from conftest import wait_for_port
        wait_for_port(port, 30)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST /api/v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10000000\r\n\r\n"
                         + b"x" * 1_000_000)
            deadline = time.monotonic() + 10
            while not os.listdir(os.path.join(home, "tmp")) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert os.listdir(os.path.join(home, "tmp")), "the upload was not being spooled"
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    Engine(home, warm=0).close()                       # the next engine's start cleans up
    assert os.listdir(os.path.join(home, "tmp")) == []


def test_a_pull_checks_every_host_it_is_sent_to(tmp_path):
    """Review: a registry a tenant may reach could send the server on, by a redirect or the
    token realm of its auth challenge, to any address (the pull followed both). The host check a
    tenant's pull carries (tenants.check_public_registry) now runs before every request; here a
    stand-in check admits only the first registry, on loopback, and the redirect and realm
    targets (other loopback ports) are never connected to."""
    import socket
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from sandtree.errors import Forbidden
    target = socket.socket()
    target.bind(("127.0.0.1", 0))
    target.listen(8)
    target.settimeout(0.5)
    elsewhere = f"127.0.0.1:{target.getsockname()[1]}"

    class Registry(BaseHTTPRequestHandler):
        def do_GET(self):
            if "redirect" in self.path:
                self.send_response(302)
                self.send_header("Location", f"http://{elsewhere}/v2/x")
            else:
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="http://{elsewhere}/token",service="r"')
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    registry = f"127.0.0.1:{srv.server_address[1]}"

    def only_the_registry(hostport: str) -> None:
        if hostport != registry:
            raise Forbidden(f"not {hostport}")
    engine = Engine(str(tmp_path / "home"), warm=0)
    try:
        for name in ("redirect/app", "auth/app"):
            with pytest.raises(Forbidden):
                engine.pull_operation(f"docker://{registry}/{name}:1", check_host=only_the_registry)
        with pytest.raises(socket.timeout):
            target.accept()                              # neither target was ever connected to
        assert os.listdir(os.path.join(engine.store.home, "tmp")) == []
    finally:
        engine.close()
        srv.shutdown()
        srv.server_close()
        target.close()
