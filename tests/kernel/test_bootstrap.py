"""Debian bootstrap through debootstrap (real mirror, real packages): the base image path of `make demo`."""

from __future__ import annotations

import os
import shutil

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("debootstrap"), reason="needs root and debootstrap")
def test_bootstrap_debian_minbase(bookworm):
    """The session's bootstrap (conftest.bookworm: minbase and python3-pip, made once for every
    test that needs Debian), as its store has it."""
    import sandtree
    home, image, lines = bookworm
    if not lines:
        pytest.skip("SANDTREE_TEST_BOOKWORM names a store bootstrapped earlier: no debootstrap log to check")
    st = sandtree.Sandtree(home, warm=0)
    try:
        _check_bootstrapped(st, st.image(image), lines)
    finally:
        st.close()


def _check_bootstrapped(st, img, lines):
    assert lines, "debootstrap's progress reaches the caller"
    assert st.image("debian:bookworm") == img
    assert img.read("/etc/debian_version").startswith(b"12")
    r = img.run("id -un; dpkg -l | grep -c '^ii'; ls /var/cache/apt/archives/*.deb 2>/dev/null | wc -l")
    user, packages, debs = r.stdout.decode().split()
    assert user == "root" and int(packages) > 50 and debs == "0"
    assert r.image == img                                   # reading changes nothing
    # apt's world works inside: a write to /etc/apt is a commit like any other
    r = img.run("echo 'APT::Install-Recommends \"false\";' > /etc/apt/apt.conf.d/99norec && apt-config dump | grep -c Recommends")
    assert r.exit_code == 0 and r.image != img
    assert st.fsck(verify_content=False)["ok"]


def test_bootstrap_rejects_bad_specs(st):
    import sandtree
    for spec in ("ubuntu:jammy", "debian:", "debian:../x"):
        with pytest.raises(sandtree.InvalidInput):
            st.bootstrap(spec)
    with pytest.raises(sandtree.InvalidInput):
        st.bootstrap("debian:bookworm", include=["bad;name"])
    assert st.images() == []
