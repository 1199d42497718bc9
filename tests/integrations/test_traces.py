"""Trace export (issue 17, deliverable 6): a real 3-level tree of runs exported as JSONL and Parquet loads with
Hugging Face `datasets`, and its rows are the lineage: parents, commands, exit codes, outputs, scores."""

from __future__ import annotations

import json
import uuid

import pytest

import sandtree
from sandtree.errors import InvalidInput
from sandtree.exploration import traces

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def tree(tmp_path_factory, rootfs):
    """root -> a (exit 0), b (exit 3) ; a -> a1 (long output), a2. Scored and tagged. Each run writes a file:
    a run that changes nothing makes no new image (its result is its source), so no node of its own."""
    st = sandtree.Sandtree(str(tmp_path_factory.mktemp("traces") / "home"))
    try:
        base = st.import_image(rootfs)
        token = uuid.uuid4().hex
        root = base.run(f"echo {token} > /token").image            # a root no other test's runs grow from
        a, b = root.fork(["echo made-a > /a; echo out-a", "echo b > /b; echo to-err >&2; exit 3"])
        a1, a2 = a.image.fork(["i=0; while [ $i -lt 3000 ]; do echo line$i; i=$((i+1)); done; echo > /a1", "cat /a; echo > /a2"])
        st.annotate(a.image, 0.5, note="half")
        a1.image.annotate(score=1.0, best=True)
        st.tag(a2.image, "trace/a2")
        yield {"st": st, "root": root, "a": a, "b": b, "a1": a1, "a2": a2}
    finally:
        st.close()


def _check(rows: list[dict], t: dict, max_output: int) -> None:
    by = {r["image"]: r for r in rows}
    root, a, b, a1, a2 = (t["root"].id, t["a"].image.id, t["b"].image.id, t["a1"].image.id, t["a2"].image.id)
    assert set(by) == {root, a, b, a1, a2} and len(rows) == 5
    assert rows[0]["image"] == root and by[root]["parent"] is None and by[root]["depth"] == 0
    assert [(by[i]["parent"], by[i]["depth"]) for i in (a, b, a1, a2)] == [(root, 1), (root, 1), (a, 2), (a, 2)]
    assert by[a]["command"] == "echo made-a > /a; echo out-a" and by[a]["exit_code"] == 0
    assert by[a]["stdout"] == "out-a\n" and by[a]["stdout_truncated"] is False
    assert by[b]["exit_code"] == 3 and by[b]["stderr"] == "to-err\n" and by[b]["stdout"] == ""
    assert by[a2]["stdout"] == "made-a\n" and by[a2]["tags"] == ["trace/a2"]
    assert len(by[a1]["stdout"].encode()) == max_output and by[a1]["stdout_truncated"] is True
    assert by[a1]["stdout"].startswith("line0\nline1\n")
    assert (by[a]["score"], json.loads(by[a]["meta"])) == (0.5, {"note": "half"})
    assert (by[a1]["score"], json.loads(by[a1]["meta"])) == (1.0, {"best": True})
    assert by[b]["score"] is None and json.loads(by[b]["meta"]) == {}
    assert all(isinstance(json.loads(r["usage"]), dict) for r in rows)
    assert json.loads(by[a]["usage"]).get("wall_s", 0) >= 0
    assert all(r["created"] > 0 for r in rows) and all(r["op"] for r in rows if r["parent"])


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_export_loads_with_datasets_and_matches_the_lineage(tree, tmp_path, fmt):
    out = str(tmp_path / f"trace.{fmt}")
    got = tree["st"].trace_export(tree["root"], fmt, out, max_output=100)
    assert got == {"file": out, "format": fmt, "rows": 5, "root": tree["root"].id}
    ds = datasets.load_dataset("json" if fmt == "jsonl" else "parquet", data_files=out, split="train")
    assert ds.column_names == list(traces.COLUMNS)
    _check([dict(r) for r in ds], tree, 100)


def test_cli_export(tree, tmp_path):
    import subprocess                     # (the test's own: the CLI in a subprocess on the module's store)
    import sys
    out = tmp_path / "cli.jsonl"
    p = subprocess.run([sys.executable, "-m", "sandtree", "--home", tree["st"].home, "trace", "export",
                        tree["root"].id, "--format", "jsonl", "-o", str(out), "--max-output", "100", "--json"],
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout)["rows"] == 5
    _check([json.loads(line) for line in out.read_text().splitlines()], tree, 100)


def test_a_subtree_and_bad_arguments(tree, tmp_path):
    rows = traces.trace_rows(tree["st"].engine, tree["a"].image.id)
    assert [r["depth"] for r in rows] == [0, 1, 1] and rows[0]["parent"] is None
    for kw in ({"fmt": "csv"}, {"max_output": -1}, {"max_output": "10"}):
        with pytest.raises(InvalidInput):
            traces.export_trace(tree["st"].engine, tree["root"].id, **{"out": str(tmp_path / "x"), **kw})
    assert not list(tmp_path.iterdir())                    # nothing written by a refused call
    with pytest.raises(InvalidInput, match="more than 2"):
        traces.trace_rows(tree["st"].engine, tree["root"].id, max_nodes=2)
