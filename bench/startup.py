"""`make bench` row for the command line's start-up: `sandtree --help`, `sandtree run --help` and `sandtree eval
--help` (the parser built, nothing run) end to end as fresh processes, p50 and p90, beside `python -c pass` (the
interpreter's own start, the floor) with the ratio; and the Python spent before the run: the difference.
Target: each <= 100 ms of Python over the floor at p50. Prints a table; asserts nothing. The processes may
write bytecode caches (PYTHONDONTWRITEBYTECODE is dropped): an installed package has them, and compiling the
sources on every start would be measured instead.

    PYTHONPATH=src .venv/bin/python bench/startup.py [-n 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table


def samples(argv: list[str], n: int) -> list[float]:
    env = {**os.environ, "SANDTREE_HOME": os.environ.get("SANDTREE_HOME", "/nonexistent-sandtree-bench")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)      # warm the page cache
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
        out.append(time.perf_counter() - t)
    return sorted(out)


def pct(xs: list[float], p: int) -> float:
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20)
    n = ap.parse_args().n
    py = sys.executable
    floor = samples([py, "-c", "pass"], n)
    rows = [("python -c pass (the floor)", floor)]
    for name, argv in (("sandtree --help", ["--help"]), ("sandtree run --help", ["run", "--help"]),
                       ("sandtree eval --help", ["eval", "--help"])):
        rows.append((name, samples([py, "-m", "sandtree", *argv], n)))
    table = Table(title=f"command-line start-up (ms, {n} fresh processes each)")
    for col in ("what", "p50", "p90", "vs the floor (p50)", "Python before the run (p50 - floor)"):
        table.add_column(col)
    f50 = statistics.median(floor)
    for name, xs in rows:
        m = statistics.median(xs)
        table.add_row(name, f"{m * 1e3:.1f}", f"{pct(xs, 90) * 1e3:.1f}", f"{m / f50:.1f}x",
                      "" if xs is floor else f"{(m - f50) * 1e3:.1f} (target <= 100)")
    Console().print(table)


if __name__ == "__main__":
    main()
