"""`make bench` rows for reaching a sandtree cluster through Ray Client (`ray://HOST:PORT`, the
head's proxy) against the GCS address (HOST:PORT): the time to connect (ray.init, and a whole
Sandtree() with its node actors found), and p50/p90 of sequential runs on a node: /bin/true (one
answer), `echo x` with an on_output callback (streamed: through Ray Client pulled, cluster/pulled.py),
and a key's echo through a node's terminal. A real Ray cluster on this machine (tests/raycluster.py:
a head without CPUs, one worker node of 1 CPU); the nodes share one SQLite store (one machine).
Each address is measured by a process of its own (a process holds one Ray connection).

    PYTHONPATH=src .venv/bin/python bench/rayclient.py [-n 100]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.dirname(__file__))
from conftest import make_rootfs  # noqa: E402
from raycluster import RayCluster  # noqa: E402
import workdir  # noqa: E402  (bench/workdir.py)

import sandtree  # noqa: E402


def measure(home: str, image: str, address: str, n: int) -> dict:
    """(in the child) connect to `address`, then the runs: {row: (p50, p90) or seconds}."""
    import ray

    from cluster import keystroke_ms, p50_ms
    t = time.perf_counter()
    ray.init(address=address, namespace="sandtree", log_to_driver=False, logging_level="WARNING")
    connected = time.perf_counter() - t
    st = sandtree.Sandtree(home, cluster=address, warm=0)
    ready = time.perf_counter() - t
    eng = st.engine
    out = {"connect (ray.init), s": connected, "connect and find the nodes (Sandtree()), s": ready,
           "run of /bin/true": p50_ms(lambda: eng.run(image, ["/bin/true"]), n),
           "run of `echo x` with on_output (streamed)":
               p50_ms(lambda: eng.run(image, ["echo", "x"], on_output=lambda s, c: None), n),
           "a key's echo through a node's terminal": keystroke_ms(eng, image, n)}
    st.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("--measure", nargs=3, metavar=("HOME", "IMAGE", "ADDRESS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print("RESULT=" + json.dumps(measure(*args.measure, args.n)))
        return
    work = tempfile.mkdtemp(prefix="st-bench-rayclient-")
    ray_cluster = RayCluster()
    results = {}
    try:
        ray_cluster.start(workers=1)
        home = os.path.join(work, "home")
        local = sandtree.Sandtree(home, cluster="")
        image = local.import_image(make_rootfs(os.path.join(work, "rootfs"))).id
        local.close()
        for label, address in (("GCS (HOST:PORT)", ray_cluster.address), ("Ray Client (ray://)", ray_cluster.client_address)):
            out = subprocess.run([sys.executable, __file__, "-n", str(args.n), "--measure", home, image, address],
                                 capture_output=True, text=True, timeout=900)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT=")), None)
            if line is None:
                raise SystemExit(f"{label}: {out.stderr[-2000:]}")
            results[label] = json.loads(line[7:])
    finally:
        ray_cluster.stop()
        workdir.remove_unless_mounted(work)
    from rich.console import Console
    from rich.table import Table
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    t = Table(title=f"a cluster through the GCS and through Ray Client (1 node; n={args.n}; load {load}; "
                    f"{os.cpu_count()} CPUs): ms p50 / p90, or s")
    t.add_column("what")
    for label in results:
        t.add_column(label)
    for row in next(iter(results.values())):
        cells = []
        for label in results:
            v = results[label][row]
            cells.append(f"{v:.2f}" if isinstance(v, float) else f"{v[0]:.2f} / {v[1]:.2f}")
        t.add_row(row, *cells)
    Console().print(t)


if __name__ == "__main__":
    main()
