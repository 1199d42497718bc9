"""A power cut loses no image whose ID was returned, and leaves the store consistent (store/durable.py).

The store lives on ext4 on a loop device (tests/powercut.py); right after a burst of operations
returns, or a random fraction of a second later, the loop's backing file is copied: the disk as
a power cut at that moment leaves it. The copy is e2fsck'd, mounted, opened as a store: every
image ID told so far reads back byte for byte, every upload too, and `sandtree fsck` (with
content hashes) is clean. Before the store synced anything, every told image of a burst was
unreadable in such a copy (its files zeros, or its row gone).
"""

from __future__ import annotations

import os
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import powercut
import sandtree
from sandtree.engine.core import Engine
from sandtree.store.imageconfig import ImageConfig
from sandtree.store.maintenance import fsck, gc

BURST = 8           # committing runs at once, per trial


def _payload(tag: str) -> bytes:
    return f"{tag}\n".encode() + os.urandom(48 << 10)      # not zeros: a lost page shows


def _burst(engine: Engine, base: str, trial: int, told: dict) -> list[str]:
    """BURST committing runs on `base`, each writing a file of its own; their images."""
    def one(i):
        data = _payload(f"run {trial}.{i}")
        rec = engine.run(base, ["sh", "-c", f"cat > /root/data-{i}"], stdin=data)
        assert rec.exit_code == 0, rec.stderr
        return rec.image, {f"/root/data-{i}": data}

    with ThreadPoolExecutor(5) as pool:
        results = list(pool.map(one, range(BURST)))
    for image, files in results:
        told[image] = files
    return [image for image, _ in results]


def _operations(engine: Engine, base: str, trial: int, work: str, told: dict, uploads: dict) -> None:
    """One of every other path that returns an ID: import, merge, edit (configure), upload."""
    images = _burst(engine, base, trial, told)
    src = os.path.join(work, f"import-{trial}")
    os.makedirs(os.path.join(src, "etc"))
    data = _payload(f"import {trial}")
    with open(os.path.join(src, "etc", "imported"), "wb") as f:
        f.write(data)
    told[engine.import_path(src)] = {"/etc/imported": data}
    merged = engine.merge(base, images[0], images[1])["image"]
    told[merged] = {**told[images[0]], **told[images[1]]}
    configured = engine.configure(images[2], ImageConfig(env={"TRIAL": str(trial)}))
    told[configured] = dict(told[images[2]])
    blob = _payload(f"upload {trial}")
    uploads[engine.upload(blob)] = blob
    # a layer of names only (a symlink, a directory, a whiteout): no file's fsync carries it
    rec = engine.run(base, ["sh", "-c", f"ln -s /etc/greeting /root/link-{trial}; mkdir /root/dir-{trial}; "
                                        "rm /etc/group"])
    assert rec.exit_code == 0, rec.stderr
    told[rec.image] = {f"/root/link-{trial}": None, f"/root/dir-{trial}": None}


# ext4 keeps its free block/inode summaries out of the journal (they are recounted at mount):
# after any unclean stop e2fsck "fixes" them. Anything else it fixes is damage.
_SUMMARIES = re.compile(r"^(Free (blocks|inodes) count wrong|Directories count wrong for group)")


def _damage(out: str) -> list[str]:
    """What e2fsck repaired, but for the summary counts."""
    lines = out.splitlines()
    return [prev for prev, line in zip(lines, lines[1:]) if line.startswith("Fix? ") and not _SUMMARIES.match(prev)]


