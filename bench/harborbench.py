"""`make bench` rows for Harbor on sandtree (issue 37): a Harbor trial's environment overhead, start + stop
with the environment cached (SandtreeEnvironment as Harbor's trial calls it: bench/harbortrial.py, on
Harbor's own Python, scripts/install-harbor), and Harbor jobs (`harbor run`, its oracle agent, 2 trials
at once) over data/evalset's 14 SWE-bench-format instances: trials per minute on this machine.

Harbor's docker environment, for comparison, is not measured here (no Docker engine runs on this machine):
- its start is at least a container start: `docker run --rm busybox true` 0.5 s on an 8-core i7, 1.7-6.7 s
  on smaller machines (github.com/moby/moby/issues/38077), before `docker compose up`'s own work;
- its stop is `docker compose down`, and harbor 0.26's compose file runs the main service as
  `command: ["sh", "-c", "sleep infinity"]` without `init:` (environments/docker/docker-compose-build.yaml
  in its wheel): PID 1 of a namespace ignores SIGTERM it has no handler for, so every down waits out
  Docker's default 10 s stop timeout before its SIGKILL (the same mechanism inspect_ai's SWE-bench runs
  show as "Removed 14.2s" with a 15 s timeout: github.com/UKGovernmentBEIS/inspect_ai/issues/509).
So Docker's per-trial container cost is >= 10.5 s; the comparison uses that floor. Goal: >= 10x less.

The Debian image for the evalset rows: $SANDTREE_TEST_BOOKWORM (HOME:IMAGE) if set, else bootstrapped
(skipped with --quick). Alone: `PYTHONPATH=src python bench/harborbench.py [--quick] [-n 30]`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from conftest import make_rootfs  # noqa: E402
from harbortasks import harbor_python, hello_tasks, job_config, swe_task, trials  # noqa: E402

import sandtree  # noqa: E402
import workdir  # noqa: E402  (bench/workdir.py)
from evalbench import DATA, HOST_BUNDLE, registry_rules  # noqa: E402

DOCKER_START_S = 0.5       # moby#38077: `docker run --rm busybox true`, the fastest machine reported
DOCKER_STOP_S = 10.0       # `docker compose down` of harbor's `sleep infinity` PID 1: Docker's default stop timeout
SRC = os.path.join(HERE, "..", "src")
GOAL = 10.0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.path.abspath(SRC), "HARBOR_TELEMETRY": "0"}


def overhead_rows(py: str, work: str, n: int) -> list[tuple[str, str, str]]:
    home = os.path.join(work, "home")
    st = sandtree.Sandtree(home, warm=2)
    try:
        st.import_image(make_rootfs(os.path.join(work, "rootfs")), tag="harbor-base")
    finally:
        st.close()
    task = hello_tasks(os.path.join(work, "tasks"), "harbor-base")[0]
    p = subprocess.run([py, os.path.join(HERE, "harbortrial.py"), task, home, str(n)], env=_env(),
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        return [(f"harbor: the trial overhead run failed: {p.stderr[-300:]}", "-", "")]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    total = [a + b for a, b in zip(got["start"], got["stop"])]
    docker = DOCKER_START_S + DOCKER_STOP_S
    p50 = statistics.median(total)
    return [
        (f"Harbor trial environment overhead, start + stop, environment cached ({n} trials): p50 ms",
         f"{p50 * 1e3:.0f}", f"{docker / p50:.0f}x less than Harbor's docker environment's >= {docker:.1f} s "
         f"(goal >= {GOAL:.0f}x); {DOCKER_START_S / p50:.1f}x Docker's bare container start"),
        ("  p95 ms", f"{pct(total, 95) * 1e3:.0f}", ""),
        ("  start (build cache hit, live sandbox, log dirs): p50 ms", f"{statistics.median(got['start']) * 1e3:.0f}", ""),
        ("  stop (commit + tag + record + stop): p50 ms", f"{statistics.median(got['stop']) * 1e3:.0f}", ""),
    ]


def _bookworm(work: str, quick: bool):
    reuse = os.environ.get("SANDTREE_TEST_BOOKWORM", "")
    if reuse:
        home, _, image = reuse.rpartition(":")
        return sandtree.Sandtree(home, warm=2), image
    if quick or not shutil.which("debootstrap"):
        return None, "no Debian image: set SANDTREE_TEST_BOOKWORM=HOME:IMAGE or run without --quick"
    st = sandtree.Sandtree(os.path.join(work, "eval-home"), warm=2)
    return st, st.bootstrap("debian:bookworm", include=["python3-pip", "git", "patch"]).id


def evalset_rows(py: str, work: str, quick: bool) -> list[tuple[str, str, str]]:
    from sandtree import evaluation
    st, image = _bookworm(work, quick)
    if st is None:
        return [(f"harbor evalset jobs: skipped ({image})", "-", "")]
    with open(DATA) as f:
        insts = [json.loads(line) for line in f if line.strip()]
    try:
        ctx = os.path.join(work, "site")
        os.makedirs(ctx, exist_ok=True)
        shutil.copyfile(HOST_BUNDLE, os.path.join(ctx, "ca.crt"))
        base = st.recipe(image, context=ctx).copy("ca.crt", "/etc/ssl/certs/ca-certificates.crt").build().id
        rules = registry_rules()
        for inst in insts:                        # the environments, cached before measuring
            evaluation.environment(st.engine, inst, base=base, build_network=rules)
        home = st.home
    except Exception as e:                        # the registry unreachable, ...
        return [(f"harbor evalset jobs: the environments did not build: {type(e).__name__}: {str(e)[-200:]}", "-", "")]
    finally:
        st.close()
    tasks_dir = os.path.join(work, "swe-tasks")
    tasks = [swe_task(tasks_dir, inst, f"eval/{inst['instance_id']}") for inst in insts]
    name = "evalset"
    cfg = job_config(os.path.join(work, f"{name}.json"), name, os.path.join(work, "jobs"), tasks, {"home": home},
                     concurrent=2)
    t = time.monotonic()
    p = subprocess.run([os.path.join(os.path.dirname(py), "harbor"), "run", "-c", cfg, "-y"], env=_env(),
                       capture_output=True, text=True, timeout=3600, cwd=work)
    wall = time.monotonic() - t
    if p.returncode != 0:
        return [(f"harbor evalset job failed: {p.stderr[-300:]}", "-", "")]
    got = trials(os.path.join(work, "jobs", name))
    resolved = sum(1 for t in got.values()
                   if ((t["result"].get("verifier_result") or {}).get("rewards") or {}).get("reward") == 1.0)
    per = [t["result"] for t in got.values()]
    setup = [_seconds(r.get("environment_setup")) for r in per]
    rows = [(f"harbor job, {len(tasks)} data/evalset tasks, oracle agent, 2 at once: trials/min",
             f"{len(got) / wall * 60:.1f}", f"{resolved}/{len(tasks)} resolved; wall {wall:.0f} s (Harbor's own "
             "start included)")]
    setup = [s for s in setup if s is not None]
    if setup:
        rows.append(("  environment setup per trial (Harbor's timing: build cache hit + start): p50 ms",
                     f"{statistics.median(setup) * 1e3:.0f}", ""))
    return rows


def _seconds(timing) -> float | None:
    from datetime import datetime
    if not timing or not timing.get("started_at") or not timing.get("finished_at"):
        return None
    return (datetime.fromisoformat(timing["finished_at"]) - datetime.fromisoformat(timing["started_at"])).total_seconds()


def main() -> None:
    quick = "--quick" in sys.argv
    n = int(sys.argv[sys.argv.index("-n") + 1]) if "-n" in sys.argv else 30
    py, why = harbor_python()
    if py is None:
        print(f"harbor: skipped ({why}) | - |")
        return
    work = tempfile.mkdtemp(prefix="sandtree-harborbench-")
    try:
        rows = overhead_rows(py, work, n) + evalset_rows(py, work, quick)
        for row in rows:
            print(" | ".join(row))
    finally:
        for home in ("home", "eval-home"):
            try:
                from sandtree.network.client import Egress
                Egress(os.path.join(work, home)).stop_daemon()
            except Exception:
                pass
        workdir.remove_unless_mounted(work)


if __name__ == "__main__":
    main()
