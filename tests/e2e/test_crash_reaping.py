"""What a `sandtree serve` killed with -9 leaves behind, and what the next start does with it: a
real server process, killed for real. Sandboxes it started ahead (engine/warm/sandboxes.py) were no
caller's: the next server stops them before it serves (their processes, cgroups, deadline files,
rows). Caller-visible live sandboxes are not the server's: they outlive it, as designed
(docs/design.md, Live sandboxes), and the restarted server still reaches them."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

import sandtree
from conftest import free_port, wait_for_port
from sandtree.procid import start_time


def serve(home: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", home, "serve", "--port", str(port),
                             "--ports-port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 60)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, f"http://127.0.0.1:{port}"


def rows(home: str, state: str | None = None) -> list[dict]:
    con = sqlite3.connect(os.path.join(home, "sandtree.db"), timeout=30)
    try:
        got = con.execute("SELECT id, state, handle, spec FROM sandboxes").fetchall()
    finally:
        con.close()
    out = [{"id": i, "state": s, "handle": json.loads(h), "spec": json.loads(sp)} for i, s, h, sp in got]
    return [r for r in out if state is None or r["state"] == state]


def alive(pid: int, start: int) -> bool:
    return start_time(pid) == start


def left_of(handle: dict) -> list[str]:
    """What of a sandbox is still on this machine: its processes (the pids it recorded with their
    start times, and any in its cgroups), its cgroup dirs, its deadline file."""
    left = []
    for pid, start in ((handle["helper_pid"], handle["helper_start"]), (handle["init_pid"], handle["init_start"])):
        if alive(pid, start):
            left.append(f"process {pid}")
    for d in ((handle.get("cgroup") or {}).get("dirs") or {}).values():
        if os.path.isdir(d):
            with open(os.path.join(d, "cgroup.procs")) as f:
                left.append(f"cgroup {d} ({f.read().split()})")
    if handle.get("deadline_file") and os.path.exists(handle["deadline_file"]):
        left.append(f"deadline {handle['deadline_file']}")
    return left


def until(what, timeout: float = 30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.fixture
def home(tmp_path, rootfs):
    home = str(tmp_path / "home")
    with sandtree.Sandtree(home, warm=0) as st:
        st.import_image(rootfs, tag="base")
    yield home
    with sandtree.Sandtree(home, warm=0) as st:           # whatever a failed test left running
        for s in st.sandboxes():
            st.sandbox(s.id).stop()
    for r in rows(home, "ahead"):                         # (without the fix: the killed server's)
        h = r["handle"]
        if alive(h["init_pid"], h["init_start"]):
            os.kill(h["init_pid"], signal.SIGKILL)
        for d in ((h.get("cgroup") or {}).get("dirs") or {}).values():
            end = time.monotonic() + 5
            while os.path.isdir(d) and time.monotonic() < end:
                try:
                    os.rmdir(d)
                except OSError:
                    time.sleep(0.05)


def test_a_killed_servers_sandbox_started_ahead_is_reaped_by_the_next(home):
    first, url = serve(home)
    try:
        client = sandtree.connect(url)
        mine = client.image("base").start()
        assert mine.exec("echo hi").stdout == b"hi\n"
        ahead, = until(lambda: [r for r in rows(home, "ahead") if alive(r["handle"]["init_pid"],
                                                                        r["handle"]["init_start"])])
        assert left_of(ahead["handle"])                   # (what the checks below look for)
        client.close()
    finally:
        first.kill()                                      # kill -9: it closes nothing
        first.wait()
    assert left_of(ahead["handle"]), "the killed server's helper ends its sandbox started ahead by itself"
    second, url = serve(home)
    try:
        # the caller's sandbox outlived the server, and the new one reaches it
        again = sandtree.connect(url)
        assert again.sandbox(mine.id).exec("echo still").stdout == b"still\n"
        again.close()
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0
    assert left_of(ahead["handle"]) == []
    assert ahead["id"] not in {r["id"] for r in rows(home)}
    # the second server's own sandbox started ahead went with its clean exit
    assert all(not left_of(r["handle"]) for r in rows(home, "ahead")) and not rows(home, "ahead")
    with sandtree.Sandtree(home, warm=0) as st:
        st.sandbox(mine.id).stop()


HIBERNATOR = """
import sys, sandtree
sandtree.Sandtree(sys.argv[1], warm=0).sandbox(sys.argv[2]).hibernate()
"""


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_a_hibernation_killed_mid_dump_is_one_state_to_every_view(tmp_path, rootfs):
    """The hibernating process killed (-9) while CRIU writes the checkpoint (CRIU runs on in a
    session of its own and finishes it): info (GET /sandboxes/{id}), list and exec must agree
    that the sandbox is hibernated, whichever looks first; and it resumes."""
    from sandtree.runtime import criu
    if not criu.find()[0]:
        pytest.skip("no CRIU here (scripts/install-deps installs CRIU 4.1)")
    home = str(tmp_path / "home")
    st = sandtree.Sandtree(home, warm=0)
    sb = st.import_image(rootfs).start(idle_timeout=300, lifetime=600)
    sid = sb.id
    try:
        # a checkpoint that takes a while to write: 48 MB on its /dev/shm tmpfs, a process
        assert sb.exec("head -c 48000000 /dev/zero > /dev/shm/big; sleep 1000 >/dev/null 2>&1 &").ok
        hibernator = subprocess.Popen([sys.executable, "-c", HIBERNATOR, home, sid],
                                      env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "..", "src")})
        mark = os.path.join(home, "sandboxes", f"{sid}.ckpt").encode()
        criu_pid = None
        for _ in range(5000):
            criu_pid = next((p for p in os.listdir("/proc") if p.isdigit() and b"dump" in _cmdline(p).split(b"\0")
                             and mark in _cmdline(p)), None)
            if criu_pid or hibernator.poll() is not None:
                break
            time.sleep(0.002)
        hibernator.kill()
        hibernator.wait()
        assert criu_pid, "the hibernator never ran CRIU"
        row = st._engine.sandboxes._row(sid)
        assert row["state"] == "running" and row["spec"].get("hibernating"), "killed too late: it said hibernated"
        while os.path.exists(f"/proc/{criu_pid}"):
            time.sleep(0.01)
        assert criu.dump_finished(mark.decode()), "CRIU did not finish the checkpoint"
        assert sb.info()["state"] == "hibernated"                     # GET first: it said "gone"
        assert [s.state for s in st.sandboxes() if s.id == sid] == ["hibernated"]
        with pytest.raises(sandtree.Conflict, match="hibernated"):
            sb.exec("true")
        assert sb.resume()["state"] == "running"
        assert sb.exec("ls /dev/shm; pidof sleep >/dev/null && echo up").stdout == b"big\nup\n"
    finally:
        st.sandbox(sid).stop()
        st.close()


def test_a_dump_still_finishing_is_waited_for_not_judged_gone(tmp_path, rootfs):
    """The window after CRIU killed the tree and before its shell records the exit status (held
    open here by stopping that shell: SIGSTOP): a look at the sandbox then (its hibernator dead)
    must wait for the dump's end, not call the sandbox gone and kill what the checkpoint needs."""
    import threading
    from sandtree.runtime import criu
    if not criu.find()[0]:
        pytest.skip("no CRIU here (scripts/install-deps installs CRIU 4.1)")
    home = str(tmp_path / "home")
    st = sandtree.Sandtree(home, warm=0)
    sb = st.import_image(rootfs).start(idle_timeout=300, lifetime=600)
    sid = sb.id
    shell = None
    try:
        assert sb.exec("head -c 32000000 /dev/zero > /dev/shm/big; sleep 1000 >/dev/null 2>&1 &").ok
        hibernator = subprocess.Popen([sys.executable, "-c", HIBERNATOR, home, sid],
                                      env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "..", "src")})
        images = os.path.join(home, "sandboxes", f"{sid}.ckpt")
        for _ in range(5000):
            shell = next((int(p) for p in os.listdir("/proc") if p.isdigit()
                          and _cmdline(p).startswith(b"/bin/sh\0-c\0") and images.encode() in _cmdline(p)), None)
            if shell or hibernator.poll() is not None:
                break
            time.sleep(0.002)
        assert shell, "the hibernator never ran its dump"
        def running_criu():
            with open(f"/proc/{shell}/task/{shell}/children") as f:
                return f.read().split()
        until(running_criu)                               # (past what it does before CRIU)
        os.kill(shell, signal.SIGSTOP)                    # its CRIU runs on; its status is not written
        hibernator.kill()
        hibernator.wait()
        h = st._engine.sandboxes._row(sid)["handle"]
        until(lambda: not st._engine.sandboxes.live.alive(h), 120)      # CRIU has killed the tree
        assert not os.path.exists(os.path.join(images, "criu.rc"))
        got = {}
        looker = threading.Thread(target=lambda: got.update(state=sb.info()["state"]))
        looker.start()
        looker.join(1.0)
        os.kill(shell, signal.SIGCONT)                    # the shell records CRIU's status
        shell = None
        looker.join(120)
        assert got == {"state": "hibernated"}
        assert sb.resume()["state"] == "running"
        assert sb.exec("ls /dev/shm").stdout == b"big\n"
    finally:
        if shell:
            os.kill(shell, signal.SIGCONT)
        st.sandbox(sid).stop()
        st.close()


