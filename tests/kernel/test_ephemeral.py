"""Ephemeral images (store/ephemeral.py): run(..., disposable="ephemeral") keeps the state the run
ended in as a short-lived, unlisted image; disposable=True still keeps nothing; gc drops an
ephemeral image after its TTL unless something keeps it. Real runs on a real store."""

from __future__ import annotations

import time

import pytest

import sandtree
from sandtree.store import maintenance

HOUR = 3600


@pytest.fixture
def base(st, rootfs):
    return st.import_image(rootfs, tag="base")


def listed(st) -> set[str]:
    return {i["id"] for i in st._engine.images()}


def test_ephemeral_run_keeps_its_end_state_unlisted(st, base):
    before = listed(st)
    rec = st._engine.run(base.id, "echo one > /f", disposable="ephemeral")
    assert rec.image and rec.image != base.id and rec.exit_code == 0
    assert listed(st) == before                              # unlisted
    assert st._engine.read(rec.image, "/f") == b"one\n"      # but usable: read, run from it
    nxt = st._engine.run(rec.image, "cat /f; echo two >> /f", disposable="ephemeral")
    assert nxt.stdout == b"one\n" and st._engine.read(nxt.image, "/f") == b"one\ntwo\n"
    same = st._engine.run(nxt.image, "true", disposable="ephemeral")
    assert same.image == nxt.image                           # no change: the same image (stable UUID)
    assert st._engine.operation(rec.op)["result"] == rec.image
    # disposable=True: still nothing kept, no commit
    none = st._engine.run(base.id, "echo x > /g", disposable=True)
    assert none.image is None
    # tagging lists it; a kept run reaching the same image makes it ordinary
    st._engine.tag(rec.image, "kept")
    assert rec.image in listed(st)
    st._engine.untag("kept")
    assert rec.image not in listed(st)
    again = st._engine.run(base.id, "echo one > /f")        # same content as rec.image
    if again.image == rec.image:                            # (mtimes may differ: then another image)
        assert rec.image in listed(st)


def test_bad_disposable_is_refused_before_anything_runs(st, base):
    ops = st._engine.operations.list()
    for bad in ("keep", 1.5, "EPHEMERAL"):
        with pytest.raises(sandtree.InvalidInput):
            st._engine.run(base.id, "touch /x", disposable=bad)
    assert st._engine.operations.list() == ops


def test_gc_drops_ephemeral_images_after_their_ttl_unless_kept(st, base):
    e = st._engine
    gone = e.run(base.id, "echo a > /a", disposable="ephemeral").image
    tagged = e.run(base.id, "echo b > /b", disposable="ephemeral").image
    e.tag(tagged, "t")
    parent = e.run(base.id, "echo c > /c", disposable="ephemeral").image
    child = e.run(parent, "echo d > /d").image                # a kept child keeps its ephemeral parent
    kept = e.run(base.id, "echo k > /k").image                # an ordinary untagged image
    used = e.run(base.id, "echo u > /u", disposable="ephemeral").image
    now = time.time()
    # within the TTL: nothing goes
    assert maintenance.gc(e.store, now=now + HOUR / 2)["removed_images"] == 0
    # a run from `used` within the TTL (as of two hours on) keeps it
    e.run(used, "true", disposable=True)
    ops = e.store.db.query("SELECT id FROM operations WHERE source=?", (used,))
    with e.store.db.tx() as con:                              # as if it ran 1.5 hours from now
        con.execute("UPDATE operations SET started=? WHERE id=?", (now + 1.5 * HOUR, ops[-1][0]))
    out = maintenance.gc(e.store, now=now + 2 * HOUR, grace=0)
    assert out["removed_images"] == 1
    ids = {r[0] for r in e.store.db.query("SELECT id FROM images")}
    assert gone not in ids and {tagged, parent, child, kept, used, base.id} <= ids
    with pytest.raises(sandtree.NotFound):
        e.read(gone, "/a")
    assert e.store.db.query("SELECT image FROM ephemeral_images WHERE image=?", (gone,)) == []
    assert maintenance.fsck(e.store)["ok"]
    # an ordinary untagged image keeps its retention (a week)
    maintenance.gc(e.store, now=now + 3 * HOUR, grace=0)
    assert kept in {r[0] for r in e.store.db.query("SELECT id FROM images")}


def test_uploads_and_operations_by_kind(st, base):
    """Two engine operations the Contree adapter needed: uploads() and operations.list(kind=)."""
    e = st._engine
    first = e.upload(b"first")
    second = e.upload(b"second")
    listed = [u["sha256"] for u in e.uploads()]
    assert set(listed) >= {first, second} and e.uploads(limit=1, offset=0)[0]["size"] in (5, 6)
    for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}, {"limit": "5"}):
        with pytest.raises(sandtree.InvalidInput):
            e.uploads(**bad)
    e.run(base.id, "true")
    assert [o["kind"] for o in e.operations.list(kind="import")] == ["import"]
    assert [o["kind"] for o in e.operations.list()] == ["run"]
    with pytest.raises(sandtree.InvalidInput):
        e.operations.list(kind="no such; kind")
