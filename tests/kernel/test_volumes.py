"""Volumes (engine/volumes.py, runtime/volumes.py): named persistent directories of a tenant, mounted into live
sandboxes at start. Real kernel: each tenant's volumes are an ext4 filesystem on a loop device, bound into the
sandbox's own mount namespace. What must hold: a volume written by one sandbox is read by another started
later; two sandboxes share one at once; read-only is read-only; a write past the tenant's quota fails inside
the sandbox with ENOSPC and loses nothing already written; deleting a volume in use is refused (naming the
sandboxes); a commit leaves the volume out and says so; a snapshot makes an image of its files; tenants see
only their own; bad paths are refused before anything starts; nothing (mounts, loop devices) outlives it."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

import sandtree
from sandtree.errors import Conflict, Forbidden, InvalidInput, LimitExceeded, NotFound
from sandtree.tenancy.tenant import Tenant

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="volumes are loop-mounted ext4: root only")


def _mounts_under(path: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if path in line]


def _loops_of(path: str) -> list[str]:
    """Loop devices still attached to files under `path`, once the kernel's deferred autoclear had its
    chance (a loop device is released after its last mount goes, asynchronously)."""
    for _ in range(50):
        out = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
        left = [line for line in out.splitlines() if path in line]
        if not left:
            return []
        time.sleep(0.1)
    return left


@pytest.fixture
def eng(tmp_path, rootfs):
    """An engine of its own (its volumes' filesystems are its store's); every sandbox stopped and the
    host's volume mounts gone at the end, and no loop device left on its files."""
    st = sandtree.Sandtree(str(tmp_path / "home"), warm=0)
    e = st._engine
    e.test_image = e.import_path(rootfs)
    e.share(e.test_image)                   # the tenants of the tenancy test start it too
    try:
        yield e
    finally:
        for s in e.sandbox_list():
            e.sandbox_stop(s["id"])
        st.close()
        home = str(tmp_path / "home")
        assert not _mounts_under(home) and not _mounts_under(e.volumes.mount_root), _mounts_under(e.volumes.mount_root)
        assert not _loops_of(home), _loops_of(home)
        assert not os.path.exists(e.volumes.mount_root)


def sh(e, sid: str, script: str):
    return e.sandbox_exec(sid, ["/bin/sh", "-c", script])


def test_a_volume_outlives_the_sandbox_that_wrote_it(eng):
    eng.volume_create("data")
    a = eng.sandbox_start(eng.test_image, volumes={"data": "/mnt/data"})
    assert a["volumes"] == [{"name": "data", "path": "/mnt/data", "readonly": False}]
    assert sh(eng, a["id"], "echo kept > /mnt/data/note && mkdir /mnt/data/d && echo x > /mnt/data/d/y").exit_code == 0
    eng.sandbox_stop(a["id"])
    b = eng.sandbox_start(eng.test_image, volumes=[{"name": "data", "path": "/work"}])
    r = sh(eng, b["id"], "cat /work/note /work/d/y; stat -c %u /work/note")
    assert r.exit_code == 0 and r.stdout == b"kept\nx\n0\n", r
    assert eng.volume_info("data")["used_by"] == [b["id"]]


def test_two_sandboxes_share_one_at_once(eng):
    eng.volume_create("shared")
    a = eng.sandbox_start(eng.test_image, volumes={"shared": "/s"})
    b = eng.sandbox_start(eng.test_image, volumes={"shared": "/t"})
    assert sh(eng, a["id"], "echo from-a > /s/a").exit_code == 0
    assert sh(eng, b["id"], "cat /t/a && echo from-b > /t/b").stdout == b"from-a\n"
    assert sh(eng, a["id"], "cat /s/b").stdout == b"from-b\n"
    assert sorted(eng.volume_info("shared")["used_by"]) == sorted([a["id"], b["id"]])


