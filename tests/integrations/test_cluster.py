"""A sandtree cluster on a real Ray cluster (issue 20): a head and two worker nodes on this machine
(tests/raycluster.py), one PostgreSQL database and one S3 bucket (SeaweedFS, tests/s3server.py),
each node with a store directory of its own (its layer cache), as on machines of their own. One
cluster for the module; the node-killing test runs last (it takes a node away)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty as ptymod
import struct
import termios
import threading
import time

import pytest

import sandtree
from sandtree.errors import Conflict, InvalidInput, NodeLost, NotFound

pytest.importorskip("ray")

from conftest import interrupt_a_sleep, make_rootfs, terminal_reader  # noqa: E402
from raycluster import RayCluster, Unavailable  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster(s3_server):
    """(after s3_server: the nodes' environment carries its endpoint and keys, as a deployment's would)"""
    cluster = RayCluster()
    try:
        cluster.start(workers=2)
    except Unavailable as exc:
        cluster.stop()
        pytest.skip(f"a Ray cluster cannot start here: {exc}")
    yield cluster
    import ray
    ray.shutdown()
    cluster.stop()


@pytest.fixture(scope="module")
def cst(ray_cluster, pg_cluster, s3_server, tmp_path_factory, rootfs):
    """A Sandtree whose runs go to the cluster (its metadata: one PostgreSQL database; its objects:
    one bucket; each node's home: API home/nodes/node-<id>)."""
    st = sandtree.Sandtree(str(tmp_path_factory.mktemp("cluster-home")), database=pg_cluster.new_database(),
                           objects=f"s3://{s3_server.new_bucket()}/cluster", cluster=ray_cluster.address, warm=0)
    st.image = st.import_image(rootfs, tag="busybox")
    yield st
    st.close()


def test_status_lists_both_nodes(cst, ray_cluster):
    status = cst.cluster_status()
    assert status["mode"] == "cluster" and status["database"] == "postgresql"
    nodes = [n for n in status["nodes"] if n["alive"]]
    assert len(nodes) == 2 and all(n["cpus"] == 1 for n in nodes)
    assert {n["node"] for n in nodes} == {n["NodeID"] for n in ray_cluster.nodes()}
    assert len({n["pid"] for n in nodes}) == 2          # one actor process per node


def test_each_node_has_its_own_home_and_cache(cst):
    nodes = cst.cluster_status()["nodes"]
    homes = {n["home"] for n in nodes}
    assert len(homes) == 2 and cst.engine.home not in homes
    assert all(h.startswith(os.path.join(cst.engine.home, "nodes", "node-")) for h in homes)
    assert all(n["objects"] == cst.engine.store.objects.url and "fetched" in n for n in nodes)


def fixed(text: str) -> str:
    """A run whose result does not depend on when it ran (fixed mtimes): equal IDs on any store."""
    return f"mkdir -p /w && echo {text} > /w/f && touch -d @1000000000 /w/f /w /"


def test_image_imported_on_node_a_runs_on_node_b(cst, tmp_path):
    """Issue 20's must-hold: imported through node A, run on node B (its layers fetched once into
    B's cache, then served from it), B's result readable from A, IDs those of one local store."""
    fabric = cst.engine.fabric
    status = {n["node"]: n for n in cst.cluster_status()["nodes"]}
    a, b = sorted(status)
    root = make_rootfs(str(tmp_path / "root"))
    with open(os.path.join(root, "etc", "only-here"), "w") as f:
        f.write("imported on A\n")                   # an image no node has seen yet
    img = fabric.call(a, "import_path", (root,), {"tag": "on-a"})
    layers = cst.engine.store.image(img).layers
    assert not any(os.path.isdir(os.path.join(status[b]["home"], "layers", l)) for l in layers)
    fetched0 = _node(cst, b)["fetched"]
    r1 = fabric.call(b, "run", (img, ["cat", "/etc/only-here"]))
    assert r1.exit_code == 0 and r1.stdout == b"imported on A\n"
    assert _node(cst, b)["fetched"] == fetched0 + len(layers)            # fetched once...
    assert all(os.path.isdir(os.path.join(status[b]["home"], "layers", l)) for l in layers)
    r2 = fabric.call(b, "run", (img, ["sh", "-c", fixed("one")]))
    assert r2.exit_code == 0 and _node(cst, b)["fetched"] == fetched0 + len(layers)   # ...then from B's cache
    # locality: only B holds the result's top layer, so runs of it go to B
    fabric.refresh()
    top = cst.engine.store.image(r2.image).layers
    assert fabric.pick(top) == b
    for _ in range(3):
        rec = cst.engine.run(r2.image, ["cat", "/w/f"])
        assert rec.stdout == b"one\n" and rec.usage["node"] == b, rec.usage
    # B's result is A's (and the API's) to read: its new layer comes from S3 into A's cache
    fetched_a = _node(cst, a)["fetched"]
    assert fabric.call(a, "read", (r2.image, "/w/f")) == b"one\n"
    assert _node(cst, a)["fetched"] == fetched_a + 1
    assert cst.engine.read(r2.image, "/w/f") == b"one\n"
    # the same IDs as a single-machine store
    local = sandtree.Sandtree(str(tmp_path / "local"), warm=0)
    try:
        base = local.import_image(root)
        assert base.id == img
        assert local.engine.run(base.id, ["sh", "-c", fixed("one")]).image == r2.image
    finally:
        local.close()


def _node(cst, nid: str) -> dict:
    return next(n for n in cst.cluster_status()["nodes"] if n["node"] == nid)


def test_local_engine_status_is_one_local_node(st):
    status = st.cluster_status()
    assert status["mode"] == "local" and [n["node"] for n in status["nodes"]] == ["local"]


def test_map_200_runs_over_both_nodes_with_local_lineage(cst, tmp_path, rootfs):
    commands = [f"echo {i} > /n; true" for i in range(200)]
    before = {n["node"]: n["runs"] for n in cst.cluster_status()["nodes"]}
    results = cst.map(cst.image, commands, parallel=8)
    assert len(results) == 200 and all(r.exit_code == 0 for r in results), \
        [(r.exit_code, r.stderr) for r in results if r.exit_code][:3]
    after = {n["node"]: n["runs"] for n in cst.cluster_status()["nodes"]}
    used = {n: after[n] - before.get(n, 0) for n in after}
    assert sum(used.values()) == 200 and all(v >= 20 for v in used.values()), used   # both nodes served
    # the same runs in a local store give the same images and the same lineage
    local = sandtree.Sandtree(str(tmp_path / "local"), warm=0)
    try:
        base = local.import_image(rootfs)
        assert base.id == cst.image.id
        mine = local.map(base, commands[:20], parallel=4)
        assert [r.image.id for r in mine] == [r.image.id for r in results[:20]]
        for r in results[:20]:
            assert [p["parent"] for p in cst.engine.parents(r.image.id)] == [cst.image.id]
        assert cst.engine.read(results[7].image.id, "/n") == b"7\n"
    finally:
        local.close()


def test_run_and_submit_through_the_cluster(cst):
    rec = cst.engine.run(cst.image.id, ["sh", "-c", "echo hi > /f; echo out"])
    assert rec.exit_code == 0 and rec.stdout == b"out\n"
    assert cst.engine.read(rec.image, "/f") == b"hi\n"
    op = cst.engine.operations.submit_run(cst.image.id, ["sh", "-c", "exit 3"])
    [done] = cst.engine.operations.wait([op], timeout=60)
    assert done["status"] == "done" and done["outcome"]["exit_code"] == 3
    with pytest.raises(NotFound):
        cst.engine.run("no-such-image", ["true"])
    for bad in (-1, True, 11, "2"):
        with pytest.raises(InvalidInput, match="retries"):
            cst.engine.run(cst.image.id, ["true"], retries=bad)
        with pytest.raises(InvalidInput, match="retries"):
            cst.engine.operations.submit_run(cst.image.id, ["true"], retries=bad)


def test_live_sandbox_is_pinned_to_its_node(cst):
    sb = cst.engine.sandbox_start(cst.image.id)
    sid = sb["id"]
    try:
        status = cst.cluster_status()
        [home] = [n for n in status["nodes"] if sid in n.get("sandbox_ids", [])]
        assert cst.engine.sandbox_exec(sid, ["sh", "-c", "echo live > /state; cat /state"]).stdout == b"live\n"
        assert cst.engine.sandbox_exec(sid, ["cat", "/state"]).stdout == b"live\n"   # the same sandbox
        image = cst.engine.sandbox_commit(sid, tag="from-live")
        assert cst.engine.read(image, "/state") == b"live\n"
        assert cst.engine.sandbox_info(sid)["id"] == sid
        assert sid in [s["id"] for s in cst.engine.sandbox_list()]
        assert home["pid"] != 0
    finally:
        cst.engine.sandbox_stop(sid)
    with pytest.raises(NotFound):
        cst.engine.sandbox_exec(sid, ["true"])


def test_pools_are_per_node(cst):
    stats = cst.engine.pool_and_wait(cst.image.id, 1, wait_timeout=60)
    try:
        assert stats["nodes"] == 2
        pools = cst.engine.pool_list()
        assert len(pools) == 2 and len({p["node"] for p in pools}) == 2
        assert all(p["image"] == cst.image.id for p in pools)
        assert cst.engine.run(cst.image.id, ["true"]).exit_code == 0      # served (or not) by its node's pool
    finally:
        cst.engine.pool_remove(cst.image.id)
    assert cst.engine.pool_list() == []


def test_cancel_reaches_the_node(cst):
    ops = cst.engine.operations
    op = ops.submit_run(cst.image.id, ["sleep", "30"])
    deadline = time.monotonic() + 20
    while ops.get(op)["status"] != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)                          # (on its node, in its sandbox)
    t0 = time.monotonic()
    ops.cancel(op)
    [done] = ops.wait([op], timeout=30)
    assert done["status"] == "cancelled" and time.monotonic() - t0 < 10, done


