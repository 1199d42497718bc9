"""`make bench` rows for the cluster on Ray (issue 20 item 3): the dispatch overhead of a run sent
to a node actor against the same run in-process (p50 of sequential runs of /bin/true, and of a
no-op call to a node: the fabric's own round trip; and of `echo x` with and without an on_output
callback: the streamed call against the one-answer call), a key's echo through a terminal
(sandbox_popen with a pty: in-process, and relayed from a node's sandbox), and runs/s of /bin/true through st.map with 1
and then 2 worker nodes. A real Ray cluster on this machine (tests/raycluster.py: a head without
CPUs, worker nodes of 1 CPU each) and one PostgreSQL database (tests/pgcluster.py) shared by the
API side and the nodes, as are the store directory and its layers. On a 2-CPU machine every node,
the API process, PostgreSQL and Ray's own daemons share the same 2 cores: the second node adds a
CPU's worth of workers, not a machine, so the scaling measured is bounded by the CPUs.

    PYTHONPATH=src .venv/bin/python bench/cluster.py [-n 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import make_rootfs  # noqa: E402
from pgcluster import PgCluster  # noqa: E402
from raycluster import RayCluster  # noqa: E402
from terminal import keystroke_ms  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import sandtree  # noqa: E402
import workdir  # noqa: E402  (bench/workdir.py)


def p50_ms(fn, n: int) -> tuple[float, float]:
    for _ in range(5):                     # warm up (pools filled, connections open)
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9)]


def rate(st, image, n: int, parallel: int) -> float:
    t = time.perf_counter()
    res = st.map(image, [["/bin/true"]] * n, parallel=parallel)
    took = time.perf_counter() - t
    assert all(r.exit_code == 0 for r in res)
    return n / took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="st-bench-cluster-")
    rootfs = make_rootfs(os.path.join(work, "rootfs"))
    pg, ray_cluster = PgCluster().start(), RayCluster()
    rows = []
    try:
        ray_cluster.start(workers=1)
        url = pg.new_database()
        home = os.path.join(work, "home")
        local = sandtree.Sandtree(home, database=url, cluster="")
        image = local.import_image(rootfs)
        eng = local.engine
        lp50, lp90 = p50_ms(lambda: eng.run(image.id, ["/bin/true"]), args.n // 2)
        rows.append(("run of /bin/true, in-process", f"{lp50:.2f}", f"{lp90:.2f}"))
        lrate = rate(local, image, args.n, 8)
        lk50, lk90 = keystroke_ms(eng, image.id, args.n // 2)
        rows.append(("a key's echo through a terminal (sandbox_popen pty), in-process", f"{lk50:.2f}", f"{lk90:.2f}"))
        clustered = sandtree.Sandtree(home, database=url, cluster=ray_cluster.address)
        ceng = clustered.engine
        cp50, cp90 = p50_ms(lambda: ceng.run(image.id, ["/bin/true"]), args.n // 2)
        rows.append(("run of /bin/true, through the cluster (1 node)", f"{cp50:.2f}", f"{cp90:.2f}"))
        rows.append(("dispatch overhead (difference of p50s)", f"{cp50 - lp50:.2f}", ""))
        for label, kw in (("without on_output", {}), ("with on_output (streamed)", {"on_output": lambda s, c: None})):
            ep50, ep90 = p50_ms(lambda: ceng.run(image.id, ["echo", "x"], **kw), args.n // 2)
            rows.append((f"run of `echo x` through the cluster, {label}", f"{ep50:.2f}", f"{ep90:.2f}"))
        fabric = ceng.fabric
        nid = fabric.pick()
        np50, np90 = p50_ms(lambda: fabric._get(nid, fabric._actor(nid).owns.remote("x"), "a no-op"), args.n)
        rows.append(("no-op call to a node actor (the fabric's round trip)", f"{np50:.2f}", f"{np90:.2f}"))
        ck50, ck90 = keystroke_ms(ceng, image.id, args.n // 2)
        rows.append(("a key's echo through a terminal, its sandbox on a node (relayed)", f"{ck50:.2f}", f"{ck90:.2f}"))
        rate1 = rate(clustered, image, args.n, 8)
        ray_cluster.add_worker()
        deadline = time.monotonic() + 60
        while len(fabric.refresh()) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        rate(clustered, image, 20, 8)          # the new node's actor and engine started
        rate2 = rate(clustered, image, args.n, 8)
        clustered.close()
        local.close()
    finally:
        import ray                              # disconnect first: a driver watching its nodes die floods stderr
        ray.shutdown()
        ray_cluster.stop()
        pg.stop()
        workdir.remove_unless_mounted(work)      # never through a mount (PLATFORM.md)
    t = Table(title=f"cluster on Ray: dispatch (sequential runs, n={args.n // 2}); PostgreSQL metadata; "
                    f"{os.cpu_count()} CPUs")
    for c in ("what", "p50 ms", "p90 ms"):
        t.add_column(c)
    for r in rows:
        t.add_row(*r)
    Console().print(t)
    Console().print(f"runs/s of /bin/true through st.map (n={args.n}, parallel=8): in-process {lrate:.0f}, "
                    f"1 worker node {rate1:.0f}, 2 worker nodes {rate2:.0f} (x{rate2 / rate1:.2f}; "
                    f"{os.cpu_count()} CPUs shared by everything: CPU-bound)")


if __name__ == "__main__":
    main()
