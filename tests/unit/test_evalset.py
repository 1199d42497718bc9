"""The evaluation instance set (data/evalset/, issue 17) holds its shape: offline checks of every field.

That each instance resolves with its gold patch and fails without it is checked on sandtree by the
eval harness's tests and by `python scripts/evalset.py verify`; here only what needs no network:
SWE-bench's fields and types, patches that parse as unified diffs (each hunk's line counts add up)
and touch only source files (patch) or only test files (test_patch), test node IDs in the test files
the test_patch touches, the environment's Dockerfile pinned (sha256, exact versions), licences, and
the script's hunk cutting on a small example."""

from __future__ import annotations

import datetime
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "evalset"
FIELDS = {"instance_id": str, "repo": str, "version": str, "base_commit": type(None), "patch": str,
          "test_patch": str, "FAIL_TO_PASS": list, "PASS_TO_PASS": list, "problem_statement": str,
          "hints_text": str, "created_at": str, "environment_setup_commit": type(None), "environment": dict,
          "test_cmd": str}
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def instances() -> list[dict]:
    return [json.loads(line) for line in (DATA / "instances.jsonl").read_text().splitlines() if line.strip()]


def sources() -> dict:
    return {s["instance_id"]: s for s in json.loads((DATA / "sources.json").read_text())}


