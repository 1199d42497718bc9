"""A live fork across the nodes of a cluster (issue 38): the checkpoint is taken on the source's
node and travels through object storage (the fork image's live state, live/<image>.tar), so the
children spread over the nodes, each going on from the source's memory. On the test cluster of
test_cluster.py (Ray head and two worker nodes on this machine, PostgreSQL, S3 on SeaweedFS): a
cluster of this module's own."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from test_cluster import _hibernate_or_skip, _recalled, _remembering, cst, ray_cluster  # noqa: E402,F401


def _node_of(cst, sid: str) -> str:  # noqa: F811
    [nid] = [n["node"] for n in cst.cluster_status()["nodes"] if sid in n["sandbox_ids"]]
    return nid


def test_a_live_fork_spreads_over_the_nodes(cst):  # noqa: F811
    _hibernate_or_skip(cst)
    eng = cst.engine
    sid = eng.sandbox_start(cst.image.id, idle_timeout=300, lifetime=600)["id"]
    made: list[str] = []
    try:
        eng.sandbox_exec(sid, ["sh", "-c", "echo before > /state"])
        word = _remembering(cst, sid)
        home = _node_of(cst, sid)
        kids = eng.sandbox_fork(sid, 2)
        made += [k["id"] for k in kids]
        image = kids[0]["forked_from"]["image"]
        assert all(k["forked_from"]["image"] == image and k["forked_from"]["sandbox"] == sid for k in kids)
        # one child on the source's node (its checkpoint there), the other where load put it: the other node
        nodes = {k["id"]: _node_of(cst, k["id"]) for k in kids}
        assert set(nodes.values()) == {n["node"] for n in cst.cluster_status()["nodes"] if n["alive"]}
        assert nodes[kids[0]["id"]] == home
        # the state went through object storage, and every child goes on from the source's memory
        assert eng.store.objects.exists(f"live/{image}.tar")
        assert eng.image_info(image)["live"] is True
        for k in kids:
            assert _recalled(cst, k["id"]) == word
            assert eng.sandbox_exec(k["id"], ["cat", "/state"]).stdout == b"before\n"
        assert _recalled(cst, sid) == word                   # the source runs on
        # children diverge on their own nodes
        eng.sandbox_exec(kids[1]["id"], ["sh", "-c", "echo other > /state"])
        assert eng.sandbox_exec(kids[0]["id"], ["cat", "/state"]).stdout == b"before\n"

        # later: the fork's image started live again, spread by load, fetched where it is not
        for k in kids:
            eng.sandbox_stop(k["id"])
        again = eng.fork_from(image, 2)
        made += [a["id"] for a in again]
        assert len({_node_of(cst, a["id"]) for a in again}) == 2
        for a in again:
            assert _recalled(cst, a["id"]) == word
    finally:
        for s in [sid, *made]:
            try:
                eng.sandbox_stop(s)
            except Exception:               # noqa: BLE001 - stopped already
                pass


def test_bad_input_over_the_cluster(cst):  # noqa: F811
    import sandtree
    eng = cst.engine
    with pytest.raises(sandtree.NotFound):
        eng.sandbox_fork("f" * 32, 2)
    with pytest.raises(sandtree.Conflict, match="no live state"):
        eng.fork_from(cst.image.id, 2)


def test_a_resumed_hibernations_state_starts_on_any_node(cst):  # noqa: F811
    """A hibernation's checkpoint, once resumed, is kept as its image's live state: its object is
    copied in S3 (not uploaded again), and fork_from starts it on both nodes."""
    _hibernate_or_skip(cst)
    eng = cst.engine
    sid = eng.sandbox_start(cst.image.id, idle_timeout=300, lifetime=600)["id"]
    made: list[str] = []
    try:
        word = _remembering(cst, sid)
        eng.sandbox_hibernate(sid)
        base = eng.sandbox_info(sid)["head"]
        assert eng.image_info(base)["live"] is False
        assert eng.sandbox_resume(sid)["state"] == "running"
        assert eng.image_info(base)["live"] is True
        assert eng.store.objects.exists(f"live/{base}.tar") and not eng.store.objects.exists(f"checkpoints/{sid}.tar")
        made += [s["id"] for s in eng.fork_from(base, 2)]
        assert len({_node_of(cst, s) for s in made}) == 2
        for s in made:
            assert _recalled(cst, s) == word
        # gc: the state goes with its image (here: older than the retention), its object too
        for s in made:
            eng.sandbox_stop(s)
        with eng.store.db.tx() as con:
            con.execute("UPDATE live_states SET created=0 WHERE image=?", (base,))
        eng.gc(grace=0)
        assert eng.image_info(base)["live"] is False and not eng.store.objects.exists(f"live/{base}.tar")
    finally:
        for s in [sid, *made]:
            try:
                eng.sandbox_stop(s)
            except Exception:               # noqa: BLE001 - stopped already
                pass