def _cancel_on_ready(cancel: threading.Event, seen: list):
    """An on_output that sets `cancel` once the command said `ready` (seen: what it got)."""
    def on_output(stream, chunk):
        seen.append((stream, chunk))
        if b"ready" in b"".join(c for s, c in seen if s == "stdout"):
            cancel.set()
    return on_output


def test_output_streams_and_a_cancel_reaches_the_node(cst):
    """A run that says `ready` and then sleeps: its on_output sees `ready` while it runs (so the
    output streams from its node) and cancels it there; it ends cancelled as a local run does."""
    cancel, seen = threading.Event(), []
    rec = cst.engine.run(cst.image.id, ["sh", "-c", "echo ready; sleep 60; echo never"],
                         on_output=_cancel_on_ready(cancel, seen), cancel=cancel)
    assert rec.cancelled and rec.image is None and rec.usage["node"], rec
    assert rec.stdout == b"ready\n" and b"".join(c for _, c in seen) == b"ready\n"
    # a submitted run: its events stream as it runs, and Operations.cancel reaches its node
    ops = cst.engine.operations
    op = ops.submit_run(cst.image.id, ["sh", "-c", "echo ready; sleep 60"])
    new, after = [], 0
    while not any(k == "stdout" and "ready" in d for _, k, d in new):
        got, ended = ops.events_after(op, after, 30)
        assert not ended, got
        new += got
        after = got[-1][0] if got else after
    assert ops.cancel(op)["status"] in ("running", "cancelled")
    [done] = ops.wait([op], timeout=60)
    assert done["status"] == "cancelled" and done["outcome"]["cancelled"], done
    # sandbox_exec on a live sandbox (pinned to its node): streamed and cancelled there too
    sid = cst.engine.sandbox_start(cst.image.id)["id"]
    try:
        cancel, seen = threading.Event(), []
        rec = cst.engine.sandbox_exec(sid, ["sh", "-c", "echo ready; sleep 60"],
                                      on_output=_cancel_on_ready(cancel, seen), cancel=cancel)
        assert rec.cancelled and b"".join(c for _, c in seen) == b"ready\n", rec
        assert cst.engine.sandbox_exec(sid, ["echo", "after"]).stdout == b"after\n"
    finally:
        cst.engine.sandbox_stop(sid)


