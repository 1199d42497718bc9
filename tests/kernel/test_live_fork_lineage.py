"""Live states in the lineage (issue 38): the checkpoint a live fork or a hibernation took is kept
with its image, so fork_from(image, n) starts live sandboxes that go on from that moment, later
and again; image info and the lineage tree say which images have one; gc removes them.

Real kernel, real CRIU (namespaces) and runsc (gVisor): live_tier runs each test on both."""

import json
import os

import pytest

import sandtree
from sandtree.tenancy import Tenant

from test_live_fork import _ask, _until, forkable, memstate_rootfs  # noqa: F401 (fixtures)


def _live_dirs(st) -> list[str]:
    d = os.path.join(st._engine.home, "sandboxes")
    return sorted(n for n in os.listdir(d) if n.endswith(".live"))


def _counting(img, tier):
    sb = img.start(idle_timeout=300, lifetime=600, tier=tier, memory="512m")
    assert sb.exec("cd /tmp; export X=7; echo before > /tmp/file").ok
    assert sb.exec("memstate 100 >/dev/null 2>&1 &").ok
    _until(sb, "test -e /tmp/ready")
    return sb


def test_a_forks_image_starts_live_again_later(forkable):
    st, img, tier = forkable
    sb = _counting(img, tier)
    count, total = _ask(sb)
    assert count == b"1"
    [kid] = sb.fork(1)
    fork_image = kid.info()["forked_from"]["image"]
    assert st.image(fork_image).info()["live"] is True and img.info()["live"] is False
    assert _live_dirs(st) == [f"{fork_image}.live"]
    mode = os.stat(os.path.join(st._engine.home, "sandboxes")).st_mode & 0o777
    assert mode == 0o700                                       # (it holds the sandbox's memory)
    # the source and the child go on, and stop: the state stays with the image
    assert _ask(sb) == [b"2", total] and _ask(kid) == [b"2", total]
    assert kid.exec("echo child > /tmp/file").ok
    kid.stop()
    sb.stop()

    later = st.image(fork_image).fork_live(2, lifetime=120)
    assert len(later) == 2
    for s in later:
        info = s.info()
        assert info["state"] == "running" and info["tier"] == tier and info["image"] == fork_image
        assert info["forked_from"] == {"sandbox": sb.id, "image": fork_image, "live_state": True}
        assert info["limits"]["memory"] == 512 << 20                  # the source's
        assert info["expires"] - info["created"] <= 121
        # the process goes on from the fork's moment: count 2 (the fork saw 1), the same 100 MB
        assert _ask(s) == [b"2", total]
        assert s.exec("pwd; echo $X; cat /tmp/file").stdout == b"/tmp\n7\nbefore\n"
    # each its own: one's writes are not the other's
    assert later[0].exec("echo a > /tmp/file").ok
    assert later[1].exec("cat /tmp/file").stdout == b"before\n"
    assert _ask(later[0]) == [b"3", total] and _ask(later[1]) == [b"3", total]
    # and again from the same state, the first ones running or not
    for s in later:
        s.stop()
    [again] = st.fork_from(fork_image)
    assert _ask(again) == [b"2", total]

    # the lineage tree marks it, and only it
    tree = st._engine.lineage_tree(img.id)
    nodes, todo = {}, [tree]
    while todo:
        n = todo.pop()
        nodes[n["image"]] = n
        todo.extend(n["children"])
    assert nodes[fork_image].get("live") is True and "live" not in nodes[img.id]


def test_a_hibernations_image_starts_live_after_the_resume(forkable):
    st, img, tier = forkable
    sb = _counting(img, tier)
    _, total = _ask(sb)
    sb.hibernate()
    base = st._engine.sandboxes._row(sb.id)["spec"]["base"]
    assert st.image(base).info()["live"] is False           # (its checkpoint is still the sandbox's own)
    sb.resume()
    assert st.image(base).info()["live"] is True
    assert not os.path.exists(st._engine.sandboxes._checkpoint_dir(sb.id))     # moved, not copied
    assert _ask(sb) == [b"2", total]
    [s] = st.fork_from(base)
    assert _ask(s) == [b"2", total]                          # from the hibernation's moment, not the source's now
    assert _ask(sb) == [b"3", total]


def test_no_live_state_is_a_clear_error(forkable):
    st, img, tier = forkable
    sb = img.start(idle_timeout=300, lifetime=600, tier=tier)
    commit = sb.commit()
    before = {s.id for s in st.sandboxes()}
    for ref in (img.id, commit.id):
        with pytest.raises(sandtree.Conflict, match="has no live state: only the commit of a live fork"):
            st.fork_from(ref)
    with pytest.raises(sandtree.ImageNotFound):
        st.fork_from("f" * 64)
    [kid] = sb.fork()
    fork_image = kid.info()["forked_from"]["image"]
    for n in (0, 17, True, "2"):
        with pytest.raises(sandtree.InvalidInput):
            st._engine.fork_from(fork_image, n)
    with pytest.raises(TypeError, match="env"):
        st._engine.fork_from(fork_image, 1, env={"A": "1"})
    assert {s.id for s in st.sandboxes()} == before | {kid.id}


