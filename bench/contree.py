"""Contree's /v1 instances (issue 16): every instance is a live run (engine/processes/instances.py: a live
sandbox its subprocesses join), against the plain run it was before. Rows, each an operation
submitted and awaited through engine.operations (what /v1 adapts), /bin/true, disposable as /v1
sends it ("ephemeral": the end state kept as an unlisted image):
  plain run; live run, its sandbox started cold and stopped before the run's record (how it was
  before the stop moved off the run's path: the same engine with that step made inline); live run,
  started cold; live run from the image's warm pool (size 2, refilled between runs, untimed).
The rows sampled in turn so all see the same machine, SETTLE apart (untimed). `python bench/contree.py [-n N]`
runs it alone (the before/after numbers: run it with PYTHONPATH at each tree's src)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import make_rootfs  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import sandtree  # noqa: E402
import workdir  # noqa: E402  (bench/workdir.py)


SETTLE = 0.02                 # seconds between samples (an agent's client between two instances)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def contree_table(st, img, n: int) -> Table:
    """The three rows sampled in turn (rotating order), on two images with the same files: `img`
    with a warm pool of 2 (refilled before each sample, untimed), and a child of it without one."""
    eng, ops = st._engine, st._engine.operations
    cold = img.run("touch /.contree-bench").image.id          # the same files but one: no pool
    inst = ops.instances
    background = getattr(inst, "stopper", None)

    class Inline:                                # the sandbox stopped before the run's record (before)
        def submit(self, fn, *a):
            fn(*a)

    def one(kind: str) -> float:
        time.sleep(SETTLE)                       # untimed: what the last run left behind is done
        eng.pool_wait(img.id)
        if background is not None:
            inst.stopper = Inline() if kind == "inline" else background
        t = time.perf_counter()
        op = ops.submit_run(img.id if kind == "pool" else cold, ["/bin/true"], disposable="ephemeral",
                            **({} if kind == "plain" else {"live": True}))
        rec = ops.wait([op], 60)[0]
        el = time.perf_counter() - t
        assert rec["status"] == "done", rec
        return el

    eng.pool_and_wait(img.id, 2)
    kinds = ["plain", "inline", "cold", "pool"] if background is not None else ["plain", "cold", "pool"]
    for k in kinds:
        one(k)
    before = eng.pool_list()[0]["served"]
    xs: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(n):
        for k in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
            xs[k].append(one(k))
    served = eng.pool_list()[0]["served"] - before
    eng.pool_remove(img.id)
    if background is not None:
        inst.stopper = background
    rows = [("plain run (what a /v1 instance was)", xs["plain"])]
    if "inline" in xs:
        rows.append(("live run, cold, its sandbox stopped before its record (as before)", xs["inline"]))
    rows += [("live run, its sandbox started cold", xs["cold"]),
            (f"live run from the image's warm pool ({served}/{n} from it)", xs["pool"])]
    table = Table(title=f"Contree /v1 instances ({n} samples each, {os.cpu_count()} CPUs, load "
                        f"{os.getloadavg()[0]:.1f})")
    for c in ("what", "p50 ms", "p90 ms", "vs plain p50"):
        table.add_column(c, justify="right" if c != "what" else "left")
    for name, v in rows:
        table.add_row(name, f"{pct(v, 50) * 1e3:.2f}", f"{pct(v, 90) * 1e3:.2f}",
                      f"{statistics.median(v) / statistics.median(xs['plain']):.2f}x")
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=100)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sandtree-bench-contree-")
    try:
        st = sandtree.Sandtree(os.path.join(work, "home"))
        img = st.import_image(make_rootfs(os.path.join(work, "rootfs")))
        Console(width=120).print(contree_table(st, img, args.n))
        st.close()
    finally:
        workdir.remove_unless_mounted(work)


if __name__ == "__main__":
    main()