# An engine killed (exit 9, no cleanup) at a point of a start: "spawned" once its helper was
# started and before any word from it (the helper then dies: its socket to the engine closed);
# "started" once the sandbox's
# helper reported ready and before its row is written; "scratch" once the helper sent its
# scratch and before the engine answers (the helper runs on, detached, either way).
KILLED_START = """
import os, sys, time, sandtree
from sandtree.runtime import live
point = sys.argv[3]
if point == "spawned":
    def spawned(self, *a, **k):
        os._exit(9)
    live.LiveRuntime._handshake = spawned
elif point == "started":
    start = live.LiveRuntime.start
    def started(self, *a, **k):
        start(self, *a, **k)
        os._exit(9)
    live.LiveRuntime.start = started
else:
    def scratch(self, proc, detach, ours, rep_r, raw, lim, prepare):
        self.rt.receive_scratch(ours, rep_r, raw, live.Detached(), time.monotonic() + 30)
        os._exit(9)
    live.LiveRuntime._handshake = scratch
st = sandtree.Sandtree(sys.argv[1], warm=0)
st.image(sys.argv[2]).start(**({"memory": sys.argv[4]} if len(sys.argv) > 4 else {}))
"""


def _helpers_of(home: str) -> dict[int, list[str]]:
    """This store's helper processes (their executable in home/bin) -> the cgroups they are in."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/exe").startswith(os.path.join(os.path.realpath(home), "bin") + "/"):
                with open(f"/proc/{pid}/cgroup") as f:
                    out[int(pid)] = [ln.split(":", 2)[2] for ln in f.read().splitlines() if "/live-" in ln]
        except OSError:
            pass
    return out


@pytest.mark.parametrize("point", ["started"])
def test_a_start_killed_before_its_row_leaves_nothing_after_the_next_start(home, point):
    with sandtree.Sandtree(home, warm=0) as st:
        image = st.image("base").id
    r = subprocess.run([sys.executable, "-c", KILLED_START, home, image, point], capture_output=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "..", "src")})
    assert r.returncode == 9, r.stderr.decode(errors="replace")[-2000:]
    helpers = until(lambda: _helpers_of(home), 10)          # running on, with no row
    (pid, groups), = helpers.items()
    assert groups and rows(home) == []
    dirs = [os.path.join("/sys/fs/cgroup", c, g.strip("/")) for g in groups
            for c in ("pids", "memory", "freezer", "devices", "") if os.path.isdir(os.path.join("/sys/fs/cgroup", c, g.strip("/")))]
    assert dirs
    with sandtree.Sandtree(home, warm=0) as st:             # the next engine process: its first reap
        st.sandboxes()
        assert _helpers_of(home) == {}
        assert [d for d in dirs if os.path.isdir(d)] == []
        assert os.listdir(os.path.join(home, "deadlines")) == []
        sb = st.image("base").start()                        # and starts go on as ever
        assert sb.exec("echo ok").stdout == b"ok\n"
        sb.stop()


def _sandboxes_limited_to(memory: int) -> list[int]:
    """Processes in a live sandbox group of ours whose memory limit is `memory` (a mark)."""
    out = []
    parent = "/sys/fs/cgroup/memory/sandtree"
    if not os.path.isdir(parent):
        return out
    for n in os.listdir(parent):
        try:
            with open(os.path.join(parent, n, "memory.limit_in_bytes")) as f:
                if n.startswith("live-") and int(f.read()) == memory:
                    with open(os.path.join(parent, n, "cgroup.procs")) as g:
                        out += [int(x) for x in g.read().split()]
        except (OSError, ValueError):
            pass
    return out


@pytest.mark.parametrize("point", ["spawned", "scratch"])
def test_a_start_killed_before_its_helper_said_ready_leaves_nothing(home, point):
    """Before "ready" the helper learns its engine is gone (its report pipe closed) and ends the
    sandbox (else its pid 1 ran on with no helper: no lifetime, no row, no end); a helper that
    said "ready" before the engine's exit was complete runs on with no row, and the next
    engine's reap ends it (reap_unrecorded). The empty cgroup, named after the dead engine, goes
    at the next engine's start."""
    if not os.path.isdir("/sys/fs/cgroup/memory/sandtree"):
        pytest.skip("finds the sandbox by its v1 memory limit")
    with sandtree.Sandtree(home, warm=0) as st:
        image = st.image("base").id
    mark = (20000 + int.from_bytes(os.urandom(2), "big")) * 4096          # a memory limit no one else uses
    p = subprocess.Popen([sys.executable, "-c", KILLED_START, home, image, point, str(mark)], stderr=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "..", "src")})
    _, err = p.communicate(timeout=120)
    assert p.returncode == 9, err.decode(errors="replace")[-2000:]
    groups = lambda: [os.path.join(r, c, "sandtree", n) for r in ("/sys/fs/cgroup",) for c in ("pids", "memory", "freezer", "devices", "")  # noqa: E731
                      if os.path.isdir(os.path.join(r, c, "sandtree"))
                      for n in os.listdir(os.path.join(r, c, "sandtree")) if n.startswith(f"live-{p.pid}-")]
    try:
        time.sleep(1)                                           # (the helper's own setup, or its end)
        with sandtree.Sandtree(home, warm=0) as st:             # the next engine process and its reap
            st.sandboxes()
            end = time.monotonic() + 20
            while (_sandboxes_limited_to(mark) or _helpers_of(home) or groups()) and time.monotonic() < end:
                time.sleep(0.05)
            assert _sandboxes_limited_to(mark) == [] and _helpers_of(home) == {} and groups() == []
            assert rows(home) == []
    finally:
        for pid in _sandboxes_limited_to(mark):               # (without the fix: its orphaned pid 1)
            os.kill(pid, signal.SIGKILL)


