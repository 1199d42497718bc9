"""SPECIFICATION.md names, for each promise, the test that checks it (`path::name`) or a bench script: each one
named must exist, so a promise cannot point at a test that was renamed or removed."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEST = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
BENCH = re.compile(r"\b(bench/\w+\.py)\b")


def missing(text: str, root: pathlib.Path = ROOT) -> list[str]:
    """The tests and bench scripts `text` names that `root` does not have."""
    out = []
    for path, name in TEST.findall(text):
        f = root / path
        if not f.is_file() or not re.search(rf"^(async )?def {name}\(", f.read_text(), re.M):
            out.append(f"{path}::{name}")
    out += [p for p in BENCH.findall(text) if not (root / p).is_file()]
    return out


def test_every_check_the_specification_names_exists():
    text = (ROOT / "SPECIFICATION.md").read_text()
    assert len(TEST.findall(text)) > 40                        # (the pattern still reads the table)
    assert missing(text) == []


def test_a_renamed_test_is_seen(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_there():\n    pass\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "b.py").write_text("")
    text = ("| a | tests/test_x.py::test_there |\n| b | tests/test_x.py::test_gone |\n| c | tests/test_y.py::test_a |\n"
            "| d | bench/b.py |\n| e | bench/gone.py |\n")
    assert missing(text, tmp_path) == ["tests/test_x.py::test_gone", "tests/test_y.py::test_a", "bench/gone.py"]
