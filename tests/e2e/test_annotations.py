"""Annotations (issue 17, deliverable 6): a score and metadata on an image, like git notes. Validated
(untrusted over REST/MCP), durable in the store's SQLite, seen through each surface, and a tenant annotates
only the images it sees, for itself."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

import sandtree
from sandtree.engine import Engine
from sandtree.errors import Forbidden, ImageNotFound, InvalidInput, NotFound
from sandtree.engine.images.annotations import MAX_KEYS, MAX_VALUE
from sandtree.tenancy import Tenant


@pytest.fixture
def eng_img(tmp_path):
    d = tmp_path / "tree"
    d.mkdir()
    (d / "f.txt").write_text("one")
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        yield eng, eng.import_path(str(d), tag="t")
    finally:
        eng.close()


def test_merge_and_read_back_without_changing_the_id(eng_img):
    eng, img = eng_img
    before, listed = eng.image_info(img), eng.images()
    assert before["annotations"] == {"score": None, "meta": {}}
    assert eng.annotate(img, 0.5, {"k": "v", "n": 3}) == {"score": 0.5, "meta": {"k": "v", "n": 3}}
    # merge: score kept when omitted, keys added, a null removes one
    assert eng.annotate(img, None, {"n": None, "ok": True}) == {"score": 0.5, "meta": {"k": "v", "ok": True}}
    assert eng.annotate("t", 1) == {"score": 1.0, "meta": {"k": "v", "ok": True}}     # a tag names it too
    info = eng.image_info(img)
    assert info["annotations"] == {"score": 1.0, "meta": {"k": "v", "ok": True}}
    assert info["id"] == img and eng.resolve("t") == img and eng.images() == listed     # no new image, same ID


@pytest.mark.parametrize("score", [math.inf, -math.inf, math.nan, "0.5", True, [1]])
def test_bad_score_is_refused_and_changes_nothing(eng_img, score):
    eng, img = eng_img
    eng.annotate(img, 0.25, {"a": 1})
    with pytest.raises(InvalidInput):
        eng.annotate(img, score, {"b": 2})
    assert eng.image_info(img)["annotations"] == {"score": 0.25, "meta": {"a": 1}}


@pytest.mark.parametrize("meta", [
    {"": 1}, {"a b": 1}, {"../x": 1}, {"x;drop": 1}, {"1abc": 1}, {"k" * 65: 1}, {3: 1},
    {"k": [1]}, {"k": {"x": 1}}, {"k": math.nan}, {"k": math.inf}, {"k": b"bytes"}, {"k": "x" * (MAX_VALUE + 1)},
    {"k": 2 ** 70}, {f"k{i}": i for i in range(MAX_KEYS + 1)}, "k=v", ["k"],
])
def test_bad_meta_is_refused_and_changes_nothing(eng_img, meta):
    eng, img = eng_img
    eng.annotate(img, 0.25, {"a": 1})
    with pytest.raises(InvalidInput):
        eng.annotate(img, 0.9, meta)
    assert eng.image_info(img)["annotations"] == {"score": 0.25, "meta": {"a": 1}}


def test_keys_per_image_count_after_merging(eng_img):
    eng, img = eng_img
    eng.annotate(img, None, {f"a{i}": i for i in range(MAX_KEYS)})
    with pytest.raises(InvalidInput, match="after merging"):
        eng.annotate(img, None, {"one_more": 1})
    eng.annotate(img, None, {"a0": None, "one_more": 1})          # replacing one is fine
    assert len(eng.image_info(img)["annotations"]["meta"]) == MAX_KEYS


def test_unknown_image_is_not_found(eng_img):
    eng, _ = eng_img
    with pytest.raises(NotFound):
        eng.annotate("f" * 64, 1.0)


def test_durable_a_new_engine_on_the_store_sees_them(eng_img, tmp_path):
    eng, img = eng_img
    eng.annotate(img, 0.75, {"note": "kept"})
    eng.close()
    again = Engine(str(tmp_path / "home"), warm=0)
    try:
        assert again.image_info(img)["annotations"] == {"score": 0.75, "meta": {"note": "kept"}}
    finally:
        again.close()


def test_each_tenant_annotates_only_for_itself(tmp_path):
    """Annotations are per principal (a tenant, or the operator): a tenant writes its own on any image
    it sees, and reads its own, else those of whoever shared the image."""
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        d = tmp_path / "x"
        d.mkdir()
        (d / "x.txt").write_text("x")
        alice = eng.as_tenant(Tenant("alice", token="t-alice"))
        bob = eng.as_tenant(Tenant("bob", token="t-bob"))
        reader = eng.as_tenant(Tenant("carol", ("list",)))
        x = alice.import_path(str(d))
        assert alice.annotate(x, 0.5, {"by": "alice"})["score"] == 0.5
        with pytest.raises(ImageNotFound):
            bob.annotate(x, 0.0, {"by": "bob"})
        assert eng.image_info(x)["annotations"] == {"score": None, "meta": {}}     # not shared: the operator's own
        alice.share(x)                                    # carol sees it now, but holds no "tag" scope
        assert reader.image_info(x)["annotations"] == {"score": 0.5, "meta": {"by": "alice"}}   # the sharer's
        with pytest.raises(Forbidden):
            reader.annotate(x, 0.0)
        assert bob.image_info(x)["annotations"]["score"] == 0.5
        assert bob.annotate(x, 0.0, {"by": "bob"}) == {"score": 0.0, "meta": {"by": "bob"}}     # his own, from none
        y = bob.import_path(str(d))                       # the same content, now his too: still his own notes
        assert y == x and bob.annotate(y, None, {"more": 1}) == {"score": 0.0, "meta": {"by": "bob", "more": 1}}
        assert eng.annotate(x, 0.9, {"by": "operator"})["score"] == 0.9
        for who in (alice, reader):                       # the sharer's, whatever bob and the operator wrote
            assert who.image_info(x)["annotations"] == {"score": 0.5, "meta": {"by": "alice"}}
        assert bob.image_info(x)["annotations"] == {"score": 0.0, "meta": {"by": "bob", "more": 1}}
        assert eng.image_info(x)["annotations"] == {"score": 0.9, "meta": {"by": "operator"}}
    finally:
        eng.close()


def test_the_lineage_tree_shows_each_readers_scores_on_its_nodes(tmp_path):
    """A tree node carries its score and its numeric annotations (`metrics`: a reward, a pass
    rate; strings stay on the image's record), as its reader reads them: the operator its own, a
    tenant its own (what the web page draws on each node)."""
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        d = tmp_path / "x"
        d.mkdir()
        (d / "x.txt").write_text("x")
        alice = eng.as_tenant(Tenant("alice", token="t-alice"))
        x = alice.import_path(str(d))
        alice.annotate(x, 0.5, {"reward": 2, "passed": 0.75, "note": "long text", "ok": True})
        assert {k: alice.lineage_tree(x).get(k) for k in ("score", "metrics")} == {
            "score": 0.5, "metrics": {"passed": 0.75, "reward": 2}}
        bare = eng.lineage_tree(x)                      # the operator wrote none of its own
        assert "score" not in bare and "metrics" not in bare
        eng.annotate(x, -1.0)
        assert eng.lineage_tree(x)["score"] == -1.0 and "metrics" not in eng.lineage_tree(x)
        assert alice.lineage_tree(x)["score"] == 0.5
    finally:
        eng.close()


def test_sdk_local_and_remote(sdk, tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    (d / "s.txt").write_text("s")
    img = sdk.import_image(str(d))
    assert img.annotate(score=0.7, task="t1", passed=3) == {"score": 0.7, "meta": {"task": "t1", "passed": 3}}
    assert sdk.annotate(img.id, None, passed=None) == {"score": 0.7, "meta": {"task": "t1"}}
    assert sdk.annotations(img) == {"score": 0.7, "meta": {"task": "t1"}}
    with pytest.raises(InvalidInput):
        sdk.annotate(img, None, **{"bad key": 1})
    with pytest.raises(InvalidInput):
        img.annotate(k=[1, 2])
    assert img.annotations() == {"score": 0.7, "meta": {"task": "t1"}}


def test_async_twin(tmp_path):
    d = tmp_path / "a"
    d.mkdir()
    (d / "a.txt").write_text("a")

    async def go():
        async with sandtree.AsyncSandtree(str(tmp_path / "home"), warm=0) as st:
            img = await st.import_image(str(d))
            await img.annotate(score=0.1, k="v")
            return await st.annotations(img)
    assert asyncio.run(go()) == {"score": 0.1, "meta": {"k": "v"}}


def test_cli(cli, tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    (d / "c.txt").write_text("c")
    img = cli("image", "import", str(d), "--json").stdout.decode().strip()
    img = json.loads(img)["image"]
    got = json.loads(cli("annotate", img, "--score", "0.7", "--meta", "k=v", "--meta", "n=3", "--meta", "ok=true",
                         "--json").stdout)
    assert got == {"image": img, "score": 0.7, "meta": {"k": "v", "n": 3, "ok": True}}
    bad = cli("annotate", img, "--meta", "bad key=1", "--json", check=False)
    assert bad.returncode == 1 and json.loads(bad.stdout)["error"] == "invalid_input"
    bad = cli("annotate", img, "--score", "nan", check=False)
    assert bad.returncode == 1 and "finite" in bad.stderr.decode()
    info = json.loads(cli("annotate", img, "--json").stdout)
    assert info["meta"] == {"k": "v", "n": 3, "ok": True} and info["score"] == 0.7


def test_gc_drops_the_annotations_of_collected_images(tmp_path):
    d = tmp_path / "gone"
    d.mkdir()
    (d / "g.txt").write_text("g")
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        img = eng.import_path(str(d))
        eng.annotate(img, 0.5, {"k": "v"})
        eng.remove_image(img)
        eng.gc(retention=0, grace=0)
        assert not eng.store.db.query("SELECT image FROM annotations_by")
        again = eng.import_path(str(d))
        assert again == img and eng.image_info(img)["annotations"] == {"score": None, "meta": {}}
    finally:
        eng.close()


def test_rest_a_reimport_of_a_shared_image_does_not_rewrite_its_sharers_annotations(tmp_path):
    """Over a real server: Bob exports the image Alice shared and imports it again (the same ID, now
    his too); what he writes on it are his notes: Alice and Carol read what Alice wrote, the operator
(who reads only its own) nothing."""
    import io
    import tarfile

    import httpx
    from conftest import listening
    from test_build_server import token

    home = tmp_path / "home"
    toks = {n: token(home, n) for n in ("alice", "bob")}
    toks["carol"] = token(home, "carol", "--scopes", "list")
    toks["ops"] = token(home, "ops", "--scopes", "admin")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("notes.txt")
        info.size = 3
        t.addfile(info, io.BytesIO(b"abc"))
    with listening(home, "serve") as url:
        c = {n: httpx.Client(base_url=url + "/api/v1", timeout=60, headers={"Authorization": f"Bearer {t}"})
             for n, t in toks.items()}
        try:
            r = c["alice"].post("/images/import", content=buf.getvalue())
            assert r.status_code == 201, r.text
            x = r.json()["image"]
            assert c["alice"].post(f"/images/{x}/annotations", json={"score": 0.9, "meta": {"verdict": "good"}}
                                   ).status_code == 200
            assert c["alice"].post(f"/images/{x}/share", json={"public": True}).status_code == 200
            exported = c["bob"].get(f"/images/{x}/export")
            assert exported.status_code == 200
            r = c["bob"].post("/images/import", content=exported.content)
            assert r.status_code == 201 and r.json()["image"] == x, r.text
            r = c["bob"].post(f"/images/{x}/annotations", json={"score": 0.0, "meta": {"verdict": "malware"}})
            assert r.status_code == 200 and r.json()["score"] == 0.0, r.text
            alices = {"score": 0.9, "meta": {"verdict": "good"}}
            for who in ("alice", "carol"):
                assert c[who].get(f"/images/{x}").json()["annotations"] == alices, who
            assert c["ops"].get(f"/images/{x}").json()["annotations"] == {"score": None, "meta": {}}  # only its own
            assert c["bob"].get(f"/images/{x}").json()["annotations"] == {"score": 0.0, "meta": {"verdict": "malware"}}
            assert c["carol"].post(f"/images/{x}/annotations", json={"score": 0.1}).status_code == 403  # no "tag" scope
        finally:
            for cl in c.values():
                cl.close()


def test_a_tenant_that_shares_the_operators_image_first_does_not_become_its_sharer(tmp_path):
    """An image's ID is its content: a tenant that imports (or builds) the same tree owns the operator's
    image too and could share it before the operator did. The operator's share then changed nothing
    (the first sharer stayed): every tenant read that tenant's annotations on the operator's published
    image, and that tenant could unshare it from everyone. The operator's (or an admin's) share makes it
    the sharer (attack review of issue 33)."""
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        d = tmp_path / "env"
        d.mkdir()
        (d / "env.txt").write_text("an evaluation environment anyone can make")
        img = eng.import_path(str(d))
        eng.annotate(img, 1.0, {"verdict": "good"})
        mallory = eng.as_tenant(Tenant("mallory", token="t-mallory"))
        carol = eng.as_tenant(Tenant("carol", ("list",)))
        assert mallory.import_path(str(d)) == img                  # the same content: hers too
        mallory.annotate(img, 0.0, {"verdict": "malware"})
        mallory.share(img)                                         # before the operator
        eng.share(img)
        assert carol.image_info(img)["annotations"] == {"score": 1.0, "meta": {"verdict": "good"}}
        with pytest.raises(Forbidden):
            mallory.unshare(img)
        assert carol.image_info(img)["id"] == img                   # still published
        admin = eng.as_tenant(Tenant("ops", ("admin",), token="t-ops"))
        other = tmp_path / "other"
        other.mkdir()
        (other / "o.txt").write_text("o")
        o = mallory.import_path(str(other))
        mallory.share(o)
        admin.share(o)                                             # an admin's share is the operator's too
        with pytest.raises(Forbidden):
            mallory.unshare(o)
    finally:
        eng.close()
