"""Beam search (issue 17, deliverable 6) on a small real tree: commands append a digit to /n, the score is the
sum so far (read from the run's output), so the best path is known: the largest digit at every level."""

from __future__ import annotations

import json
import uuid

import pytest

import sandtree
from sandtree.errors import InvalidInput
from sandtree.exploration import search, traces


@pytest.fixture(scope="module")
def world(tmp_path_factory, rootfs):
    st = sandtree.Sandtree(str(tmp_path_factory.mktemp("search") / "home"))
    try:
        root = st.import_image(rootfs).run(f"echo {uuid.uuid4().hex} > /token; : > /n").image
        yield st, root
    finally:
        st.close()


def expand(image):
    return [f"echo {d} >> /n; cat /n" for d in (1, 3, 2)]


def total(rec) -> float:
    return float(sum(int(x) for x in rec.stdout.split()))


def test_beam_finds_the_best_path_and_annotates_every_node(world):
    st, root = world
    expanded = []
    got = st.beam_search(root, lambda i: expanded.append(i) or expand(i), total, beam=2, depth=2)
    assert got["score"] == 6.0 and got["path"] == ["echo 3 >> /n; cat /n"] * 2
    assert st.image(got["image"]).read("/n") == b"3\n3\n"
    # level 1: the root expanded; level 2: only the beam (the 3 and the 2 of level 1)
    assert len(expanded) == 3 and expanded[0] == root.id
    level1 = {n["image"]: n["score"] for n in got["nodes"] if n["depth"] == 1}
    assert sorted(level1[i] for i in expanded[1:]) == [2.0, 3.0]
    assert len(got["nodes"]) == 3 + 2 * 3
    for n in got["nodes"]:                                     # scores are on the images (trace export reads them)
        notes = st.annotations(n["image"])
        assert notes["score"] == n["score"] and notes["meta"]["search"] == "beam"
        assert notes["meta"]["depth"] == n["depth"] and notes["meta"]["command"] == n["command"]
    rows = traces.trace_rows(st.engine, root.id)
    assert {r["image"]: r["score"] for r in rows if r["depth"] >= 1} == {n["image"]: n["score"] for n in got["nodes"]}


def test_best_first_stops_at_the_target(world):
    st, root = world
    got = search.beam_search(st.engine, root.id, expand, total, beam=1, depth=3, stop=3.0)
    assert got["score"] == 3.0 and len(got["nodes"]) == 3 and got["path"] == ["echo 3 >> /n; cat /n"]


def test_bad_arguments(world):
    st, root = world
    for kw in ({"beam": 0}, {"depth": -1}, {"beam": True}):
        with pytest.raises(InvalidInput):
            search.beam_search(st, root, expand, total, **kw)
    with pytest.raises(InvalidInput, match="score returned nan"):
        search.beam_search(st, root, expand, lambda r: float("nan"), depth=1)
