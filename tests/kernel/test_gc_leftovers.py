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


def test_gc_removes_transfer_temp_files_of_killed_processes_only(tmp_path):
    """A process killed while writing a blob (or fetching/packing from S3) leaves a temp file
    named by its owner: gc removes it once that process is verifiably gone, and before that fix
    such a name in a blob shard made gc fail (blobs.files() yielded it as a digest)."""
    home = str(tmp_path / "home")
    st = sandtree.Sandtree(home)
    try:
        fifo = str(tmp_path / "fifo")
        os.mkfifo(fifo)
        digest = "ab" * 32
        # a writer blocked mid-blob (its source never ends), then killed -9
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import sandtree
            st = sandtree.Sandtree({home!r})
            st.engine.store.blobs.put_file({fifo!r}, {digest!r})
        """)])
        with open(fifo, "wb") as w:
            w.write(b"x" * 1000)
            w.flush()
            shard = os.path.join(home, "objects", "blobs", "ab")
            for _ in range(600):
                if os.path.isdir(shard) and any(n.startswith(".tmp-") for n in os.listdir(shard)):
                    break
                time.sleep(0.05)
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        [blob_tmp] = [os.path.join(shard, n) for n in os.listdir(shard) if n.startswith(".tmp-")]
        # what a killed checkpoint transfer leaves (named as checkpoints.py names them), by a gone process
        made = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import os
            from sandtree.procid import owner_prefix
            d = os.path.join({home!r}, "sandboxes")
            os.makedirs(d, exist_ok=True)
            open(os.path.join(d, ".pack-" + owner_prefix() + "sb1-0a0b"), "w").close()
            os.makedirs(os.path.join(d, ".fetch-" + owner_prefix() + "sb1-0c0d", "sub"))
            print(owner_prefix())
        """)], capture_output=True, text=True, check=True)
        assert made.stdout.strip()
        sandboxes = os.path.join(home, "sandboxes")
        dead = sorted(os.path.join(sandboxes, n) for n in os.listdir(sandboxes) if n.startswith((".pack-", ".fetch-")))
        assert len(dead) == 2
        # this (live) process's own transfer in progress stays
        from sandtree.procid import owner_prefix
        mine = os.path.join(sandboxes, f".fetch-{owner_prefix()}sb2-0e0f")
        os.mkdir(mine)
        out = st.gc()
        assert out["removed_transfers"] == 3, out
        assert not any(os.path.lexists(p) for p in [blob_tmp, *dead])
        assert os.path.isdir(mine)
        os.rmdir(mine)
        assert st.gc()["removed_transfers"] == 0
    finally:
        st.close()


def test_ended_sandboxes_leave_no_lock_files(tmp_path, rootfs):
    """One commit lock file per sandbox (sandboxes/<id>.lock) must not outlive it: a stop removes
    its own; gc removes those of sandboxes that ended without a lock (an expiry) and keeps a
    running one's, and one someone holds."""
    home = str(tmp_path / "home")
    locks = lambda: sorted(n for n in os.listdir(os.path.join(home, "sandboxes")) if n.endswith(".lock"))  # noqa: E731
    with sandtree.Sandtree(home, warm=0) as st:
        img = st.import_image(rootfs)
        for _ in range(50):
            sb = img.start()
            sb.commit()                                   # (a commit takes the lock too)
            sb.stop()
        assert locks() == []
        running, expiring = img.start(), img.start()
        running.commit()
        expiring.commit()
        assert len(locks()) == 2
        with st.engine.store.db.tx() as con:              # its end passed: a reap stops it, with no lock
            con.execute("UPDATE sandboxes SET expires=? WHERE id=?", (time.time() - 1, expiring.id))
        st.sandboxes()
        assert expiring.state == "expired" and len(locks()) == 2
        with open(os.path.join(home, "sandboxes", "0" * 32 + ".lock"), "w"):
            pass                                          # (a file no row names: a killed engine's)
        held = os.path.join(home, "sandboxes", "1" * 32 + ".lock")
        fd = os.open(held, os.O_RDWR | os.O_CREAT)
        try:
            import fcntl
            fcntl.flock(fd, fcntl.LOCK_EX)                # held by someone: left alone
            out = st.gc(retention=0, grace=0)
        finally:
            os.close(fd)
        assert out["removed_lock_files"] == 2
        assert locks() == [f"{'1' * 32}.lock", f"{running.id}.lock"]
        running.stop()
        assert locks() == [f"{'1' * 32}.lock"]