def test_streamed_output_keeps_its_order_on_both_streams(cst):
    script = "i=0; while [ $i -lt 3000 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done"
    seen = {"stdout": [], "stderr": []}
    rec = cst.engine.run(cst.image.id, ["sh", "-c", script], on_output=lambda s, c: seen[s].append(c))
    assert rec.exit_code == 0 and rec.usage["node"]
    for stream, word in (("stdout", "out"), ("stderr", "err")):
        want = "".join(f"{word}{i}\n" for i in range(3000)).encode()
        assert b"".join(seen[stream]) == want == getattr(rec, stream)
    # without on_output: the one-answer call, the same record
    plain = cst.engine.run(cst.image.id, ["sh", "-c", script])
    assert (plain.stdout, plain.stderr) == (rec.stdout, rec.stderr)


def _node_of(cst, sid: str) -> str:
    [nid] = [n["node"] for n in cst.cluster_status()["nodes"] if sid in n["sandbox_ids"]]
    return nid


def test_live_run_and_its_processes_run_on_a_node(cst):
    """A live run (stdin open: Contree's instance) runs on a node, which owns it while it runs; its
    stdin, spawned processes, signals and process views go there; its events stream here."""
    ops = cst.engine.operations
    op = ops.submit_run(cst.image.id, ["sh", "-c", "read line; echo got $line; echo $line > /said"],
                        stdin_open=True)
    spid = cst.engine.sandbox_spawn(op, ["sh", "-c", "echo two; sleep 60"])    # waits for its sandbox
    nid = _node_of(cst, op)
    assert spid == 2 and cst.engine.fabric.sandbox_node(op) == nid
    deadline = time.monotonic() + 30
    while cst.engine.sandbox_process(op, 2)["stdout"] != "two\n" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cst.engine.sandbox_process(op, 2)["stdout"] == "two\n"
    cst.engine.sandbox_signal(op, 2, "TERM")
    cst.engine.sandbox_stdin(op, 1, "hello\n")
    [done] = ops.wait([op], timeout=60)
    assert done["status"] == "done" and done["outcome"]["exit_code"] == 0, done
    rec = ops.result(op)
    assert rec.stdout == b"got hello\n" and rec.usage["node"] == nid, rec
    assert cst.engine.read(rec.image, "/said") == b"hello\n"
    # its events came here as they happened: process 2's spawn, output and exit, process 1's output
    events, _ = ops.events_after(op, 0, 0)
    procs = [json.loads(d) for _, k, d in events if k == "proc"]
    assert [p["type"] for p in procs if p["spid"] == 2][:1] == ["spawn"]
    assert {"type": "stdout", "spid": 2, "data": "two\n"}.items() <= next(
        p for p in procs if p["spid"] == 2 and p["type"] == "stdout").items()
    assert [p["signal"] for p in procs if p["spid"] == 2 and p["type"] == "exit"] == [15]
    assert "".join(d for _, k, d in events if k == "stdout") == "got hello\n"
    # ended: its processes are told from its events here; the node owns it no more
    assert op not in _node(cst, nid)["sandbox_ids"]
    assert cst.engine.sandbox_process(op, 1)["exit_code"] == 0
    with pytest.raises(Conflict):
        cst.engine.sandbox_spawn(op, ["true"])
    # a cancel reaches it on its node
    op = ops.submit_run(cst.image.id, ["sleep", "60"], live=True)
    assert cst.engine.sandbox_spawn(op, ["true"]) == 2
    ops.cancel(op)
    [done] = ops.wait([op], timeout=60)
    assert done["status"] == "cancelled", done


def test_processes_of_a_plain_live_sandbox_run_on_its_node(cst):
    sid = cst.engine.sandbox_start(cst.image.id)["id"]
    try:
        spid = cst.engine.sandbox_spawn(sid, ["sh", "-c", "read x; echo $x$x"], stdin_open=True)
        cst.engine.sandbox_stdin(sid, spid, "ab\n")
        deadline = time.monotonic() + 30
        while cst.engine.sandbox_process(sid, spid)["exit_code"] is None and time.monotonic() < deadline:
            time.sleep(0.05)
        view = cst.engine.sandbox_process(sid, spid)
        assert view["exit_code"] == 0 and view["stdout"] == "abab\n", view
        # the process is the node's: its Instances knows it, the API side's does not
        nid = _node_of(cst, sid)
        assert cst.engine.fabric.ask(nid, "process", sid, spid)["stdout"] == "abab\n"
        assert sid not in cst.engine.operations.instances.plain
    finally:
        cst.engine.sandbox_stop(sid)


