"""`make bench` rows for the eval harness (issue 17): the real instance set (data/evalset) evaluated
with its gold patches, environments cached (built once before measuring, with the registry reached
through the sandbox's egress path), one worker then two; instances per minute, seconds per instance,
and the harness's own cost per instance (everything but the eval script: the run's fork of the
environment image and its commit, the patch step, writing and reading the run's files, grading)
beside what swebench's Docker harness spends per instance on its container alone.

The Docker numbers are published ones, not measured here (no Docker engine runs on this machine):
- swebench's harness stops each instance's container with `docker stop --time=15` (swebench
  harness/docker_utils.py cleanup_container) and its PID 1 is `tail -f /dev/null`, which as a
  namespace's init ignores SIGTERM, so every stop waits out the 15 s: inspect_ai's SWE-bench runs
  show each container "Removed 14.2s" (github.com/UKGovernmentBEIS/inspect_ai/issues/509);
- starting a container at all: `docker run --rm busybox true` 0.5 s on an 8-core i7, 1.7-6.7 s on
  smaller machines (github.com/moby/moby/issues/38077).
So swebench's per-instance container start + cleanup is >= 14.7 s; 0.5 s is the floor of Docker's
start alone, the comparison least favourable to us.

The Debian image: $SANDTREE_TEST_BOOKWORM (HOME:IMAGE, the tests' store) if set, else bootstrapped
into the bench's store (skipped with --quick). Alone: `python bench/evalbench.py`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

import sandtree
import workdir  # bench/workdir.py (this script's folder is on sys.path when run or imported by bench.py)

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "evalset", "instances.jsonl")
REGISTRY = ["pypi.org", "files.pythonhosted.org"]
HOST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
DOCKER_STOP_S = 14.2        # inspect_ai#509: a SWE-bench container's stop + remove (swebench: docker stop --time=15)
DOCKER_START_S = 0.5        # moby#38077: `docker run --rm busybox true`, the fastest machine reported


def registry_rules() -> list[str]:
    """The registry's names, and its addresses where they are not public (a policy reaches a
    non-public address only when a rule names it: see tests/kernel/test_network_pip.py)."""
    ips = {a[4][0] for n in REGISTRY for a in socket.getaddrinfo(n, 443, socket.AF_INET)}
    return REGISTRY + sorted(f"{ip}:443" for ip in ips if not ipaddress.ip_address(ip).is_global)


def _store(work: str, quick: bool):
    reuse = os.environ.get("SANDTREE_TEST_BOOKWORM", "")
    if reuse:
        home, _, image = reuse.rpartition(":")
        return sandtree.Sandtree(home, warm=2), image
    if quick or os.geteuid() != 0 or not shutil.which("debootstrap"):
        return None, "no Debian image: set SANDTREE_TEST_BOOKWORM=HOME:IMAGE or run without --quick as root"
    st = sandtree.Sandtree(os.path.join(work, "eval-home"), warm=2)
    return st, st.bootstrap("debian:bookworm", include=["python3-pip", "git", "patch"]).id


def eval_rows(work: str, quick: bool = False) -> list[tuple[str, str, str]]:
    """(what, value, vs Docker) rows; one row saying why when they cannot run here."""
    st, image = _store(work, quick)
    if st is None:
        return [(f"eval: skipped ({image})", "-", "")]
    try:
        ctx = os.path.join(work, "eval-site")
        os.makedirs(ctx, exist_ok=True)
        shutil.copyfile(HOST_BUNDLE, os.path.join(ctx, "ca.crt"))
        base = st.recipe(image, context=ctx).copy("ca.crt", "/etc/ssl/certs/ca-certificates.crt").build().id
        rules = registry_rules()
        out = os.path.join(work, "eval-out")
        t = time.monotonic()
        warmup = st.eval(DATA, validate="gold", base=base, run_id="bench-build", out_dir=out, build_network=rules)
        build_s = time.monotonic() - t
        if not warmup["validation"]["ok"]:
            return [(f"eval: the environments did not build or resolve: {warmup['validation']['why']}", "-", "")]
        rows = []
        for workers in (1, 2):
            events = []
            t = time.monotonic()
            s = st.eval(DATA, validate="gold", base=base, run_id=f"bench-{workers}", out_dir=out, workers=workers,
                        build_network=rules, progress=events.append)
            wall = time.monotonic() - t
            n = s["evaluated_instances"]
            assert s["validation"]["ok"] and n == s["total_instances"], s["validation"]
            rows.append((f"eval of {n} instances, {workers} worker(s), environments cached: instances/min",
                         f"{n / wall * 60:.1f}", ""))
            rows.append((f"  seconds per instance ({workers} worker(s), wall / instances)", f"{wall / n:.2f}", ""))
            if workers == 1:
                over = []
                for ev in events:
                    if ev.get("status") != "resolved":
                        continue
                    path = os.path.join(out, f"bench-{workers}", "gold", ev["instance_id"], "report.json")
                    with open(path) as f:
                        rep = json.load(f)
                    over.append(ev["seconds"] - rep[ev["instance_id"]]["sandtree"]["seconds"]["tests"])
                p50 = statistics.median(over)
                rows.append(("  harness cost per instance, eval script excluded (fork, patch, commit, records): p50 ms",
                             f"{p50 * 1e3:.0f}",
                             f"{(DOCKER_START_S + DOCKER_STOP_S) / p50:.0f}x fewer s than swebench's container "
                             f"start + stop ({DOCKER_START_S + DOCKER_STOP_S:.1f} s); {DOCKER_START_S / p50:.1f}x "
                             f"Docker's bare start ({DOCKER_START_S} s)"))
                rows.append(("  max ms", f"{max(over) * 1e3:.0f}", ""))
        rows.append(("  first run: environments built (or found in the build cache), not in the rows above: s",
                     f"{build_s:.1f}", ""))
        return rows
    finally:
        st.close()


def main() -> None:
    work = tempfile.mkdtemp(prefix="sandtree-evalbench-")
    try:
        for row in eval_rows(work, quick="--quick" in sys.argv):
            print(" | ".join(row))
    finally:
        workdir.remove_unless_mounted(work)


if __name__ == "__main__":
    main()
