"""Contree's /v1 instances (issue 16): every instance is a live run (engine/instances.py: a live
sandbox its subprocesses join), against the plain run it was before. Rows, each an operation
submitted and awaited through engine.operations (what /v1 adapts), /bin/true, disposable as /v1
sends it ("ephemeral": the end state kept as an unlisted image):
  plain run; live run, its sandbox started cold; live run from the image's warm pool (size 2,
  refilled between runs, untimed: every run checked to come from it).
Alternating plain and live samples so both see the same machine, SETTLE apart (untimed). `python bench/contree.py [-n N]`
runs it alone (the before/after numbers: run it with PYTHONPATH at each tree's src)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import make_rootfs  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import sandtree  # noqa: E402


SETTLE = 0.02                 # seconds between samples (an agent's client between two instances)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def contree_table(st, img, n: int) -> Table:
    ops = st._engine.operations

    def one(live: bool) -> float:
        time.sleep(SETTLE)                       # untimed: what the last run left behind is done
        t = time.perf_counter()
        op = ops.submit_run(img.id, ["/bin/true"], disposable="ephemeral", **({"live": True} if live else {}))
        rec = ops.wait([op], 60)[0]
        el = time.perf_counter() - t
        assert rec["status"] == "done", rec
        return el

    for _ in range(5):
        one(False), one(True)
    plain, live = [], []
    for _ in range(n):
        plain.append(one(False))
        live.append(one(True))
    rows = [("plain run (what a /v1 instance was)", plain), ("live run, its sandbox started cold", live)]
    eng = st._engine
    eng.pool_and_wait(img.id, 2)
    before = eng.pool_list()[0]["served"]
    pooled = []
    for _ in range(n):
        eng.pool_wait(img.id)
        pooled.append(one(True))
    served = eng.pool_list()[0]["served"] - before
    eng.pool_remove(img.id)
    rows.append((f"live run from the image's warm pool ({served}/{n} from it)", pooled))
    table = Table(title=f"Contree /v1 instances ({n} samples each, {os.cpu_count()} CPUs, load "
                        f"{os.getloadavg()[0]:.1f})")
    for c in ("what", "p50 ms", "p90 ms", "vs plain p50"):
        table.add_column(c, justify="right" if c != "what" else "left")
    for name, xs in rows:
        table.add_row(name, f"{pct(xs, 50) * 1e3:.2f}", f"{pct(xs, 90) * 1e3:.2f}",
                      f"{statistics.median(xs) / statistics.median(plain):.2f}x")
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
        if any(work in line for line in open("/proc/self/mountinfo")):
            print(f"a mount is left under {work}: not deleting it", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
