"""Tree search that repairs a real failing test: python-semver__python-semver-426 of data/evalset
(semver 3.0.1: `Version.replace()` on a subclass returns a plain Version).

From the instance's environment image, a beam search (sandtree.exploration.search) forks one branch per
candidate patch; each branch applies its patch, runs the instance's tests with its test_patch applied (and
reverted after, so the image holds the candidate fix only), and is scored by the fraction of FAIL_TO_PASS +
PASS_TO_PASS tests that passed (swebench's own pytest log parser). Scores are annotated on the images, and
the search tree is exported with `trace_export` (JSONL) for inspection.

    python examples/tree_search.py [--home H] [--from-home STORE | --base IMAGE --network RULE ...] [-o trace.jsonl]

The environment image is `eval/python-semver__python-semver-426` in the store; when absent it is copied (by
bundle) from --from-home, else built from the instance's Dockerfile on --base with --network (README
"SWE-bench-style instances")."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from swebench.harness.log_parsers.python import parse_log_pytest

import sandtree
from sandtree import evaluation
from sandtree.exploration import search

IID = "python-semver__python-semver-426"
INSTANCES = Path(__file__).resolve().parent.parent / "data" / "evalset" / "instances.jsonl"


def candidates(gold: str) -> dict[str, str]:
    """Wrong fixes beside the gold one: each changes the same line another way."""
    def variant(new_line: str) -> str:
        return gold.replace("+            return type(self)(**version)  # type: ignore",
                            f"+            {new_line}  # type: ignore")
    return {"returns-self": variant("return self"),
            "base-class": variant("return type(self).__mro__[-2](**version)"),
            "gold": gold,
            "copy-then-replace": variant("return Version(**version).replace()")}


def environment(st: sandtree.Sandtree, inst: dict, args) -> sandtree.Image:
    tag = f"eval/{IID}"
    try:
        return st.image(tag)
    except sandtree.ImageNotFound:
        pass
    if args.from_home:
        other = sandtree.Sandtree(args.from_home, warm=0)
        with tempfile.TemporaryDirectory() as d:
            try:
                image = other.image(tag).id
                other.bundle(f"{d}/env.bundle", [image])
            finally:
                other.close()
            st.import_bundle(f"{d}/env.bundle")
        return st.tag(image, tag)
    return st.image(evaluation.environment(st.engine, inst, base=args.base, build_network=args.network or None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", help="the store (default $SANDTREE_HOME)")
    ap.add_argument("--from-home", help="a store holding eval/" + IID + " to copy it from")
    ap.add_argument("--base", help="the base image to build the environment on (python3, pip, git)")
    ap.add_argument("--network", action="append", default=[], help="the environment build's egress rules")
    ap.add_argument("-o", "--output", default="tree_search_trace.jsonl")
    args = ap.parse_args()

    inst = next(json.loads(line) for line in INSTANCES.read_text().splitlines() if IID in line)
    tests = inst["FAIL_TO_PASS"] + inst["PASS_TO_PASS"]
    patches = candidates(inst["patch"])
    files = [{"path": "/tmp/test.diff", "content": inst["test_patch"]}] + \
            [{"path": f"/tmp/{name}.diff", "content": p} for name, p in patches.items()]

    def expand(image: str) -> list[str]:
        if image != env.id:                      # one level of candidates: a fix is a patch on the environment
            return []
        return [f"cd /testbed && git apply /tmp/{name}.diff && git apply /tmp/test.diff && "
                f"{{ {inst['test_cmd']}; rc=$?; git apply -R /tmp/test.diff; exit $rc; }}" for name in patches]

    def score(rec) -> float:
        status = parse_log_pytest((rec.stdout + rec.stderr).decode(errors="replace"), None)
        return sum(status.get(t) == "PASSED" for t in tests) / len(tests)

    with sandtree.Sandtree(args.home) as st:
        env = environment(st, inst, args)
        t = time.monotonic()
        best = st.beam_search(env, expand, score, beam=2, depth=2, stop=1.0, files=files, timeout=600)
        seconds = time.monotonic() - t
        for n in best["nodes"]:
            name = next(k for k in patches if f"/tmp/{k}.diff" in n["command"])
            print(f"{n['image'][:12]}  {name:18} exit {n['exit_code']}  score {n['score']:.2f}")
        winner = next(k for k in patches if f"/tmp/{k}.diff" in best["path"][0])
        print(f"best: {winner} ({best['image'][:12]}, score {best['score']:.2f}) in {seconds:.1f}s")
        check = st.image(best["image"]).run(f"cd /testbed && git apply /tmp/test.diff && {inst['test_cmd']}",
                                            files=files, timeout=600, disposable=True)
        print(f"the best image with the test patch: pytest exit {check.exit_code}")
        out = st.trace_export(env, "jsonl", args.output)
        print(f"trace: {out['rows']} rows -> {out['file']}")


if __name__ == "__main__":
    main()
