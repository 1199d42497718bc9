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


def settled(fn):
    """fn()'s first non-empty answer: a run's sandbox (its overlay names the layer) may still be
    exiting when the run has returned, and eviction skips a layer some overlay uses."""
    for _ in range(200):
        out = fn()
        if out:
            return out
        time.sleep(0.05)
    return fn()


def mounted_under(home) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(home) + "/")]


def test_big_layers_fetched_as_images_same_as_tars(tmp_path, pg_cluster, bucket):
    db = pg_cluster.new_database()                               # (the other tests: SQLite)
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
        assert b.image(img.id).read("/usr/share/many/f3") == b"file 3\n"
        assert {"path": "/usr/share/many/f5"}.items() <= next(
            d for d in b.diff(base.id, img.id) if d["path"] == "/usr/share/many/f5").items()
    finally:
        a.close(), b.close(), c.close(), local.close()
    assert mounted_under(tmp_path) == []                          # closed: unmounted


def _image_object(store, layer):
    objects = store.objects
    return objects.client.get_object(Bucket=objects.bucket, Key=f"{objects.prefix}layers/{layer}.erofs")["Body"].read()


@pytest.fixture
def pair(tmp_path, bucket):
    """Node A imported a big image; node B (same database and bucket) never saw it."""
    db = f"sqlite:///{tmp_path}/shared.db"
    a = node(tmp_path / "a", db, bucket)
    b = node(tmp_path / "b", db, bucket)
    try:
        img = a.import_image(big_rootfs(str(tmp_path / "root")))
        (layer,) = b.engine.store.image(img.id).layers
        yield a, b, img, layer
    finally:
        a.close(), b.close()
    assert mounted_under(tmp_path) == []