def test_read_only_is_read_only(eng):
    eng.volume_create("ro")
    w = eng.sandbox_start(eng.test_image, volumes={"ro": "/v"})
    assert sh(eng, w["id"], "echo seed > /v/f").exit_code == 0
    r = eng.sandbox_start(eng.test_image, volumes={"ro": "/v:ro"})
    assert r["volumes"][0]["readonly"] is True
    out = sh(eng, r["id"], "cat /v/f; echo no > /v/f; echo $?; rm /v/f; mkdir /v/new; "
                           "mount -o remount,rw /v; echo x > /v/g; cat /v/f")
    assert out.stdout.startswith(b"seed\n1\n") and out.stdout.endswith(b"seed\n"), out
    assert b"Read-only file system" in out.stderr, out.stderr
    assert sh(eng, w["id"], "ls /v").stdout == b"f\n"          # nothing came through


def test_a_write_past_the_quota_fails_and_keeps_what_was_written(eng):
    eng.tenancy.set_limits("q", max_volumes=24 << 20)
    t = eng.as_tenant(Tenant("q", token="t-q", limits=eng.tenancy.limits("q")))
    t.volume_create("small")
    s = t.sandbox_start(eng.test_image, volumes={"small": "/v"})
    assert sh(eng, s["id"], "dd if=/dev/urandom of=/v/first bs=1M count=8 2>/dev/null && md5sum /v/first "
                             "> /tmp/sum && sync").exit_code == 0
    r = sh(eng, s["id"], "dd if=/dev/zero of=/v/second bs=1M count=64")
    assert r.exit_code != 0 and b"No space left on device" in r.stderr, r
    check = sh(eng, s["id"], "md5sum -c /tmp/sum && rm /v/second && echo again > /v/third && cat /v/third")
    assert check.exit_code == 0 and check.stdout.endswith(b"again\n"), check
    info = t.volume_info("small")
    assert info["quota"]["size"] <= 24 << 20 and info["bytes"] >= 8 << 20


def test_deleting_a_volume_in_use_is_refused_naming_the_sandboxes(eng):
    eng.volume_create("busy")
    s = eng.sandbox_start(eng.test_image, volumes={"busy": "/b"})
    sh(eng, s["id"], "echo x > /b/x")
    with pytest.raises(Conflict) as exc:
        eng.volume_delete("busy")
    assert s["id"][:12] in str(exc.value) and exc.value.details["sandboxes"] == [s["id"]]
    assert sh(eng, s["id"], "cat /b/x").stdout == b"x\n"      # nothing was removed
    eng.sandbox_stop(s["id"])
    eng.volume_delete("busy")
    assert eng.volume_list() == []
    with pytest.raises(NotFound):
        eng.volume_info("busy")
    with pytest.raises(NotFound):
        eng.sandbox_start(eng.test_image, volumes={"busy": "/b"})


def test_commit_leaves_the_volume_out_and_says_so(eng):
    eng.volume_create("out")
    s = eng.sandbox_start(eng.test_image, volumes={"out": "/mnt/deep/out"})
    assert sh(eng, s["id"], "echo secret > /mnt/deep/out/f && echo mine > /root/own").exit_code == 0
    image = eng.sandbox_commit(s["id"])
    assert eng.read(image, "/root/own") == b"mine\n"
    names = {e.name for e in eng.ls(image, "/")}
    assert "mnt" not in names                                   # not its files, nor the mount points made for it
    op = next(o for o in eng.produced_by(image) if o["kind"] == "commit")
    assert "volumes left out: /mnt/deep/out" in op["command"]
    rec = eng.operations.get(op["op"])
    assert rec["spec"]["volumes_left_out"] == [{"name": "out", "path": "/mnt/deep/out", "readonly": False}]
    with pytest.raises(Conflict):
        eng.sandbox_hibernate(s["id"])                           # a checkpoint cannot hold a volume


def test_a_snapshot_is_an_image_of_the_volumes_files(eng):
    eng.volume_create("snap")
    s = eng.sandbox_start(eng.test_image, volumes={"snap": "/v"})
    assert sh(eng, s["id"], "mkdir /v/dir && echo hello > /v/dir/file && ln -s / /v/escape && "
                             "chown 1000:1000 /v/dir/file").exit_code == 0
    image = eng.volume_snapshot("snap", tag="vol/snap")
    assert eng.resolve("vol/snap") == image
    assert eng.read(image, "/dir/file") == b"hello\n"
    entries = {e.name: e for e in eng.ls(image, "/dir")}
    assert (entries["file"].uid, entries["file"].gid) == (1000, 1000)   # the sandbox's ids, not the host's
    link = {e.name: e for e in eng.ls(image, "/")}["escape"]
    assert link.kind == "l"                                    # a link is kept as a link, never followed
    op = eng.produced_by(image)[0]
    assert op["kind"] == "volume snapshot" and "snapshot of volume snap" in op["command"]