def _check_cut(disk: powercut.Disk, told: dict, uploads: dict, when: str, durability: str) -> None:
    """strict: every told ID reads back. relaxed: the last ones may be gone, but an image the
    store still has reads back whole. Both: e2fsck and the store's fsck (content hashes) clean."""
    with disk.after(disk.cut()) as (rc, out, mnt):
        assert rc in (0, 1) and not _damage(out), f"e2fsck after a cut {when} after the operations: {rc}\n{out}"
        after = Engine(os.path.join(mnt, "store"), warm=0)
        try:
            lost, kept = {}, 0
            for image, files in told.items():
                if durability == "relaxed" and not after.store.has_image(image):
                    continue                     # lost whole: what relaxed allows
                kept += 1
                try:
                    after.store.ensure_layers(after.store.image(image).layers)     # what a run mounts
                except Exception as exc:         # noqa: BLE001 - said below
                    lost[image[:12]] = f"{type(exc).__name__}: {exc}"
                    continue
                for path, data in files.items():
                    try:
                        # (None: a name only, a symlink or a directory)
                        got = after.read(image, path) if data is not None else after.stat(image, path) and None
                    except Exception as exc:     # noqa: BLE001 - what is lost is said below
                        got = f"{type(exc).__name__}: {exc}"
                    if got != data:
                        lost[image[:12]] = (path, got[:40] if isinstance(got, bytes) else got)
            for digest, data in uploads.items():
                try:
                    got = after.download(digest)
                except Exception as exc:         # noqa: BLE001
                    got = f"{type(exc).__name__}: {exc}"
                if got != data:
                    lost[f"upload {digest[:12]}"] = got[:40] if isinstance(got, bytes) else got
            assert not lost, (f"{durability}: {len(lost)} of {len(told) + len(uploads)} told IDs lost or damaged "
                              f"by a power cut {when} after they were returned: {dict(list(lost.items())[:5])}")
            report = fsck(after.store)
            assert report["ok"], f"{durability}: fsck after a cut {when} later: {report['problems'][:5]}"
            if durability == "strict":
                assert kept == len(told)
        finally:
            after.close()



def _disk_or_skip(tmp_path) -> "powercut.Disk":
    """A loop-mounted ext4 whose unflushed writes a copy drops, or a skip saying why there is none."""
    why = powercut.available()
    if why:
        pytest.skip(f"no power-cut simulation here: {why}")
    try:
        return powercut.Disk(str(tmp_path))
    except powercut.Unavailable as exc:
        pytest.skip(str(exc))

@pytest.mark.parametrize("durability,trials", [("strict", 3), ("relaxed", 2)])
def test_power_cut_loses_no_told_image_and_leaves_the_store_consistent(tmp_path, rootfs, durability, trials):
    """strict (the default): no told image lost. relaxed: the store consistent all the same."""
    disk = _disk_or_skip(tmp_path)
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    delays = [0.0] + [rnd.uniform(0, 0.5) for _ in range(trials)]
    told: dict[str, dict[str, bytes]] = {}
    uploads: dict[str, bytes] = {}
    try:
        engine = Engine(os.path.join(disk.mnt, "store"), warm=0, durability=durability)
        try:
            base = engine.import_path(rootfs)
            with open(os.path.join(rootfs, "etc", "greeting"), "rb") as f:
                told[base] = {"/etc/greeting": f.read()}
            for trial, delay in enumerate(delays):
                _operations(engine, base, trial, str(tmp_path), told, uploads)
                if durability == "relaxed" and trial % 2:
                    # the WAL synced after those commits by someone else (a checkpoint, gc's
                    # durable transaction): their rows reach the disk; their bytes must be there
                    with engine.store.db.tx(durable=True) as con:
                        con.execute("INSERT OR REPLACE INTO meta VALUES('powercut-test', ?)", (str(trial),))
                time.sleep(delay)
                _check_cut(disk, told, uploads, f"{delay:.2f} s (seed {seed})", durability)
        finally:
            engine.close()
    finally:
        disk.close()


def test_power_cut_after_gc_in_a_relaxed_store_leaves_no_row_naming_a_removed_layer(tmp_path, rootfs):
    """gc removes a layer's files after the transaction that deletes its rows: in a relaxed store
    (SQLite commits not synced) that transaction is synced all the same, or a power cut could
    keep the rows of an image whose layer the disk no longer has."""
    disk = _disk_or_skip(tmp_path)
    try:
        engine = Engine(os.path.join(disk.mnt, "store"), warm=0, durability="relaxed")
        try:
            base = engine.import_path(rootfs, tag="base")
            doomed = engine.run(base, ["sh", "-c", "echo doomed > /root/f"]).image
            with engine.store.db.tx(durable=True) as con:       # its row on the disk (a checkpoint)
                con.execute("INSERT OR REPLACE INTO meta VALUES('powercut-test', '1')")
            layer = engine.store.image(doomed).layers[0]
            assert gc(engine.store, retention=0, grace=0)["removed_layers"] >= 1
            assert not os.path.exists(engine.store.layers.path(layer))
            # a later commit syncs its own files: the journal takes the layer's removal with it
            kept = engine.run(base, ["sh", "-c", "echo kept > /root/g"]).image
            engine.store.tag(kept, "kept")
            with disk.after(disk.cut()) as (rc, out, mnt):
                assert rc in (0, 1) and not _damage(out), out
                after = Engine(os.path.join(mnt, "store"), warm=0)
                try:
                    report = fsck(after.store)
                    assert report["ok"], report["problems"][:5]
                finally:
                    after.close()
        finally:
            engine.close()
    finally:
        disk.close()


