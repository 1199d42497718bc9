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
    assert out["report"] == {"signal": 9}
