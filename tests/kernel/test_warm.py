"""Cold and warm starts are the same sandbox: both paths, same results, nothing left behind."""

from __future__ import annotations

import os
import subprocess

import pytest

import sandtree


@pytest.fixture(params=["cold", "warm"])
def img(request, tmp_path, rootfs):
    st = sandtree.Sandtree(str(tmp_path / "home"), warm=0 if request.param == "cold" else 2)
    image = st.import_image(rootfs)
    if request.param == "warm":
        image.run("true")                    # the first run starts the pool
        rt = st._engine.runtime
        if rt._pool is None:
            pytest.skip("warm starts need root and cgroups")
        import time
        for _ in range(100):
            if rt._pool.ready:
                break
            time.sleep(0.01)
        assert rt._pool.ready, rt._pool.broken
    yield image
    st.close()


def test_same_behaviour_both_paths(img):
    r = img.run("echo $FOO; pwd; id -u; cat; cat /proc/self/uid_map; hostname; echo w > /w",
                env={"FOO": "bar"}, cwd="/etc", stdin=b"in\n", hostname="h1",
                files=[{"path": "/etc/injected", "content": "x"}])
    lines = r.stdout.decode().splitlines()
    assert lines[:4] == ["bar", "/etc", "0", "in"]
    if os.geteuid() == 0:
        assert lines[4].split()[:2] == ["0", "100000"]
    assert lines[5] == "h1"
    assert r.image.read("/w") == b"w\n" and r.image.read("/etc/injected") == b"x"
    assert img.run("exit 5").exit_code == 5
    t = img.run("sleep 30", timeout=0.3)
    assert t.timed_out
    with pytest.raises(sandtree.CommandNotFound):
        img.run(["/nope"])
    assert int(img.run("ps -o comm | grep -c .", disposable=True).stdout) <= 6     # only its own


def test_pool_leaves_nothing_behind(tmp_path, rootfs):
    before = set(os.listdir("/sys/fs/cgroup/memory/sandtree")) if os.path.isdir("/sys/fs/cgroup/memory/sandtree") else set()
    st = sandtree.Sandtree(str(tmp_path / "home"), warm=3)
    img = st.import_image(rootfs)
    for _ in range(5):
        img.run("true")
    st.close()
    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    mine = str(tmp_path / "home")                 # the helper runs from <home>/bin
    assert not [l for l in out.splitlines() if mine in l and not l.startswith("Z")]
    if os.geteuid() == 0:
        d = "/sys/fs/cgroup/memory/sandtree"
        if os.path.isdir(d):                      # (the session's shared store has its own)
            assert not [n for n in os.listdir(d) if n.startswith(f"{os.getpid()}-") and n not in before]
