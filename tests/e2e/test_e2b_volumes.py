"""E2B's own `e2b` package, unmodified, against a real `sandtree serve` on loopback: its Volume API
(Volume.create / list / get_info / destroy, sync and async) with only E2B_API_URL, E2B_SANDBOX_URL and
E2B_API_KEY set, and its volume content client (write_file / read_file / list / make_dir / get_info /
exists / remove) with E2B_VOLUME_API_URL too (the SDK's default for it is https://api.<domain>). A
volume E2B made is the one a sandtree sandbox mounts; deleting it in use is refused; another tenant's
key can neither see nor touch it."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import time

import httpx
import pytest

import sandtree
from conftest import serve_process
from sandtree.engine.volumes import MOUNT_BASE

e2b = pytest.importorskip("e2b", reason="the e2b extra is not installed (pip install -e '.[test]')")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="volumes are loop-mounted ext4: root only")


@pytest.fixture(scope="module")
def world(tmp_path_factory, rootfs):
    """A server with two tenants' tokens and a busybox image every tenant sees; what it leaves is stopped."""
    home = str(tmp_path_factory.mktemp("e2b-volumes") / "home")
    st = sandtree.Sandtree(home, warm=0)
    eng = st._engine
    image = eng.import_path(rootfs)
    eng.share(image)
    alice = eng.tenancy.create_token("alice", "run,list,tag")["token"]
    bob = eng.tenancy.create_token("bob", "run,list,tag")["token"]
    st.close()
    with serve_process(home) as url:
        yield {"url": url, "image": image, "alice": alice, "bob": bob}
        with httpx.Client(base_url=url + "/api/v1", timeout=30, trust_env=False) as c:
            for key in (alice, bob):
                h = {"Authorization": f"Bearer {key}"}
                for s in c.get("/sandboxes", headers=h).json():
                    c.post(f"/sandboxes/{s['id']}/stop", headers=h)
    # the server's process is gone, and with it the host's mount of the volumes; no loop device is left
    for _ in range(50):
        if home not in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout:
            break
        time.sleep(0.1)
    assert home not in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    mounted_at = os.path.join(MOUNT_BASE, hashlib.sha256(os.path.realpath(home).encode()).hexdigest()[:16])
    assert not [line for line in open("/proc/self/mountinfo") if home in line or mounted_at in line]


def _as(monkeypatch, world, who: str, content: bool = False) -> None:
    for var in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_VOLUME_API_URL", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("E2B_API_URL", world["url"] + "/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", world["url"] + "/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", world[who])
    if content:
        monkeypatch.setenv("E2B_VOLUME_API_URL", world["url"] + "/e2b")


def _api(world, who: str) -> httpx.Client:
    return httpx.Client(base_url=world["url"] + "/api/v1", timeout=60, trust_env=False,
                        headers={"Authorization": f"Bearer {world[who]}"})


def test_volume_lifecycle_through_the_e2b_sdk(monkeypatch, world):
    _as(monkeypatch, world, "alice")
    vol = e2b.Volume.create("data")
    assert (vol.volume_id, vol.name) == ("data", "data") and vol.token
    assert "data" in [v.name for v in e2b.Volume.list()]
    assert e2b.Volume.get_info("data").name == "data"
    with pytest.raises(Exception):
        e2b.Volume.create("data")                              # it exists
    with pytest.raises(Exception):
        e2b.Volume.create("../x")                              # a bad name: E2B's error, not a 500
    assert e2b.Volume.destroy("data") is True
    assert e2b.Volume.destroy("data") is False                 # E2B: False for a volume that is not there
    with pytest.raises(e2b.VolumeNotFoundException):
        e2b.Volume.get_info("data")


