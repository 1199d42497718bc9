#!/usr/bin/env python3
"""Build and verify data/evalset/instances.jsonl from data/evalset/sources.json (README there).

    python scripts/evalset.py diff PROJECT X Y [FILE...]   # numbered hunks of the sdists' diff, to choose from
    python scripts/evalset.py make [ID...]                 # sources.json -> instances.jsonl (+ LICENSES/)
    python scripts/evalset.py verify [ID...]               # every instance checked on sandtree

A source (one per instance) names the project, the release X with the bug, the release Y with the
fix, the hunks of Y's diff to keep (`{"path": "all" | [hunk numbers]}`, numbered as `diff` prints
them) for the gold patch (source files) and the test_patch (test files), and the FAIL_TO_PASS tests.
`make` downloads both sdists on the host (pip download, hash from PyPI's JSON simple API), cuts the
patches, writes the environment's Dockerfile, then runs the test file(s) on sandtree with both
patches applied to fill PASS_TO_PASS (every other test that passes there; FAIL_TO_PASS "auto": the
tests that pass there and fail or error with the test patch alone; a source's "flaky" tests, which
depend on wall-clock timing, are left out of PASS_TO_PASS). `verify` checks each
instance the way the eval does: gold + test patch -> FAIL_TO_PASS and PASS_TO_PASS pass; test patch
only -> FAIL_TO_PASS fail, PASS_TO_PASS pass.

Needs root (sandtree), the host's pip and PyPI reachable from the host (make) and through the
sandbox's egress path (the environments' RUN --network steps). Environment: EVALSET_HOME (the
sandtree store, default /work/scratch/evalset/home), EVALSET_BASE (the base image: Debian with
python3, pip, git, patch; default: the session's bookworm image), EVALSET_BASE_HOME (a store to
copy BASE from when EVALSET_HOME lacks it, default the session's), EVALSET_SITE_CA (a CA bundle put
into BASE's /etc/ssl/certs/ca-certificates.crt, "" for none: see data/evalset/README.md),
EVALSET_CACHE (sdists), EVALSET_PIP (the host's pip).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "evalset"
SOURCES = DATA / "sources.json"
INSTANCES = DATA / "instances.jsonl"
HOME = os.environ.get("EVALSET_HOME", "/work/scratch/evalset/home")
BASE = os.environ.get("EVALSET_BASE", "e7802a9d6c014c3782aa216cd6bfd26c888c4f1fee7685d3ce371b2c13dce098")
CACHE = Path(os.environ.get("EVALSET_CACHE", "/work/scratch/evalset/sdists"))
SITE_CA = os.environ.get("EVALSET_SITE_CA", "/etc/ssl/certs/ca-certificates.crt")
BASE_HOME = os.environ.get("EVALSET_BASE_HOME", "/work/scratch/bookworm/home")
PIP = os.environ.get("EVALSET_PIP", "/work/main/.venv/bin/pip")
PYPI = ["pypi.org", "files.pythonhosted.org"]
PIP_INSTALL = "pip install --break-system-packages --no-cache-dir --no-deps"

# ---- sdists on the host --------------------------------------------------------------------------

def release(project: str, version: str) -> dict:
    """The sdist of a release: its file name, URL, sha256 and upload time (PyPI's JSON simple API)."""
    req = urllib.request.Request(f"https://pypi.org/simple/{project}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        files = json.load(r)["files"]
    norm = re.sub(r"[-_.]+", "_", project).lower()
    for f in files:
        stem, _, ext = f["filename"].partition(f"-{version}.")
        if ext == "tar.gz" and re.sub(r"[-_.]+", "_", stem).lower() == norm:
            return {"filename": f["filename"], "url": f["url"], "sha256": f["hashes"]["sha256"],
                    "uploaded": f["upload-time"]}
    raise SystemExit(f"no sdist of {project} {version} on PyPI")


def sdist_tree(project: str, version: str) -> tuple[dict, Path]:
    """Download (once) and unpack the sdist; its release record and the unpacked top directory."""
    rel = release(project, version)
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / rel["filename"]
    if not path.exists():
        subprocess.run([PIP, "download", "-q", "--no-deps", "--no-binary", ":all:", f"{project}=={version}",
                        "-d", str(CACHE)], check=True)
    if hashlib.sha256(path.read_bytes()).hexdigest() != rel["sha256"]:
        raise SystemExit(f"{path}: sha256 differs from PyPI's")
    out = CACHE / "unpacked" / f"{project}-{version}"
    if not out.exists():
        with tarfile.open(path) as t:
            t.extractall(out, filter="data")
    tops = [p for p in out.iterdir() if p.is_dir()]
    return rel, tops[0]

# ---- patches ------------------------------------------------------------------------------------

def git_diff(old: str | None, new: str | None, path: str) -> str:
    """A `diff --git a/PATH b/PATH` of two texts (None: the file does not exist), as git writes it."""
    with tempfile.TemporaryDirectory() as d:
        a, b = Path(d, "a", path), Path(d, "b", path)
        for p, text in ((a, old), (b, new)):
            p.parent.mkdir(parents=True, exist_ok=True)
            if text is not None:
                p.write_text(text)
        r = subprocess.run(["git", "diff", "--no-index", "--no-color", "--no-ext-diff", "--no-prefix",
                            f"a/{path}" if old is not None else "/dev/null",
                            f"b/{path}" if new is not None else "/dev/null"],
                           cwd=d, capture_output=True, text=True)
        if r.returncode not in (0, 1):
            raise SystemExit(r.stderr)
        # --no-index names a side it lacks by the other's path; the header must say a/PATH b/PATH
        return re.sub(r"^diff --git \S+ \S+$", f"diff --git a/{path} b/{path}", r.stdout, count=1, flags=re.M)


HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def hunks(diff: str) -> list[list[str]]:
    """The hunks of a one-file unified diff, each as its lines (the @@ line first)."""
    out: list[list[str]] = []
    for line in diff.splitlines(keepends=True):
        if HUNK.match(line):
            out.append([line])
        elif out:
            out[-1].append(line)
    return out


def keep_hunks(old: str, new: str, keep) -> str:
    """`old` with only the chosen hunks (numbers from 1) of old->new applied."""
    if keep == "all":
        return new
    olds = old.splitlines(keepends=True)
    result, at = [], 0
    for n, h in enumerate(hunks(git_diff(old, new, "f")), 1):
        if n not in keep:
            continue
        start = int(HUNK.match(h[0]).group(1)) - 1 + (0 if HUNK.match(h[0]).group(2) != "0" else 1)
        result += olds[at:start]
        body = [l for l in h[1:] if not l.startswith("\\")]
        at = start + sum(1 for l in body if l[:1] in (" ", "-"))
        result += [l[1:] for l in body if l[:1] in (" ", "+")]
    return "".join(result + olds[at:])


def cut(tree_x: Path, tree_y: Path, files: dict) -> str:
    """The patch of the chosen hunks of each file, X's tree to Y's."""
    parts = []
    for path, keep in files.items():
        px, py = tree_x / path, tree_y / path
        old = px.read_text() if px.exists() else None
        new = py.read_text() if py.exists() else None
        if old is None or new is None:
            if keep != "all":
                raise SystemExit(f"{path}: a created or deleted file is taken whole")
            parts.append(git_diff(old, new, path))
        else:
            parts.append(git_diff(old, keep_hunks(old, new, keep), path))
    return "".join(parts)

# ---- the environment ----------------------------------------------------------------------------

def dockerfile(src: dict, rel: dict) -> str:
    """The environment: the sdist (hash checked) unpacked in /testbed as a one-commit git work tree,
    the exact test dependencies, the project installed in develop mode."""
    fetch = ("python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "
             f"{rel['url']} /tmp/{rel['filename']} && echo '{rel['sha256']}  /tmp/{rel['filename']}' | sha256sum -c -")
    # the commit's dates are the release's, so its ID is the same in every build of the environment;
    # `git read-tree HEAD` writes the index again without the stat data `git add` put in it (inode
    # numbers, ctimes: another build, another index, another image ID); git compares the files'
    # contents where the index has no stat data, so the work tree still reads as clean
    uploaded = datetime.datetime.fromisoformat(rel["uploaded"].replace("Z", "+00:00"))
    stamp = f"@{int(uploaded.timestamp())} +0000"
    lines = [
        "ARG BASE",
        "FROM ${BASE}",
        f"RUN --network=default {fetch}",
        f"RUN --network=none mkdir /testbed && tar -xzf /tmp/{rel['filename']} -C /testbed --strip-components=1 && "
        f"rm /tmp/{rel['filename']} && cd /testbed && git init -q && git add -A && "
        f"GIT_AUTHOR_DATE='{stamp}' GIT_COMMITTER_DATE='{stamp}' git -c user.name=evalset "
        f"-c user.email=evalset@localhost commit -qm '{src['project']} {src['version']} (sdist)' && git read-tree HEAD",
        f"RUN --network=default {PIP_INSTALL} {' '.join(src['test_deps'] + src.get('build_deps', []))}",
        f"RUN --network=none cd /testbed && {PIP_INSTALL} --no-build-isolation -e .",
        "WORKDIR /testbed",
    ]
    return "\n".join(lines) + "\n"


def test_cmd(src: dict) -> str:
    files = " ".join(shlex.quote(f) for f in src["test_files"])
    return " ".join(["python3 -m pytest -rA -p no:cacheprovider", *src.get("pytest_args", []), files])

# ---- sandtree -----------------------------------------------------------------------------------

def open_store():
    sys.path.insert(0, str(ROOT / "src"))
    import sandtree
    return sandtree.Sandtree(HOME)


def registry_rules() -> list[str]:
    """The build's network: the registry's names, and the addresses they resolve to where those are
    not public (here every registry name resolves to the host's package gateway, 203.0.113.80, which
    a policy reaches only when a rule names it: tests/kernel/test_network_pip.py)."""
    ips = {a[4][0] for n in PYPI for a in socket.getaddrinfo(n, 443, socket.AF_INET)}
    return PYPI + sorted(f"{ip}:443" for ip in ips if not ipaddress.ip_address(ip).is_global)


def site_base(st) -> str:
    """BASE with this host's CA bundle (its package gateway's certificates are signed by a CA the
    host trusts and a fresh Debian image does not); BASE itself where the bundle is not set. BASE
    is copied (by bundle) from the store EVALSET_BASE_HOME when this store lacks it."""
    import sandtree
    try:
        st.image(BASE)
    except sandtree.ImageNotFound:
        with tempfile.TemporaryDirectory() as d:
            other = sandtree.Sandtree(BASE_HOME)
            try:
                other.bundle(f"{d}/base.bundle", [BASE])
            finally:
                other.close()
            st.import_bundle(f"{d}/base.bundle")
    if not SITE_CA:
        return BASE
    bundle = Path(SITE_CA).read_bytes()
    r = st.image(BASE).run("true", files=[{"path": "/etc/ssl/certs/ca-certificates.crt", "content": bundle,
                                           "mode": 0o644}])
    return r.image.id


def environment(st, inst: dict, base: str):
    rules = registry_rules()
    recipe = st.dockerfile(None, text=inst["environment"]["dockerfile"], build_args={"BASE": base}, network=rules)
    # (the parser gave each RUN its network: a network here too would turn on the --network=none steps)
    return st.build(recipe, tag=f"eval/{inst['instance_id']}").image


def run_tests(st, image, inst: dict, patches: list[str]) -> tuple[dict, str]:
    """Apply the patches with git apply, run test_cmd; pytest's statuses by node ID and the log."""
    from swebench.harness.log_parsers.python import parse_log_pytest
    files = [{"path": f"/tmp/patch{i}.diff", "content": p} for i, p in enumerate(patches)]
    apply = " && ".join(f"git apply -v /tmp/patch{i}.diff" for i in range(len(patches))) or "true"
    cmd = f"cd /testbed && {apply} && {inst['test_cmd']}"
    r = st.image(image).run(cmd, files=files, timeout=600, disposable=True)
    log = (r.stdout + r.stderr).decode(errors="replace")
    return parse_log_pytest(log, None), log

# ---- commands -----------------------------------------------------------------------------------

def load_sources(ids) -> list[dict]:
    sources = json.loads(SOURCES.read_text())
    return [s for s in sources if not ids or s["instance_id"] in ids]


def load_instances() -> list[dict]:
    return [json.loads(l) for l in INSTANCES.read_text().splitlines() if l.strip()] if INSTANCES.exists() else []


def cmd_diff(project: str, x: str, y: str, *paths: str) -> None:
    _, tx = sdist_tree(project, x)
    _, ty = sdist_tree(project, y)
    names = sorted({str(p.relative_to(t)) for t in (tx, ty) for p in t.rglob("*") if p.is_file()})
    for path in names:
        if paths and path not in paths or "egg-info" in path or path == "PKG-INFO":
            continue
        old = (tx / path).read_text(errors="replace") if (tx / path).exists() else None
        new = (ty / path).read_text(errors="replace") if (ty / path).exists() else None
        if old == new:
            continue
        d = git_diff(old, new, path)
        head = d.split("@@", 1)[0]
        print(head, end="")
        for n, h in enumerate(hunks(d), 1):
            print(f"#### hunk {n}\n" + "".join(h), end="")


def make_instance(src: dict) -> dict:
    rel_x, tx = sdist_tree(src["project"], src["version"])
    rel_y, ty = sdist_tree(src["project"], src["fixed"])
    lic = DATA / "LICENSES" / f"{src['project']}.txt"
    lic.parent.mkdir(parents=True, exist_ok=True)
    lic.write_text((tx / src["license"]).read_text())
    return {
        "instance_id": src["instance_id"],
        "repo": src["repo"],
        "version": src["version"],
        "base_commit": None,
        "patch": cut(tx, ty, src["source_files"]),
        "test_patch": cut(tx, ty, src["test_hunks"]),
        "FAIL_TO_PASS": src["FAIL_TO_PASS"],
        "PASS_TO_PASS": [],
        "problem_statement": src["problem_statement"],
        "hints_text": "",
        "created_at": rel_y["uploaded"],
        "environment_setup_commit": None,
        "environment": {"dockerfile": dockerfile(src, rel_x)},
        "test_cmd": test_cmd(src),
    }


def whole(node: str) -> bool:
    """A node ID the log parser read whole: it splits lines on whitespace, so a parameter with a
    space in it (`test_x[a b]`) comes out cut (`test_x[a`); such tests are left out."""
    return "[" not in node or node.endswith("]")


def cmd_make(*ids: str) -> None:
    done = {i["instance_id"]: i for i in load_instances()}
    st = open_store()
    try:
        for src in load_sources(ids):
            inst = make_instance(src)
            image = environment(st, inst, site_base(st))
            status, log = run_tests(st, image, inst, [inst["test_patch"], inst["patch"]])
            if src["FAIL_TO_PASS"] == "auto":      # what the gold patch turns from failing to passing
                bare, _ = run_tests(st, image, inst, [inst["test_patch"]])
                inst["FAIL_TO_PASS"] = sorted(t for t, s in status.items()
                                              if s == "PASSED" and bare.get(t) in ("FAILED", "ERROR") and whole(t))
            missing = [t for t in inst["FAIL_TO_PASS"] if status.get(t) != "PASSED"] or not inst["FAIL_TO_PASS"]
            if missing:
                print(log[-4000:])
                raise SystemExit(f"{inst['instance_id']}: with the gold patch these do not pass: {missing}")
            inst["PASS_TO_PASS"] = sorted(t for t, s in status.items()
                                          if s == "PASSED" and t not in inst["FAIL_TO_PASS"] and whole(t)
                                          and t not in src.get("flaky", ()))
            done[inst["instance_id"]] = inst
            print(f"{inst['instance_id']}: {image} F2P {len(inst['FAIL_TO_PASS'])} P2P {len(inst['PASS_TO_PASS'])}")
    finally:
        st.close()
    order = [s["instance_id"] for s in load_sources(())]
    INSTANCES.write_text("".join(json.dumps(done[i], sort_keys=False) + "\n" for i in order if i in done))


def verify(st, inst: dict) -> tuple[list[str], str]:
    """What is wrong with one instance on sandtree (nothing: an empty list), and a summary line."""
    image = environment(st, inst, site_base(st))
    problems = []
    gold, _ = run_tests(st, image, inst, [inst["test_patch"], inst["patch"]])
    bare, _ = run_tests(st, image, inst, [inst["test_patch"]])
    for t in inst["FAIL_TO_PASS"]:
        if gold.get(t) != "PASSED":
            problems.append(f"gold: FAIL_TO_PASS {t} is {gold.get(t)}")
        if bare.get(t) not in ("FAILED", "ERROR"):
            problems.append(f"test patch only: FAIL_TO_PASS {t} is {bare.get(t)}")
    for t in inst["PASS_TO_PASS"]:
        for name, status in (("gold", gold), ("test patch only", bare)):
            if status.get(t) != "PASSED":
                problems.append(f"{name}: PASS_TO_PASS {t} is {status.get(t)}")
    counts = {n: sum(1 for v in st_.values() if v == "PASSED") for n, st_ in (("gold", gold), ("bare", bare))}
    return problems, (f"image {image[:12]}; gold + test patch: {counts['gold']} passed; test patch only: "
                      f"{counts['bare']} passed, FAIL_TO_PASS {[bare.get(t) for t in inst['FAIL_TO_PASS']]}")


def cmd_verify(*ids: str) -> None:
    st = open_store()
    bad = 0
    try:
        for inst in load_instances():
            if ids and inst["instance_id"] not in ids:
                continue
            problems, summary = verify(st, inst)
            bad += bool(problems)
            print(f"{inst['instance_id']}: {'ok' if not problems else 'FAILED'} ({summary})")
            for p in problems:
                print("   ", p)
    finally:
        st.close()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    commands = {"diff": cmd_diff, "make": cmd_make, "verify": cmd_verify}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        raise SystemExit(__doc__)
    commands[sys.argv[1]](*sys.argv[2:])
