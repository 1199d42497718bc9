"""Image store: import sources, IDs as filesystem state, fidelity, tags, inspection, fsck and gc."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time

import pytest

from sandtree import BadArchive, ImageNotFound, InvalidInput, PathEscape, PathNotFound


def _tar_bytes(members, fmt=tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for ti, data in members:
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name, data=b"", mode=0o644, uid=0, gid=0, mtime=1_600_000_000):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.uid, ti.gid, ti.mtime = len(data), mode, uid, gid, mtime
    return ti, data


def _special(name, kind, **kw):
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = kw.pop("mode", 0o755)
    ti.mtime = 1_600_000_000
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti, None


def test_import_dir_id_is_state_not_time(st, rootfs, tmp_path):
    a = st.import_image(rootfs)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", rootfs, str(copy)], check=True)
    os.utime(copy / "etc" / "greeting", (1, 1))             # timestamps are not state
    assert st.import_image(str(copy)).id == a.id
    (copy / "etc" / "greeting").write_text("changed\n")
    assert st.import_image(str(copy)).id != a.id
    os.chmod(copy / "etc" / "greeting", 0o600)
    b = st.import_image(str(copy))
    (copy / "etc" / "greeting").chmod(0o644)
    assert st.import_image(str(copy)).id != b.id            # mode is state


def test_import_keeps_first_timestamps(st, rootfs):
    img = st.import_image(rootfs)
    want = os.lstat(os.path.join(rootfs, "etc", "greeting")).st_mtime_ns
    assert img.stat("/etc/greeting")["mtime"] == pytest.approx(want / 1e9)


def test_fidelity_ownership_links_devices_xattrs(st, tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "bin").mkdir()
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", src / "bin" / "busybox")
    for applet in ("sh", "stat", "readlink", "cat"):
        os.symlink("busybox", src / "bin" / applet)
    (src / "d" / "f").write_bytes(b"data")
    os.chown(src / "d" / "f", 1000, 1001)
    os.chmod(src / "d" / "f", 0o4750)
    os.link(src / "d" / "f", src / "hard")
    os.symlink("../d/f", src / "d" / "sym")
    os.mknod(src / "null", 0o20666, os.makedev(1, 3))
    os.mkfifo(src / "fifo")
    os.setxattr(src / "d" / "f", "user.note", b"hi")
    img = st.import_image(str(src))
    f = img.stat("/d/f")
    assert (f["uid"], f["gid"], f["mode"]) == (1000, 1001, "4750")
    assert f["xattrs"] == {"user.note": "hi"}
    assert img.stat("/hard")["hardlink"] == img.stat("/d/f")["hardlink"] == "/d/f"
    assert img.stat("/d/sym")["target"] == "../d/f"
    assert img.stat("/null")["rdev"] == os.makedev(1, 3)
    assert img.stat("/fifo")["type"] == "fifo"
    # hard-link structure is part of the ID
    os.unlink(src / "hard")
    shutil.copy2(src / "d" / "f", src / "hard")
    os.chown(src / "hard", 1000, 1001)
    os.chmod(src / "hard", 0o4750)
    assert st.import_image(str(src)).id != img.id
    # and inside a sandbox, the files are where and what they were
    r = img.run("stat -c '%u %g %a %h' /d/f; readlink /d/sym; cat /hard", disposable=True)
    assert r.stdout.decode().split("\n")[:3] == ["1000 1001 4750 2", "../d/f", "data"]


def test_export_roundtrip_same_id(st, rootfs, tmp_path):
    img = st.import_image(rootfs)
    out = tmp_path / "img.tar"
    img.export(str(out))
    again = st.import_image(str(out))
    assert again.id == img.id


@pytest.mark.parametrize("compress", ["gz", "zst", "none"])
def test_import_compressed_tar(st, rootfs, tmp_path, compress):
    plain = tmp_path / "plain.tar"
    st.import_image(rootfs).export(str(plain))
    if compress == "gz":
        path = tmp_path / "x.tar.gz"
        path.write_bytes(gzip.compress(plain.read_bytes()))
    elif compress == "zst":
        path = tmp_path / "x.tar.zst"
        subprocess.run(["zstd", "-q", str(plain), "-o", str(path)], check=True)
    else:
        path = plain
    assert st.import_image(str(path)).id == st.import_image(rootfs).id


def test_import_progress_reports_bytes(st, rootfs):
    seen = []
    st.import_image(rootfs, progress=seen.append)
    assert sum(seen) >= os.path.getsize(os.path.join(rootfs, "bin", "busybox"))


@pytest.mark.parametrize("name,members,err", [
    ("absolute", [_file("/etc/passwd", b"x")], PathEscape),
    ("dotdot", [_file("a/../../etc/x", b"x")], PathEscape),
    ("symlink-escape", [_special("link", tarfile.SYMTYPE, linkname="/etc"), _file("link/owned", b"x")], PathEscape),
    ("hardlink-escape", [_special("h", tarfile.LNKTYPE, linkname="../../etc/shadow")], PathEscape),
    ("hardlink-missing", [_special("h", tarfile.LNKTYPE, linkname="nope")], BadArchive),
])
def test_bad_tars_rejected_and_store_unchanged(st, tmp_path, name, members, err):
    path = tmp_path / f"{name}.tar"
    path.write_bytes(_tar_bytes(members))
    before = [i.id for i in st.images()]
    with pytest.raises(err):
        st.import_image(str(path))
    assert [i.id for i in st.images()] == before
    assert os.listdir(os.path.join(st.home, "tmp")) == []
    assert not os.path.exists("/etc/owned")


def test_not_a_tar(st, tmp_path):
    p = tmp_path / "junk.tar"
    p.write_bytes(os.urandom(3000))
    with pytest.raises(BadArchive):
        st.import_image(str(p))


def _oci_layout(root, layers: list[bytes], gzip_layers=True):
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> dict:
        d = hashlib.sha256(data).hexdigest()
        (blobs / d).write_bytes(data)
        return {"digest": f"sha256:{d}", "size": len(data)}

    descs = []
    for layer in layers:
        data = gzip.compress(layer) if gzip_layers else layer
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **put(data)})
    config = put(json.dumps({"architecture": "amd64", "os": "linux",
                             "rootfs": {"type": "layers", "diff_ids": []}}).encode())
    manifest = put(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
                               "layers": descs}).encode())
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest}]}))
    return root


LAYER1 = _tar_bytes([_special("etc", tarfile.DIRTYPE), _file("etc/a", b"a"), _file("etc/b", b"b"),
                     _special("opt", tarfile.DIRTYPE), _file("opt/old", b"old")])
LAYER2 = _tar_bytes([_special("etc", tarfile.DIRTYPE), _file("etc/.wh.a", b""),
                     _special("opt", tarfile.DIRTYPE), _file("opt/.wh..wh..opq", b""), _file("opt/new", b"new")])


def test_import_oci_layout_applies_whiteouts(st, tmp_path):
    layout = _oci_layout(tmp_path / "oci", [LAYER1, LAYER2])
    img = st.import_image(str(layout))
    assert [e["name"] for e in img.ls("/etc")] == ["b"]
    assert [e["name"] for e in img.ls("/opt")] == ["new"]
    # the same layout as a tar gives the same image
    tar = tmp_path / "oci.tar"
    with tarfile.open(tar, "w") as t:
        for name in os.listdir(layout):
            t.add(layout / name, arcname=name)
    assert st.import_image(str(tar)).id == img.id


def test_import_oci_rejects_tampered_blob(st, tmp_path):
    layout = _oci_layout(tmp_path / "oci", [LAYER1])
    blob = next(p for p in (layout / "blobs" / "sha256").iterdir() if p.stat().st_size > 200 and b"etc" not in p.read_bytes())
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(BadArchive):
        st.import_image(str(layout))


def test_import_docker_archive(st, tmp_path):
    root = tmp_path / "docker"
    (root / "l1").mkdir(parents=True)
    (root / "l2").mkdir()
    (root / "l1" / "layer.tar").write_bytes(LAYER1)
    (root / "l2" / "layer.tar").write_bytes(LAYER2)
    (root / "manifest.json").write_text(json.dumps([{"Config": "c.json", "RepoTags": ["x:1"],
                                                      "Layers": ["l1/layer.tar", "l2/layer.tar"]}]))
    tar = tmp_path / "docker.tar"
    with tarfile.open(tar, "w") as t:
        for name in ("manifest.json", "l1", "l2"):
            t.add(root / name, arcname=name)
    img = st.import_image(str(tar))
    assert [e["name"] for e in img.ls("/etc")] == ["b"]
    assert img.read("/opt/new") == b"new"


def test_tags_resolve_move_and_history(st, rootfs, tmp_path):
    a = st.import_image(rootfs, tag="team/base:v1")
    assert st.image("team/base:v1") == a
    assert st.image("tag:team/base:v1") == a
    assert st.image(a.id[:10]) == a
    b = a.run("echo x > /x").image
    st.tag(b, "team/base:v1")                              # a tag move is explicit and recorded
    assert st.image("team/base:v1") == b
    hist = st._engine.store.tag_history("team/base:v1")
    assert [(h["old"], h["new"]) for h in hist] == [(None, a.id), (a.id, b.id)]
    st.untag("team/base:v1")
    with pytest.raises(ImageNotFound):
        st.image("team/base:v1")
    with pytest.raises(InvalidInput):
        st.tag(a, "bad tag with spaces")
    with pytest.raises(ImageNotFound):
        st.image("0" * 64)


def test_inspection(bb):
    names = [e["name"] for e in bb.ls("/etc")]
    assert "greeting" in names and "passwd" in names
    assert bb.read("/etc/greeting") == b"hello from the image\n"
    assert bb.read("/etc/greeting", offset=6, limit=4) == b"from"
    assert bb.read("/bin/../etc/greeting") == b"hello from the image\n"
    st = bb.stat("/bin/sh")
    assert st["type"] == "symlink" and st["target"] == "busybox"
    hits = bb.grep("root", "/etc", glob="passwd")
    assert hits and all(h["path"] == "/etc/passwd" for h in hits)
    assert bb.grep("hello", max_matches=1) == [{"path": "/etc/greeting", "line": 1, "text": "hello from the image"}]
    buf = io.BytesIO()
    bb.export(buf, "/etc")
    buf.seek(0)
    with tarfile.open(fileobj=buf) as t:
        assert "greeting" in t.getnames()


def test_inspection_bad_paths(bb):
    with pytest.raises(PathEscape):
        bb.read("/../../etc/passwd")
    with pytest.raises(PathNotFound):
        bb.read("/nope")
    with pytest.raises(InvalidInput):
        bb.read("/etc")
    with pytest.raises(InvalidInput):
        bb.grep("(unclosed")
    escaped = bb.run("ln -s ../../../../etc/hostname /escape; ln -s /etc/greeting /abs").image
    with pytest.raises(PathEscape):
        escaped.read("/escape")
    assert escaped.read("/abs") == b"hello from the image\n"   # absolute links are image-rooted


def test_fsck_and_gc(st, rootfs):
    base = st.import_image(rootfs, tag="keep")
    child = base.run("echo 1 > /one").image
    orphan = st.import_image(rootfs).run("echo 2 > /two; rm /etc/greeting").image
    st.tag(child, "child")
    assert st.fsck()["ok"]
    res = st.gc(retention=0, grace=0)
    assert res["removed_images"] == 1
    ids = {i.id for i in st.images()}
    assert ids == {base.id, child.id} and orphan.id not in ids
    report = st.fsck()
    assert report["ok"], report["problems"]
    assert child.run("cat /one").stdout == b"1\n"


def test_fsck_detects_damage(st, rootfs):
    img = st.import_image(rootfs)
    digest = img.stat("/etc/greeting")["sha256"]
    path = st._engine.store.blobs.path(digest)
    os.chmod(path, 0o644)
    with open(path, "ab") as f:
        f.write(b"tamper")
    report = st.fsck()
    assert not report["ok"]
    assert {"kind": "blob_hash_mismatch", "blob": digest} in report["problems"]


def test_gc_waits_for_runs_in_flight(st, rootfs):
    import threading
    old = st.import_image(rootfs)                     # untagged: gc(retention=0) would take it
    result = {}

    def slow_run():
        result["r"] = old.run("sleep 1; echo made > /made")

    t = threading.Thread(target=slow_run)
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    st.gc(retention=0, grace=0)                       # must wait for the run, not pull its layers away
    waited = time.monotonic() - t0
    t.join()
    assert waited > 0.4
    assert result["r"].exit_code == 0
    assert st.fsck()["ok"]


def test_hard_links_keep_their_owner_on_an_in_place_import(st, tmp_path):
    """A tar's hard link imported in place (scan without a copy): the second name used to read the
    first's already host-shifted ids as sandbox ids (uid 100000 in the tree, nobody on disk)."""
    first, data = _file("etc/a", b"a", uid=7, gid=8)
    link = tarfile.TarInfo("etc/b")
    link.type, link.linkname, link.uid, link.gid = tarfile.LNKTYPE, "etc/a", 7, 8
    (tmp_path / "t.tar").write_bytes(_tar_bytes([_special("etc", tarfile.DIRTYPE), (first, data), (link, None)]))
    img = st.import_image(str(tmp_path / "t.tar"))
    assert [(img.stat(p)["uid"], img.stat(p)["gid"]) for p in ("/etc/a", "/etc/b")] == [(7, 8), (7, 8)]
    assert img.stat("/etc/b")["hardlink"] == "/etc/a"
