"""Forking a running sandbox (issue 38): sb.fork(n) gives N live sandboxes that go on from the
source's processes, memory, open files, shell session and listening sockets at one instant, each a
full sandbox of its own (namespaces, cgroup, limits, seccomp), while the source runs on.

Real kernel, real CRIU (namespaces) and runsc (gVisor): live_tier runs each test on both."""

import os
import subprocess
import sys
import time

import pytest

import sandtree
from sandtree.procid import owner_prefix

MEMSTATE = os.path.join(os.path.dirname(__file__), "..", "programs", "memstate.c")
SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


@pytest.fixture(scope="module")
def memstate_rootfs(tmp_path_factory):
    """The busybox rootfs plus memstate: a counter and 100 MB of random bytes, in memory only."""
    from conftest import make_rootfs
    root = make_rootfs(str(tmp_path_factory.mktemp("forkstate") / "root"))
    os.makedirs(os.path.join(root, "usr/local/bin"))
    subprocess.run(["cc", "-O2", "-static", "-o", os.path.join(root, "usr/local/bin/memstate"), MEMSTATE], check=True)
    os.makedirs(os.path.join(root, "www"))
    with open(os.path.join(root, "www", "index.html"), "w") as f:
        f.write("served\n")
    return root


@pytest.fixture
def forkable(tmp_path, memstate_rootfs, live_tier):
    """(store, image) in a home of this test's, skipped where this tier cannot checkpoint."""
    st = sandtree.Sandtree(str(tmp_path / "home"), warm=0)
    ok, why = st._engine.sandboxes.live.hibernate_available(live_tier)
    if not ok:
        st.close()
        pytest.skip(why)
    try:
        yield st, st.import_image(memstate_rootfs), live_tier
    finally:
        for s in st.sandboxes():
            s.stop()
        st.close()


def _ask(sb) -> list[bytes]:
    """memstate's next count and the checksum of its 100 MB."""
    assert sb.exec("touch /tmp/ask; while [ -e /tmp/ask ]; do sleep 0.01; done").ok
    return sb.exec("cat /tmp/answer").stdout.split()