def test_popen_with_pipes_on_a_node_sandbox(cst):
    """sandbox_popen on a sandbox pinned to a node: the process runs there, its pipes are this
    machine's (relayed), shaped as the local one (write, read both streams, close, wait, communicate)."""
    sid = cst.engine.sandbox_start(cst.image.id)["id"]
    try:
        sb = cst.sandbox(sid)
        p = sb.popen(["sh", "-c", "while read x; do echo got $x; echo err $x >&2; done; exit 5"])
        p.stdin.write(b"one\n")
        p.stdin.flush()
        assert p.stdout.readline() == b"got one\n" and p.stderr.readline() == b"err one\n"
        assert p.poll() is None
        p.stdin.close()
        assert p.wait(timeout=30) == 5 and p.stdout.read() == b"" and p.stderr.read() == b""
        q = cst.engine.sandbox_popen(sid, ["sh", "-c", "cat; echo e >&2; exit 3"])
        assert q.communicate(b"abc" * 30000, timeout=30) == (b"abc" * 30000, b"e\n") and q.returncode == 3
        with pytest.raises(InvalidInput):
            cst.engine.sandbox_popen(sid, ["sh"], pty=True)        # a terminal needs a terminal
        k = cst.engine.sandbox_popen(sid, ["sleep", "60"], stdin=-3)
        k.kill()
        assert k.wait(timeout=30) == -9
    finally:
        cst.engine.sandbox_stop(sid)
    with pytest.raises(NotFound):
        cst.engine.sandbox_popen("0" * 32, ["true"])


def test_popen_with_a_terminal_on_a_node_sandbox(cst):
    """pty=True on a node's sandbox: the caller's pty carries the node's terminal (one echo, not
    two), a window size set on the caller's master reaches `stty size`, ^C interrupts the
    foreground `sleep` and not the shell, closing the master hangs the shell up."""
    sid = cst.engine.sandbox_start(cst.image.id)["id"]
    master, slave = ptymod.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        p = cst.sandbox(sid).popen(["sh", "-i"], pty=True, stdin=slave, stdout=slave, stderr=slave,
                                   env={"TERM": "xterm"})
        os.close(slave)
        slave = None
        until = terminal_reader(master)
        # typed after the prompt, as a user would: a line typed before the shell's line editor
        # took the terminal is echoed by the line discipline and again by the editor (any tty)
        until(b"# ")
        os.write(master, b"echo st-$((40+2)); [ -t 0 ] && echo on-a-$((6*7))\n")
        shown = until(b"on-a-42\r\n")
        assert shown.count(b"echo st-$((40+2))") == 1 and b"st-42\r\n" in shown, shown
        os.write(master, b"stty size\n")
        until(b"24 80")
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
        os.write(master, b"stty size\n")
        until(b"40 100")
        interrupt_a_sleep(master, until)
        assert p.poll() is None
        os.close(master)                # the terminal closed: its shell is hung up
        master = None
        assert p.wait(timeout=30) is not None
        nid = _node_of(cst, sid)
        assert cst.engine.fabric.ask(nid, "popen_write", "no-such", b"x") is False
    finally:
        for fd in (master, slave):
            if fd is not None:
                os.close(fd)
        cst.engine.sandbox_stop(sid)


def _terminal_through_serve(cst, url):
    """The web terminal's WebSocket route of `serve --cluster` on a node's sandbox."""
    import asyncio

    from websockets.asyncio.client import connect

    async def session(sid):
        async with connect(f"ws{url[4:]}/api/v1/sandboxes/{sid}/terminal?cols=100&rows=30",
                           subprotocols=["sandtree.terminal"], open_timeout=20) as ws:
            await ws.send(b"echo h''i; stty size\n")
            got = b""
            while b"30 100" not in got:
                got += await asyncio.wait_for(ws.recv(), 20)
            await ws.send(json.dumps({"resize": [90, 20]}))
            await ws.send(b"stty size\n")
            while b"20 90" not in got:
                got += await asyncio.wait_for(ws.recv(), 20)
            await ws.send(json.dumps({"end": True}))
            with contextlib.suppress(Exception):
                while True:
                    await asyncio.wait_for(ws.recv(), 20)
            return got
    sid = cst.engine.sandbox_start(cst.image.id)["id"]
    try:
        got = asyncio.run(session(sid))
        assert b"hi\r\n" in got, got
        # the shell was ended: the sandbox runs no command (hibernate would refuse one)
        ps = cst.engine.sandbox_exec(sid, ["sh", "-c", "ps | grep -c '/bin/sh$' || true"]).stdout
        assert ps == b"0\n", ps
    finally:
        cst.engine.sandbox_stop(sid)