def test_tenants_see_only_their_own_volumes(eng):
    alice = eng.as_tenant(Tenant("alice", token="t-alice"))
    bob = eng.as_tenant(Tenant("bob", token="t-bob"))
    alice.volume_create("data")
    bob.volume_create("data")                                  # names are per tenant
    a = alice.sandbox_start(eng.test_image, volumes={"data": "/d"})
    sh(eng, a["id"], "echo alice > /d/who")
    b = bob.sandbox_start(eng.test_image, volumes={"data": "/d"})
    assert sh(eng, b["id"], "ls /d").stdout == b""            # bob's own, empty
    assert [v["name"] for v in alice.volume_list()] == ["data"]
    assert [v["name"] for v in bob.volume_list()] == ["data"]
    assert eng.volume_list() == []                             # the operator's own set
    alice.volume_create("private")
    with pytest.raises(NotFound):
        bob.volume_info("private")
    with pytest.raises(NotFound):
        bob.volume_delete("private")
    with pytest.raises(NotFound):
        bob.volume_snapshot("private")
    with pytest.raises(NotFound):
        bob.sandbox_start(eng.test_image, volumes={"private": "/p"})
    with pytest.raises(InvalidInput):
        bob.sandbox_start(eng.test_image, volumes={"alice~private": "/p"})
    with pytest.raises(Conflict):
        alice.volume_delete("data")                            # hers is in use
    img = alice.volume_snapshot("data")
    with pytest.raises(Exception):
        bob.image_info(img)                                    # her snapshot is hers
    assert alice.read(img, "/who") == b"alice\n"


@pytest.mark.parametrize("path", ["relative", "/a/../b", "/a/./b", "/a//b", "/", "/proc", "/proc/x", "/dev",
                                  "/dev/shm/v", "/sys/fs", ""])
def test_bad_paths_are_refused_before_anything_starts(eng, path):
    eng.volume_create("v")
    before = len(eng.sandbox_list(all=True))
    with pytest.raises(InvalidInput):
        eng.sandbox_start(eng.test_image, volumes=[{"name": "v", "path": path}])
    assert len(eng.sandbox_list(all=True)) == before


def test_bad_names_and_shapes_are_refused(eng):
    for name in ("", "a/b", "..", "-lead", "a" * 64, 3, "x~"):
        with pytest.raises(InvalidInput):
            eng.volume_create(name)
    eng.volume_create("v")
    with pytest.raises(Conflict):
        eng.volume_create("v")
    for bad in ("v", ["v"], [{"name": "v"}], [{"name": "v", "path": "/a", "readonly": "yes"}],
                [{"name": "v", "path": "/a"}, {"name": "v", "path": "/a/b"}]):
        with pytest.raises(InvalidInput):
            eng.sandbox_start(eng.test_image, volumes=bad)
    with pytest.raises(InvalidInput):
        eng.sandbox_start(eng.test_image, volumes={"v": "/a"}, idle_action="hibernate")


def test_no_device_or_setuid_file_is_usable_through_a_volume(eng):
    eng.volume_create("dev")
    s = eng.sandbox_start(eng.test_image, volumes={"dev": "/v"})
    sh(eng, s["id"], "mknod /v/mem c 1 1; cp /bin/busybox /v/suid && chmod 4755 /v/suid")
    info = [line for line in open(f"/proc/{_init_pid(eng, s['id'])}/mountinfo") if " /v " in line]
    assert info and "nodev" in info[0] and "nosuid" in info[0], info
    d = eng.volumes.directory("dev")
    assert not os.path.exists(os.path.join(d, "mem"))          # a userns cannot mknod a device
    host = [line for line in open("/proc/self/mountinfo") if eng.volumes.mount_root in line]
    assert host and all("nodev" in line and "nosuid" in line for line in host), host


