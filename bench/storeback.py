"""`make bench` rows for the store's metadata backends (issue 20): the metadata cost of a run on
SQLite (the default) and on PostgreSQL (a throwaway cluster on a unix socket, tests/pgcluster.py),
the input to the capacity model. Per run, for a committing run (each writes a new file) and a
disposable one: wall p50/p90, SQL statements, write transactions, and on PostgreSQL the server's
transactions (write transactions plus reads outside one, each its own) and, on PostgreSQL, the
time spent inside the driver's execute calls (a round trip each).

    PYTHONPATH=src .venv/bin/python bench/storeback.py [-n 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import make_rootfs  # noqa: E402
from pgcluster import PgCluster  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import sandtree  # noqa: E402
from sandtree.store import db as sqlitedb, pgdb  # noqa: E402
import workdir  # noqa: E402  (bench/workdir.py)

COUNT = {"stmts": 0, "tx": 0, "ms": 0.0, "auto": 0}
_lock = threading.Lock()


def instrument() -> None:
    """Count statements and write transactions on both backends (and driver time on PostgreSQL)."""
    execute, executemany = pgdb._Connection.execute, pgdb._Connection.executemany

    def timed(fn):
        def wrapper(self, *a, **k):
            t = time.perf_counter()
            try:
                return fn(self, *a, **k)
            finally:
                with _lock:
                    COUNT["stmts"] += 1
                    COUNT["auto"] += not self.in_transaction      # a read outside tx(): its own transaction
                    COUNT["ms"] += (time.perf_counter() - t) * 1000
        return wrapper
    pgdb._Connection.execute, pgdb._Connection.executemany = timed(execute), timed(executemany)
    open_ = sqlitedb.Database._open

    def traced(self):
        con = open_(self)

        def count(sql):
            if sql.split(None, 1)[0].upper() in ("BEGIN", "COMMIT", "ROLLBACK", "PRAGMA"):
                return                                        # as on PostgreSQL: statements only
            with _lock:
                COUNT["stmts"] += 1
                COUNT["auto"] += not con.in_transaction
        con.set_trace_callback(count)
        return con
    sqlitedb.Database._open = traced
    for cls in (sqlitedb.Database, pgdb.PgDatabase):
        tx = cls.tx

        def counted(self, *a, _tx=tx, **k):
            with _lock:
                COUNT["tx"] += 1
            return _tx(self, *a, **k)
        cls.tx = counted


def measure(name: str, url: str | None, rootfs: str, work: str, n: int) -> list:
    rows = []
    with sandtree.Sandtree(os.path.join(work, name), warm=2, database=url) as st:
        img = st.import_image(rootfs)
        img.run("true")                                     # warm helpers, caches
        sb = img.start()
        sb.exec("true")

        def step(kind, i, disposable=False):
            if kind == "live start+stop":
                img.start().stop()
            elif kind == "live exec":
                sb.exec(f"echo {i} > /f")
            else:
                img.run(f"echo {i} > /f", disposable=disposable)

        # The live rows are the capacity model's input for concurrent sandboxes: what a start, a stop
        # and a command in a running sandbox cost the shared database.
        for kind, count in (("commit", n), ("disposable", n), ("live exec", n), ("live start+stop", max(n // 5, 5))):
            walls = []
            for k in COUNT:
                COUNT[k] = 0
            for i in range(count):
                t = time.perf_counter()
                step(kind, i, disposable=kind == "disposable")
                walls.append((time.perf_counter() - t) * 1000)
            q = statistics.quantiles(walls, n=10)
            rows.append([name, kind, f"{statistics.median(walls):.1f}", f"{q[8]:.1f}",
                         f"{COUNT['stmts'] / count:.1f}", f"{COUNT['tx'] / count:.1f}",
                         f"{(COUNT['auto'] + COUNT['tx']) / count:.1f}",
                         f"{COUNT['ms'] / count:.2f}" if url else "-"])
        sb.stop()
    return rows


def write_rate(url: str | None, work: str, threads: int = 4, seconds: float = 3.0, serial: bool = True,
               durability: str = "strict") -> float:
    """Write transactions per second (a tag move: a ref row and its reflog row) from `threads`
    threads at once: the ceiling the one write lock puts on a shared database. serial=False: an
    exec's record instead (an operation row of its own, outside the one-writer lock). durability:
    SQLite's level (store/durable.py: strict syncs every commit)."""
    db = sqlitedb.open_database(os.path.join(work, f"rate-{bool(url)}"), url) if url else \
        sqlitedb.open_database(tempfile.mkdtemp(dir=work), None, durability)
    done, end = [0] * threads, time.monotonic() + seconds

    def loop(k):
        i = 0
        while time.monotonic() < end:
            i += 1
            with db.tx(serial=serial) as con:
                if not serial:
                    con.execute("INSERT INTO operations(id, kind, source, result, spec, outcome, started, finished) "
                                "VALUES(?,?,?,?,?,?,?,?)", (f"{k}-{i}-{time.time()}", "exec", "img", None,
                                                           '{"command": "true"}', '{"exit_code": 0}', time.time(),
                                                           time.time()))
                    done[k] = i
                    continue
                con.execute("INSERT OR REPLACE INTO refs(name, kind, image, updated) VALUES(?,?,?,?)",
                            (f"t{k}", "tag", f"i{i}", time.time()))
                con.execute("INSERT INTO reflog(kind, name, old, new, at, reason) VALUES(?,?,?,?,?,?)",
                            ("tag", f"t{k}", None, f"i{i}", time.time(), "bench"))
            done[k] = i
    ts = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    db.close()
    return sum(done) / seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=50)
    args = ap.parse_args()
    instrument()
    work = tempfile.mkdtemp(prefix="st-bench-store-")
    rootfs = make_rootfs(os.path.join(work, "rootfs"))
    cluster = PgCluster().start()
    try:
        rows = measure("sqlite", None, rootfs, work, args.n)
        rows += measure("postgresql", cluster.new_database(), rootfs, work, args.n)
        rates = [write_rate(None, work), write_rate(cluster.new_database(), work),
                 write_rate(cluster.new_database(), work, threads=16, serial=False),
                 write_rate(None, work, durability="relaxed")]
    finally:
        cluster.stop()
        workdir.remove_unless_mounted(work)      # never through a mount (PLATFORM.md)
    t = Table(title=f"metadata cost per run (/bin/sh -c 'echo i > /f', n={args.n}; PostgreSQL on a unix socket)")
    for c in ("backend", "run", "p50 ms", "p90 ms", "statements", "write tx", "transactions", "driver ms"):
        t.add_column(c)
    for r in rows:
        t.add_row(*r)
    Console().print(t)
    Console().print(f"write transactions/s, 4 threads (a ref and its reflog row each): SQLite {rates[0]:.0f} "
                    f"(relaxed: {rates[3]:.0f}), "
                    f"PostgreSQL {rates[1]:.0f}; an exec's record (outside that lock), 16 threads: PostgreSQL {rates[2]:.0f}")


if __name__ == "__main__":
    main()
