"""A gVisor hibernation answers once the checkpoint is whole and the row says `hibernated`; the old
sandbox (paused by runsc, left by `runsc checkpoint --leave-running`) is stopped off that path
(engine/sandboxes/retiring.py). An engine killed between the two must leave no sandbox both running and
hibernated, and lose nothing: the next reap, resume or stop stops the old one."""

import os
import subprocess
import sys
import time

import pytest

import sandtree
from sandtree.runtime.liveproc import LiveHandle

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")

# an engine killed (exit 9, no cleanup) right after the row says hibernated, before the old stop
KILLED = """
import os, sys, sandtree
from sandtree.engine.sandboxes import retiring
retiring.Retiring.later = lambda self, sid, h: os._exit(9)
sandtree.Sandtree(sys.argv[1], warm=0).sandbox(sys.argv[2]).hibernate()
"""

# each number written beside and renamed over: a freeze (or a checkpoint) between a write's truncate and
# its data would otherwise leave /tmp/count empty for good (it did once: the frozen old sandbox read b"")
COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.05; done"


def _killed_hibernate(home: str, sid: str) -> None:
    r = subprocess.run([sys.executable, "-c", KILLED, home, sid], env={**os.environ, "PYTHONPATH": SRC},
                       capture_output=True, timeout=120)
    assert r.returncode == 9, r.stderr.decode(errors="replace")[-2000:]


def _count(sb) -> int:
    """The counter's last number. Read again while there is none: before its first write, or
    between a write's truncation and its number (`echo > file` is two steps), the file is empty."""
    for _ in range(100):
        out = sb.exec("cat /tmp/count 2>/dev/null").stdout.strip()
        if out.isdigit():
            return int(out)
        time.sleep(0.02)
    raise AssertionError(f"the counter wrote no number: {out!r}")


def _old_count(h: LiveHandle) -> bytes:
    """What the old sandbox's counter wrote last, read through its helper's mount namespace."""
    with open(f"/proc/{h.helper_pid}/root/tmp/r/tmp/count", "rb") as f:
        return f.read()


def _gvisor_sandbox(tmp_path, rootfs):
    """(home, store, a live gVisor sandbox in it), or a skip when gVisor cannot hibernate here."""
    home = str(tmp_path / "home")
    st = sandtree.Sandtree(home, warm=0)
    ok, why = st._engine.sandboxes.live.hibernate_available("gvisor")
    if not ok:
        st.close()
        pytest.skip(why)
    return home, st, st.import_image(rootfs).start(tier="gvisor", idle_timeout=300, lifetime=600)


def test_an_engine_killed_before_the_old_gvisor_sandbox_stopped_loses_nothing(tmp_path, rootfs):
    home, st, sb = _gvisor_sandbox(tmp_path, rootfs)
    live = st._engine.sandboxes.live
    sid = sb.id
    try:
        assert sb.exec(f"({COUNTER}) >/dev/null 2>&1 &").ok
        while _count(sb) < 3:
            time.sleep(0.05)

        for finisher in ("reap", "resume"):
            _killed_hibernate(home, sid)
            row = st._engine.sandboxes._row(sid)
            assert row["state"] == "hibernated" and row["spec"].get("retiring")
            old = LiveHandle.from_dict(row["spec"]["retiring"])
            assert live.alive(old)                        # left behind by the killed engine ...
            seen = _old_count(old)
            time.sleep(0.3)
            assert _old_count(old) == seen                # ... paused: it runs nothing
            with pytest.raises(sandtree.Conflict, match="hibernated"):
                sb.exec("true")                           # and no one uses it: the row says hibernated
            at_hibernate = int(seen)
            if finisher == "reap":
                assert [s.state for s in st.sandboxes() if s.id == sid] == ["hibernated"]   # (list reaps)
                assert not live.alive(old)
                assert "retiring" not in st._engine.sandboxes._row(sid)["spec"]
                assert old.cg() is None or not any(os.path.exists(d) for d in old.cg().dirs.values())
            assert sb.resume()["state"] == "running"
            assert not live.alive(old)
            assert not os.path.exists(os.path.join(home, "sandboxes", f"{sid}.ckpt"))   # (deleted aside)
            assert "retiring" not in st._engine.sandboxes._row(sid)["spec"]
            # the same shell, counting on from where it was checkpointed (not from 1)
            first = _count(sb)
            assert first >= at_hibernate
            time.sleep(0.2)
            assert _count(sb) > first

        # a plain hibernate in this process: answered before the stop, which follows by itself
        assert sb.hibernate()["state"] == "hibernated"
        st._engine.sandboxes.retiring.wait(sid)
        assert "retiring" not in st._engine.sandboxes._row(sid)["spec"]
        assert st._engine.sandboxes._row(sid)["state"] == "hibernated"
    finally:
        st.sandbox(sid).stop()
        assert not os.path.exists(os.path.join(home, "sandboxes", f"{sid}.ckpt"))
        st.close()


