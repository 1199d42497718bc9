"""Objects in S3 and a node's layer cache (issue 20 items 1-2, 5): a real S3 server on loopback
(SeaweedFS, tests/s3server.py), a real PostgreSQL (tests/pgcluster.py), real runs. Two store
directories on one database and one bucket are two nodes of one store."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import sandtree
from sandtree import StoreCorrupt
from sandtree.runtime.reaper import reaper
from sandtree.store.maintenance import fsck, gc

from conftest import TIER, make_rootfs

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")


@pytest.fixture
def bucket(s3_server):
    return f"s3://{s3_server.new_bucket()}/store"


def node(path, database, objects, **kw):
    return sandtree.Sandtree(str(path), tier=TIER["current"], database=database, objects=objects, warm=0, **kw)


def fixed(text: str) -> str:
    """A run whose result does not depend on when it ran (fixed mtimes): equal IDs on any store."""
    return f"mkdir -p /w && echo {text} > /w/f && touch -d @1000000000 /w/f /w /"


def test_two_nodes_one_store(tmp_path, pg_cluster, bucket, rootfs):
    db = pg_cluster.new_database()
    a = node(tmp_path / "a", db, bucket)
    b = node(tmp_path / "b", db, bucket)
    local = sandtree.Sandtree(str(tmp_path / "local"), tier=TIER["current"], warm=0)
    try:
        img = a.import_image(rootfs, tag="bb")
        assert local.import_image(rootfs).id == img.id            # one ID whatever the backend
        r_local = local.image(img.id).run(fixed("one"))
        # node B: never saw the image; its layers come from S3 once, then from its cache
        cache_b = b.engine.store.cache
        r1 = b.image("bb").run("cat /etc/greeting")
        assert r1.exit_code == 0 and r1.stdout == b"hello from the image\n"
        assert cache_b.fetched == len(img.engine_row().layers if hasattr(img, "engine_row") else
                                      b.engine.store.image(img.id).layers)
        r2 = b.image("bb").run(fixed("one"))
        assert cache_b.fetched == 1 and r2.exit_code == 0
        assert r2.image.id == r_local.image.id                    # the same run, the same ID
        # B's result is A's to read: its layer is fetched by A from S3
        r3 = a.image(r2.image.id).run("cat /w/f")
        assert r3.stdout == b"one\n"
        assert a.engine.store.cache.fetched == 1
        assert fsck(a.engine.store)["ok"] and fsck(b.engine.store)["ok"]
    finally:
        a.close(), b.close(), local.close()


def test_corrupt_layer_object_refused(tmp_path, s3_server, bucket, rootfs):
    db = f"sqlite:///{tmp_path}/shared.db"
    a = node(tmp_path / "a", db, bucket)
    b = node(tmp_path / "b", db, bucket)
    try:
        img = a.import_image(rootfs, tag="bb")
        (layer,) = b.engine.store.image(img.id).layers
        objects = a.engine.store.objects
        good = objects.client.get_object(Bucket=objects.bucket, Key=f"{objects.prefix}layers/{layer}.tar")["Body"].read()
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 1                                   # one bit, same size
        objects.put_bytes(f"layers/{layer}.tar", bytes(bad))
        images_before = b.images()
        with pytest.raises(StoreCorrupt) as e:
            b.image("bb").run("true")
        assert "sha256" in str(e.value)
        assert b.engine.store.layers.all() == []                  # nothing of it was kept
        assert os.listdir(b.engine.store.layers.tmp) == []
        assert b.images() == images_before
        objects.put_bytes(f"layers/{layer}.tar", good)            # repaired: B runs it
        assert b.image("bb").run("cat /etc/greeting").exit_code == 0
    finally:
        a.close(), b.close()


def test_cache_eviction_lru_never_pinned_or_mounted(tmp_path, bucket):
    db = f"sqlite:///{tmp_path}/shared.db"
    a = node(tmp_path / "a", db, bucket)
    imgs = []
    for i in range(3):
        root = make_rootfs(str(tmp_path / f"root{i}"))
        with open(os.path.join(root, "etc", "greeting"), "w") as f:
            f.write(f"image {i}\n")
        imgs.append(a.import_image(root))
    one = a.engine.store.cache.entries()[0][2]                    # bytes of one layer
    b = node(tmp_path / "b", db, bucket, cache_max=int(one * 2.5))
    try:
        store = b.engine.store
        layer = [store.image(i.id).layers[0] for i in imgs]
        live = b.image(imgs[0].id).start()                        # mounted for as long as it lives
        try:
            cached = lambda: sorted(x for _, x, _ in store.cache.entries())
            for i in (1, 2):
                assert b.image(imgs[i].id).run("cat /etc/greeting").stdout == f"image {i}\n".encode()
                # a run returns while its sandbox still tears its mount namespace down (reaper.py),
                # its overlay (on this layer) still mounted: evictable once that ended
                reaper.drain()
            # over the cap: the least recently used one goes, never the mounted one (older)
            assert cached() == sorted([layer[0], layer[2]])
            b.image(imgs[1].id).run("true")
            reaper.drain()
            assert cached() == sorted([layer[0], layer[1]]) and store.cache.fetched == 4
            assert store.cache.evict(0) == [layer[1]]
            assert cached() == [layer[0]]
            assert live.exec("cat /etc/greeting").stdout == b"image 0\n"
        finally:
            live.stop()
        # pinned by an operation in progress: kept; after it ends: evictable
        with store.using():
            store.ensure_layers([layer[2]])
            assert store.cache.evict(0) == [layer[0]]
            assert os.path.isdir(store.layers.path(layer[2]))
        assert store.cache.evict(0) == [layer[2]]
        assert store.layers.all() == []
        # the markers survive a restart: a new engine on the same directory knows its cache
        assert b.image(imgs[2].id).run("cat /etc/greeting").exit_code == 0
        b.close()
        b = node(tmp_path / "b", db, bucket, cache_max=0)
        assert [x for _, x, _ in b.engine.store.cache.entries()] == [layer[2]]
        report = fsck(b.engine.store)
        assert report["ok"], report["problems"]
    finally:
        b.close(), a.close()


def test_gc_removes_unreferenced_objects(tmp_path, bucket, rootfs):
    a = node(tmp_path / "a", None, bucket)
    try:
        img = a.import_image(rootfs)
        r = img.run("echo x > /x")
        store = a.engine.store
        keys = lambda: sorted(k for k, _, _ in store.objects.keys("layers/"))
        assert len(keys()) == 2
        a.tag(img, "keep")
        out = gc(store, retention=0, grace=0, ephemeral_ttl=0, now=time.time() + 5)
        assert out["removed_images"] == 1 and out["removed_objects"] == 1
        assert keys() == [f"layers/{store.image(img.id).layers[0]}.tar"]
        assert store.db.query("SELECT count(*) FROM layer_objects")[0][0] == 1
        assert not store.has_image(r.image.id)
        assert fsck(store)["ok"]
    finally:
        a.close()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_gc_on_one_node_waits_for_a_run_on_another(tmp_path, bucket, rootfs, database, request):
    """gc's fence spans the store's database, not one store directory: a gc on node A while a run
    on node B builds on an image gc would collect waits for that run; the run's result (kept, and
    with it its parent) survives whole, and a third node with an empty cache runs it. (With the
    lock in each store directory, A's gc deleted the parent's layer object under B's run.)"""
    db = (request.getfixturevalue("pg_cluster").new_database() if database == "postgresql"
          else f"sqlite:///{tmp_path}/shared.db")
    a, b, c = (node(tmp_path / n, db, bucket) for n in "abc")
    try:
        parent = a.import_image(rootfs)                            # untagged: collectable when old
        created = a.engine.store.image(parent.id).created
        began, out = threading.Event(), {}

        def run():
            out["run"] = b.image(parent.id).run("echo began; sleep 2; echo child > /child",
                                                on_output=lambda s, chunk: began.set())
        t = threading.Thread(target=run)
        t.start()
        try:
            assert began.wait(60), "the run on node B did not start"
            # as if an hour had passed since the import: the parent is past the retention, while
            # its child (committed at least 2 s after it) is not
            out["gc"] = gc(a.engine.store, retention=3600, grace=0, ephemeral_ttl=3600, now=created + 3601)
        finally:
            t.join(120)
        child = out["run"]
        assert child.exit_code == 0 and child.image is not None
        assert out["gc"]["removed_images"] == 0 and out["gc"]["removed_objects"] == 0, out["gc"]
        assert c.image(child.image.id).run("cat /child").stdout == b"child\n"
        assert c.engine.store.cache.fetched == len(c.engine.store.image(child.image.id).layers)
        assert fsck(c.engine.store)["ok"]
    finally:
        a.close(), b.close(), c.close()


KILLED_IMPORT = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import sandtree
    st = sandtree.Sandtree(sys.argv[2], objects=sys.argv[3], warm=0)
    st.import_image(sys.argv[4], tag="big")
""")


def test_kill9_mid_upload_leaves_nothing_visible(tmp_path, s3_server, bucket):
    root = make_rootfs(str(tmp_path / "root"))
    with open(os.path.join(root, "big"), "wb") as f:
        f.write(os.urandom(160 << 20))                           # a multipart upload: several requests
    home = str(tmp_path / "home")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_IMPORT, SRC, home, bucket, root],
                            env={**os.environ}, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    packed = False
    while time.time() < deadline and proc.poll() is None:
        packs = glob.glob(os.path.join(home, "tmp", "pack-*"))
        if packs and os.path.getsize(packs[0]) > 160 << 20:
            packed = True
            time.sleep(0.3)                                      # the upload is under way
            break
        time.sleep(0.05)
    assert packed, proc.stderr.read().decode()[-500:] if proc.poll() is not None else "never packed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    st = node(home, None, bucket)
    try:
        assert st.images() == [] and st.tags() == {}
        assert st.engine.store.db.query("SELECT count(*) FROM layer_objects")[0][0] == 0
        assert fsck(st.engine.store)["ok"]
        assert glob.glob(os.path.join(home, "tmp", "*")) == []   # the dead process's staging went
        gc(st.engine.store, grace=0, now=time.time() + 5)
        assert list(st.engine.store.objects.keys()) == []
    finally:
        st.close()


def test_layers_fetched_at_once_and_unpacked_while_downloading(tmp_path, bucket):
    """An image of several layers, new to node B: each fetched once (several at a time, each
    unpacked while it streams) into exactly the bytes node A packed; a wrong-sized object is refused
    after the stream, with nothing kept."""
    from sandtree.store import layerpack
    from sandtree.store.layercache import _Null
    from sandtree.store.layerpack import HashingWriter
    db = f"sqlite:///{tmp_path}/shared.db"
    a = node(tmp_path / "a", db, bucket)
    b = node(tmp_path / "b", db, bucket)
    try:
        root = make_rootfs(str(tmp_path / "root"))
        for i in range(300):                                    # more files than the writers' batch
            with open(os.path.join(root, "etc", f"f{i}"), "wb") as f:
                f.write(os.urandom(i * 37))
        with open(os.path.join(root, "etc", "big"), "wb") as f:    # written inline (over HANDOFF_MAX)
            f.write(os.urandom(layerpack.HANDOFF_MAX + 4097))
        img = a.import_image(root)
        img = img.run("mkdir -p /w && echo two > /w/two && setfattr -n user.k -v v /w/two 2>/dev/null; true").image
        img = img.run("echo three > /w/three && rm /etc/f7 && ln -s /w/two /w/link").image
        layers = b.engine.store.image(img.id).layers
        assert len(layers) == 3
        out = b.image(img.id).run("cat /w/two /w/three; readlink /w/link; test -e /etc/f7 || echo gone; "
                                  "wc -c < /etc/f299; wc -c < /etc/big")
        assert out.stdout.split() == [b"two", b"three", b"/w/two", b"gone", str(299 * 37).encode(),
                                      str(layerpack.HANDOFF_MAX + 4097).encode()], out.stdout
        assert b.engine.store.cache.fetched == 3
        rows = dict(b.engine.store.db.query("SELECT layer, sha256 FROM layer_objects"))
        for layer in layers:                                    # packed again: the same bytes as A's
            w = HashingWriter(_Null())
            layerpack.pack(b.engine.store.layers.path(layer), w, b.engine.store.idmap)
            assert w.h.hexdigest() == rows[layer]
        # an object one byte longer than its row: refused once streamed, nothing left behind
        objects = a.engine.store.objects
        top = layers[-1]
        good = objects.client.get_object(Bucket=objects.bucket, Key=f"{objects.prefix}layers/{top}.tar")["Body"].read()
        objects.put_bytes(f"layers/{top}.tar", good + b"\0")
        c = node(tmp_path / "c", db, bucket)
        try:
            with pytest.raises(StoreCorrupt):
                c.image(img.id).run("true")
            assert top not in c.engine.store.layers.all()
            assert os.listdir(c.engine.store.layers.tmp) == []
        finally:
            objects.put_bytes(f"layers/{top}.tar", good)
            c.close()
    finally:
        a.close(), b.close()