def test_gc_removes_a_live_state_with_its_image_or_after_the_retention(forkable):
    st, img, tier = forkable
    eng = st._engine
    sb = img.start(idle_timeout=300, lifetime=600, tier=tier)
    assert sb.exec("echo x > /tmp/x").ok
    [a] = sb.fork()
    assert sb.exec("echo y > /tmp/y").ok                    # (else the same commit: one image, its newest state)
    [b] = sb.fork()
    ia, ib = a.info()["forked_from"]["image"], b.info()["forked_from"]["image"]
    # (kept after each fork returned: an image's info says so once it is)
    assert st.image(ia).info()["live"] is True and st.image(ib).info()["live"] is True
    assert _live_dirs(st) == sorted([f"{ia}.live", f"{ib}.live"])
    a.stop(), b.stop(), sb.stop()
    # a: its image removed; b: older than the retention
    eng.remove_image(ia, force=True)
    with eng.store.db.tx() as con:
        con.execute("UPDATE live_states SET created=created-? WHERE image=?", (sandtree.defaults.LIVE_STATE_RETENTION + 1, ib))
    out = eng.gc()
    assert out["removed_live_states"] == 2
    assert _live_dirs(st) == [] and eng.store.db.one("SELECT count(*) FROM live_states")[0] == 0
    with pytest.raises(sandtree.Conflict, match="no live state"):
        st.fork_from(ib)


def test_a_tenant_starts_only_its_own_live_states(forkable, memstate_rootfs):  # noqa: F811
    st, img, tier = forkable
    eng = st._engine
    alice = eng.as_tenant(Tenant("alice", limits={"max_sandboxes": 3}))
    bob = eng.as_tenant(Tenant("bob"))
    image = alice.import_path(memstate_rootfs)
    info = alice.sandbox_start(image, tier=tier, idle_timeout=300, lifetime=600)
    [kid] = alice.sandbox_fork(info["id"])
    fork_image = kid["forked_from"]["image"]
    assert alice.image_info(fork_image)["live"] is True
    # bob: not his image (nothing said of it), even once alice shares it (its memory stays hers)
    with pytest.raises(sandtree.ImageNotFound):
        bob.fork_from(fork_image)
    alice.share(fork_image)
    assert bob.image_info(fork_image)["live"] is False
    with pytest.raises(sandtree.ImageNotFound):
        bob.fork_from(fork_image)
    # alice: max_sandboxes counts them (2 running: 1 more at most)
    with pytest.raises(sandtree.LimitExceeded, match="max_sandboxes"):
        alice.fork_from(fork_image, 2)
    [s] = alice.fork_from(fork_image)
    assert s["id"] in {x["id"] for x in alice.sandbox_list()}
    assert bob.sandbox_list() == []
    audit = [json.loads(r[0]) for r in eng.store.db.query("SELECT detail FROM audit WHERE action='fork from'")]
    assert audit and audit[-1]["children"] == [s["id"]]



def test_rest_remote_sdk_and_the_lineage_page(tmp_path, memstate_rootfs):  # noqa: F811
    """Over a real `sandtree serve`: POST /images/{ref}/fork, the remote SDK, the lineage's `live`."""
    import httpx
    from conftest import serve_process
    with serve_process(tmp_path / "home") as url:
        st = sandtree.connect(url)
        img = st.import_image(memstate_rootfs)
        sb = img.start(idle_timeout=300, lifetime=600)
        try:
            assert sb.exec("memstate 100 >/dev/null 2>&1 &").ok
            _until(sb, "test -e /tmp/ready")
            _, total = _ask(sb)
            [kid] = sb.fork()
            image = kid.info()["forked_from"]["image"]
            r = httpx.post(f"{url}/api/v1/images/{image}/fork", json={"n": 1, "lifetime": 60}, timeout=120)
            assert r.status_code == 201, r.text
            [child] = r.json()
            assert child["forked_from"]["live_state"] is True and child["image"] == image
            again = st.image(image).fork_live(1)[0]
            for sid in (child["id"], again.id):
                assert _ask(st.sandbox(sid)) == [b"2", total]
            r = httpx.post(f"{url}/api/v1/images/{img.id}/fork", json={"n": 1}, timeout=60)
            assert r.status_code == 409 and "no live state" in r.text
            r = httpx.post(f"{url}/api/v1/images/{image}/fork", json={"n": 0}, timeout=60)
            assert r.status_code == 422
            assert httpx.get(f"{url}/api/v1/images/{image}", timeout=30).json()["live"] is True
            tree = httpx.get(f"{url}/api/v1/images/{img.id}/lineage", timeout=30).json()["tree"]
            assert tree["children"][0]["image"] == image and tree["children"][0]["live"] is True
            assert "live" not in tree
            # the web page draws it: the fork's node marked live, its parent not
            from browser import headless_chromium
            with headless_chromium() as browser:
                page = browser.new_context(viewport={"width": 1400, "height": 860}).new_page()
                page.set_default_timeout(20_000)
                page.goto(f"{url}/#tree={img.id}")
                node = page.locator(f'#viewport .node.live[data-image="{image}"]')
                node.wait_for()
                assert node.locator("text.live").text_content() == "▶ live"
                assert page.locator(f'#viewport .node[data-image="{img.id}"]').get_attribute("class").split() \
                    .count("live") == 0
        finally:
            for s in st.sandboxes():
                s.stop()