@pytest.mark.parametrize("damage", ["bit", "truncated"])
def test_damaged_image_refused_never_mounted(tmp_path, pair, damage):
    a, b, img, layer = pair
    store = b.engine.store
    good = _image_object(a.engine.store, layer)
    bad = bytearray(good)
    if damage == "bit":
        bad[len(bad) // 2] ^= 1                               # one bit, same size
    else:
        del bad[len(bad) // 2:]
    a.engine.store.objects.put_bytes(f"layers/{layer}.erofs", bytes(bad))
    before = b.images()
    with pytest.raises(StoreCorrupt):
        b.image(img.id).run("true")
    assert mounted_under(tmp_path) == []                      # never mounted
    assert store.layers.all() == [] and store.cache.images.names() == []
    assert os.listdir(store.layers.tmp) == [] and b.images() == before
    if damage == "truncated":                                 # fsck sees the object's size
        assert {"kind": "layer_image_object_mismatch", "layer": layer} in fsck(a.engine.store)["problems"]
    a.engine.store.objects.put_bytes(f"layers/{layer}.erofs", good)           # repaired: B runs it
    assert b.image(img.id).run("cat /usr/share/many/f1").stdout == b"file 1\n"
    assert erofs.is_mounted(store.layers.path(layer))


def test_evict_gc_release_and_remount(tmp_path, pair):
    a, b, img, layer = pair
    store = b.engine.store
    path = store.layers.path(layer)
    live = b.image(img.id).start()                            # a live sandbox's lower: kept
    try:
        assert erofs.is_mounted(path)
        assert store.cache.evict(0) == [] and store.cache.release_mounts() == []
        assert live.exec("cat /usr/share/many/f2").stdout == b"file 2\n"
    finally:
        live.stop()
    # nothing uses it: released (unmounted, image kept), then mounted again on use, hashed first
    assert settled(store.cache.release_mounts) == [layer]
    assert not os.path.exists(path) and os.path.exists(store.cache.images.path(layer))
    assert [x for _, x, _ in store.cache.entries()] == [layer]
    stamp = os.stat(os.path.join(store.cache.images.root, f"{layer}.ok")).st_mtime_ns
    assert b.image(img.id).run("cat /usr/share/many/f3").stdout == b"file 3\n"
    assert erofs.is_mounted(path) and store.cache.fetched == 1
    # (unchanged since its check, this boot: not hashed again, so not stamped again)
    assert os.stat(os.path.join(store.cache.images.root, f"{layer}.ok")).st_mtime_ns == stamp
    # an image whose bytes changed on disk is never mounted again: fetched anew
    assert settled(store.cache.release_mounts) == [layer]
    with open(store.cache.images.path(layer), "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * 16)
    assert store.cache.check() == [{"kind": "cached_layer_image_mismatch", "layer": layer}]
    assert b.image(img.id).run("true").exit_code == 0 and store.cache.fetched == 2
    # eviction unmounts, then deletes the image
    assert settled(lambda: store.cache.evict(0)) == [layer]
    assert mounted_under(tmp_path / "b") == [] and not os.path.exists(path)
    assert store.cache.images.names() == [] and store.cache.entries() == []
    assert fsck(store)["ok"]
    # gc: the unused layer's image object goes with its tar, and the local image with its mount
    assert b.image(img.id).run("true").exit_code == 0
    gc(a.engine.store, retention=0, grace=0, ephemeral_ttl=0, now=time.time() + 5)
    assert list(a.engine.store.objects.keys("layers/")) == []
    gc(store, retention=0, grace=0, ephemeral_ttl=0, now=time.time() + 5)
    assert mounted_under(tmp_path) == [] and store.cache.images.names() == []
    assert store.layers.all() == []


FETCH = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import sandtree
    st = sandtree.Sandtree(sys.argv[2], database=sys.argv[3], objects=sys.argv[4], warm=0)
    store = st.engine.store
    with store.using():
        store.ensure_layers(store.image(sys.argv[5]).layers)
    print("fetched", flush=True)
    sys.stdin.read()                                             # killed here (kill -9): its mount stays
""")


def test_kill9_mid_fetch_and_after_mount(tmp_path, bucket):
    db = f"sqlite:///{tmp_path}/shared.db"
    a = node(tmp_path / "a", db, bucket)
    home = str(tmp_path / "b")
    try:
        img = a.import_image(big_rootfs(str(tmp_path / "root"), extra=160 << 20))
        (layer,) = a.engine.store.image(img.id).layers
        args = [sys.executable, "-c", FETCH, SRC, home, db, bucket, img.id]
        # killed while the image downloads: nothing mounted, nothing kept but a dead process's tmp file
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        seen = False
        while time.time() < deadline and proc.poll() is None and not seen:
            seen = any(os.path.getsize(p) > 0 for p in glob.glob(os.path.join(home, "tmp", "erofs-*")))
            time.sleep(0.01)
        assert seen, proc.stderr.read().decode()[-500:] if proc.poll() is not None else "never downloading"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert mounted_under(tmp_path) == []
        # killed after its mount: the mount stays (the host's namespace) and is reused
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout.readline() == b"fetched\n", proc.stderr.read().decode()[-500:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert mounted_under(tmp_path) == [os.path.join(home, "layers", layer)]
        b = node(home, db, bucket)
        try:
            assert glob.glob(os.path.join(home, "tmp", "*")) == []   # the dead processes' downloads went
            assert b.image(img.id).run("cat /usr/share/many/f4").stdout == b"file 4\n"
            assert b.engine.store.cache.fetched == 0                   # the mount it found
            assert mounted_under(tmp_path) == [os.path.join(home, "layers", layer)]
            assert fsck(b.engine.store)["ok"]
        finally:
            b.close()
    finally:
        a.close()
    assert mounted_under(tmp_path) == []


def test_warm_helper_born_before_a_mount_is_not_used(tmp_path, bucket):
    """Warm helpers keep the mount namespace they were born with: one started before a layer
    was mounted would see its empty mount point; it is discarded and the run starts cold."""
    db = f"sqlite:///{tmp_path}/shared.db"
    a = node(tmp_path / "a", db, bucket)
    b = sandtree.Sandtree(str(tmp_path / "b"), tier="namespaces", database=db, objects=bucket, warm=2)
    try:
        small = a.import_image(make_rootfs(str(tmp_path / "small")))
        img = a.import_image(big_rootfs(str(tmp_path / "root")))
        assert b.image(small.id).run("true").exit_code == 0        # starts the warm pool
        rt = b.engine.tier("namespaces")
        deadline = time.time() + 60
        while (rt._pool is None or len(rt._pool.ready) < 2) and time.time() < deadline:
            time.sleep(0.05)
        assert rt._pool is not None and len(rt._pool.ready) == 2  # born before the big layer's mount
        # (without the check, the first of these took one and found no /bin/sh: an empty lower)
        for _ in range(3):
            assert b.image(img.id).run("cat /usr/share/many/f5").stdout == b"file 5\n"
        assert b.image(small.id).run("cat /etc/greeting").stdout == b"hello from the image\n"
    finally:
        a.close(), b.close()
    assert mounted_under(tmp_path) == []


def test_gvisor_tier_and_hibernate_on_mounted_layers(pair):
    """The other readers of a layer dir: gVisor's runsc (its gofer opens the host overlay's files)
    and CRIU (a live sandbox hibernated, then resumed on its image's mounted layers)."""
    a, b, img, layer = pair
    try:
        gvisor = b.engine.tier("gvisor").available()[0]
    except sandtree.RuntimeUnavailable:
        gvisor = False                                           # (runsc not installed: CRIU only)
    if gvisor:
        r = b.image(img.id).run("cat /usr/share/many/f8 && echo g > /g", tier="gvisor")
        assert r.stdout == b"file 8\n" and erofs.is_mounted(b.engine.store.layers.path(layer))
        assert a.image(r.image.id).run("cat /g").stdout == b"g\n"
    ok, why = b._engine.sandboxes.live.hibernate_available()
    if not ok:
        pytest.skip(why)
    sb = b.image(img.id).start(idle_timeout=300, lifetime=600)
    try:
        assert sb.exec("echo kept > /k").ok
        assert sb.hibernate()["state"] == "hibernated"
        assert sb.resume()["state"] == "running"
        assert sb.exec("cat /k /usr/share/many/f9").stdout == b"kept\nfile 9\n"
    finally:
        sb.stop()
