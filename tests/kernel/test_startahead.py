"""Live sandboxes started ahead (engine/warm/sandboxes.py): a start with the spec of a recent start claims
a sandbox already started; what the caller gets is the sandbox it asked for (its env, limits,
labels, lifetime, its own files), and nothing started ahead is listed, collected or left behind."""

from __future__ import annotations

import time

import pytest

import sandtree


def ready(st, timeout: float = 10.0) -> dict:
    """Wait until the engine has a sandbox started ahead for every spec it wants one for."""
    starts = st.engine.sandboxes.starts
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with starts.cv:
            if starts.want and set(starts.want) <= set(starts.ready):
                return dict(starts.ready)
        time.sleep(0.01)
    raise AssertionError("nothing was started ahead")


def state_of(st, sid: str) -> str | None:
    rows = st.engine.store.db.query("SELECT state FROM sandboxes WHERE id=?", (sid,))
    return rows[0][0] if rows else None


@pytest.fixture
def img(st, rootfs):
    return st.import_image(rootfs)


def test_a_start_claims_the_one_started_ahead(st, img):
    first = img.start(env={"A": "1"}, memory="256M")
    ahead = ready(st)
    (sid, handle), = ahead.values()
    assert state_of(st, sid) == "ahead"
    assert sid not in [s.id for s in st.sandboxes(all=True)]         # never listed
    t = time.time()
    second = img.start(env={"A": "1"}, memory="256M", labels={"who": "second"}, lifetime=100, idle_timeout=50)
    assert second.id == sid and state_of(st, sid) == "running"
    info = second.info()
    assert info["labels"] == {"who": "second"} and info["idle_timeout"] == 50
    assert info["limits"]["memory"] == 256 << 20 and t + 99 < info["expires"] < time.time() + 101
    assert second.exec("echo $A").stdout == b"1\n"
    second.write("/mine", "2")
    assert not first.exists("/mine")                                  # each its own upper
    assert second.commit().read("/mine") == b"2"
    assert ready(st) and sid not in [s for s, _ in st.engine.sandboxes.starts.ready.values()]   # replaced
    first.stop()
    second.stop()


def test_other_specs_start_their_own(st, img, tmp_path):
    a = img.start(env={"A": "1"})
    ahead = ready(st)
    (sid, _), = ahead.values()
    b = img.start(env={"A": "2"})                     # another env: not that sandbox
    c = img.start(env={"A": "1"}, files={"/f": "x"})  # injected files: never from ahead
    assert sid not in (b.id, c.id) and c.read("/f") == b"x"
    d = img.start(env={"A": "1"})
    assert d.id == sid
    for sb in (a, b, c, d):
        sb.stop()


def test_the_lifetime_moves_to_the_callers(st, img):
    img.start().stop()
    ready(st)
    sb = img.start(lifetime=2)
    assert sb.exec("true").exit_code == 0
    time.sleep(3.5)                                   # its helper ends it at the caller's lifetime, not 600 s
    assert sb.state != "running"


def test_gc_keeps_the_image_and_close_stops_them(tmp_path, rootfs):
    st = sandtree.Sandtree(str(tmp_path / "home"))
    try:
        img = st.import_image(rootfs)                 # untagged: only a sandbox keeps it
        img.start().stop()
        (sid, handle), = ready(st).values()
        st.gc(retention=0, grace=0)
        sb = img.start()
        assert sb.id == sid and sb.exec("cat /etc/greeting").stdout == b"hello from the image\n"
        sb.stop()
        (sid, handle), = ready(st).values()
    finally:
        st.close()
    with sandtree.Sandtree(str(tmp_path / "home"), warm=0) as again:
        assert state_of(again, sid) is None       # stopped unclaimed: its row goes too (no caller's spec to list)
        assert not again.engine.sandboxes.live.alive(handle)
        assert again.engine.sandboxes.starts is None             # warm=0: nothing started ahead
        again.image(img.id).start().stop()


