"""The core behaviour on every isolation tier (one suite, parametrized by tier). A tier this host
cannot run is skipped with the reason `sandtree doctor` gives."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

import sandtree

TIERS = ["namespaces", "gvisor"]


@pytest.fixture(scope="module")
def tier_st(tmp_path_factory):
    st = sandtree.Sandtree(str(tmp_path_factory.mktemp("tiers")), warm=0)
    yield st
    st.close()


@pytest.fixture(scope="module")
def tier_img(tier_st, rootfs):
    return tier_st.import_image(rootfs)


@pytest.fixture(params=TIERS)
def tier(request, tier_st):
    status = {r["tier"]: r for r in tier_st.doctor()}[request.param]
    if not status["available"]:
        pytest.skip(f"tier {request.param} unavailable here: {status['reason']}")
    return request.param


def test_run_inputs_and_results(tier_img, tier):
    r = tier_img.run("echo $FOO; pwd; cat; id -u; echo err >&2; exit 3", env={"FOO": "bar"}, cwd="/etc",
                     stdin=b"in\n", tier=tier, files=[{"path": "/app/f", "content": "x"}])
    assert (r.stdout, r.stderr, r.exit_code) == (b"bar\n/etc\nin\n0\n", b"err\n", 3)
    assert r.image.read("/app/f") == b"x"
    with pytest.raises(sandtree.CommandNotFound):
        tier_img.run(["/no/such/binary"], tier=tier)


def test_same_change_same_id_on_every_tier(tier_img, tier):
    cmd = "echo data > /tmp/out; mkdir -p /srv/a; rm /etc/greeting; chmod 700 /var; ln -s /tmp/out /srv/a/l"
    ref = tier_img.run(cmd, tier="namespaces").image
    assert tier_img.run(cmd, tier=tier).image == ref
    assert tier_img.run("true", tier=tier).image == tier_img                # no change: same ID


def test_isolation(tier_img, tier, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("TOPSECRET")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        r = tier_img.run(f"cat {secret} 2>&1; ls /proc | grep -c '^[0-9]'; "
                         f"wget -q -T 2 -O - http://127.0.0.1:{port}/ && echo REACHED; "
                         f"mount -t tmpfs none /mnt 2>&1 || echo MOUNT-DENIED; "
                         f"kill -0 {os.getpid()} 2>&1 || echo NO-HOST-PID", tier=tier, timeout=30, disposable=True)
    finally:
        srv.close()
    out = r.stdout.decode()
    assert "TOPSECRET" not in out and "REACHED" not in out
    assert "MOUNT-DENIED" in out and "NO-HOST-PID" in out
    assert int(out.splitlines()[1]) < 10                                     # its own few processes


def test_limits(tier_img, tier):
    r = tier_img.run("sleep 30 & sleep 30", timeout=1, tier=tier)
    assert r.timed_out
    r = tier_img.run("dd if=/dev/zero of=/big bs=1M count=200", disk="16M", tier=tier, disposable=True)
    assert r.exit_code != 0 and b"space" in r.stderr.lower()
    assert tier_img.run("echo ok", tier=tier, disposable=True).stdout == b"ok\n"


def test_doctor_names_every_tier(tier_st):
    rows = {r["tier"]: r for r in tier_st.doctor()}
    assert set(rows) == {"namespaces", "gvisor", "microvm"}
    assert rows["namespaces"]["available"]
    assert not rows["microvm"]["available"] and rows["microvm"]["reason"]
    p = subprocess.run([sys.executable, "-m", "sandtree", "--home", tier_st.home, "doctor", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert {r["tier"] for r in json.loads(p.stdout)} == {"namespaces", "gvisor", "microvm"}


def test_unknown_tier(tier_img):
    with pytest.raises(sandtree.InvalidInput):
        tier_img.run("true", tier="vm")


def test_sandbox_root_is_not_host_root(tier_img, tier, tier_st):
    if os.geteuid() != 0:
        pytest.skip("the id range is only mapped when sandtree runs as root")
    img = tier_img.run("echo x > /made-by-root; chown 1000:1000 /tmp", tier=tier).image
    top = tier_st._engine.store.image(img.id).layers[0]
    layer = os.path.join(tier_st._engine.store.layers.root, top)
    st = os.lstat(os.path.join(layer, "made-by-root"))
    assert (st.st_uid, st.st_gid) == (100000, 100000)             # host ids of sandbox root
    assert os.lstat(os.path.join(layer, "tmp")).st_uid == 101000
    assert img.stat("/made-by-root")["uid"] == 0 and img.stat("/tmp")["uid"] == 1000
