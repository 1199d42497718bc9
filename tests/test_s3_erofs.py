"""Layers as EROFS images (issue 20's cold start, store/erofs.py): a big layer is uploaded as a tar
and as a filesystem image; a node with an empty cache downloads the image and mounts it at
layers/<id> (no file created), only once its sha256 and size matched. Real SeaweedFS on loopback
(tests/s3server.py), real mounts; the session's leak check sees that none is left behind."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import sandtree
from sandtree import StoreCorrupt
from sandtree.store import erofs
from sandtree.store.maintenance import fsck, gc

from conftest import TIER, make_rootfs
from test_s3store import SRC, fixed, node

pytestmark = pytest.mark.skipif(not (erofs.can_build() and erofs.can_mount(os.geteuid() != 0)),
                                reason="needs root, mkfs.erofs (scripts/install-deps) and file-backed "
                                       "EROFS mounts (Linux >= 6.12)")


@pytest.fixture
def bucket(s3_server):
    return f"s3://{s3_server.new_bucket()}/store"


def big_rootfs(path: str, extra: int = 0) -> str:
    """A busybox rootfs with more files than erofs.MIN_FILES: its layer gets an image."""
    root = make_rootfs(path)
    os.makedirs(os.path.join(root, "usr", "share", "many"))
    for i in range(erofs.MIN_FILES):
        with open(os.path.join(root, "usr", "share", "many", f"f{i}"), "w") as f:
            f.write(f"file {i}\n")
    os.makedirs(os.path.join(root, "opt", "dir"))
    with open(os.path.join(root, "opt", "dir", "old"), "w") as f:
        f.write("old\n")
    if extra:
        with open(os.path.join(root, "big"), "wb") as f:
            f.write(os.urandom(extra))
    return root


# A second big layer holding what overlay's lower dirs carry: whiteouts (a deleted file), an opaque
# dir (replaced), xattrs, other owners, setuid, a fifo, exact mtimes.
CHANGES = ("rm /usr/share/many/f5 && rm -r /opt/dir && mkdir /opt/dir && echo new > /opt/dir/new && "
           "mkdir /w && for i in $(seq 1 1100); do echo $i > /w/g$i; done && "
           "setfattr -n user.k -v v /w/g1 2>/dev/null; chown 1000:1000 /w/g2 && chmod 4755 /w/g3 && "
           "mkfifo /w/fifo && touch -d @1000000000 /w/g4")
READ = ("cat /usr/share/many/f999 /opt/dir/new; ls /opt/dir; test -e /usr/share/many/f5 || echo gone; "
        "stat -c '%u %a %Y' /w/g2 /w/g3 /w/g4; test -p /w/fifo && echo fifo; ls /w | wc -l")


def mounted_under(home) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(home) + "/")]


def test_big_layers_fetched_as_images_same_as_tars(tmp_path, bucket):
    db = f"sqlite:///{tmp_path}/shared.db"
    a = node(tmp_path / "a", db, bucket)
    local = sandtree.Sandtree(str(tmp_path / "local"), tier=TIER["current"], warm=0)
    b = node(tmp_path / "b", db, bucket)
    c = node(tmp_path / "c", db, bucket)
    try:
        root = big_rootfs(str(tmp_path / "root"))
        base = a.import_image(root)
        assert local.import_image(root).id == base.id
        img = base.run(CHANGES).image
        store_a = a.engine.store
        layers = store_a.image(img.id).layers
        rows = store_a.db.query("SELECT layer, erofs_sha256, erofs_size FROM layer_objects")
        assert len(layers) == 2 and all(r[1] and r[2] for r in rows)
        keys = {k for k, _, _ in store_a.objects.keys("layers/")}
        assert keys == {f"layers/{x}.{ext}" for x in layers for ext in ("tar", "erofs")}
        small = a.image(img.id).run("echo small > /s").image      # a small layer: its tar alone
        (small_layer,) = set(store_a.image(small.id).layers) - set(layers)
        assert store_a.db.one("SELECT erofs_sha256 FROM layer_objects WHERE layer=?", (small_layer,)) == (None,)
        # node B mounts both images (no file unpacked), node C (told it cannot) unpacks the tars
        c.engine.store.cache.mount_images = False
        out_b = b.image(img.id).run(READ)
        out_c = c.image(img.id).run(READ)
        store_b = b.engine.store
        assert out_b.exit_code == 0 and out_b.stdout == out_c.stdout, (out_b.stdout, out_c.stdout)
        for want in (b"file 999\nnew\nnew\ngone\n1000 644 ", b"0 4755 ", b"0 644 1000000000\nfifo\n1101\n"):
            assert want in out_b.stdout, out_b.stdout
        for layer in layers:
            assert erofs.is_mounted(store_b.layers.path(layer))
            assert not erofs.is_mounted(c.engine.store.layers.path(layer))
        assert "download+unpack" not in store_b.cache.timings and store_b.cache.fetched == 2
        # every file as packed: fsck packs each mounted layer again and matches the uploader's tar
        report = fsck(store_b)
        assert report["ok"], report["problems"]
        # the same run gives the same image on every node and on a single-machine store
        assert len({n.image(img.id).run(fixed("one")).image.id for n in (a, b, c)}) == 1
        assert len({n.image(base.id).run(fixed("two")).image.id for n in (local, b, c)}) == 1
        # B reads files and commits on top of the mounted layers
        r = b.image(img.id).run("cat /w/g1 > /w/copy && rm /w/g7")
        assert a.image(r.image.id).run("cat /w/copy; test -e /w/g7 || echo gone").stdout == b"1\ngone\n"
        assert b.read(img.id, "/usr/share/many/f3") == b"file 3\n"
    finally:
        a.close(), b.close(), c.close(), local.close()
    assert mounted_under(tmp_path) == []                          # closed: unmounted
