"""kill -9 at any moment of an import or a commit leaves a consistent store.

A worker process imports and commits in a loop; the test SIGKILLs it at staggered moments, then
opens the store again: fsck (with content re-hashing) must pass, staging leftovers of the dead
worker are cleaned, and every listed image is whole (every file readable, every layer present).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import sandtree

WORKER = textwrap.dedent("""
    import os, sys, sandtree
    home, rootfs, big, database = sys.argv[1:5]
    st = sandtree.Sandtree(home, database=database or None)
    img = st.import_image(rootfs, tag="base")
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        st.import_image(big)                                   # mid-import kills
        img = img.run(f"mkdir -p /w/{i}; for n in $(seq 200); do echo {i}-$n > /w/{i}/$n; done; "
                      f"head -c 4000000 /dev/urandom > /w/{i}/blob").image   # mid-commit kills
""")


@pytest.fixture(scope="module")
def big_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    for i in range(40):
        sub = d / f"d{i}"
        sub.mkdir()
        for j in range(50):
            (sub / f"f{j}").write_bytes(os.urandom(2048) + f"{i}-{j}".encode())
    return str(d)


@pytest.mark.parametrize("delay", [0.35, 0.6, 0.9, 1.3, 1.7])
def test_kill_9_mid_import_and_commit(tmp_path, rootfs, big_dir, delay, store_database):
    home = str(tmp_path / "home")
    proc = subprocess.Popen([sys.executable, "-c", WORKER, home, rootfs, big_dir, store_database or ""], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"ready\n", proc.stderr.read()
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    time.sleep(0.1)                                             # the helper chain dies by PDEATHSIG

    with sandtree.Sandtree(home, database=store_database) as st:
        report = st.fsck()
        assert report["ok"], report["problems"]
        assert os.listdir(os.path.join(home, "tmp")) == []     # the dead worker's staging is gone
        for img in st.images():
            buf = open(os.devnull, "wb")
            img.export(buf)                                     # every file of every listed image
            buf.close()
        assert st.image("base").run("cat /etc/greeting", disposable=True).exit_code == 0
        st.gc(retention=0, grace=0)
        assert st.fsck()["ok"]
