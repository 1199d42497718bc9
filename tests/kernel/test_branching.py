"""Branching: diff, three-way merge, branches with compare-and-swap, rollback, lineage, bundles."""

from __future__ import annotations

import os
import threading
import xml.etree.ElementTree as ET

import pytest

import sandtree
from sandtree import Conflict, InvalidInput, MergeConflict, best_of


@pytest.fixture
def base(st, rootfs):
    img = st.import_image(rootfs)
    return img.run("printf 'a\\nb\\nc\\nd\\ne\\n' > /f.txt; mkdir -p /d; echo keep > /d/k; "
                   "head -c 100 /dev/urandom > /bin.dat").image


def test_diff_self_empty_and_inverse(base):
    assert base.diff(base) == []
    other = base.run("echo new > /n; rm /d/k; sed -i s/c/C/ /f.txt; chmod 600 /f.txt; rm -rf /d; "
                     "echo file > /d").image
    fwd, back = base.diff(other), other.diff(base)
    swap = {"added": "removed", "removed": "added"}
    assert sorted((c["path"], swap.get(c["kind"], c["kind"])) for c in fwd) == \
        sorted((c["path"], c["kind"]) for c in back)
    kinds = {c["path"]: c["kind"] for c in fwd}
    assert kinds == {"/n": "added", "/f.txt": "modified", "/d": "type_changed", "/d/k": "removed"}
    patch = base.patch(other)
    assert "-c\n+C\n" in patch and "+++ b/n" in patch


def test_diff_names_binary_and_metadata(base):
    other = base.run("head -c 100 /dev/urandom > /bin.dat; chown 1000 /d/k").image
    kinds = {c["path"]: c["kind"] for c in base.diff(other)}
    assert kinds == {"/bin.dat": "modified", "/d/k": "metadata_changed"}
    assert "Binary files a/bin.dat and b/bin.dat differ" in base.patch(other)


def test_diff_cost_follows_changes(st, base):
    big = base.run("for i in $(seq 40); do mkdir -p /many/$i; for j in $(seq 25); do echo $j > /many/$i/$j; "
                   "done; done").image
    changed = big.run("echo changed > /many/7/3").image
    store = st._engine.store
    store._trees.clear()
    calls = []
    orig = store.tree
    store.tree = lambda h: calls.append(h) or orig(h)
    try:
        assert [c["path"] for c in big.diff(changed)] == ["/many/7/3"]
    finally:
        store.tree = orig
    assert len(calls) <= 8          # root, /many, /many/7 on each side: not the 40 dirs


def test_merge_equals_both_changes_in_one_run(st, base):
    ours = base.run("sed -i 's/^a$/A/' /f.txt; echo o > /o").image
    theirs = base.run("sed -i 's/^e$/E/' /f.txt; rm /d/k").image
    both = base.run("sed -i 's/^a$/A/' /f.txt; echo o > /o; sed -i 's/^e$/E/' /f.txt; rm /d/k").image
    m = st.merge(base, ours, theirs)
    assert m.ok and m.conflicts == [] and m.image == both
    assert {ours, theirs} <= set(m.image.parents())             # (base too: it made `both`)
    assert st.merge(None, ours, theirs).image == both             # base found from lineage
    r = m.image.run("cat /f.txt; ls /d")
    assert r.stdout == b"A\nb\nc\nd\nE\n"
    assert st.fsck()["ok"]


def test_merge_conflicts_change_nothing_unless_strategy(st, base):
    ours = base.run("echo X > /f.txt; echo 1 > /d/k").image
    theirs = base.run("echo Y > /f.txt; rm -rf /d").image
    images_before = {i.id for i in st.images()}
    blobs_before = set(st._engine.store.blobs.files())
    # conflicts raise (issue 12 item 17: a result with image None was the bug), or come back if asked
    with pytest.raises(MergeConflict) as raised:
        st.merge(base, ours, theirs)
    want = {("/f.txt", "content"), ("/d/k", "modify/delete")}
    assert {(c["path"], c["kind"]) for c in raised.value.details["conflicts"]} == want
    m = st.merge(base, ours, theirs, on_conflict="return")
    assert m.image is None
    assert {(c["path"], c["kind"]) for c in m.conflicts} == want
    assert {i.id for i in st.images()} == images_before
    assert set(st._engine.store.blobs.files()) == blobs_before
    assert st.merge(base, ours, theirs, strategy="ours").image.read("/f.txt") == b"X\n"
    t = st.merge(base, ours, theirs, strategy="theirs").image
    assert t.read("/f.txt") == b"Y\n" and not any(e["name"] == "d" for e in t.ls("/"))
    mk = st.merge(base, ours, theirs, strategy="markers").image
    assert mk.read("/f.txt") == b"<<<<<<< ours\nX\n=======\nY\n>>>>>>> theirs\n"
    assert mk.read("/d/k") == b"1\n"                                # the modified side is kept
    with pytest.raises(InvalidInput):
        st.merge(base, ours, theirs, strategy="random")


