"""Live runs and the processes of a live sandbox (engine/processes/instances.py, issue 16): a submitted run
whose command is process 1 of a live sandbox, joined by more processes while it runs, with stdin
kept open and signals; a plain live sandbox's processes the same way; on the real kernel, through
the table's rows sandbox_spawn / sandbox_stdin / sandbox_signal / sandbox_process (what Contree's
/v1 adapts), in process, through the SDK (sync and async) and over REST."""

from __future__ import annotations

import base64
import json
import os
import time
import uuid as uuid_mod

import httpx
import pytest
from conftest import serve_process

import sandtree
from sandtree.errors import Conflict, Ended, InvalidInput, NotFound, NotReady

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="live sandboxes need root")


@pytest.fixture
def ops(st, rootfs):
    st.import_image(rootfs, tag="bb")
    return st._engine.operations


def out(view, stream="stdout") -> bytes:
    """A process view's exact bytes of one stream."""
    return base64.b64decode(view[stream + "_base64"])


def until(fn, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_processes_join_a_live_run_and_its_commit_holds_their_writes(ops):
    eng = ops.host
    op = ops.submit_run("bb", "cat; echo main > /main", live=True, stdin_open=True)
    spid = eng.sandbox_spawn(op, "echo sub $X; echo sub > /sub", env={"X": "1"})     # waits for the sandbox
    assert spid == 2
    p = until(lambda: (v := eng.sandbox_process(op, 2)) and not v["running"] and v)
    assert (p["exit_code"], out(p), p["stdout"], p["pid"]) == (0, b"sub 1\n", "sub 1\n", 2)
    three = eng.sandbox_spawn(op, ["sh", "-c", "echo up; exec sleep 30"])
    # (signalled once it runs: a signal between the helper's fork and the command's setsid is
    # lost, a limit of the entering helper, runtime/helper/enter.c)
    until(lambda: out(eng.sandbox_process(op, three)) == b"up\n")
    assert eng.sandbox_process(op, three)["running"]
    eng.sandbox_signal(op, three, "TERM")
    p3 = until(lambda: (v := eng.sandbox_process(op, three)) and not v["running"] and v)
    assert (p3["exit_code"], p3["signal"]) == (None, 15)
    with pytest.raises(NotFound):
        eng.sandbox_signal(op, three, "9")            # exited
    with pytest.raises(InvalidInput):
        eng.sandbox_signal(op, 1, "NOSUCH")
    eng.sandbox_stdin(op, 1, b"a\n", close=False)
    eng.sandbox_stdin(op, 1, "b\n")
    with pytest.raises(Conflict):
        eng.sandbox_stdin(op, 1, b"late")             # closed
    rec = ops.wait([op], 30)[0]
    res = ops.result(op)
    assert rec["status"] == "done" and res.stdout == b"a\nb\n" and res.exit_code == 0
    assert {"main", "sub"} <= {e.name for e in eng.ls(res.image, "/")}
    # ended: no new processes (Conflict), no stdin to write (Ended: Contree's 410); the old ones
    # are told from the events
    with pytest.raises(Conflict) as exc:
        eng.sandbox_spawn(op, "true")
    assert not isinstance(exc.value, Ended)
    with pytest.raises(Ended):
        eng.sandbox_stdin(op, 1, b"x")
    assert out(eng.sandbox_process(op, 2)) == b"sub 1\n" and out(eng.sandbox_process(op, 1)) == b"a\nb\n"
    with pytest.raises(NotFound):
        eng.sandbox_process(op, 9)


def test_a_live_runs_image_has_one_edge_labelled_by_its_command(ops):
    """The commit that ends a live run is a step of the run: one edge to its image, the run's
    (its command, its exit code), not a second one labelled "commit of live sandbox ..."."""
    eng = ops.host
    base = eng.resolve("bb")
    op = ops.submit_run("bb", "echo made > /made; exit 3", live=True)
    ops.wait([op], 30)
    image = ops.result(op).image
    parents = eng.parents(image)
    assert [(e["parent"], e["op"], e["command"], e["exit_code"]) for e in parents] == [
        (base, op, "echo made > /made; exit 3", 3)]
    assert [e["child"] for e in eng.children(base)] == [image]
    tree = eng.lineage_tree(base)
    assert [(n["image"], n["command"], n["exit_code"]) for n in tree["children"]] == [
        (image, "echo made > /made; exit 3", 3)]
    # the commit is still recorded (what the sandbox's commits say), as the run's
    made = {m["kind"]: m for m in eng.produced_by(image)}
    assert made["run"]["op"] == op and eng.operations.get(made["commit"]["op"])["spec"]["run"] == op


def test_a_live_run_times_out_is_cancelled_and_a_disposable_one_keeps_nothing(ops):
    slow = ops.submit_run("bb", "sleep 30", live=True, timeout=1)
    rec = ops.wait([slow], 30)[0]
    assert ops.result(slow).timed_out and ops.result(slow).signal == 9 and rec["status"] == "done"
    held = ops.submit_run("bb", "cat", live=True, stdin_open=True)
    ops.host.sandbox_spawn(held, ["sleep", "30"])    # killed with it
    ops.cancel(held)
    assert ops.wait([held], 30)[0]["status"] == "cancelled"
    gone = ops.submit_run("bb", "echo x > /x", live=True, disposable=True)
    ops.wait([gone], 30)
    assert ops.result(gone).image is None and ops.result(gone).exit_code == 0
    # not a live run: nothing joins it
    plain = ops.submit_run("bb", "sleep 1")
    with pytest.raises(Conflict):
        ops.host.sandbox_spawn(plain, "true")
    ops.wait([plain], 30)


def test_only_its_tenant_reaches_an_instances_processes(tmp_path, rootfs):
    """Over /v1 with tokens: another tenant's calls on an instance's processes are 404 (it does
    not exist for them) and change nothing; its own tenant's work."""
    home = str(tmp_path / "home")
    st = sandtree.Sandtree(home)
    try:
        st.import_image(rootfs, tag="bb")
        a = st._engine.tenancy.create_token("alpha", None)["token"]
        b = st._engine.tenancy.create_token("beta", None)["token"]
        base = st._engine.resolve("bb")
        st._engine.tenancy.share(base)
    finally:
        st.close()
    ha, hb = ({"Authorization": f"Bearer {t}"} for t in (a, b))
    with serve_process(home) as url:
        r = httpx.post(f"{url}/v1/instances", headers=ha, json={
            "command": "cat", "shell": True, "image": str(uuid_mod.UUID(base[:32])),
            "stdin": {"value": "", "close": False}})
        assert r.status_code == 201, r.text
        ops = f"{url}/v1/operations/{r.json()['uuid']}"
        for call in (lambda h: httpx.post(f"{ops}/subprocesses", headers=h, json={"command": "true", "shell": True}),
                     lambda h: httpx.get(f"{ops}/subprocesses/1", headers=h),
                     lambda h: httpx.post(f"{ops}/subprocesses/1/stdin", headers=h, json={"value": "x", "close": False}),
                     lambda h: httpx.delete(f"{ops}/subprocesses/1", headers=h)):
            assert call(hb).status_code == 404
        spid = httpx.post(f"{ops}/subprocesses", headers=ha, json={"command": "echo mine", "shell": True})
        assert spid.status_code == 201 and spid.json() == {"spid": 2}, spid.text
        assert httpx.post(f"{ops}/subprocesses/1/stdin", headers=ha, json={"value": "in\n"}).status_code == 204
        with httpx.stream("GET", f"{ops}/events", params={"follow": "1"}, headers=ha, timeout=60) as s:
            for _ in s.iter_lines():
                pass
        done = httpx.get(ops, headers=ha).json()
        assert done["status"] == "SUCCESS" and done["metadata"]["result"]["stdout"]["value"] == "in\n", done
        assert httpx.get(f"{ops}/subprocesses/2", headers=ha).json()["stdout"]["value"] == "mine\n"


def test_a_process_left_in_the_background_does_not_hold_the_run(ops):
    t0 = time.monotonic()
    op = ops.submit_run("bb", "sleep 60 & echo started", live=True)
    ops.wait([op], 30)
    assert ops.result(op).stdout == b"started\n" and time.monotonic() - t0 < 10


def test_a_live_sandboxes_processes_through_the_sdk_sync_and_async(st, rootfs):
    """Sandbox.spawn (the table's rows on a plain live sandbox): stdin kept open, written, closed;
    a signal; the async twin; numbered from 1; gone with the sandbox."""
    import asyncio

    from sandtree.client.aio import AsyncSandbox
    img = st.import_image(rootfs)
    with img.start() as sb:
        cat = sb.spawn("cat; echo done >&2", stdin_open=True)
        assert cat.pid == 1 and cat.state()["running"] and cat.state()["stdin_open"]
        cat.write("hi\n")
        cat.write(b"\xff\n", close=True)
        v = cat.wait(10)
        assert (v["exit_code"], out(v), v["stderr"], v["stdin_open"]) == (0, b"hi\n\xff\n", "done\n", False)
        with pytest.raises(Conflict):
            cat.write("late")                                # closed
        sleeper = sb.spawn(["sh", "-c", "echo up; exec sleep 30"])
        assert sleeper.pid == 2
        until(lambda: sleeper.state()["stdout"] == "up\n")
        sleeper.signal("TERM")
        assert sleeper.wait(10)["signal"] == 15
        with pytest.raises(NotFound):
            sb._st.engine.sandbox_process(sb.id, 7)

        async def twin():
            proc = await AsyncSandbox(sb).spawn("read x; echo got $x", stdin_open=True)
            await proc.write("it", close=True)
            return await proc.wait(10)
        assert asyncio.run(twin())["stdout"] == "got it\n"
        sid = sb.id
    with pytest.raises(Conflict):
        st._engine.sandbox_spawn(sid, "true")                # stopped
    with pytest.raises(NotFound):
        st._engine.sandbox_spawn("0" * 32, "true")


def test_a_live_run_is_a_run_slot_not_a_listed_sandbox(ops):
    """Its sandbox is the run's (counted as a run: max_runs, the queue), not one of the live
    sandboxes listed (max_sandboxes counts those); its info names the run."""
    eng = ops.host
    op = ops.submit_run("bb", "sleep 30", live=True)
    sid = until(lambda: (i := ops.instances.live.get(op)) and i.sid)
    assert sid not in {s["id"] for s in eng.sandbox_list()} and eng.sandbox_info(sid)["run"] == op
    assert ops.get(op)["status"] == "running"
    ops.cancel(op)
    ops.wait([op], 30)


def test_v1_statuses_cwd_and_events_as_contree(tmp_path, rootfs):
    """Over /v1 (a real `sandtree serve`, one run slot): a subprocess of an instance still queued
    is 425 with Retry-After (its clients retry); stdin of a finished one 410, a spawn 409; a
    missing cwd is made, for the instance and its subprocesses; the events Contree documents:
    init first (spid 0), stdin, truncated, size_cap, exit, shutdown, then completion."""
    home = str(tmp_path / "home")
    st = sandtree.Sandtree(home)
    try:
        image = str(uuid_mod.UUID(st.import_image(rootfs).id[:32]))
    finally:
        st.close()
    with serve_process(home, "--max-runs", "1") as url:
        def spawn(**body):
            r = httpx.post(f"{url}/v1/instances", json={"image": image, "shell": True, **body})
            assert r.status_code == 201, r.text
            return f"{url}/v1/operations/{r.json()['uuid']}"

        def events(ops):
            with httpx.stream("GET", f"{ops}/events", params={"follow": "1"}, timeout=60) as s:
                return [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: ")]

        busy = spawn(command="sleep 30")
        queued = spawn(command="true")
        r = httpx.post(f"{queued}/subprocesses", json={"command": "true", "shell": True})
        assert r.status_code == 425 and int(r.headers["retry-after"]) >= 1, r.text
        assert httpx.delete(busy).status_code == 202
        until(lambda: httpx.get(queued).json()["status"] == "SUCCESS", 30)
        assert httpx.post(f"{queued}/subprocesses/1/stdin", json={"value": "x"}).status_code == 410
        assert httpx.post(f"{queued}/subprocesses", json={"command": "true", "shell": True}).status_code == 409

        ops = spawn(command="pwd; cat; head -c 100 /dev/zero", cwd="/made/here", truncate_output_at=16,
                    stdin={"value": "", "close": False})
        sub = httpx.post(f"{ops}/subprocesses", json={"command": "pwd; head -c 50 /dev/zero", "shell": True,
                                                      "cwd": "/also/new", "truncate_output_at": 10})
        assert sub.status_code == 201, sub.text
        until(lambda: not httpx.get(f"{ops}/subprocesses/2").json()["state"]["exit_code"] == -1)
        assert httpx.get(f"{ops}/subprocesses/2").json()["stdout"]["value"].startswith("/also/new\n")
        # a process whose own cap is higher than the log's budget (8 x 16 bytes) fills the log
        big = httpx.post(f"{ops}/subprocesses", json={"command": "head -c 1000 /dev/zero | tr '\\0' b; echo",
                                                      "shell": True, "truncate_output_at": 2000})
        until(lambda: not httpx.get(f"{ops}/subprocesses/3").json()["state"]["exit_code"] == -1)
        assert len(httpx.get(f"{ops}/subprocesses/3").json()["stdout"]["value"]) == 1001, big.text
        assert httpx.post(f"{ops}/subprocesses/1/stdin", json={"value": "in\n"}).status_code == 204
        evs = events(ops)
        done = httpx.get(ops).json()
        assert done["status"] == "SUCCESS", done
        ids = [e["id"] for e in evs]
        assert ids == sorted(set(ids))
        types = [(e["type"], e.get("spid")) for e in evs]
        assert types[0] == ("init", 0) and types[-2:] == [("shutdown", 0), ("completion", None)], types
        assert {"started_at", "runtime_path", "verbose", "init_pid"} <= set(evs[0]["data"])
        assert evs[-2]["data"]["reason"] == "job_complete"
        stdin = [e for e in evs if e["type"] == "stdin"]
        assert stdin == []                               # written after the log's cap: dropped
        cut = {e["spid"]: e["data"] for e in evs if e["type"] == "truncated"}
        assert cut[2] == {"stream": "stdout", "bytes_emitted": 10, "bytes_dropped": 50}, cut
        assert cut[1]["bytes_emitted"] == 16 and cut[1]["stream"] == "stdout"
        caps = [e for e in evs if e["type"] == "size_cap"]
        assert len(caps) == 1 and caps[0]["spid"] == 0 and caps[0]["data"]["limit_bytes"] == 8 * 16, caps
        # after it, no stream event (process 3's output, then process 1's stdin and output)
        assert not [e for e in evs if e["id"] > caps[0]["id"] and e["type"] in ("stdout", "stderr", "stdin")]
        assert any(e["type"] == "exit" and e["spid"] == 3 for e in evs)         # service events go on
        out1 = "".join(e["data"]["value"] for e in evs if e["type"] == "stdout" and e["spid"] == 1)
        result = done["metadata"]["result"]["stdout"]             # base64: the NULs of /dev/zero
        assert out1 == "/made/here\n" and base64.b64decode(result["value"]) == b"/made/here\nin\n\0\0"
        # resuming after an event gives only what came after it
        with httpx.stream("GET", f"{ops}/events", params={"since": str(ids[2])}, timeout=60) as s:
            after = [json.loads(ln[6:])["id"] for ln in s.iter_lines() if ln.startswith("data: ")]
        assert after == ids[3:]


def test_processes_over_rest_the_cli_and_mcp(tmp_path, rootfs):
    """The same rows through the remote client (sandtree.connect: REST /api/v1), `sandtree spawn`
    and `sandtree proc --server`, and the MCP tools sandbox_spawn / sandbox_process (a real
    `sandtree mcp` over stdio)."""
    import asyncio
    import subprocess
    import sys

    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters
    home = str(tmp_path / "home")
    with serve_process(home) as url:
        remote = sandtree.connect(url)
        sb = remote.import_image(rootfs).start()
        try:
            p = sb.spawn("cat", stdin_open=True)
            p.write(b"\xfe bytes\n", close=True)
            v = p.wait(10)
            assert (v["pid"], out(v), v["exit_code"]) == (1, b"\xfe bytes\n", 0)
            with pytest.raises(Conflict):
                p.write("late")
            with pytest.raises(NotFound):
                remote.engine.sandbox_process(sb.id, 9)
            cli = [sys.executable, "-m", "sandtree", "--home", home]
            r = subprocess.run(cli + ["spawn", sb.id, "--server", url, "--stdin-open", "--", "read x; echo cli $x"],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0 and r.stdout.strip() == "2", r.stderr
            r = subprocess.run(cli + ["proc", sb.id, "2", "--server", url, "--write", "ok", "--close", "--wait", "10"],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0 and r.stdout == "cli ok\n" and "exit 0" in r.stderr, r.stderr
            r = subprocess.run(cli + ["spawn", sb.id, "--", "true"], capture_output=True, text=True, timeout=60)
            assert r.returncode != 0 and "--server" in r.stderr
        finally:
            sb.stop()
            remote.close()

    async def main():
        params = StdioServerParameters(command=sys.executable, args=["-m", "sandtree", "--home", home, "mcp", "--tools", "all"],
                                       env={**os.environ})
        async with Client(params) as c:
            def data(res):
                assert not res.is_error, res.content
                return json.loads(res.content[0].text)
            img = data(await c.call_tool("import_image", {"source": rootfs, "tag": "bb"}))["image"]
            sid = data(await c.call_tool("sandbox_start", {"image": img}))["id"]
            pid = data(await c.call_tool("sandbox_spawn", {"sandbox_id": sid, "command": "cat; echo end",
                                                           "stdin_open": True}))["pid"]
            v = data(await c.call_tool("sandbox_process", {"sandbox_id": sid, "pid": pid, "stdin": "mcp\n",
                                                           "close_stdin": True}))
            assert v["pid"] == pid
            for _ in range(200):
                v = data(await c.call_tool("sandbox_process", {"sandbox_id": sid, "pid": pid}))
                if not v["running"]:
                    break
                await asyncio.sleep(0.05)
            assert (v["exit_code"], v["stdout"]) == (0, "mcp\nend\n"), v
            slow = data(await c.call_tool("sandbox_spawn", {"sandbox_id": sid, "command": "sleep 30"}))["pid"]
            await asyncio.sleep(0.3)
            data(await c.call_tool("sandbox_process", {"sandbox_id": sid, "pid": slow, "signal": "KILL"}))
            for _ in range(200):
                v = data(await c.call_tool("sandbox_process", {"sandbox_id": sid, "pid": slow}))
                if not v["running"]:
                    break
                await asyncio.sleep(0.05)
            assert v["signal"] == 9
            r = await c.call_tool("sandbox_process", {"sandbox_id": sid, "pid": 99})
            assert r.is_error and "not_found" in r.content[0].text
            data(await c.call_tool("sandbox_stop", {"sandbox_id": sid}))
    asyncio.run(main())


def test_a_live_run_starts_from_the_images_warm_pool(ops):
    """A live run on an image with a warm pool takes a ready sandbox (its limits fitting), gives
    it back stopped, and commits what its processes wrote; one with other limits starts its own;
    the pool then closes (nothing lent is left out)."""
    eng = ops.host
    eng.pool_and_wait("bb", 2)
    before = eng.pool_list()[0]["served"]
    op = ops.submit_run("bb", "cat; echo main > /main", live=True, stdin_open=True)
    assert eng.sandbox_spawn(op, "echo sub > /sub") == 2
    until(lambda: not eng.sandbox_process(op, 2)["running"], 30)   # (process 1's end kills what is left)
    eng.sandbox_stdin(op, 1, b"x\n")
    rec, res = ops.wait([op], 30)[0], ops.result(op)
    assert rec["status"] == "done" and res.stdout == b"x\n"
    assert {"main", "sub"} <= {e.name for e in eng.ls(res.image, "/")}
    assert eng.pool_list()[0]["served"] == before + 1
    other = ops.submit_run("bb", "true", live=True, memory="96M")
    ops.wait([other], 30)
    assert ops.result(other).exit_code == 0 and eng.pool_list()[0]["served"] == before + 1
    t0 = time.monotonic()
    eng.pool_remove("bb")                       # waits for what it lent: given back
    assert time.monotonic() - t0 < 10


def test_a_tenant_reaches_only_its_own_sandboxes_processes(tmp_path, rootfs):
    """The rows through the tenant view: another tenant's sandbox and live run answer as ones
    that do not exist, and a token without the run scope is refused."""
    from sandtree.engine import Engine
    from sandtree.errors import Forbidden
    from sandtree.tenancy import Tenant
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        alice, bob = eng.as_tenant(Tenant("alice")), eng.as_tenant(Tenant("bob"))
        img = alice.import_path(rootfs)
        sid = alice.sandbox_start(img)["id"]
        op = alice.operations.submit_run(img, "cat", live=True, stdin_open=True)
        pid = alice.sandbox_spawn(sid, "echo mine")
        until(lambda: not alice.sandbox_process(sid, pid)["running"])
        assert alice.sandbox_process(sid, pid)["stdout"] == "mine\n"
        for target in (sid, op):
            with pytest.raises(NotFound):
                bob.sandbox_spawn(target, "true")
            with pytest.raises(NotFound):
                bob.sandbox_process(target, 1)
            with pytest.raises(NotFound):
                bob.sandbox_signal(target, 1, "KILL")
            with pytest.raises(NotFound):
                bob.sandbox_stdin(target, 1, b"x")
        with pytest.raises(Forbidden):
            eng.as_tenant(Tenant("alice", ("list",))).sandbox_spawn(sid, "true")
        alice.sandbox_stdin(op, 1, b"ok\n")                 # its own live run, by its operation ID
        assert alice.operations.wait([op], 30)[0]["status"] == "done"
        assert alice.sandbox_process(op, 1)["stdout"] == "ok\n"
        alice.sandbox_stop(sid)
    finally:
        eng.close()


def test_a_call_on_a_queued_live_run_is_not_ready_then_works(tmp_path, rootfs):
    """No worker free (max_runs 1): a call on the queued live run waits 2 s, then NotReady (the
    engine's 425); once a worker takes it, the same call waits for its sandbox and works."""
    from sandtree.engine import Engine
    eng = Engine(str(tmp_path / "home"), warm=0, max_runs=1)
    try:
        img = eng.import_path(rootfs)
        busy = eng.operations.submit_run(img, "sleep 30", live=True)
        queued = eng.operations.submit_run(img, "cat", live=True, stdin_open=True)
        t0 = time.monotonic()
        with pytest.raises(NotReady) as exc:
            eng.sandbox_spawn(queued, "true")
        assert 1.5 < time.monotonic() - t0 < 10 and exc.value.details["retry_after"] >= 1
        assert isinstance(exc.value, Conflict) and exc.value.http_status == 425
        eng.operations.cancel(busy)
        assert eng.sandbox_spawn(queued, "echo late") == 2           # waits for its sandbox now
        eng.sandbox_stdin(queued, 1, b"")
        assert eng.operations.wait([queued], 30)[0]["status"] == "done"
    finally:
        eng.close()


def test_v1_instances_start_from_the_servers_pool(tmp_path, rootfs):
    """`serve --pool IMAGE=N`: Contree's instances on that image (default limits, as the clients
    send them) take its ready sandboxes, their subprocesses included."""
    home = str(tmp_path / "home")
    st = sandtree.Sandtree(home)
    try:
        image = str(uuid_mod.UUID(st.import_image(rootfs, tag="bb").id[:32]))
    finally:
        st.close()
    with serve_process(home, "--pool", "bb=1") as url:
        until(lambda: httpx.get(f"{url}/api/v1/pools").json()[0]["ready"] == 1, 30)
        served = []
        for _ in range(2):
            r = httpx.post(f"{url}/v1/instances", json={"image": image, "command": "cat", "shell": True,
                                                        "stdin": {"value": "", "close": False}})
            ops = f"{url}/v1/operations/{r.json()['uuid']}"
            assert httpx.post(f"{ops}/subprocesses", json={"command": "echo sub", "shell": True}).status_code == 201
            assert httpx.post(f"{ops}/subprocesses/1/stdin", json={"value": "main\n"}).status_code == 204
            until(lambda: httpx.get(ops).json()["status"] == "SUCCESS", 30)
            assert httpx.get(ops).json()["metadata"]["result"]["stdout"]["value"] == "main\n"
            assert httpx.get(f"{ops}/subprocesses/2").json()["stdout"]["value"] == "sub\n"
            served.append(httpx.get(f"{url}/api/v1/pools").json()[0]["served"])
            until(lambda: httpx.get(f"{url}/api/v1/pools").json()[0]["ready"] == 1, 30)
        assert served == [1, 2], served