def test_stopping_a_hibernated_sandbox_stops_an_old_one_left_behind(tmp_path, rootfs):
    home, st, sb = _gvisor_sandbox(tmp_path, rootfs)
    try:
        assert sb.exec("echo kept > /tmp/f").ok
        _killed_hibernate(home, sb.id)
        old = LiveHandle.from_dict(st._engine.sandboxes._row(sb.id)["spec"]["retiring"])
        assert st._engine.sandboxes.live.alive(old)
        sb.stop()
        assert st._engine.sandboxes._row(sb.id)["state"] == "stopped"
        assert not st._engine.sandboxes.live.alive(old)
        assert "retiring" not in st._engine.sandboxes._row(sb.id)["spec"]
    finally:
        st.sandbox(sb.id).stop()
        st.close()


def test_a_checkpoint_pause_goes_through_the_sentrys_control_socket(bb, shared_st):
    """freeze(checkpoint=True) pauses gVisor's kernel by runsc's control socket (no runsc start);
    any engine thaws it by the marker; a marker whose pauser died before saying how is left
    alone (an Unpause of a kernel not paused would end the Sentry)."""
    ok, why = shared_st._engine.sandboxes.live.hibernate_available("gvisor")
    if not ok:
        pytest.skip(why)
    live = shared_st._engine.sandboxes.live
    with bb.start(tier="gvisor") as sb:
        assert sb.exec(f"({COUNTER}) >/dev/null 2>&1 &").ok
        while _count(sb) < 2:
            time.sleep(0.05)
        h = shared_st._engine.sandboxes._row(sb.id)["handle"]
        path = f"/proc/{h.helper_pid}/root/tmp/paused"
        assert live.freeze(h, True, checkpoint=True) and live.frozen(h)
        with open(path, "rb") as f:
            assert f.read() == b"control\n"
        seen = _old_count(h)
        time.sleep(0.3)
        assert _old_count(h) == seen                           # its kernel is paused
        live.freeze(h, False)
        assert not live.frozen(h) and not os.path.exists(path)
        time.sleep(0.3)
        assert _old_count(h) != seen                           # and runs on
        with open(path, "wb"):
            pass                                               # a pauser that died before its call
        assert live.frozen(h)
        assert sb.exec("echo alive").stdout == b"alive\n"      # (the next use thaws: nothing to undo)
        assert not os.path.exists(path)
        assert _count(sb) > int(seen)


def test_a_resumed_sandboxs_checkpoint_left_aside_goes_at_the_next_reap(tmp_path):
    """A resume moves its checkpoint aside and deletes it off its path (retiring.py discard); one
    a killed engine left behind is deleted by the next reap."""
    home = str(tmp_path / "home")
    st = sandtree.Sandtree(home, warm=0)
    try:
        left = os.path.join(home, "sandboxes", "0123abcd.ckpt.old")
        os.makedirs(left)
        with open(os.path.join(left, "pages"), "wb") as f:
            f.write(b"x" * 4096)
        kept = os.path.join(home, "sandboxes", "4567abcd.ckpt")     # a hibernated one's: kept
        os.makedirs(kept)
        st.sandboxes()                                  # (a list reaps)
        assert not os.path.exists(left) and os.path.isdir(kept)
    finally:
        st.close()