def test_branch_runs_advance_and_rollback(st, base):
    b = st.branch("exp-1", from_=base)
    r1 = b.run("echo 1 > /x")
    r2 = b.run("echo 2 >> /x")
    assert b.head == r2.image and b.head.read("/x") == b"1\n2\n"
    assert st.image("exp-1") == r2.image and st.image("branch:exp-1") == r2.image
    assert b.rollback(steps=1) == r1.image and b.head == r1.image
    assert b.rollback(to=base) == base
    with pytest.raises(InvalidInput):
        b.rollback(to=r2.image.run("echo x > /y").image)          # not an ancestor of the head
    assert [m["reason"].split()[0] for m in b.log()] == ["create", "run", "run", "rollback", "rollback"]
    with pytest.raises(Conflict):
        st.branch("exp-1", from_=base)
    st.tag(base, "a-tag")
    with pytest.raises(InvalidInput):
        st.branch("bad name!", from_=base)
    b.delete()
    assert "exp-1" not in st.branches()


def test_concurrent_runs_on_a_branch_never_lost(st, base):
    b = st.branch("race", from_=base)
    outcomes = []

    def go(i):
        try:
            r = b.run(f"echo {i} >> /log; sleep 0.2")
            outcomes.append(("applied", i, r.image))
        except Conflict as exc:
            outcomes.append(("stale", i, exc.details["image"]))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    applied = [o for o in outcomes if o[0] == "applied"]
    assert applied and len(outcomes) == 4
    moves = [m for m in b.log() if m["reason"].startswith("run")]
    assert len(moves) == len(applied)                               # every applied run is one move
    for _, i, image in outcomes:                                    # and no result is lost
        assert st.image(image).read("/log").endswith(f"{i}\n".encode())


def test_map_and_best_of(st, base):
    results = st.map(base, [f"echo {i} > /score" for i in (3, 9, 4)], parallel=3)
    assert [r.image.read("/score") for r in results] == [b"3\n", b"9\n", b"4\n"]
    winner = best_of(results, score=lambda r: int(r.image.read("/score")))
    assert winner is results[1]
    ids = {i.id for i in st.images()}
    assert winner.image.id in ids and results[0].image.id not in ids and results[2].image.id not in ids
    kept = base.fork(["echo a > /a", "echo b > /a"])
    assert best_of(kept, score=lambda r: 1, keep_losers=True) is kept[0]
    assert all(r.image.id in {i.id for i in st.images()} for r in kept)


def test_lineage_queries_and_pictures(st, base, tmp_path):
    a = base.run("echo a > /a").image
    a2 = a.run("echo a2 > /a").image
    b = base.run("echo b > /b").image
    assert [i for i in a2.ancestors()][:2] == [a, base]
    assert set(base.descendants()) >= {a, a2, b}
    assert st.common_ancestor(a2, b) == base
    assert st.path(a2, b) == [a2, a, base, b]
    assert a2.produced_by()[0]["command"] == "echo a2 > /a"
    st.tag(a2, "deep")
    text = base.lineage("text")
    assert "deep" in text and "echo a2 > /a" in text
    svg = base.lineage("svg")
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg") and svg.count("<rect") >= 5
    assert base.lineage()["children"]


def test_bundle_roundtrip_same_ids_and_bytes(st, base, tmp_path):
    child = base.run("echo x > /x; ln /x /x2; chmod 4755 /x").image
    st.tag(child, "shipped")
    path = str(tmp_path / "b.bundle")
    st.bundle(path, [child], with_ancestry=True)
    other = sandtree.Sandtree(str(tmp_path / "elsewhere"))
    res = other.import_bundle(path)
    assert child.id in res["images"] and base.id in res["images"]
    again = other.image("shipped")
    assert again.id == child.id
    assert [p.id for p in again.parents()] == [base.id]
    for p in ("/x", "/f.txt", "/bin.dat", "/bin/busybox"):
        assert again.read(p) == child.read(p)
        assert again.stat(p) == child.stat(p)                       # modes, ids, links, mtimes
    assert again.run("stat -c '%a %h' /x").stdout == b"4755 2\n"
    assert other.fsck()["ok"]
    other.close()


def test_tampered_bundle_rejected(st, base, tmp_path):
    import zstandard
    path = tmp_path / "b.bundle"
    st.bundle(str(path), [base])
    raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb")).read()
    i = raw.index(b"hello from the image")
    bad = raw[:i] + b"HELLO" + raw[i + 5:]
    (tmp_path / "bad.bundle").write_bytes(zstandard.ZstdCompressor().compress(bad))
    other = sandtree.Sandtree(str(tmp_path / "elsewhere"))
    with pytest.raises(sandtree.BadArchive):
        other.import_bundle(str(tmp_path / "bad.bundle"))
    assert other.images() == [] and list(other._engine.store.blobs.files()) == []
    (tmp_path / "junk.bundle").write_bytes(os.urandom(500))
    with pytest.raises(sandtree.BadArchive):
        other.import_bundle(str(tmp_path / "junk.bundle"))
    other.close()


def test_gc_keeps_branches_and_recent_reflog(st, base):
    b = st.branch("keep", from_=base)
    r = b.run("echo 1 > /one")
    b.rollback(steps=1)
    st.gc(retention=3600, grace=0)                     # r is only in the reflog now: kept
    assert r.image.id in {i.id for i in st.images()}
    st.gc(retention=0, grace=0)
    ids = {i.id for i in st.images()}
    assert base.id in ids and r.image.id not in ids
    assert st.fsck()["ok"]
