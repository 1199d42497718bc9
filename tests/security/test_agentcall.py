"""The engine's side of the gVisor agent's protocol (runtime/agentcall.py) against a hostile agent:
pid 1 is the sandbox's own process, which its root could drive (ptrace), so what it sends is
bounded. The real agent is exercised on gVisor by test_live.py; here a Python stand-in writes
frames into real pipes."""

from __future__ import annotations

import os
import struct
import threading
import time

import pytest

from conftest import tier_or_skip
from sandtree.defaults import Limits
from sandtree.runtime import agentcall
from sandtree.runtime.base import RunSpec

RS = 0x53525453


def spec(**kw) -> RunSpec:
    return RunSpec(argv=["true"], layers=[], root_meta=(0o755, 0, 0), limits=Limits(**kw))


def agent(frames_of):
    """Pipes to a stand-in agent: it reads the request, then writes frames_of(request id)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()

    def run():
        head = os.read(in_r, 16)
        rid = struct.unpack("=4I", head)[1]
        try:
            for f in frames_of(rid):
                os.write(out_w, f)
        except (BrokenPipeError, OSError):
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return in_w, out_r, (in_r, out_w)


def frame(rid, kind, data=b"", n=None):
    return struct.pack("=4I", RS, rid, ord(kind), len(data) if n is None else n) + data


def test_a_frame_past_the_largest_ends_the_call():
    w, r, keep = agent(lambda rid: [frame(rid, "o", n=1 << 30)])
    with pytest.raises(OSError, match="out of turn"):
        agentcall.call(w, r, spec(), time.monotonic() + 10)


def test_an_agent_that_never_reports_is_given_up_after_its_kill(monkeypatch):
    monkeypatch.setattr(agentcall, "GIVE_UP", 0.3)
    w, r, keep = agent(lambda rid: [frame(rid, "o", b"x")])     # then silence
    t = time.monotonic()
    out = agentcall.call(w, r, spec(), time.monotonic() + 0.3)
    assert out["timed_out"] and out["report"] == {} and out["stdout"] == b"x"
    assert time.monotonic() - t < 5


def test_frames_of_another_call_are_skipped_and_a_bad_step_is_exec():
    w, r, keep = agent(lambda rid: [frame(rid ^ 1, "o", b"stale"), frame(rid, "o", b"mine"),
                                    frame(rid, "f", struct.pack("=I", 2) + b"\xff\xfe")])
    out = agentcall.call(w, r, spec(), time.monotonic() + 10)
    assert out["stdout"] == b"mine" and out["report"] == {"execfail": (2, "exec")}


def test_output_is_kept_to_the_cap_and_the_command_killed():
    got = []

    def frames(rid):
        yield frame(rid, "o", b"y" * 5000)
        got.append(rid)
        yield frame(rid, "x", struct.pack("=I", 9))               # killed by SIGKILL
    w, r, keep = agent(frames)
    out = agentcall.call(w, r, spec(output=1000), time.monotonic() + 10)
    assert out["stdout"] == b"y" * 1000 and out["stdout_truncated"] and out["output_exceeded"] == "stdout"
    assert out["report"] == {"signal": 9, "alone": False}     # (an older agent's frame: never alone)


def test_the_exit_frame_says_whether_the_agent_is_alone():
    w, r, keep = agent(lambda rid: [frame(rid, "x", struct.pack("=II", 3 << 8, 1))])
    assert agentcall.call(w, r, spec(), time.monotonic() + 10)["report"] == {"exit": 3, "alone": True}
    w, r, keep = agent(lambda rid: [frame(rid, "x", struct.pack("=II", 0, 7))])      # only 1 means alone
    assert agentcall.call(w, r, spec(), time.monotonic() + 10)["report"] == {"exit": 0, "alone": False}


def test_the_real_agent_is_alone_only_once_nothing_else_runs(bb, shared_st, request):
    """sandtree-agent (pid 1 on gVisor) says it is alone, so a pool commits its upper without
    stopping it first (pools.py, RunOutcome.quiescent), only when no process of the sandbox is
    left: not while a background job or an orphan (re-parented to pid 1) still runs."""
    tier_or_skip(request, shared_st, "gvisor")
    with bb.start(tier="gvisor") as sb:
        h = shared_st._engine.sandboxes._row(sb.id)["handle"]

        def ask(*argv):
            conn, w, r = agentcall.lend(h.agent)
            try:
                return agentcall.call(w, r, RunSpec(argv=list(argv), layers=[], root_meta=(0o755, 0, 0),
                                                    limits=Limits(), cwd="/"), time.monotonic() + 30)["report"]
            finally:
                os.close(w)
                os.close(r)
                conn.close()
        assert ask("sh", "-c", "echo x > /tmp/f") == {"exit": 0, "alone": True}
        assert ask("sh", "-c", "sleep 1 >/dev/null 2>&1 & exit 4") == {"exit": 4, "alone": False}
        assert ask("sh", "-c", "(sh -c 'sleep 1' >/dev/null 2>&1 &)")["alone"] is False      # an orphan
        end = time.monotonic() + 10
        while not ask("true")["alone"]:
            assert time.monotonic() < end
            time.sleep(0.1)
        assert ask("sh", "-c", "kill -9 $$") == {"signal": 9, "alone": True}
        # what the pool relies on: a quiescent exec is the agent's word, and the upper holds its writes
        out = shared_st._engine._live.exec(h, RunSpec(argv=["sh", "-c", "echo y > /tmp/g"], layers=[],
                                                      root_meta=(0o755, 0, 0), limits=Limits(), cwd="/"))
        assert out.quiescent and sb.read("/tmp/g") == b"y\n"

