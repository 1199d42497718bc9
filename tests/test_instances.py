"""Live runs (engine/instances.py, issue 16): a submitted run whose command is process 1 of a live
sandbox, joined by more processes while it runs, with stdin kept open and signals; on the real
kernel, through engine.operations (what Contree's /v1 adapts)."""

from __future__ import annotations

import os
import time

import pytest

from sandtree.errors import Conflict, InvalidInput, NotFound

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="live sandboxes need root")


@pytest.fixture
def ops(st, rootfs):
    st.import_image(rootfs, tag="bb")
    return st._engine.operations if hasattr(st, "_engine") else st.engine.operations


def until(fn, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_processes_join_a_live_run_and_its_commit_holds_their_writes(ops):
    op = ops.submit_run("bb", "cat; echo main > /main", live=True, stdin_open=True)
    spid = ops.spawn(op, "echo sub $X; echo sub > /sub", env={"X": "1"})     # waits for the sandbox
    assert spid == 2
    p = until(lambda: (v := ops.process(op, 2)) and not v["running"] and v)
    assert (p["exit_code"], p["stdout"]) == (0, b"sub 1\n")
    three = ops.spawn(op, ["sleep", "30"])
    assert ops.process(op, three)["running"]
    ops.signal(op, three, "TERM")
    p3 = until(lambda: (v := ops.process(op, three)) and not v["running"] and v)
    assert (p3["exit_code"], p3["signal"]) == (None, 15)
    with pytest.raises(NotFound):
        ops.signal(op, three, 9)                      # exited
    with pytest.raises(InvalidInput):
        ops.signal(op, 1, "NOSUCH")
    ops.write(op, 1, b"a\n", close=False)
    ops.write(op, 1, b"b\n")
    with pytest.raises(Conflict):
        ops.write(op, 1, b"late")                     # closed
    rec = ops.wait([op], 30)[0]
    res = ops.result(op)
    assert rec["status"] == "done" and res.stdout == b"a\nb\n" and res.exit_code == 0
    assert {"main", "sub"} <= {e.name for e in ops.host.ls(res.image, "/")}
    # ended: no new processes; the old ones are told from the events
    with pytest.raises(Conflict):
        ops.spawn(op, "true")
    assert ops.process(op, 2)["stdout"] == b"sub 1\n" and ops.process(op, 1)["stdout"] == b"a\nb\n"
    with pytest.raises(NotFound):
        ops.process(op, 9)


def test_a_live_run_times_out_is_cancelled_and_a_disposable_one_keeps_nothing(ops):
    slow = ops.submit_run("bb", "sleep 30", live=True, timeout=1)
    rec = ops.wait([slow], 30)[0]
    assert ops.result(slow).timed_out and ops.result(slow).signal == 9 and rec["status"] == "done"
    held = ops.submit_run("bb", "cat", live=True, stdin_open=True)
    ops.spawn(held, ["sleep", "30"])                  # killed with it
    ops.cancel(held)
    assert ops.wait([held], 30)[0]["status"] == "cancelled"
    gone = ops.submit_run("bb", "echo x > /x", live=True, disposable=True)
    ops.wait([gone], 30)
    assert ops.result(gone).image is None and ops.result(gone).exit_code == 0
    # not a live run: nothing joins it
    plain = ops.submit_run("bb", "sleep 1")
    with pytest.raises(Conflict):
        ops.spawn(plain, "true")
    ops.wait([plain], 30)
