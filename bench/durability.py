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


class Level:
    """A store at one durability level, on `base`; commit() times one commit of `size` bytes."""

    def __init__(self, level: str, work: str, shm: str, noise: bytes):
        self.level, self.shm, self.noise = level, shm, noise
        self.engine = Engine(tempfile.mkdtemp(dir=work, prefix=f"{level}-"), warm=0,
                             durability="relaxed" if level == "unsynced" else level)
        rootfs = os.path.join(tempfile.mkdtemp(dir=work), "rootfs")
        make_rootfs(rootfs)
        self.base = self.engine.import_path(rootfs)
        self.i = 0

    def commit(self, size: int) -> float:
        self.i += 1
        upper = tempfile.mkdtemp(dir=self.shm)
        real = durable.sync_tree, durable.sync_dir, durable.start_writeback
        try:
            fill_upper(upper, self.i, size, self.noise)
            if self.level == "unsynced":
                durable.sync_tree = durable.sync_dir = durable.start_writeback = lambda *a, **k: None
            return commit_once(self.engine, self.base, upper)[1] * 1000
        finally:
            durable.sync_tree, durable.sync_dir, durable.start_writeback = real
            layers.remove_tree(upper)


def measure(levels: list[Level], n: int, size: int) -> dict[str, list[float]]:
    """n rounds, one commit per level each (interleaved: the machine's other load falls on all
    alike). After an unsynced commit of a big file, an (untimed) fsync of the store's disk: the
    writes it deferred are not paid by the next level's commit."""
    times: dict[str, list[float]] = {lv.level: [] for lv in levels}
    for _ in range(n):
        for lv in levels:
            times[lv.level].append(lv.commit(size))
            if lv.level == "unsynced" and size:
                durable.sync_fs(lv.engine.store.home)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=40, help="commits of 1 file per level")
    ap.add_argument("--big", type=int, default=5, help="commits of 100 MB per level")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sandtree-bench-durable-", dir=os.environ.get("SANDTREE_BENCH_DIR", "/var/tmp"))
    shm = tempfile.mkdtemp(prefix="sandtree-bench-upper-", dir="/dev/shm")
    noise = os.urandom(BIG)
    levels: list[Level] = []
    try:
        levels = [Level(level, work, shm, noise) for level in ("strict", "relaxed", "unsynced")]
        small, big = measure(levels, args.n, 0), measure(levels, args.big, BIG)
        rows = {lv.level: (small[lv.level], big[lv.level]) for lv in levels}
    finally:
        for lv in levels:
            lv.engine.close()
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