def _init_pid(eng, sid: str) -> int:
    return eng.sandboxes._row(sid)["handle"].init_pid


def test_both_tiers_share_a_volume(eng):
    """A namespaces sandbox and a gVisor one mount the same volume at once (gVisor: a bind of runsc's OCI
    spec); each sees the other's writes, read-only holds on gVisor too, and a gVisor commit leaves it out."""
    if not {r["tier"]: r for r in eng.doctor()}["gvisor"]["available"]:
        pytest.skip("gVisor is not available here")
    eng.volume_create("both")
    ns = eng.sandbox_start(eng.test_image, volumes={"both": "/v"})
    gv = eng.sandbox_start(eng.test_image, volumes={"both": "/mnt/v"}, tier="gvisor")
    ro = eng.sandbox_start(eng.test_image, volumes={"both": "/r:ro"}, tier="gvisor")
    assert gv["tier"] == "gvisor"
    assert sh(eng, ns["id"], "echo from-ns > /v/ns").exit_code == 0
    assert sh(eng, gv["id"], "cat /mnt/v/ns && echo from-gvisor > /mnt/v/gv").stdout == b"from-ns\n"
    assert sh(eng, ns["id"], "cat /v/gv").stdout == b"from-gvisor\n"
    r = sh(eng, ro["id"], "cat /r/gv; echo x > /r/x")
    assert r.stdout == b"from-gvisor\n" and r.exit_code != 0, r
    assert sh(eng, gv["id"], "echo own > /root/own").exit_code == 0
    image = eng.sandbox_commit(gv["id"])
    assert eng.read(image, "/root/own") == b"own\n"
    assert "mnt" not in {e.name for e in eng.ls(image, "/")}
    with pytest.raises(Conflict):
        eng.volume_delete("both")


def test_a_volumes_files_from_outside_any_sandbox(eng):
    eng.volume_create("files")
    eng.volume_write("files", "/a/b/c.txt", b"hello", mode=0o640, uid=1000, gid=1000)
    assert eng.volume_read("files", "/a/b/c.txt") == b"hello"
    st = eng.volume_stat("files", "/a/b/c.txt")
    assert (st["type"], st["size"], st["mode"], st["uid"], st["gid"]) == ("file", 5, 0o640, 1000, 1000)
    eng.volume_mkdir("files", "/m/n")
    assert [e["path"] for e in eng.volume_ls("files", "/", depth=3)] == ["/a", "/m", "/a/b", "/m/n", "/a/b/c.txt"]
    s = eng.sandbox_start(eng.test_image, volumes={"files": "/v"})
    assert sh(eng, s["id"], "cat /v/a/b/c.txt; stat -c '%u %a' /v/a/b/c.txt; ln -s / /v/root; "
                            "ln -s /etc/passwd /v/pw").stdout == b"hello1000 640\n"
    assert eng.volume_stat("files", "/root")["target"] == "/"
    assert [e["name"] for e in eng.volume_ls("files", "/root")] == ["a", "m", "pw", "root"]   # the volume's own /
    with pytest.raises(NotFound):
        eng.volume_read("files", "/pw")                       # /etc/passwd inside the volume: there is none
    eng.volume_remove("files", "/a/b/c.txt")
    with pytest.raises(NotFound):
        eng.volume_read("files", "/a/b/c.txt")
    for bad in ("relative", "/a/../../etc/passwd"):
        with pytest.raises(InvalidInput):
            eng.volume_read("files", bad)


def test_a_write_from_outside_past_the_quota_is_refused(eng):
    eng.tenancy.set_limits("w", max_volumes=16 << 20)
    t = eng.as_tenant(Tenant("w", token="t-w", limits=eng.tenancy.limits("w")))
    t.volume_create("full")
    t.volume_write("full", "/keep", b"k" * 1000)
    with pytest.raises(LimitExceeded):
        t.volume_write("full", "/big", b"x" * (32 << 20))
    assert t.volume_read("full", "/keep") == b"k" * 1000
    assert [e["name"] for e in t.volume_ls("full")] == ["keep"]


