"""Live runs and the processes of a live sandbox (engine/instances.py, issue 16): a submitted run
whose command is process 1 of a live sandbox, joined by more processes while it runs, with stdin
kept open and signals; a plain live sandbox's processes the same way; on the real kernel, through
the table's rows sandbox_spawn / sandbox_stdin / sandbox_signal / sandbox_process (what Contree's
/v1 adapts), in process, through the SDK (sync and async) and over REST."""

from __future__ import annotations

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
    import base64
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
    # lost, a limit of the entering helper, runtime/helper.c)
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