def test_a_volume_e2b_made_is_the_one_a_sandbox_mounts(monkeypatch, world):
    _as(monkeypatch, world, "alice", content=True)
    vol = e2b.Volume.create("shared")
    vol.write_file("/from-e2b.txt", "hello from the SDK")
    vol.make_dir("/dir/sub")
    with _api(world, "alice") as c:
        r = c.post("/sandboxes", json={"image": world["image"], "volumes": {"shared": "/data"}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        r = c.post(f"/sandboxes/{sid}/exec", json={"command": "cat /data/from-e2b.txt; echo in-sandbox > "
                                                                "/data/dir/sub/s.txt"})
        assert r.status_code == 200 and "hello from the SDK" in str(r.json()), r.text
        assert vol.read_file("/dir/sub/s.txt") == "in-sandbox\n"
        names = sorted(e.path for e in vol.list("/", depth=3))
        assert names == ["/dir", "/dir/sub", "/dir/sub/s.txt", "/from-e2b.txt"]
        info = vol.get_info("/from-e2b.txt")
        assert (info.type.value, info.size) == ("file", len("hello from the SDK"))
        assert vol.exists("/dir") and not vol.exists("/nope")
        with pytest.raises(e2b.VolumePathNotFoundException):
            vol.read_file("/nope")
        with pytest.raises(Exception) as exc:
            e2b.Volume.destroy("shared")                        # in use: refused, nothing removed
        assert sid[:12] in str(exc.value)
        assert vol.read_file("/from-e2b.txt") == "hello from the SDK"
        c.post(f"/sandboxes/{sid}/stop")
    vol.remove("/from-e2b.txt")
    assert not vol.exists("/from-e2b.txt")
    assert e2b.Volume.destroy("shared") is True


def test_another_tenants_key_cannot_see_or_touch_a_volume(monkeypatch, world):
    _as(monkeypatch, world, "alice", content=True)
    vol = e2b.Volume.create("private")
    vol.write_file("/secret", "alice's")
    _as(monkeypatch, world, "bob", content=True)
    assert "private" not in [v.name for v in e2b.Volume.list()]
    with pytest.raises(e2b.VolumeNotFoundException):
        e2b.Volume.get_info("private")
    assert e2b.Volume.destroy("private") is False
    as_bob = e2b.Volume("private", "private", token=world["bob"])
    with pytest.raises(Exception):
        as_bob.read_file("/secret")
    with pytest.raises(Exception):
        as_bob.write_file("/planted", "bob's")
    with _api(world, "bob") as c:                               # nor mount it
        r = c.post("/sandboxes", json={"image": world["image"], "volumes": {"private": "/p"}})
        assert r.status_code == 404, r.text
    _as(monkeypatch, world, "alice", content=True)
    assert vol.read_file("/secret") == "alice's" and not vol.exists("/planted")
    assert e2b.Volume.destroy("private") is True


def test_the_async_volume_api(monkeypatch, world):
    _as(monkeypatch, world, "alice", content=True)

    async def go():
        vol = await e2b.AsyncVolume.create("async-vol")
        await vol.write_file("/f", "async")
        assert await vol.read_file("/f") == "async"
        assert "async-vol" in [v.name for v in await e2b.AsyncVolume.list()]
        assert (await e2b.AsyncVolume.get_info("async-vol")).name == "async-vol"
        assert await e2b.AsyncVolume.destroy("async-vol") is True
        assert await e2b.AsyncVolume.destroy("async-vol") is False
    asyncio.run(go())


def test_sandtrees_own_sdk_over_http_sees_the_same_volumes(monkeypatch, world):
    """The rows reach the remote SDK (REST /api/v1/volumes): what E2B's client made, sandtree's sees."""
    _as(monkeypatch, world, "alice", content=True)
    vol = e2b.Volume.create("both-apis")
    vol.write_file("/from-e2b", "e2b")
    st = sandtree.connect(world["url"], token=world["alice"])
    assert "both-apis" in [v["name"] for v in st.volumes()]
    assert st.read_volume("both-apis", "/from-e2b") == b"e2b"
    st.write_volume("both-apis", "/from-sdk", b"sdk", mode=0o600)
    assert vol.read_file("/from-sdk") == "sdk" and vol.get_info("/from-sdk").mode == 0o600
    sb = st.image(world["image"]).start(volumes=[{"name": "both-apis", "path": "/v", "readonly": True}])
    try:
        assert sb.info()["volumes"] == [{"name": "both-apis", "path": "/v", "readonly": True}]
        assert sb.exec("cat /v/from-e2b /v/from-sdk").stdout == b"e2bsdk"
    finally:
        sb.stop()
    image = st.snapshot_volume("both-apis", tag="vol/both")
    assert st.image("vol/both").id == image.id
    st.remove_volume("both-apis")
    assert "both-apis" not in [v.name for v in e2b.Volume.list()]
    bob = sandtree.connect(world["url"], token=world["bob"])
    with pytest.raises(sandtree.errors.ImageNotFound):
        bob.image("vol/both")


def test_bad_input_gets_e2bs_error_shape_never_a_500(monkeypatch, world):
    _as(monkeypatch, world, "alice", content=True)
    vol = e2b.Volume.create("bad-input")
    try:
        with httpx.Client(base_url=world["url"] + "/e2b", timeout=30, trust_env=False,
                          headers={"X-API-Key": world["alice"], "Authorization": f"Bearer {world['alice']}"}) as c:
            for method, path, params in (("GET", "/volumecontent/bad-input/file", {"path": "/../../etc/passwd"}),
                                         ("GET", "/volumecontent/bad-input/file", {"path": "relative"}),
                                         ("GET", "/volumecontent/bad-input/dir", {"path": "/", "depth": 0}),
                                         ("GET", "/volumecontent/no-such/file", {"path": "/x"}),
                                         ("POST", "/volumes", None), ("GET", "/volumes/a~b", None)):
                r = c.request(method, path, params=params, json={"name": "a/b"} if method == "POST" else None)
                assert 400 <= r.status_code < 500, (path, params, r.status_code, r.text)
                body = r.json()
                assert body["code"] == r.status_code and body["message"], body
        with pytest.raises(e2b.VolumeException):
            vol.read_file("/../../etc/passwd")
    finally:
        e2b.Volume.destroy("bad-input")


def test_sandbox_create_mounts_a_volume(monkeypatch, world):
    """Sandbox.create(volume_mounts={path: volume}) through the control plane: the sandbox sees the volume's
    files there, writes to it through envd's files, and get_info names the mount."""
    _as(monkeypatch, world, "alice", content=True)
    vol = e2b.Volume.create("mounted")
    vol.write_file("/seed.txt", "seeded")
    sb = e2b.Sandbox.create(world["image"], volume_mounts={"/mnt/vol": vol})
    try:
        assert sb.files.read("/mnt/vol/seed.txt") == "seeded"
        sb.files.write("/mnt/vol/from-sandbox.txt", "written inside")
        assert vol.read_file("/from-sandbox.txt") == "written inside"
        assert [(m["name"], m["path"]) for m in sb.get_info().volume_mounts] == [("mounted", "/mnt/vol")]
    finally:
        sb.kill()
    assert e2b.Volume.destroy("mounted") is True