def is_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return ("tests/" in f"/{path}" or "/test/" in f"/{path}" or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


def parse_diff(text: str) -> list[str]:
    """The paths a unified diff (git's format) touches; AssertionError where it is malformed."""
    lines = text.splitlines()
    assert lines and lines[0].startswith("diff --git a/"), "a patch starts with a diff --git header"
    paths, i = [], 0
    while i < len(lines):
        m = re.fullmatch(r"diff --git a/(\S+) b/(\S+)", lines[i])
        assert m and m.group(1) == m.group(2), f"bad header {lines[i]!r}"
        path = m.group(1)
        i += 1
        while i < len(lines) and not lines[i].startswith("--- "):
            assert re.match(r"(index [0-9a-f]+\.\.[0-9a-f]+( \d+)?|(new|deleted) file mode \d+)$", lines[i]), lines[i]
            i += 1
        assert i + 1 < len(lines), f"{path}: no ---/+++ lines"
        assert lines[i] in (f"--- a/{path}", "--- /dev/null") and lines[i + 1] in (f"+++ b/{path}", "+++ /dev/null")
        i += 2
        hunks = 0
        while i < len(lines) and not lines[i].startswith("diff --git "):
            h = HUNK.match(lines[i])
            assert h, f"{path}: expected a hunk header, got {lines[i]!r}"
            old = int(h.group(2) if h.group(2) is not None else 1)
            new = int(h.group(4) if h.group(4) is not None else 1)
            i += 1
            while old > 0 or new > 0:
                assert i < len(lines), f"{path}: the patch ends inside a hunk"
                line = lines[i]
                assert line[:1] in (" ", "-", "+"), f"{path}: hunk ends early at {line!r}"
                old -= line[:1] in (" ", "-")
                new -= line[:1] in (" ", "+")
                i += 1
                while i < len(lines) and lines[i].startswith("\\ No newline"):
                    i += 1
            assert old == 0 and new == 0, f"{path}: hunk line counts do not add up"
            hunks += 1
        assert hunks, f"{path}: no hunks"
        paths.append(path)
    return paths


def test_the_set_is_big_enough_and_ids_are_unique():
    insts = instances()
    assert len(insts) >= 10
    assert len({i["repo"] for i in insts}) >= 3
    ids = [i["instance_id"] for i in insts]
    assert len(set(ids)) == len(ids)
    assert set(ids) == set(sources()), "sources.json and instances.jsonl name the same instances"


@pytest.mark.parametrize("inst", instances(), ids=lambda i: i["instance_id"])
def test_fields(inst):
    assert set(inst) == set(FIELDS), set(inst) ^ set(FIELDS)
    for name, kind in FIELDS.items():
        assert isinstance(inst[name], kind), name
    owner, name = inst["repo"].split("/")
    assert re.fullmatch(re.escape(f"{owner}__{name}") + r"-\d+", inst["instance_id"])
    assert re.fullmatch(r"\d+(\.\d+)*", inst["version"])
    assert inst["hints_text"] == "" and len(inst["problem_statement"]) > 80
    assert datetime.datetime.fromisoformat(inst["created_at"].replace("Z", "+00:00")).year >= 2000
    src = sources()[inst["instance_id"]]
    assert (src["version"], src["repo"]) == (inst["version"], inst["repo"])
    assert not set(src.get("flaky", ())) & set(inst["PASS_TO_PASS"]), "timing-dependent tests stay out"


@pytest.mark.parametrize("inst", instances(), ids=lambda i: i["instance_id"])
def test_patches_parse_and_touch_source_and_test_files_respectively(inst):
    gold, tests = parse_diff(inst["patch"]), parse_diff(inst["test_patch"])
    assert all(p.endswith(".py") and not is_test_file(p) for p in gold), gold
    assert all(is_test_file(p) for p in tests), tests
    assert not set(gold) & set(tests)


@pytest.mark.parametrize("inst", instances(), ids=lambda i: i["instance_id"])
def test_tests_are_in_the_test_files_the_test_patch_touches(inst):
    touched = set(parse_diff(inst["test_patch"]))
    f2p, p2p = inst["FAIL_TO_PASS"], inst["PASS_TO_PASS"]
    assert f2p, "at least one FAIL_TO_PASS test"
    assert len(set(f2p)) == len(f2p) and len(set(p2p)) == len(p2p) and not set(f2p) & set(p2p)
    for node in f2p + p2p:
        # as `pytest -rA` prints it (no spaces: swebench's log parser splits lines on whitespace)
        assert re.fullmatch(r"[^\s:]+\.py(::[^\s:\[]+)+(\[\S*\])?", node), node
        assert node.split("::")[0] in touched, node
        assert node.split("::")[0] in inst["test_cmd"].split()
    added = "\n".join(l for l in inst["test_patch"].splitlines() if l.startswith("+"))
    for node in f2p:
        # the fix's test (or its class, for a changed test) is in the test_patch, or for a test
        # parametrized by data the test_patch adds, that data
        names = [part.split("[")[0] for part in node.split("::")[1:]]
        params = node.partition("[")[2].rstrip("]").split("-") if "[" in node else []
        assert (any(re.search(rf"\b{re.escape(n)}\b", inst["test_patch"]) for n in names)
                or params and all(p in added for p in params)), node


@pytest.mark.parametrize("inst", instances(), ids=lambda i: i["instance_id"])
def test_environment_pins_the_sdist_and_the_test_dependencies(inst):
    text = inst["environment"]["dockerfile"]
    lines = text.splitlines()
    assert set(inst["environment"]) == {"dockerfile"}
    assert lines[:2] == ["ARG BASE", "FROM ${BASE}"] and lines[-1] == "WORKDIR /testbed"
    fetch = next(l for l in lines if "files.pythonhosted.org" in l)
    assert re.search(r"echo '[0-9a-f]{64}  /tmp/\S+\.tar\.gz' \| sha256sum -c -", fetch)
    assert "/testbed" in text and "git init" in text and "commit" in text
    # the index written again without stat data (inode numbers, ctimes): the same image ID in every store
    git = next(l for l in lines if "git init" in l)
    assert git.endswith(" && git read-tree HEAD"), git
    for line in lines:
        if line.startswith("RUN "):
            assert re.match(r"RUN --network=(default|none) ", line), line
        if "pip install" in line and "-e ." not in line:
            reqs = line.split("--no-deps", 1)[1].split()
            assert reqs and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", r) for r in reqs), line
            assert any(r.startswith("pytest==") for r in reqs)
    assert inst["test_cmd"].startswith("python3 -m pytest -rA ")


def test_every_project_has_its_licence_and_every_instance_is_documented():
    readme = (DATA / "README.md").read_text()
    for iid, src in sources().items():
        licence = DATA / "LICENSES" / f"{src['project']}.txt"
        assert licence.is_file() and len(licence.read_text()) > 200, licence
        assert iid in readme and src["changelog"]


@pytest.mark.skipif(not shutil.which("git"), reason="the script diffs with git")
def test_the_script_keeps_only_the_chosen_hunks():
    spec = importlib.util.spec_from_file_location("evalset_script", ROOT / "scripts" / "evalset.py")
    evalset = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evalset)
    old = "".join(f"line {n}\n" for n in range(1, 41))
    new = old.replace("line 5\n", "line five\n").replace("line 30\n", "").replace("line 40\n", "line 40\nline 41\n")
    assert len(evalset.hunks(evalset.git_diff(old, new, "f.py"))) == 3
    assert evalset.keep_hunks(old, new, [2]) == old.replace("line 30\n", "")
    assert evalset.keep_hunks(old, new, [1, 3]) == new.replace("line 29\n", "line 29\nline 30\n")
    assert evalset.keep_hunks(old, new, "all") == new
    patch = evalset.git_diff(old, evalset.keep_hunks(old, new, [2]), "pkg/f.py")
    assert parse_diff(patch) == ["pkg/f.py"] and "-line 30" in patch and "line five" not in patch
    created = evalset.git_diff(None, "x = 1\n", "tests/test_new.py")
    assert parse_diff(created) == ["tests/test_new.py"] and "--- /dev/null" in created