KILLED_STOP = """
import os, sys, sandtree
from sandtree.runtime import live
from sandtree.runtime.liveproc import kill_pid
def stop(self, h, *a, **k):                 # pid 1 killed, then the engine: no cgroup removal, no row
    kill_pid(h.init_pid, h.init_start)
    os._exit(9)
live.LiveRuntime.stop = stop
sandtree.Sandtree(sys.argv[1], warm=0).sandbox(sys.argv[2]).stop()
"""


def test_a_stop_killed_half_way_is_finished_by_the_next_engine(home):
    with sandtree.Sandtree(home, warm=0) as st:
        sb = st.image("base").start()
        sid = sb.id
    h = next(r["handle"] for r in rows(home) if r["id"] == sid)
    r = subprocess.run([sys.executable, "-c", KILLED_STOP, home, sid], capture_output=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(__file__), "..", "..", "src")})
    assert r.returncode == 9, r.stderr.decode(errors="replace")[-2000:]
    assert next(r["state"] for r in rows(home) if r["id"] == sid) == "running"
    with sandtree.Sandtree(home, warm=0) as st:
        assert st.sandbox(sid).info()["state"] in ("gone", "stopped")
        assert left_of(h) == []
        assert not [n for n in os.listdir(os.path.join(home, "sandboxes")) if n.endswith(".lock")]