def test_dockerfile_build_runs_its_steps_on_nodes(cst, tmp_path):
    """A build's RUN steps run on the nodes (their operations name their node), each step's cache
    row written with its result; the rebuild is all cache hits and the same image."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("hi\n")
    (ctx / "Dockerfile").write_text("FROM busybox\nRUN echo one > /one && echo made-one && touch -d @1000000000 /one /\n"
                                    "COPY hello.txt /h\nRUN cat /h /one > /both\n")
    seen = []
    res = cst.build_context(str(ctx), progress=seen.append)
    runs = [s for s in res.steps if s.text.startswith("RUN")]
    assert len(runs) == 2 and not any(s.cached for s in runs), res.steps
    assert b"".join(e["output"] for e in seen if e.get("output")) == b"made-one\n"   # streamed from its node
    nodes = {n["node"] for n in cst.cluster_status()["nodes"]}
    for s in runs:
        op = cst.engine.operation(s.operation)
        assert op["outcome"]["usage"]["node"] in nodes, op
    assert cst.engine.read(res.image, "/both") == b"hi\none\n"
    again = cst.build_context(str(ctx))
    assert again.image == res.image and all(s.cached for s in again.steps), again.steps


def test_a_recipe_pool_is_made_on_the_nodes(cst, tmp_path):
    """pool_recipe through the cluster: built (its RUN on a node), pooled on every node as
    pool_create does; a change rolls it over there (the new pool filled on the nodes, the old
    one drained from them)."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM busybox\nCOPY app.txt /app.txt\nRUN echo built > /stamp\n")
    (ctx / "app.txt").write_text("v1\n")
    nodes = {n["node"] for n in cst.cluster_status()["nodes"]}
    first = cst.pool(cst.dockerfile(str(ctx)), size=1, tag="app-c", wait=True)
    second = None
    try:
        assert first["tag"] == "app-c" and first["nodes"] == 2 and first["previous"] is None, first
        listed = [p for p in cst.pools() if p["image"] == first["image"]]
        assert {p["node"] for p in listed} == nodes and all(p["ready"] == 1 for p in listed), listed
        r = cst.engine.run("app-c", ["cat", "/app.txt", "/stamp"], disposable=True)
        assert r.stdout == b"v1\nbuilt\n" and r.usage.get("pool") is True and r.usage["node"] in nodes, r.usage
        (ctx / "app.txt").write_text("v2\n")
        second = cst.pool(cst.dockerfile(str(ctx)), size=1, tag="app-c", wait=True)
        assert second["previous"] == first["image"] != second["image"], second
        assert cst.engine.resolve("app-c") == second["image"]
        assert {p["node"] for p in cst.pools() if p["image"] == second["image"]} == nodes
        deadline = time.monotonic() + 60          # the old pool drains on the nodes, behind the roll
        while any(p["image"] == first["image"] for p in cst.pools()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(p["image"] == first["image"] for p in cst.pools())
        assert cst.engine.run("app-c", ["cat", "/app.txt"], disposable=True).stdout == b"v2\n"
    finally:
        for stats in (first, second):
            if stats is not None:
                cst.engine.pool_remove(stats["image"])


def test_a_relay_whose_api_process_died_ends_on_its_node(cst, ray_cluster):
    """An API process holding a terminal to a node's sandbox is killed (-9): the node, hearing no
    keepalive from it, hangs the terminal up and kills its process (Ray keeps a generator call
    of a dead caller running; without this the shell would stay)."""
    import subprocess
    import sys
    sid = cst.engine.sandbox_start(cst.image.id)["id"]
    script = f"""
import os, pty, time, sandtree
st = sandtree.Sandtree({cst.engine.home!r}, database={cst.engine.store.database_url!r},
                       objects={cst.engine.store.objects.url!r}, cluster={ray_cluster.address!r}, warm=0)
st.engine.fabric.keepalive_s = 0.5          # (the node gives up after 6 of them: 3 s)
master, slave = pty.openpty()
p = st.engine.sandbox_popen({sid!r}, ["sh", "-c", "echo $$ > /tmp/orphan; exec sleep 300"], pty=True,
                            stdin=slave, stdout=slave, stderr=slave)
print("up", flush=True)
time.sleep(600)
"""
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 30
        while not cst.engine.sandbox_exists(sid, "/tmp/orphan") and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = cst.engine.sandbox_read(sid, "/tmp/orphan").decode().strip()

        def running() -> bool:
            return cst.engine.sandbox_exec(sid, ["sh", "-c", f"kill -0 {pid}"]).exit_code == 0
        assert running()
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 60
        while running() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not running()
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        cst.engine.sandbox_stop(sid)


def test_serve_and_connect_reach_the_cluster_unchanged(cst, ray_cluster):
    """`sandtree serve --cluster ... --database ...` on the same store: a connect()ed client's runs
    go to the nodes (the API process finds the same node actors), and GET /cluster says so."""
    from conftest import serve_process
    with serve_process(cst.engine.home, "--cluster", ray_cluster.address, "--database",
                       cst.engine.store.database_url) as url:
        remote = sandtree.connect(url)
        res = remote.image(cst.image.id).run("echo remote > /r; cat /r", retries=1)    # (REST carries retries)
        assert res.exit_code == 0 and res.stdout == b"remote\n"
        assert cst.engine.read(res.image.id, "/r") == b"remote\n"      # one store
        runs = sum(n["runs"] for n in cst.cluster_status()["nodes"])
        assert remote.map(cst.image.id, ["true"] * 6, parallel=3)[5].exit_code == 0
        assert sum(n["runs"] for n in cst.cluster_status()["nodes"]) == runs + 6   # on the nodes
        status = remote.cluster_status()
        assert status["mode"] == "cluster" and len([n for n in status["nodes"] if n["alive"]]) == 2
        assert {n["pid"] for n in status["nodes"]} == {n["pid"] for n in cst.cluster_status()["nodes"]}
        _rest_streams_and_cancels(cst, remote, url)
        _terminal_through_serve(cst, url)


def test_ray_client_reaches_the_cluster(cst, ray_cluster):
    """Through Ray Client (`ray://`, the head's proxy) instead of the GCS: `serve --cluster ray://...`
    finds the same node actors; a map uses both nodes; output streams as it comes though Ray
    Client has no generator methods (pulled: cluster/pulled.py), cancels reach the nodes, a live
    run and a terminal work, as through the GCS (the helpers of the test above)."""
    from conftest import serve_process
    with serve_process(cst.engine.home, "--cluster", ray_cluster.client_address, "--database",
                       cst.engine.store.database_url) as url:
        remote = sandtree.connect(url)
        status = remote.cluster_status()
        assert status["ray_client"] and status["address"] == ray_cluster.client_address, status
        assert {n["pid"] for n in status["nodes"] if n["alive"]} == {n["pid"] for n in cst.cluster_status()["nodes"]}
        before = {n["node"]: n["runs"] for n in cst.cluster_status()["nodes"]}
        results = remote.map(cst.image.id, [f"sleep 0.2; echo {i} > /m" for i in range(8)], parallel=4)
        assert [r.exit_code for r in results] == [0] * 8
        assert cst.engine.read(results[5].image.id, "/m") == b"5\n"
        used = {n["node"]: n["runs"] - before[n["node"]] for n in cst.cluster_status()["nodes"]}
        assert sum(used.values()) == 8 and all(used.values()), used        # both nodes served
        _rest_streams_and_cancels(cst, remote, url)
        _terminal_through_serve(cst, url)


def _rest_streams_and_cancels(cst, remote, url):
    """Through REST: a run's event stream (SSE) carries its output while it runs on its node and a
    cancel over REST ends it there; a live sandbox's exec streams; a Contree instance (a live run)
    runs on a node, its subprocess started there, its DELETE cancels it."""
    import httpx
    ops = remote.engine.operations
    op = ops.submit_run(cst.image.id, "echo ready; sleep 60")
    seen = []

    def on_output(stream, chunk):
        seen.append(chunk)
        if b"ready" in b"".join(seen):
            ops.cancel(op)
    ops.stream(op, on_output)
    [done] = ops.wait([op], timeout=60)
    assert done["status"] == "cancelled" and b"".join(seen) == b"ready\n", done
    sid = remote.engine.sandbox_start(cst.image.id)["id"]
    try:
        # it goes on only once the test, seeing `ready`, has written /go: its output came as it ran
        got = []

        def go(stream, chunk):
            got.append(chunk)
            if b"ready" in chunk:
                cst.engine.sandbox_write(sid, "/go", b"")
        rec = remote.engine.sandbox_exec(sid, ["sh", "-c", "echo ready; while [ ! -e /go ]; do sleep 0.05; done; "
                                                          "echo went"], on_output=go)
        assert rec.exit_code == 0 and b"".join(got) == rec.stdout == b"ready\nwent\n", rec
    finally:
        remote.engine.sandbox_stop(sid)
    inst = httpx.post(f"{url}/v1/instances", json={"command": "echo started; sleep 60", "shell": True,
                                                   "image": "tag:busybox"})
    assert inst.status_code == 201, inst.text
    op = inst.json()["uuid"].replace("-", "")
    sub = httpx.post(f"{url}/v1/operations/{op}/subprocesses", json={"command": "echo sub", "shell": True})
    assert sub.status_code == 201, sub.text
    assert [n["node"] for n in cst.cluster_status()["nodes"] if op in n["sandbox_ids"]]   # on a node
    for _ in range(200):                   # ?inflight: its output so far, streamed from its node
        live = httpx.get(f"{url}/v1/operations/{op}", params={"inflight": ""}).json()
        if (live["metadata"]["result"] or {}).get("stdout", {}).get("value"):
            break
        time.sleep(0.05)
    assert live["status"] == "EXECUTING" and live["metadata"]["result"]["stdout"]["value"] == "started\n", live
    assert httpx.delete(f"{url}/v1/operations/{op}").status_code == 202
    with httpx.stream("GET", f"{url}/v1/operations/{op}/events", params={"follow": "1"}, timeout=60) as r:
        for _ in r.iter_lines():
            pass
    assert httpx.get(f"{url}/v1/operations/{op}").json()["status"] == "CANCELLED"


def test_cli_cluster_status(cst, ray_cluster):
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "sandtree", "--home", cst.engine.home, "--database",
                          cst.engine.store.database_url, "--cluster", ray_cluster.address, "cluster", "status",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    status = json.loads(out.stdout.strip().splitlines()[-1])
    assert status["mode"] == "cluster" and sorted(n["node"] for n in status["nodes"]) == \
        sorted(n["node"] for n in cst.cluster_status()["nodes"])
    human = subprocess.run([sys.executable, "-m", "sandtree", "--home", cst.engine.home, "cluster", "status"],
                           capture_output=True, text=True, timeout=120)
    assert human.returncode == 0 and "mode: local" in human.stdout, human.stderr[-2000:]
    # `sandtree shell` on a node's sandbox: its terminal relayed (here fed from a pipe, not a tty)
    sid = cst.engine.sandbox_start(cst.image.id)["id"]
    try:
        shell = subprocess.run([sys.executable, "-m", "sandtree", "--home", cst.engine.home, "--database",
                                cst.engine.store.database_url, "--cluster", ray_cluster.address, "shell", sid,
                                "--", "sh", "-c", "read x; echo got-$x-$((1+1)); exit 7"],
                               input="hi\n", capture_output=True, text=True, timeout=120)
        assert shell.returncode == 7 and "got-hi-2" in shell.stdout, (shell.stdout, shell.stderr[-2000:])
    finally:
        cst.engine.sandbox_stop(sid)


def test_cli_through_ray_client(cst, ray_cluster):
    """`sandtree --cluster ray://... cluster status`; a Ray Client address nothing answers is
    refused with a typed error naming it (after Ray's own connection attempts, shortened here)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "sandtree", "--home", cst.engine.home, "--database",
                          cst.engine.store.database_url, "--cluster", ray_cluster.client_address, "cluster", "status",
                          "--json"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    status = json.loads(out.stdout.strip().splitlines()[-1])
    assert status["ray_client"] and sorted(n["node"] for n in status["nodes"] if n["alive"]) == \
        sorted(n["node"] for n in cst.cluster_status()["nodes"])
    from conftest import free_port
    nobody = f"ray://127.0.0.1:{free_port()}"
    env = {**os.environ, "RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1", "RAY_CLIENT_MAX_CONNECTION_TIMEOUT_S": "1"}
    out = subprocess.run([sys.executable, "-m", "sandtree", "--home", cst.engine.home, "--cluster", nobody, "cluster",
                          "status"], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode != 0 and f"cannot connect to the Ray cluster at {nobody}" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]


# A process whose state lives only in its memory: a random word it read, then deleted from disk;
# each /tmp/ask it answers with that word in /tmp/answer.
REMEMBER = ("x=$(cat /proc/sys/kernel/random/uuid); echo $x > /tmp/word; "
            "while true; do if [ -e /tmp/ask ]; then echo $x > /tmp/answer; rm /tmp/ask; fi; sleep 0.02; done")


def _remembering(cst, sid: str) -> bytes:
    """Start REMEMBER in sandbox `sid`; its word (no longer on disk)."""
    assert cst.engine.sandbox_exec(sid, ["sh", "-c", f"({REMEMBER}) >/dev/null 2>&1 &"]).exit_code == 0
    out = cst.engine.sandbox_exec(sid, ["sh", "-c", "while [ ! -s /tmp/word ]; do sleep 0.02; done; "
                                                   "cat /tmp/word; rm /tmp/word"])
    assert out.exit_code == 0 and len(out.stdout) == 37, out
    return out.stdout


def _recalled(cst, sid: str) -> bytes:
    return cst.engine.sandbox_exec(sid, ["sh", "-c", "touch /tmp/ask; while [ -e /tmp/ask ]; do sleep 0.02; "
                                                    "done; cat /tmp/answer"]).stdout


def _hibernate_or_skip(cst):
    ok, why = cst.engine.runtime.live().hibernate_available()
    if not ok:
        pytest.skip(f"hibernate is not available here: {why}")


def test_hibernated_sandbox_resumes_on_any_node(cst):
    """A hibernation's checkpoint is in object storage: resume goes where load and layers say,
    here the other node (the hibernating one is busier), with its processes' memory."""
    _hibernate_or_skip(cst)
    fabric = cst.engine.fabric
    sid = cst.engine.sandbox_start(cst.image.id)["id"]
    extra = []
    try:
        [home] = [n["node"] for n in cst.cluster_status()["nodes"] if sid in n["sandbox_ids"]]
        cst.engine.sandbox_exec(sid, ["sh", "-c", "echo before > /state"])
        word = _remembering(cst, sid)
        cst.engine.sandbox_hibernate(sid)
        assert cst.engine.sandbox_info(sid)["state"] == "hibernated"
        assert fabric.checkpoint_node(sid) == home           # (its copy there: unused)
        extra = [fabric.start_sandbox("sandbox_start", (cst.image.id,), {}, node=home)["id"] for _ in range(3)]
        base = cst.engine.store.image(cst.engine.sandbox_info(sid)["head"]).layers
        assert fabric.pick(base) != home                     # by load and layers: the other node
        assert cst.engine.sandbox_resume(sid)["state"] == "running"
        assert sid not in _node(cst, home)["sandbox_ids"]
        assert cst.engine.sandbox_exec(sid, ["cat", "/state"]).stdout == b"before\n"
        assert _recalled(cst, sid) == word
    finally:
        for s in [sid, *extra]:
            cst.engine.sandbox_stop(s)


def test_killed_node_fails_its_runs_and_the_other_keeps_serving(cst, ray_cluster):
    """kill -9 of a worker node mid-runs: its runs end failed with NodeLost, except those asked
    with retries=, which run again on the survivor and succeed; the other node's finish, later
    runs go to the survivor, fsck finds nothing wrong."""
    status = {n["node"]: n for n in cst.cluster_status()["nodes"]}
    # a live sandbox on each node (placed: this process's count of a node's sandboxes still holds
    # those another replica, a serve test's, started and stopped, so load may not alternate)
    sandboxes = [cst.engine.fabric.start_sandbox("sandbox_start", (cst.image.id,), {}, node=n)["id"] for n in status]
    try:
        _killed_node(cst, ray_cluster, status, sandboxes)
    finally:                                # whatever failed: this machine's sandbox processes end
        for sid in sandboxes:
            try:
                type(cst.engine).sandbox_stop(cst.engine, sid)
            except Exception:               # noqa: BLE001 - stopped already
                pass


def _killed_node(cst, ray_cluster, status, sandboxes):
    ops = cst.engine.operations
    victim = 0
    victim_node = ray_cluster.node_id(victim)
    # a sandbox hibernated on the node about to die (its checkpoint in object storage)
    hib = cst.engine.fabric.start_sandbox("sandbox_start", (cst.image.id,), {}, node=victim_node)["id"]
    sandboxes.append(hib)
    word = _remembering(cst, hib) if cst.engine.runtime.live().hibernate_available()[0] else None
    if word is not None:
        cst.engine.sandbox_hibernate(hib)
    else:
        cst.engine.sandbox_stop(hib)
    where = {sid: n["node"] for n in cst.cluster_status()["nodes"] for sid in n["sandbox_ids"]}
    assert sorted(where.values()) == sorted(status), where
    submitted, retried = [], []
    fabric = cst.engine.fabric

    def in_flight() -> int:
        return sum(v.running for v in fabric.nodes())

    # One at a time, each sent to its node before the next (by load they alternate between the
    # two nodes), in pairs of a kind: runs with retries and without reach both nodes.
    for i in range(16):
        before = in_flight()
        if (i // 2) % 2:
            retried.append(ops.submit_run(cst.image.id, ["sh", "-c", f"sleep 6; echo {i} > /k"], retries=2))
        else:
            submitted.append(ops.submit_run(cst.image.id, ["sh", "-c", f"sleep 6; echo {i} > /k"]))
        deadline = time.monotonic() + 10
        while in_flight() <= before and time.monotonic() < deadline:
            time.sleep(0.01)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:      # until both nodes run some
        running = {n["node"]: n["running"] for n in cst.cluster_status()["nodes"]}
        if all(v > 0 for v in running.values()):
            break
        time.sleep(0.1)
    victim_pid = status[victim_node]["pid"]
    t0 = time.monotonic()
    ray_cluster.kill(victim)
    finished = ops.wait(submitted, timeout=120)
    noticed = time.monotonic() - t0
    failed = [f for f in finished if f["status"] == "failed"]
    done = [f for f in finished if f["status"] == "done"]
    assert failed and done, finished
    assert all(f["outcome"]["error"] == "node_lost" and "was lost" in f["outcome"]["message"]
               and f["outcome"]["node"] == victim_node for f in failed), failed
    assert noticed < 30, noticed
    print(f"node lost noticed after {noticed:.1f} s: {failed[0]['outcome']['message']}")
    for f in done:
        assert f["outcome"]["exit_code"] == 0 and f["result"]
    # the runs that asked for retries all succeeded; those the lost node had ran again on the survivor
    again = ops.wait(retried, timeout=120)
    assert all(f["status"] == "done" and f["outcome"]["exit_code"] == 0 for f in again), again
    # (a run that committed on the victim just before it died is done in its row, but its caller got
    # NodeLost "not retried: ... committed on that node" naming its image: no record here;
    # tests/integrations/test_cluster_retries.py)
    for op in retried:
        if ops.result(op) is None:
            assert ops.get(op)["result"], ops.get(op)
    moved = [op for op in retried if ops.result(op) is not None and ops.result(op).usage.get("retried_after_lost")]
    assert moved, [ops.get(op) for op in retried]
    for op in moved:
        rec = ops.result(op)
        assert rec.usage["retried_after_lost"] == [victim_node] and rec.usage["node"] != victim_node
        k = retried.index(op)
        i = 4 * (k // 2) + 2 + k % 2
        assert cst.engine.read(rec.image, "/k") == f"{i}\n".encode()
    # the survivor keeps serving, alone
    more = cst.map(cst.image, [f"echo after{i} > /a" for i in range(6)], parallel=3)
    assert all(r.exit_code == 0 for r in more)
    alive = [n for n in cst.cluster_status()["nodes"] if n["alive"]]
    assert len(alive) == 1 and alive[0]["pid"] != victim_pid
    # the lost node's sandbox is reported lost; the survivor's answers
    [lost] = [sid for sid, n in where.items() if n == victim_node]
    [kept] = [sid for sid, n in where.items() if n != victim_node]
    with pytest.raises(NodeLost, match="was lost") as e:
        cst.engine.sandbox_exec(lost, ["true"])
    assert e.value.details["node"] == victim_node
    info = cst.engine.sandbox_info(lost)             # its row says so, for every replica
    assert info["state"] == "lost" and info["lost"]["node"] == victim_node and info["lost"]["reason"], info
    assert {s["id"]: s["state"] for s in cst.engine.sandbox_list()}[lost] == "lost"
    assert cst.engine.sandbox_exec(kept, ["echo", "ok"]).stdout == b"ok\n"
    cst.engine.sandbox_stop(kept)
    # its processes outlive the node on this one machine (live sandboxes are detached by design):
    # a stop of a lost sandbox is answered from its row here, and ends them
    assert cst.engine.sandbox_stop(lost)["state"] == "stopped"
    # the sandbox hibernated on the lost node resumes on the survivor, its memory intact
    if word is not None:
        assert cst.engine.sandbox_info(hib)["state"] == "hibernated"
        assert cst.engine.sandbox_resume(hib)["state"] == "running"
        assert hib in _node(cst, alive[0]["node"])["sandbox_ids"]
        assert _recalled(cst, hib) == word
        assert cst.engine.sandbox_stop(hib)["state"] == "stopped"
    report = cst.engine.fsck()
    assert report["ok"], report