def test_the_cli_verbs_and_no_mount_outlives_a_command(cli, tmp_path, rootfs):
    from sandtree.engine.volumes import MOUNT_BASE
    import hashlib
    mounted_at = os.path.join(MOUNT_BASE, hashlib.sha256(os.path.realpath(str(tmp_path / "home")).encode())
                              .hexdigest()[:16])
    cli("volume", "create", "data")
    cli("volume", "put", "data", "/in.txt", "-", input=b"from stdin\n")
    assert cli("volume", "cat", "data", "/in.txt").stdout == b"from stdin\n"
    assert b"in.txt" in cli("volume", "ls", "data").stdout
    image = cli("image", "import", rootfs, "-q").stdout.decode().strip()
    sid = cli("start", image, "--volume", "data=/data:ro").stdout.decode().strip()
    try:
        r = cli("exec", sid, "--", "cat /data/in.txt; touch /data/x", check=False)
        assert b"from stdin" in r.stdout and r.returncode != 0
        assert b"live sandbox" in cli("volume", "rm", "data", check=False).stderr
    finally:
        cli("stop", sid)
    cli("volume", "rm", "data")
    assert b"data" not in cli("volume", "list").stdout
    assert not _mounts_under(mounted_at)                    # each command's own mount went with it
    assert not _loops_of(str(tmp_path / "home"))


def test_several_volumes_and_a_path_that_is_a_file(eng):
    eng.volume_create("one")
    eng.volume_create("two")
    s = eng.sandbox_start(eng.test_image, volumes=[{"name": "one", "path": "/a/one"},
                                                  {"name": "two", "path": "/b", "readonly": True}])
    assert sh(eng, s["id"], "echo 1 > /a/one/f && ! touch /b/f").exit_code == 0
    before = len(eng.sandbox_list())
    with pytest.raises(InvalidInput):
        eng.sandbox_start(eng.test_image, volumes={"one": "/etc/greeting"})    # a file of the image
    assert len(eng.sandbox_list()) == before                                    # the half-started one is gone


@pytest.mark.parametrize("tier", ["namespaces", "gvisor"])
def test_a_sandboxs_file_calls_on_a_volume_path_reach_the_volume(eng, tier):
    """sandbox_read/write/ls/exists/mkdir/remove on a path under a volume go to the volume (what the
    sandbox sees, on both tiers), never to the mount point in its upper; read-only is not written."""
    if tier == "gvisor" and not {r["tier"]: r for r in eng.doctor()}["gvisor"]["available"]:
        pytest.skip("gVisor is not available here")
    eng.volume_create("files")
    s = eng.sandbox_start(eng.test_image, volumes=[{"name": "files", "path": "/w"},
                                                  {"name": "files", "path": "/r", "readonly": True}], tier=tier)
    eng.sandbox_write(s["id"], "/w/sub/host.txt", b"from the host", uid=1000, gid=1000)
    assert sh(eng, s["id"], "cat /w/sub/host.txt; stat -c %u /w/sub/host.txt").stdout == b"from the host1000\n"
    assert eng.volume_read("files", "/sub/host.txt") == b"from the host"
    sh(eng, s["id"], "echo inside > /w/inside.txt")
    assert eng.sandbox_read(s["id"], "/r/inside.txt") == b"inside\n"
    assert [e["name"] for e in eng.sandbox_ls(s["id"], "/w")] == ["inside.txt", "sub"]
    assert eng.sandbox_exists(s["id"], "/w/sub") and not eng.sandbox_exists(s["id"], "/w/nope")
    eng.sandbox_mkdir(s["id"], "/w/made/deep")
    assert sh(eng, s["id"], "test -d /w/made/deep").exit_code == 0
    with pytest.raises(Forbidden):
        eng.sandbox_write(s["id"], "/r/x", b"no")
    with pytest.raises(Forbidden):
        eng.sandbox_remove(s["id"], "/r/inside.txt")
    eng.sandbox_remove(s["id"], "/w/inside.txt")
    assert sh(eng, s["id"], "ls /w").stdout == b"made\nsub\n"
    image = eng.sandbox_commit(s["id"])
    assert not {"w", "r"} & {e.name for e in eng.ls(image, "/")}     # none of it in the upper
