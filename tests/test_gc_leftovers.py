"""`gc` sweeps the files a live sandbox's helper used (deadlines/*.deadline, agents/*.sock in the
store directory) once nothing uses them: an engine killed with -9 never removed its own
(runtime/leftovers.py). What a running sandbox or a live engine still uses stays."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import sandtree


def _age(paths, seconds: float = 3600) -> None:
    t = time.time() - seconds
    for p in paths:
        os.utime(p, (t, t), follow_symlinks=False)


def _held() -> set[str]:
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            out.update(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    return out


def test_gc_sweeps_what_a_killed_engines_pool_left_and_keeps_what_is_in_use(tmp_path, rootfs):
    home = str(tmp_path / "home")
    script = textwrap.dedent(f"""
        import sys, time, sandtree
        st = sandtree.Sandtree({home!r}, warm=0)
        st.pool(st.import_image({rootfs!r}), size=1, wait=True)
        print("ready", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert proc.stdout.readline().strip() == "ready", "the engine did not fill its pool"
        dead_files = set(os.listdir(os.path.join(home, "deadlines")))
        assert len(dead_files) == 1
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadlines, agents = os.path.join(home, "deadlines"), os.path.join(home, "agents")
    with sandtree.Sandtree(home, warm=0) as st:
        dead_paths = {os.path.join(deadlines, f) for f in dead_files}
        deadline = time.time() + 60
        while dead_paths & _held() and time.time() < deadline:
            time.sleep(0.2)                   # a pool's sandbox dies with its engine (PDEATHSIG)
        assert not dead_paths & _held()
        live = st.image(st.images()[0].id).start(lifetime=600)
        try:
            live_files = set(os.listdir(deadlines)) - dead_files
            assert len(live_files) == 1
            os.makedirs(agents, mode=0o700, exist_ok=True)
            bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)      # as a live engine's agent socket
            bound.bind(os.path.join(agents, "0123456789abcdef.sock"))
            bound.listen(1)
            stale_sock = os.path.join(agents, "fedcba9876543210.sock")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(stale_sock)
            s.close()                         # its socket gone, its file left (an engine killed)
            young = os.path.join(deadlines, "00000000000000ff.deadline")
            open(young, "w").write("0")       # a sandbox being started: its file before its row
            everything = [os.path.join(deadlines, f) for f in dead_files | live_files] + \
                [os.path.join(agents, "0123456789abcdef.sock"), stale_sock]
            _age(everything)
            try:
                out = st.gc(grace=60)
            finally:
                bound.close()
            assert out["removed_runtime_files"] == 2
            assert set(os.listdir(deadlines)) == live_files | {"00000000000000ff.deadline"}
            assert os.listdir(agents) == ["0123456789abcdef.sock"]
            assert live.exec("echo still").stdout == b"still\n"
            live.set_timeout(300)             # its deadline file is still the one its helper reads
        finally:
            live.stop()
        assert not set(os.listdir(deadlines)) & live_files        # its engine removes it at the end