def test_durability_levels_sync_sqlite_commits_and_a_bad_one_is_refused(tmp_path, monkeypatch):
    """strict (the default): every write transaction's commit is flushed (GroupSync) before tx()
    returns; relaxed: only a durable=True one. A transaction that wrote nothing flushes nothing.
    An unknown level is InvalidInput and makes no store. (What a flush buys: the power-cut tests.)"""
    from sandtree.errors import InvalidInput
    from sandtree.store.layers import IdMap
    from sandtree.store.store import Store

    def writes(db, n, **kw):
        before = db.group.synced
        for i in range(n):
            with db.tx(**kw) as con:
                con.execute("INSERT OR REPLACE INTO meta VALUES('t', ?)", (str(i),))
        with db.tx(**kw) as con:
            con.execute("SELECT 1 FROM meta").fetchall()
        return db.group.synced - before

    idmap = IdMap(100000, 100000, 65536)
    strict = Store(str(tmp_path / "strict"), idmap)
    assert strict.durability == "strict" and writes(strict.db, 3) == 3
    strict.close()
    monkeypatch.setenv("SANDTREE_DURABILITY", "relaxed")
    relaxed = Store(str(tmp_path / "relaxed"), idmap)
    assert relaxed.durability == "relaxed" and writes(relaxed.db, 3) == 0
    assert writes(relaxed.db, 2, durable=True) == 2
    relaxed.close()
    with pytest.raises(InvalidInput):
        Store(str(tmp_path / "bad"), idmap, durability="fast")
    assert not os.path.exists(tmp_path / "bad")


def test_group_sync_flushes_once_for_commits_that_wait_together(tmp_path):
    """Threads committing while a flush runs share the next one: fewer flushes than commits, and
    all of them counted flushed."""
    from sandtree.store.db import Database

    db = Database(str(tmp_path / "g.db"))
    flushes = []
    real = db.group._flush

    def slow_flush():
        flushes.append(db.group.committed)
        time.sleep(0.05)                       # a slow disk: commits pile up behind it
        real()
    db.group._flush = slow_flush

    def commit(i):
        with db.tx() as con:
            con.execute("INSERT OR REPLACE INTO meta VALUES(?, '1')", (f"k{i}",))
        return db.group.synced

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(commit, range(32)))
    assert db.group.synced == 32 and len(flushes) < 32
    db.close()


def test_a_disk_that_fails_a_flush_stops_the_store_taking_writes(tmp_path, rootfs):
    """A flush of the database that fails after its COMMIT (EIO: the disk) cannot be undone nor
    retried (Linux marks the lost pages clean, so a second fsync says nothing): the image of that
    commit is returned, the failure logged, and the store takes no write after it (StoreUnavailable,
    nothing changed) until it is checked and opened again. The failing disk is simulated (the flush
    raises EIO): no device here can be made to fail a flush on demand."""
    import errno
    from sandtree.errors import StoreUnavailable

    home = str(tmp_path / "home")
    st = sandtree.Sandtree(home, warm=0)
    try:
        first = st.import_image(rootfs)
        group = st.engine.store.db.group

        def failing():
            raise OSError(errno.EIO, "Input/output error")
        group._flush = failing
        told = first.run("echo a > /a")             # committed; its flush failed: logged, told
        assert told.image is not None
        images = len(st.images())
        with pytest.raises(StoreUnavailable) as exc:
            first.run("echo b > /b")
        assert "failed to flush" in str(exc.value)
        with pytest.raises(StoreUnavailable):
            st.import_image(rootfs)
        assert len(st.images()) == images           # reads still answer; nothing was written
    finally:
        st.close()
    st = sandtree.Sandtree(home, warm=0)          # opened again (after the disk was checked): writes
    try:
        assert st.image(told.image.id).run("cat /a").stdout == b"a\n"
    finally:
        st.close()
