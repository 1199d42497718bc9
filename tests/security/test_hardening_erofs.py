"""Attacks on a mounted EROFS layer (store/erofs.py) from root inside a sandbox whose lower it is:
nothing it does reaches the image or the mount the host shares with other sandboxes, and the
mount is read-only, nosuid, nodev."""

from __future__ import annotations

import os

import pytest

from sandtree.store import erofs
from sandtree.store.blobs import hash_file

from conftest import TIERS, tier_or_skip
from test_s3_erofs import bucket, mounted_under, pair  # noqa: F401 - fixtures

pytestmark = pytest.mark.skipif(not (erofs.can_build() and erofs.can_mount(os.geteuid() != 0)),
                                reason="needs root, mkfs.erofs and file-backed EROFS mounts")

ATTACK = ("echo changed > /usr/share/many/f1; rm /usr/share/many/f2; chmod 4777 /usr/share/many/f3; "
          "mv /usr/share/many/f4 /f4; ln -sf /etc/passwd /usr/share/many/f6; "
          "mount -o remount,rw / 2>/dev/null; mount -o remount,rw /usr 2>/dev/null; "
          "cat /usr/share/many/f1")


@pytest.mark.parametrize("tier", TIERS)
def test_sandbox_root_cannot_change_a_mounted_layer(request, tmp_path, pair, tier):  # noqa: F811
    a, b, img, layer = pair
    tier_or_skip(request, b, tier)
    store = b.engine.store
    row = store.db.one("SELECT erofs_sha256, erofs_size FROM layer_objects WHERE layer=?", (layer,))
    r = b.image(img.id).run(ATTACK, tier=tier)
    assert r.stdout == b"changed\n"                         # (its own upper: the run sees its change)
    path = store.layers.path(layer)
    assert erofs.is_mounted(path)
    with open(os.path.join(path, "usr", "share", "many", "f1")) as f:
        assert f.read() == "file 1\n"
    for name in ("f2", "f4"):
        assert os.path.exists(os.path.join(path, "usr", "share", "many", name))
    assert oct(os.stat(os.path.join(path, "usr", "share", "many", "f3")).st_mode & 0o7777) == "0o644"
    assert not os.path.islink(os.path.join(path, "usr", "share", "many", "f6"))
    assert hash_file(store.cache.images.path(layer)) == tuple(row)
    with open("/proc/self/mountinfo") as f:
        [opts] = [line.split()[5] for line in f if line.split()[4] == path]
    assert {"ro", "nosuid", "nodev"} <= set(opts.split(","))
    # another sandbox on the same layer sees it as it was
    assert b.image(img.id).run("cat /usr/share/many/f1; ls /usr/share/many | wc -l", tier=tier).stdout == \
        f"file 1\n{erofs.MIN_FILES}\n".encode()
