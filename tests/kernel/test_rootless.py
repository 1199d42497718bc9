"""Rootless: the engine run by an unprivileged user (here `nobody`) through user namespaces.

Needs root to switch user, and a Python that user can reach (the system python3 with this
checkout's source and the venv's packages on PYTHONPATH); skipped, saying why, otherwise.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = next((p for p in sys.path if p.endswith("site-packages") and ".venv" in p), None)

SCRIPT = textwrap.dedent("""
    import sandtree
    st = sandtree.Sandtree()
    img = st.import_image(ROOTFS)
    r = img.run("id -u; cat /proc/self/uid_map; echo hi > /x; rm /etc/greeting; rm -rf /root; mkdir /root; "
                "echo n > /root/new")
    assert r.exit_code == 0, r.stderr
    uid, mapline = r.stdout.decode().splitlines()[:2]
    assert uid == "0" and mapline.split()[1] == str(__import__("os").getuid()), mapline
    r2 = r.image.run("cat /x; ls /etc /root")
    assert b"greeting" not in r2.stdout and r2.stderr == b"", (r2.stdout, r2.stderr)
    assert r.image.read("/x") == b"hi\\n"
    assert [e["name"] for e in r.image.ls("/root")] == ["new"]
    m = st.merge(None, r.image.run("echo a > /a").image, r.image.run("rm /x").image)
    assert m.image.run("ls /").stdout.split() == [b"a", b"bin", b"dev", b"etc", b"proc", b"root", b"tmp", b"usr", b"var"]
    assert r.usage["limits_enforced"] is False
    assert st.fsck()["ok"]
    try:                                      # no egress daemon without root: refused, saying why
        img.run("true", network="all")
        raise AssertionError("a rootless engine accepted a network policy")
    except sandtree.RuntimeUnavailable as e:
        assert "root" in str(e) and "network=off" in str(e), e
    print("ROOTLESS OK")
""")


def _reachable(user: str, path: str) -> bool:
    return subprocess.run(["su", "-s", "/bin/sh", user, "-c", f"test -r '{path}'"]).returncode == 0


@pytest.mark.root
def test_rootless_run_commit_merge(rootfs):
    if os.geteuid() != 0 or shutil.which("su") is None:
        pytest.skip("needs root to switch to an unprivileged user")
    py = "/usr/bin/python3"
    if not os.path.exists(py) or SITE is None:
        pytest.skip("no system python3 or venv site-packages for the unprivileged user")
    for path in (os.path.join(ROOT, "src", "sandtree", "__init__.py"), os.path.join(SITE, "zstandard")):
        if not _reachable("nobody", path):
            pytest.skip(f"user nobody cannot read {path} (checkout under a private directory)")
    work = pathlib.Path(tempfile.mkdtemp(prefix="sandtree-rootless-"))   # pytest's tmp is root-only
    try:
        _run_as_nobody(work, rootfs, py)
    finally:
        from sandtree.store.layers import remove_tree
        remove_tree(str(work))


def _run_as_nobody(work, rootfs, py):
    shutil.copytree(rootfs, work / "rootfs", symlinks=True)
    subprocess.run(["chown", "-R", "nobody:nogroup", str(work)], check=True)
    env = f"HOME={work} SANDTREE_HOME={work}/home PYTHONPATH={ROOT}/src:{SITE}"
    code = SCRIPT.replace("ROOTFS", repr(str(work / "rootfs")))
    script = work / "t.py"
    script.write_text(code)
    p = subprocess.run(["su", "-s", "/bin/sh", "nobody", "-c", f"cd {work} && env {env} {py} {script}"],
                       capture_output=True, text=True, timeout=120)
    assert "ROOTLESS OK" in p.stdout, p.stdout + p.stderr