def test_an_unclaimed_one_past_its_end_is_removed(st, img):
    img.start().stop()
    (sid, handle), = ready(st).values()
    with st.engine.store.db.tx() as con:              # as if its engine had died 10 minutes ago
        con.execute("UPDATE sandboxes SET expires=? WHERE id=?", (time.time() - 1, sid))
    st.sandboxes()                                    # (a list reaps)
    assert state_of(st, sid) is None and sid not in {s.id for s in st.sandboxes(all=True)}


def test_two_tenants_with_one_spec_share_nothing(tmp_path, rootfs):
    """The sandbox started ahead after tenant a's start is claimed by tenant b (same image: same
    content is one image; same spec): b gets a fresh sandbox, none of a's files, processes or
    environment, and each tenant sees and enters only its own."""
    from sandtree.engine import Engine
    from sandtree.tenancy import Tenant
    eng = Engine(str(tmp_path / "home"), warm=2)
    started = []
    try:
        a = eng.as_tenant(Tenant("a"))
        b = eng.as_tenant(Tenant("b"))
        image = a.import_path(rootfs)
        assert b.import_path(rootfs) == image
        sa = a.sandbox_start(image, env={"K": "v"})["id"]
        started.append(sa)
        a.sandbox_write(sa, "/secret", b"a's")
        a.sandbox_exec(sa, "export A_ONLY=1; sleep 300 >/dev/null 2>&1 &")
        starts = eng.sandboxes.starts
        end = time.monotonic() + 10
        while time.monotonic() < end and not starts.ready:
            time.sleep(0.01)
        (waiting, _), = starts.ready.values()
        sb = b.sandbox_start(image, env={"K": "v"})["id"]
        started.append(sb)
        assert sb == waiting != sa                                   # b claimed the one started ahead
        procs = "cat /proc/[0-9]*/comm"
        assert b"sleep" in a.sandbox_exec(sa, procs).stdout                # (what the next check looks for)
        out = b.sandbox_exec(sb, f"ls /secret; echo A=$A_ONLY K=$K; {procs}")
        assert b"No such file" in out.stderr and b"A= K=v" in out.stdout and b"sleep" not in out.stdout
        assert [s["id"] for s in a.sandbox_list()] == [sa] and [s["id"] for s in b.sandbox_list()] == [sb]
        for view, other in ((a, sb), (b, sa)):
            with pytest.raises(sandtree.NotFound):
                view.sandbox_exec(other, "true")
            with pytest.raises(sandtree.NotFound):
                view.sandbox_read(other, "/etc/hostname")
    finally:
        for sid in started:                       # (detached: they would outlive the engine)
            eng.sandbox_stop(sid)
        eng.close()


def test_a_process_that_never_closes_its_engine_leaves_nothing(tmp_path, rootfs):
    """A script (or `inspect eval`) that ends without closing its engine: the sandbox started ahead
    for it is stopped at its exit, not left running until AHEAD_LIFETIME."""
    import subprocess
    import sys
    home = str(tmp_path / "home")
    code = ("import sys, time, sandtree\n"
            "st = sandtree.Sandtree(sys.argv[1])\n"
            "st.import_image(sys.argv[2]).start().stop()\n"
            "end = time.monotonic() + 10\n"
            "while not st.engine.sandboxes.starts.ready and time.monotonic() < end:\n"
            "    time.sleep(0.01)\n"
            "print(len(st.engine.sandboxes.starts.ready))\n")
    p = subprocess.run([sys.executable, "-c", code, home, rootfs], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "1", p.stderr      # one was started ahead
    ps = subprocess.run(["ps", "-eo", "stat=,comm=,args="], capture_output=True, text=True).stdout
    assert not [l for l in ps.splitlines() if str(tmp_path) in l and not l.startswith("Z")]   # (argv may be cut)
    st = sandtree.Sandtree(home, warm=0)
    try:
        assert st.engine.store.db.query("SELECT id FROM sandboxes WHERE state='ahead'") == []
    finally:
        st.close()
