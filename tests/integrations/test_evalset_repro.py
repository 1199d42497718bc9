"""Environments citable across machines (issue 37): every data/evalset environment, built from its
Dockerfile in two stores, has the same image ID in both: the session's Debian store (conftest's
bookworm, where test_eval.py builds the same environments with the same cache keys: whichever
runs first builds them) and a fresh store given the same base by bundle, as another machine would
get it. What used to differ: the git step's index holds stat
data (inode numbers, ctimes) and pip's .pyc files the install time; the recipe regenerates the
index without stat data and every RUN step gets SOURCE_DATE_EPOCH (hash-based .pyc files). The
environment's git work tree still reads as clean.

The registry is reached only through the sandbox's egress path (see test_network_pip.py for why
the policy names the gateway's address and why the base carries the host's CA bundle); skipped
with the reason when it is unreachable."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

import sandtree
from sandtree.errors import BuildFailed
from test_network_pip import HOST_BUNDLE, registry_rules

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "evalset")


def _instances() -> list[dict]:
    with open(os.path.join(DATA, "instances.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def given(bookworm, tmp_path_factory):
    """(bundle of the Debian base, its ID, a context holding the host's CA bundle, the build's network)."""
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft")
    rules = registry_rules()
    d = tmp_path_factory.mktemp("repro")
    src = sandtree.Sandtree(bookworm[0], warm=0)
    t = time.monotonic()
    try:
        src.bundle(str(d / "base.bundle"), [bookworm[1]])
    finally:
        src.close()
    print(f"\nthe base's bundle: {time.monotonic() - t:.1f} s")
    ctx = d / "ctx"
    ctx.mkdir()
    shutil.copyfile(HOST_BUNDLE, ctx / "ca.crt")
    return str(d / "base.bundle"), bookworm[1], str(ctx), rules


def build_every_environment(home: str, given, fresh: bool) -> tuple[dict, float, str]:
    """({instance_id: environment image ID}, seconds of the builds, git status in one) in the
    store at `home` (fresh: the base imported from its bundle first)."""
    bundle, base, ctx, rules = given
    s = sandtree.Sandtree(home, warm=0)
    try:
        if fresh:
            t = time.monotonic()
            s.import_bundle(bundle)
            print(f"the base imported into a fresh store in {time.monotonic() - t:.1f} s")
        site = s.recipe(base, context=ctx).copy("ca.crt", "/etc/ssl/certs/ca-certificates.crt").build().id
        ids, built = {}, {}
        t0 = time.monotonic()
        for inst in _instances():
            text = inst["environment"]["dockerfile"]
            if text not in built:
                try:
                    built[text] = s.build_context(None, text=text, build_args={"BASE": site}, network=rules).image
                except BuildFailed as exc:            # pragma: no cover - depends on the registry
                    msg = exc.message[-300:]
                    if "Connection" in msg or "resolution" in msg or "refused" in msg or "Network" in msg:
                        pytest.skip(f"the registry is unreachable through the egress path: {msg}")
                    raise
            ids[inst["instance_id"]] = built[text]
        seconds = time.monotonic() - t0
        r = s.image(ids[_instances()[0]["instance_id"]]).run(
            "cd /testbed && git status --porcelain && git diff --stat && git rev-parse HEAD", disposable=True)
        assert r.exit_code == 0, r.stderr
        return ids, seconds, r.stdout.decode()
    finally:
        s.engine.egress.stop_daemon()
        s.close()


def test_two_stores_build_every_evalset_environment_to_the_same_ids(bookworm, given, tmp_path):
    one, t1, git1 = build_every_environment(bookworm[0], given, fresh=False)
    two, t2, git2 = build_every_environment(str(tmp_path / "fresh"), given, fresh=True)
    print(f"{len(set(one.values()))} environments: {t1:.1f} s in the session's store, {t2:.1f} s in the fresh one")
    assert set(one) == {i["instance_id"] for i in _instances()}
    assert one == two, {k: (one[k], two[k]) for k in one if one[k] != two[k]}
    # the work tree reads as clean: the regenerated index matches the files (only HEAD's ID printed)
    assert git1 == git2 and len(git1.split()) == 1, git1