def _until(sb, command: str, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while not sb.exec(command).ok:
        assert time.monotonic() < end, command
        time.sleep(0.05)


def _confinement(sb) -> tuple:
    """What confines memstate, seen from inside: ids, capabilities, seccomp, no_new_privs."""
    return sb.exec("grep -E '^(Uid|Gid|Cap|Seccomp|NoNewPrivs)' /proc/$(pidof memstate)/status").stdout


def test_children_continue_memory_processes_and_session(forkable):
    st, img, tier = forkable
    sb = img.start(idle_timeout=300, lifetime=600, tier=tier, memory="512m")
    assert sb.exec("cd /tmp; export X=7; echo before > /tmp/file").ok
    assert sb.exec("memstate 100 >/dev/null 2>&1 &").ok
    _until(sb, "test -e /tmp/ready")
    count, total = _ask(sb)
    assert count == b"1"
    before = sb.info()["head"]

    kids = sb.fork(2)
    assert len(kids) == 2 and len({k.id for k in kids} | {sb.id}) == 3
    fork_image = kids[0].info()["forked_from"]["image"]
    assert all(k.info()["forked_from"] == {**kids[0].info()["forked_from"]} for k in kids)
    assert kids[0].info()["forked_from"]["sandbox"] == sb.id
    # the lineage: the source's commit at the fork (its head now), the children on it
    assert sb.info()["head"] == fork_image and fork_image != before
    assert st.image(fork_image).read("/tmp/file") == b"before\n"

    # each child goes on from the fork: the same process, counting on, with the same 100 MB
    for k in kids:
        assert k.state == "running" and k.info()["tier"] == tier
        assert _ask(k) == [b"2", total]
        assert k.exec("pwd; echo $X; cat /tmp/file").stdout == b"/tmp\n7\nbefore\n"
        assert k.info()["memory_bytes"] > 100 << 20         # charged to its own cgroup
    # the source never stopped: it counts on from its own state
    assert _ask(sb) == [b"2", total]
    assert _confinement(kids[0]) == _confinement(sb) == _confinement(kids[1])
    assert kids[0].info()["limits"] == sb.info()["limits"]

    # children diverge: their own writes, their own images, neither sees the other's nor the source's
    assert kids[0].exec("echo zero > /tmp/file").ok and kids[1].exec("echo one > /tmp/file").ok
    assert sb.exec("echo source > /tmp/file").ok
    a, b = kids[0].commit(), kids[1].commit()
    assert a.read("/tmp/file") == b"zero\n" and b.read("/tmp/file") == b"one\n"
    assert [p.id for p in a.parents()] == [fork_image] == [p.id for p in b.parents()]
    assert sb.exec("cat /tmp/file").stdout == b"source\n"
    assert _ask(kids[0]) == [b"3", total] and _ask(sb) == [b"3", total]

    # a child is a sandbox like any: stopped alone, the others run on
    kids[0].stop()
    assert kids[1].exec("echo alive").stdout == b"alive\n" and sb.exec("echo alive").stdout == b"alive\n"


def test_listening_sockets_listen_and_connections_stay_the_sources(forkable):
    st, img, tier = forkable
    sb = img.start(idle_timeout=300, lifetime=600, tier=tier)
    # a server listening, and a connection open to it: a writer streaming into a reader
    assert sb.exec("httpd -p 8000 -h /www").ok
    assert sb.exec("(sleep 100000 | nc -l -p 9000 > /tmp/got 2>/dev/null &); sleep 0.2; "
                   "((while :; do echo tick; sleep 0.05; done) | nc 127.0.0.1 9000 >/dev/null 2>&1 &)").ok
    _until(sb, "test -s /tmp/got")
    [kid] = sb.fork()
    for s in (sb, kid):                       # the listener answers in each, on its own loopback
        assert s.exec("wget -qO- http://127.0.0.1:8000/index.html").stdout == b"served\n"
    # the child's loopback is its own (on the namespaces tier a network namespace made for it,
    # criu.py NETNS_FRESH), up, and its root binds a low port there as in any sandbox
    assert kid.exec("httpd -p 81 -h /www").ok
    assert kid.exec("wget -qO- http://127.0.0.1:81/index.html").stdout == b"served\n"
    assert not sb.exec("wget -qO- -T 2 http://127.0.0.1:81/index.html").ok
    # the source's connection goes on
    size = len(sb.read("/tmp/got"))
    time.sleep(0.5)
    assert len(sb.read("/tmp/got")) > size and sb.exec("pidof nc").ok
    if tier == "namespaces":
        # the child's copy of it was closed (CRIU restores it so: criu.py TCP_FORK): both its ends exit
        _until(kid, "! pidof nc")
        size = len(kid.read("/tmp/got"))
        time.sleep(0.3)
        assert len(kid.read("/tmp/got")) == size
    else:
        # gVisor's checkpoint is its whole network stack: a connection with both ends inside goes on
        # in the child, apart from the source's (docs/design.md, "Forking a live sandbox")
        assert kid.exec("echo child-only > /tmp/mark").ok
        size = len(kid.read("/tmp/got"))
        time.sleep(0.5)
        assert len(kid.read("/tmp/got")) > size and b"child-only" not in sb.exec("cat /tmp/mark 2>&1").stdout


def test_a_child_cannot_reach_the_source(forkable):
    st, img, tier = forkable
    sb = img.start(idle_timeout=300, lifetime=600, tier=tier)
    assert sb.exec("(sleep 1000 &); echo secret-before > /tmp/s; mkdir -p /dev/shm; echo shm > /dev/shm/x").ok
    [kid] = sb.fork()
    assert sb.exec("echo secret-after > /tmp/s2; echo more > /dev/shm/y").ok
    # its own pid namespace: the source's processes are not there, only its own copies
    own = kid.ps()
    assert kid.exec("pidof sleep").ok
    assert kid.exec("cat /tmp/s; cat /dev/shm/x").stdout == b"secret-before\nshm\n"     # (the fork's state)
    assert not kid.exec("cat /tmp/s2").ok and not kid.exec("cat /dev/shm/y").ok          # (not the source's since)
    src = st._engine.sandboxes._row(sb.id)["handle"]
    child = st._engine.sandboxes._row(kid.id)["handle"]
    assert src.cgroup != child.cgroup and src.init_pid != child.init_pid
    # no way out to the source's memory: no host pids in its /proc, no ptrace of a pid it cannot see
    host_pid = src.init_pid
    r = kid.exec(f"cat /proc/{host_pid}/environ; ls /proc/{host_pid}/mem")
    assert not r.ok or host_pid in {p["pid"] for p in own}


def test_bad_input_starts_nothing(forkable):
    st, img, tier = forkable
    sb = img.start(idle_timeout=300, lifetime=600, tier=tier)
    before = {s.id for s in st.sandboxes()}
    for n in (0, -1, 17, 2.5, True, "2"):
        with pytest.raises(sandtree.InvalidInput):
            st._engine.sandbox_fork(sb.id, n)
    with pytest.raises(TypeError, match="env"):        # (its env is its processes': no such option)
        st._engine.sandbox_fork(sb.id, 1, env={"A": "1"})
    with pytest.raises(sandtree.InvalidInput):
        sb.fork(1, idle_action="pause")
    with pytest.raises(sandtree.NotFound):
        st._engine.sandbox_fork("f" * 32, 1)
    if tier == "namespaces":                  # (a hibernated source: hibernate itself is covered per tier elsewhere)
        sb.hibernate()
        with pytest.raises(sandtree.Conflict, match="hibernated"):
            sb.fork(1)
        sb.resume()
    sb.stop()
    with pytest.raises(sandtree.Conflict, match="stopped"):
        sb.fork(1)
    assert {s.id for s in st.sandboxes()} == before - {sb.id}
    # no checkpoint left of this process's forks (other processes on the host may be forking now),
    # once the live states its forks kept after returning are kept
    st._engine.sandboxes.wait_live_states()
    assert not [n for n in os.listdir("/dev/shm/sandtree-forks") if n.endswith(".fork") and
                n.startswith(owner_prefix())] if os.path.isdir("/dev/shm/sandtree-forks") else True


def test_a_commit_failing_during_the_checkpoint_leaves_the_source_running(forkable, monkeypatch):
    """The fork's commit runs while the checkpoint is taken (LiveTier.dump's meanwhile): if it
    fails, the checkpoint is let finish (a CRIU killed mid-dump could leave its parasite in the
    source), the source is thawed and goes on with its memory, and nothing is started or left."""
    st, img, tier = forkable
    sb = img.start(idle_timeout=300, lifetime=600, tier=tier, memory="512m")
    assert sb.exec("memstate 20 >/dev/null 2>&1 &").ok
    _until(sb, "test -e /tmp/ready")
    _, total = _ask(sb)
    before = {s.id for s in st.sandboxes()}
    head = sb.info()["head"]
    eng = st._engine.sandboxes
    eng.wait_live_states()                           # (earlier forks' checkpoints, kept after they returned)

    def broken(*a, **k):
        raise sandtree.errors.TooLarge("planted: the commit does not fit")
    monkeypatch.setattr(eng, "_snapshot", broken)
    with pytest.raises(sandtree.errors.TooLarge, match="planted"):
        sb.fork(2)
    monkeypatch.undo()
    assert sb.state == "running" and sb.info()["head"] == head
    assert _ask(sb) == [b"2", total]                 # its process went on, memory whole
    assert {s.id for s in st.sandboxes()} == before
    assert not [n for n in os.listdir("/dev/shm/sandtree-forks") if n.endswith(".fork") and
                n.startswith(owner_prefix())] if os.path.isdir("/dev/shm/sandtree-forks") else True
    [kid] = sb.fork()                                # and it forks once the commit works
    assert _ask(kid) == [b"3", total]


def test_a_checkpoint_a_killed_fork_left_is_swept(tmp_path):
    """A fork's checkpoint holds the source's memory: one left by an engine killed mid-fork goes at
    the next reap or gc; one of a living engine (a fork in progress) stays."""
    from sandtree.engine.sandboxes.forking import FORKS
    st = sandtree.Sandtree(str(tmp_path / "home"), warm=0)
    try:
        dead = subprocess.run([sys.executable, "-c", "from sandtree.procid import owner_prefix; print(owner_prefix())"],
                              capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": SRC}).stdout.strip()
        made = st._engine.sandboxes._fork_dir()
        os.rmdir(made)
        base = os.path.dirname(made)                                    # (FORKS, or the home where no tmpfs)
        left = os.path.join(base, f"{dead}{'a' * 32}.fork")
        alive = os.path.join(base, f"{owner_prefix()}{'b' * 32}.fork")
        for d in (left, alive):
            os.makedirs(d)
            with open(os.path.join(d, "pages-1.img"), "wb") as f:
                f.write(b"memory")
        st.sandboxes()                                                  # (a reap)
        assert not os.path.exists(left) and os.path.exists(alive)
        os.rename(alive, left)
        assert left.rsplit("/", 1)[1] in st.gc()["removed_fork_checkpoints"] and not os.path.exists(left)
        assert base == FORKS or base.startswith(str(tmp_path))
    finally:
        st.close()
