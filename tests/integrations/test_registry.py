"""OCI registry pulls against a real registry on loopback (Debian's docker-registry), holding an
image this test pushes itself with a real client (skopeo)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess

import pytest

import sandtree
from conftest import free_port, wait_for_port
from test_store import LAYER1, LAYER2, _oci_layout

pytestmark = pytest.mark.skipif(not (shutil.which("docker-registry") and shutil.which("skopeo")),
                                reason="docker-registry and skopeo are not installed (make test installs them)")


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    (root / "config.yml").write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
                                     f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port)
    layout = _oci_layout(root / "oci", [LAYER1, LAYER2])
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}",
                    f"docker://127.0.0.1:{port}/team/app:1"], check=True)
    yield {"host": f"127.0.0.1:{port}", "layout": layout, "data": root / "data"}
    proc.terminate()
    proc.wait(timeout=10)


def test_pull_gives_the_same_image_as_the_layout(st, registry):
    pulled = st.pull(f"docker://{registry['host']}/team/app:1", tag="app")
    assert pulled == st.import_image(str(registry["layout"]))
    assert st.image("app") == pulled
    assert [e["name"] for e in pulled.ls("/opt")] == ["new"]
    assert pulled.read("/etc/b") == b"b"
    assert pulled.produced_by()[0]["command"] == f"pull:{registry['host']}/team/app:1"


def test_pull_errors(st, registry):
    with pytest.raises(sandtree.NotFound):
        st.pull(f"docker://{registry['host']}/team/app:nope")
    with pytest.raises(sandtree.InvalidInput):
        st.pull("docker://UPPER/Case!!")
    assert st.images() == []


def test_tampered_layer_rejected(st, registry, tmp_path):
    pushed = tmp_path / "copy"
    shutil.copytree(registry["layout"], pushed)
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{pushed}",
                    f"docker://{registry['host']}/team/bad:1"], check=True)
    blobs = sorted(glob.glob(f"{registry['data']}/docker/registry/v2/blobs/sha256/*/*/data"),
                   key=os.path.getsize, reverse=True)
    victim = blobs[0]                                    # the biggest blob: a layer
    original = open(victim, "rb").read()
    try:
        with open(victim, "r+b") as f:
            f.seek(len(original) // 2)
            f.write(b"\xff\xff")
        with pytest.raises(sandtree.BadArchive):
            st.pull(f"docker://{registry['host']}/team/bad:1")
        assert st.images() == []
    finally:
        with open(victim, "wb") as f:
            f.write(original)


def test_registry_login_checks_and_keeps(st, registry):
    st._engine.registry_login(f"docker://{registry['host']}/team/app", "someone", "token")
    row = st._engine.store.db.one("SELECT username FROM registry_auth WHERE registry=?", (registry["host"],))
    assert row == ("someone",)
    with pytest.raises(sandtree.SandtreeError):
        st._engine.registry_login("docker://127.0.0.1:1/x", "a", "b")


def test_cli_registry_login_list_logout(cli, registry):
    """`registry list` names each registry with stored credentials and its username, never the secret; `registry
    logout` forgets them (a second logout is a clear error); the real `sandtree` command against a real registry."""
    host = registry["host"]
    cli("registry", "login", f"docker://{host}/team/app", "--username", "someone", "--password-stdin",
        input=b"s3cret-token\n")
    p = cli("registry", "list")
    assert p.stdout.split() == [host.encode(), b"someone"] and b"s3cret" not in p.stdout
    assert json.loads(cli("registry", "list", "--json").stdout) == [{"registry": host, "username": "someone"}]
    assert cli("registry", "logout", host).stdout == f"logged out of {host}\n".encode()
    assert json.loads(cli("registry", "list", "--json").stdout) == []
    p = cli("registry", "logout", host, check=False)
    assert p.returncode == 1 and p.stderr == f"error: no credentials stored for {host}\n".encode()
