"""`make bench` rows for the store's durability (store/durable.py): the cost of a commit that a power
cut cannot lose. A commit of 1 small file and of one 100 MB file, from an upper on tmpfs (where a
run's writes are) into a store on this machine's disk, timed from the upper to the recorded image
(commit + publish + the transaction): p50 and p90 per level.

  - unsynced: the store before durability (no file, directory or WAL sync): what a power cut
    could lose, for comparison only (the bench turns the syncs off; no store can ask for it)
  - relaxed: the layer's bytes synced before its row, the SQLite commit not synced
  - strict (the default): both synced

    PYTHONPATH=src .venv/bin/python bench/durability.py [-n 40] [--big 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import make_rootfs  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from sandtree.engine.core import Engine  # noqa: E402
from sandtree.store import durable, layers  # noqa: E402
import workdir  # noqa: E402  (bench/workdir.py)

BIG = 100 << 20


def commit_once(engine: Engine, base: str, upper: str) -> tuple[str, float]:
    """One commit of `upper` on `base` as a run's is recorded: (image, seconds)."""
    row = engine.store.image(base)
    t = time.perf_counter()
    cr = engine.committer.commit(row, upper)
    write = engine.committer.image_writer(cr)
    engine.records.record(uuid.uuid4().hex, base, {"command": "bench"}, time.time(), cr.image, {}, write)
    return cr.image, time.perf_counter() - t


def fill_upper(upper: str, i: int, size: int, noise: bytes) -> None:
    os.makedirs(os.path.join(upper, "root"), exist_ok=True)
    with open(os.path.join(upper, "root", "f"), "wb") as f:
        f.write(f"{i} {time.time_ns()}\n".encode())
        if size:
            f.write(noise[:size])


def measure(level: str, n: int, size: int, work: str, shm: str, noise: bytes) -> list[float]:
    os.sync()                 # what earlier rows left dirty is not written back during this one's
    home = tempfile.mkdtemp(dir=work, prefix=f"{level}-")
    engine = Engine(home, warm=0, durability="relaxed" if level == "unsynced" else level)
    try:
        rootfs = os.path.join(tempfile.mkdtemp(dir=work), "rootfs")
        make_rootfs(rootfs)
        base = engine.import_path(rootfs)
        times = []
        for i in range(n):
            upper = tempfile.mkdtemp(dir=shm)
            try:
                fill_upper(upper, i, size, noise)
                _, took = commit_once(engine, base, upper)
                times.append(took * 1000)
            finally:
                layers.remove_tree(upper)
        return times
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=40, help="commits of 1 file per level")
    ap.add_argument("--big", type=int, default=5, help="commits of 100 MB per level")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sandtree-bench-durable-", dir=os.environ.get("SANDTREE_BENCH_DIR", "/var/tmp"))
    shm = tempfile.mkdtemp(prefix="sandtree-bench-upper-", dir="/dev/shm")
    noise = os.urandom(BIG)
    real = durable.sync_tree, durable.sync_dir
    rows = {}
    try:
        for level in ("strict", "relaxed", "unsynced"):
            if level == "unsynced":
                durable.sync_tree = durable.sync_dir = lambda path: None
            else:
                durable.sync_tree, durable.sync_dir = real[0], real[1]
            rows[level] = (measure(level, args.n, 0, work, shm, noise),
                           measure(level, args.big, BIG, work, shm, noise))
    finally:
        durable.sync_tree, durable.sync_dir = real[0], real[1]
        workdir.remove_unless_mounted(work)
        workdir.remove_unless_mounted(shm)
    table = Table(title="commit cost by durability level (ms, upper on tmpfs, store on disk)")
    for col in ("level", "1 file p50", "1 file p90", "100 MB p50", "100 MB p90", "100 MB vs unsynced"):
        table.add_column(col)
    base_big = statistics.median(rows["unsynced"][1])
    for level, (small, big) in rows.items():
        q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(len(xs) * p))]
        table.add_row(level, f"{statistics.median(small):.2f}", f"{q(small, 0.9):.2f}",
                      f"{statistics.median(big):.0f}", f"{q(big, 0.9):.0f}",
                      f"{statistics.median(big) / base_big:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
