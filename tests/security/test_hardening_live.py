"""Hardening of live sandboxes (issue 12, items 3, 13, 16): the host-side file API, background
jobs outliving their exec, and liveness by (pid, start time) rather than pid alone.

Everything runs against a real live sandbox on the real kernel. Tests that could damage the host
if the defence were missing (a chmod of the host's /dev/full) put back what they find changed.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
import uuid

import pytest

import sandtree

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="live sandboxes need root")


@pytest.fixture
def sb(bb):
    with bb.start(idle_timeout=120, lifetime=300) as s:
        yield s


def _node(path: str) -> tuple:
    st = os.stat(path)
    return stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_rdev


# ---- item 3: the file API never touches a host node, never blocks -----------------------------

def test_write_to_a_device_leaves_the_host_node_alone(sb):
    before = _node("/dev/full")
    try:
        with pytest.raises(sandtree.NotRegularFile):
            sb.write("/dev/full", b"x", mode=0, uid=7, gid=7)
        # through a symlink the sandbox planted, too
        assert sb.exec("ln -s /dev/full /tmp/full-link").ok
        with pytest.raises(sandtree.NotRegularFile):
            sb.write("/tmp/full-link", b"x", mode=0o4777, uid=7, gid=7)
        with pytest.raises(sandtree.NotRegularFile):
            sb.read("/dev/full")
        assert _node("/dev/full") == before
    finally:
        # the unfixed code chowned/chmodded the host's node: put it back, whatever happened
        kind, mode, uid, gid, _ = before
        os.chown("/dev/full", uid, gid)
        os.chmod("/dev/full", mode)
    # the sandbox still has a working /dev/full and /dev/null (nothing replaced them)
    assert sb.exec("echo x > /dev/null && ! echo x > /dev/full").ok


def _timed(call, limit: float = 2.0):
    """call() in a thread: (what it returned or raised, seconds), or a hang after `limit`."""
    out = []

    def run():
        t = time.monotonic()
        try:
            out.append((call(), time.monotonic() - t))
        except BaseException as exc:             # noqa: BLE001 - handed to the test
            out.append((exc, time.monotonic() - t))
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit)
    return out[0] if out else None, th


def test_a_fifo_is_refused_at_once(sb):
    assert sb.exec("mkfifo /tmp/fifo && mkfifo -m 666 /tmp/fifo2").ok
    got, th = _timed(lambda: sb.read("/tmp/fifo"))
    try:
        assert got is not None, "reading a FIFO through the file API hung"
        assert isinstance(got[0], sandtree.NotRegularFile) and got[1] < 2.0, got
    finally:
        if th.is_alive():                        # the unfixed code: unblock its open()
            sb.exec("echo x > /tmp/fifo", timeout=5)
            th.join(5)
    got, th = _timed(lambda: sb.write("/tmp/fifo2", b"data", mode=0o600))
    try:
        assert got is not None, "writing a FIFO through the file API hung"
        assert isinstance(got[0], sandtree.NotRegularFile), got
    finally:
        if th.is_alive():
            sb.exec("cat /tmp/fifo2 >/dev/null", timeout=5)
            th.join(5)
    # nothing replaced the FIFO
    assert sb.exec("test -p /tmp/fifo2").ok


def test_symlinks_resolve_inside_the_sandbox(sb):
    assert sb.exec("echo sandbox-shadow > /etc/shadow && ln -s /etc/shadow /tmp/shadow-link"
                   " && ln -s ../../etc/shadow /tmp/rel-link && ln -s /etc/os-release /tmp/host-only").ok
    assert sb.read("/tmp/shadow-link") == b"sandbox-shadow\n"
    assert sb.read("/tmp/rel-link") == b"sandbox-shadow\n"
    with pytest.raises(sandtree.PathNotFound):
        sb.read("/tmp/host-only")                 # exists on the host, not in the sandbox
    # a write through a symlink writes the sandbox's file the link names, as a new file
    host_shadow = os.stat("/etc/shadow")
    sb.write("/tmp/shadow-link", b"written\n", mode=0o640, uid=1000, gid=1000)
    assert sb.exec("cat /etc/shadow; stat -c '%u %g %a' /etc/shadow; readlink /tmp/shadow-link").stdout == \
        b"written\n1000 1000 640\n/etc/shadow\n"
    assert os.stat("/etc/shadow").st_mtime_ns == host_shadow.st_mtime_ns
    # a dangling link to a host-only path makes a sandbox file, never a host one
    sb.write("/tmp/host-only", b"inside\n")
    assert sb.exec("cat /etc/os-release").stdout == b"inside\n"
    assert open("/etc/os-release", "rb").read() != b"inside\n"
    # loops end in a clear error, on both paths; a magic link (/proc/N/root) is never followed
    assert sb.exec("ln -s loop-b /tmp/loop-a && ln -s loop-a /tmp/loop-b").ok
    for call in (lambda: sb.read("/tmp/loop-a"), lambda: sb.write("/tmp/loop-a", b"x"),
                 lambda: sb.read("/proc/1/root/etc/shadow"), lambda: sb.write("/proc/1/root/etc/shadow", b"x")):
        with pytest.raises(sandtree.InvalidInput):
            call()


def test_write_replaces_and_never_writes_through_a_hard_link(sb):
    # a hard link to a read-only file: the API's write
    # is a new file renamed into place, so the other name keeps its content
    assert sb.exec("echo original > /tmp/a && ln /tmp/a /tmp/b && chmod 444 /tmp/a").ok
    sb.write("/tmp/b", b"new\n")
    assert sb.exec("cat /tmp/a /tmp/b").stdout == b"original\nnew\n"
    assert sb.exec("ls -a /tmp").stdout.count(b".sandtree") == 0     # no temporary file left
    # a file of the image's own layers is replaced in the sandbox (and so in its commit)
    sb.write("/etc/greeting", b"replaced\n", mode=0o600)
    assert sb.exec("cat /etc/greeting; stat -c %a /etc/greeting").stdout == b"replaced\n600\n"
    assert sb.commit().read("/etc/greeting") == b"replaced\n"


def test_proc_and_directories_are_refused(sb):
    for path in ("/proc/1/stack", "/proc/self/status", "/proc/modules", "/proc/sys/kernel/hostname"):
        with pytest.raises((sandtree.NotRegularFile, sandtree.PathNotFound)):
            sb.read(path)
    with pytest.raises(sandtree.NotRegularFile):
        sb.write("/proc/sys/kernel/hostname", b"pwned")
    assert open("/proc/sys/kernel/hostname").read().strip() != "pwned"
    with pytest.raises(sandtree.InvalidInput):
        sb.read("/etc")
    with pytest.raises(sandtree.InvalidInput):
        sb.write("/etc", b"x")
    with pytest.raises(sandtree.InvalidInput):
        sb.write("/tmp/", b"x")


def test_reads_are_bounded(sb):
    # a sparse 8 GiB file costs the sandbox nothing; reading it whole would cost the host 8 GiB
    assert sb.exec("dd if=/dev/zero of=/tmp/sparse bs=1 count=1 seek=8589934591 2>/dev/null").ok
    t = time.monotonic()
    with pytest.raises(sandtree.TooLarge):
        sb.read("/tmp/sparse")
    assert time.monotonic() - t < 2
    sb.write("/tmp/hundred", b"x" * 100)
    assert sb._st._engine.sandboxes.read(sb.id, "/tmp/hundred", limit=100) == b"x" * 100
    with pytest.raises(sandtree.TooLarge):
        sb._st._engine.sandboxes.read(sb.id, "/tmp/hundred", limit=99)     # never cut silently
    sb.write("/tmp/name\nwith newline", b"ok")
    assert sb.read("/tmp/name\nwith newline") == b"ok"


# ---- item 13: liveness by (pid, start time, pid namespace), not by pid alone -------------------

def _me() -> tuple[int, int, int]:
    """(pid, start time, pid namespace) of this process, read here as the engine reads them."""
    with open("/proc/self/stat", "rb") as f:
        data = f.read()
    start = int(data[data.rindex(b")") + 2:].split()[19])
    try:
        link = os.readlink("/proc/1/ns/pid")          # the namespace /proc's pids are numbered in
    except OSError:
        link = os.readlink("/proc/self/ns/pid")
    ns = int(link.split("[")[1].rstrip("]"))
    return int(os.readlink("/proc/self")), start, ns


def test_an_operation_of_a_recycled_pid_is_recovered(st):
    from sandtree.engine.runs.operations import Operations
    pid, start, ns = _me()
    rows = {"recycled": {"owner_pid": pid, "owner_start": start + 1, "owner_ns": ns},     # pid reused
            "mine": {"owner_pid": pid, "owner_start": start, "owner_ns": ns},             # alive: kept
            "elsewhere": {"owner_pid": 1, "owner_start": 1, "owner_ns": ns + 1},          # other pid ns
            "old-alive": {"owner_pid": pid},                                             # older engine
            "old-dead": {"owner_pid": 4 << 22}}                                          # > pid_max
    ids = {k: uuid.uuid4().hex for k in rows}
    with st._engine.store.db.tx() as con:
        for k, spec in rows.items():
            con.execute("INSERT INTO operations(id, kind, source, result, spec, outcome, started, finished) "
                        "VALUES(?,?,?,?,?,?,?,?)", (ids[k], "run", None, None, json.dumps({**spec, "queued": True}),
                                                    None, time.time(), None))
    ops = Operations(st._engine, workers=1)
    ops.close()
    finished = {k: st._engine.store.db.one("SELECT finished FROM operations WHERE id=?", (ids[k],))[0] is not None
                for k in rows}
    assert finished == {"recycled": True, "mine": False, "elsewhere": False, "old-alive": False, "old-dead": True}
    # what this engine submits now records its start time and namespace
    op = st._engine.operations.submit_pull("127.0.0.1:9/none/none:x")
    spec = json.loads(st._engine.store.db.one("SELECT spec FROM operations WHERE id=?", (op,))[0])
    assert (spec["owner_pid"], spec["owner_start"], spec["owner_ns"]) == (pid, start, ns)
    st._engine.operations.wait([op], timeout=30)


def test_stale_cgroups_and_staging_dirs_by_start_time(st):
    from sandtree.runtime.cgroups import Cgroups
    pid, start, ns = _me()
    tag = uuid.uuid4().hex[:8]
    names = {"recycled": f"{pid}-{start + 1}-{ns}-t{tag}", "mine": f"{pid}-{start}-{ns}-t{tag}",
             "elsewhere": f"{pid}-{start + 1}-{ns + 1}-t{tag}", "old-alive": f"{pid}-t{tag}"}
    cg = Cgroups()
    if not cg.available:
        pytest.skip("no writable cgroups here")
    parents = list(cg._parents().values())
    made = []
    try:
        for p in parents:
            for n in names.values():
                os.mkdir(os.path.join(p, n))
                made.append(os.path.join(p, n))
        Cgroups().cleanup_stale()
        left = {k: [os.path.isdir(os.path.join(p, n)) for p in parents] for k, n in names.items()}
        assert left == {"recycled": [False] * len(parents), "mine": [True] * len(parents),
                        "elsewhere": [True] * len(parents), "old-alive": [True] * len(parents)}
    finally:
        for d in made:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
    # staging dirs of the store: the same rule
    layers = st._engine.store.layers
    for n in names.values():
        os.mkdir(os.path.join(layers.tmp, f"import-{n}"))
    layers.clean_stale()
    assert sorted(os.listdir(layers.tmp)) == sorted(f"import-{names[k]}" for k in ("mine", "elsewhere", "old-alive"))
    # a staging dir made now carries this process's identity
    d = layers.stage("import")
    assert os.path.basename(d).startswith(f"import-{pid}-{start}-{ns}-")
    os.rmdir(d)


# ---- item 16: a background job outlives the exec that started it -------------------------------

TICKER = "i=0; while :; do i=$((i+1)); echo tick $i; echo $i > /tmp/count; sleep 0.05; done &"


def _count(sb) -> int:
    return int(sb.exec("cat /tmp/count").stdout or 0)


def _ticking(sb) -> None:
    """The ticker runs (ps) and goes on writing its output (its counter moves)."""
    first = _count(sb)
    deadline = time.monotonic() + 10
    while _count(sb) <= first + 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _count(sb) > first + 3, "the background job stopped writing"
    assert b"while :" in sb.exec("ps").stdout


def test_a_background_job_keeps_running_and_writing(sb):
    t = time.monotonic()
    r = sb.exec(TICKER + " echo started")
    # (under load the job may tick before the command echoes: only that it returns at exit counts)
    assert r.ok and b"started\n" in r.stdout and time.monotonic() - t < 2     # returns at exit
    for _ in range(5):
        assert sb.exec("echo another").stdout == b"another\n"
    _ticking(sb)
    # a server logging each request to the exec's stderr (busybox httpd -f -v) serves on
    assert sb.exec("mkdir -p /www && echo page > /www/index.html && httpd -f -v -p 127.0.0.1:8001 -h /www &").ok
    for _ in range(4):
        deadline = time.monotonic() + 5
        while not (r := sb.exec("wget -qO- http://127.0.0.1:8001/index.html")).ok and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.stdout == b"page\n", r
    # each exec's own output still arrives whole, stdout and stderr apart, and a list command too
    r = sb.exec("yes abcdefgh | head -c 300000; echo err >&2")
    assert r.stdout == (b"abcdefgh\n" * 40000)[:300000] and r.stderr == b"err\n"
    assert sb.exec(["sh", "-c", "echo list; sleep 30 & exit 3"]).exit_code == 3


def test_a_background_job_survives_hibernate_and_resume(tmp_path, rootfs):
    st = sandtree.Sandtree(str(tmp_path / "home"), warm=0)
    try:
        ok, why = st._engine.sandboxes.live.hibernate_available()
        if not ok:
            pytest.skip(why)
        sb = st.import_image(rootfs).start(idle_timeout=300, lifetime=600)
        try:
            assert sb.exec(TICKER).ok
            _ticking(sb)
            assert sb.hibernate()["state"] == "hibernated"
            assert sb.resume()["state"] == "running"
            _ticking(sb)                              # the same job, still writing
            assert sb.exec("echo after").stdout == b"after\n"
        finally:
            sb.stop()
    finally:
        st.close()


def test_proc_files_of_a_recycled_pid_are_not_opened(shared_st):
    """The sandbox's root, scratch and mount table are opened only while (pid, start time) still
    name the process the handle recorded (a pidfd pins it over the open)."""
    from sandtree.procid import start_time
    from sandtree.runtime.liveproc import LiveHandle
    live = shared_st._engine.sandboxes.live
    me, start = os.getpid(), start_time(os.getpid())
    wrong = LiveHandle(me, start + 1, me, start + 1, None)
    for call in (live.root, live.scratch, live.own_mounts):
        with pytest.raises(sandtree.NotFound):
            call(wrong)
    right = LiveHandle(me, start, me, start, None)
    fd = live.root(right)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat("/"))
    finally:
        os.close(fd)


def test_a_sandbox_of_another_pid_namespace_is_never_reaped(bb, shared_st):
    """Two engines share a store and the host's cgroups, one in a pid namespace of its own: the
    other sees its sandboxes' pids as other (or no) processes. It must not conclude they are
    gone and kill their cgroups, nor enter them."""
    from sandtree.procid import start_time
    from sandtree.store.db import dumps
    boxes = shared_st._engine.sandboxes
    sb = bb.start(idle_timeout=120, lifetime=300)
    real = boxes._row(sb.id)["handle"]
    _, _, ns = _me()
    there = {**real.to_dict(), "helper_pid": 4 << 22, "init_pid": (4 << 22) + 1, "ns": ns + 1}
    try:
        with shared_st._engine.store.db.tx() as con:
            con.execute("UPDATE sandboxes SET handle=? WHERE id=?", (dumps(there), sb.id))
        shared_st.sandboxes()                          # reaps
        boxes.reap()
        assert start_time(real.init_pid) == real.init_start, "another namespace's sandbox was killed"
        assert boxes._row(sb.id)["state"] == "running"
        for call in (lambda: sb.exec("true"), sb.stop, sb.commit, lambda: sb.read("/etc/greeting")):
            with pytest.raises(sandtree.Conflict, match="another pid namespace"):
                call()
        assert start_time(real.init_pid) == real.init_start
    finally:
        with shared_st._engine.store.db.tx() as con:
            con.execute("UPDATE sandboxes SET handle=? WHERE id=?", (dumps(real.to_dict()), sb.id))
        sb.stop()
    assert start_time(real.init_pid) != real.init_start


def test_a_cgroup_kill_spares_a_listed_pid_that_left(monkeypatch):
    """kill_all reads the group's pids, then signals them: a pid that exited in between and was
    reused outside the group must not be killed (simulated: the list names an outsider)."""
    import subprocess
    from sandtree.runtime import cgroups
    cg_all = cgroups.Cgroups()
    if not cg_all.available:
        pytest.skip("no writable cgroups here")
    pid, start, ns = _me()
    name = f"{pid}-{start}-{ns}-k{uuid.uuid4().hex[:8]}"
    dirs = {c: os.path.join(p, name) for c, p in cg_all._parents(cpu=False, freezer=False).items()}
    for d in dirs.values():
        os.mkdir(d)
    inside = subprocess.Popen(["sleep", "60"])
    outside = subprocess.Popen(["sleep", "60"])
    try:
        for d in dirs.values():
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(inside.pid))
        real_read, told = cgroups._read, []

        def listing(path, default=""):
            text = real_read(path, default)
            if path.endswith("cgroup.procs") and not told:
                told.append(path)
                return text + f"{outside.pid}\n"       # as if a member's pid now named it
            return text
        monkeypatch.setattr(cgroups, "_read", listing)
        cgroups.RunCgroup(cg_all.version, dirs).kill_all()
        assert inside.wait(5) == -9
        time.sleep(0.1)
        assert outside.poll() is None, "a pid outside the group was killed"
    finally:
        for p in (inside, outside):
            p.kill()
            p.wait()
        monkeypatch.undo()
        cgroups.RunCgroup(cg_all.version, dirs).remove(wait=2.0)


def test_an_exec_returns_at_exit_while_its_background_job_floods(sb):
    # The job floods only after its exec returned: an exec passing its own cap is stopped
    # (test_hardening_runtime's flood tests), a job flooding the drain afterwards is discarded.
    t = time.monotonic()
    r = sb.exec("(sleep 0.3; exec yes flood) & echo done >&2", output=10000)
    assert r.ok and r.stderr == b"done\n" and time.monotonic() - t < 5
    time.sleep(0.6)
    assert b"yes flood" in sb.exec("ps").stdout                   # still running, output discarded
    assert sb.exec("echo quiet").stdout == b"quiet\n"             # later execs get only their own
    assert sb.exec("kill $(pidof yes)").ok


def test_a_reader_that_stops_still_gives_sigpipe(sb):
    """With the output passing through sandtree-drain, closing a popen's stdout still ends a
    writer with SIGPIPE while it runs (the drain closes its end too), as without the relay."""
    p = sb.popen(["yes"])
    assert p.stdout.read(100) == b"y\n" * 50
    p.stdout.close()
    assert p.wait(timeout=10) == -13


def test_a_write_over_the_sandbox_disk_is_refused_whole(bb):
    with bb.start(disk="8M") as sb:
        with pytest.raises(sandtree.TooLarge):
            sb.write("/tmp/big", b"x" * (16 << 20))
        assert sb.exec("ls -a /tmp").stdout.count(b".sandtree") == 0       # nothing half-written left
        assert sb.exec("test -e /tmp/big").exit_code == 1
        sb.write("/tmp/small", b"fits")                                    # and the disk is usable again
        assert sb.read("/tmp/small") == b"fits"
