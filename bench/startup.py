"""`make bench` row for the command line's start-up: `sandtree --help`, `sandtree run --help` and `sandtree eval
--help` (the parser built, nothing run) end to end as fresh processes, p50 and p90, beside `python -c pass` (the
interpreter's own start, the floor) with the ratio; and the Python spent before the run: the difference.
And `sandtree run IMAGE -- true` (root: the namespaces tier) on a busybox image in a store of its own: there the
Python before the run is the difference less the run itself, the same run timed in a process whose imports are
done (the engine opened, the run, the engine closed: what a long-lived SDK user pays per run).
Target: each <= 100 ms of Python over the floor at p50. Prints a table; asserts nothing. The processes may
write bytecode caches (PYTHONDONTWRITEBYTECODE is dropped): an installed package has them, and compiling the
sources on every start would be measured instead.

    PYTHONPATH=src .venv/bin/python bench/startup.py [-n 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table


def samples(argv: list[str], n: int, home: str | None = None) -> list[float]:
    env = {**os.environ, "SANDTREE_HOME": home or os.environ.get("SANDTREE_HOME", "/nonexistent-sandtree-bench")}
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


BUSYBOX = shutil.which("busybox") or "/bin/busybox"

# The run itself, in one process whose imports are done: n times Engine(home) + run + close, each timed.
IN_PROCESS = """
import json, sys, time
from sandtree import engine
out = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    eng = engine.Engine(sys.argv[1], warm=0)
    eng.run("busybox", ["true"])
    eng.close()
    out.append(time.perf_counter() - t)
print(json.dumps(out))
"""


def busybox_home(tmp: str) -> str | None:
    """A store holding a busybox image tagged `busybox` (None when this host cannot run one: not root, no
    static busybox)."""
    if os.geteuid() != 0 or not os.path.exists(BUSYBOX):
        return None
    rootfs = os.path.join(tmp, "rootfs")
    for d in ("bin", "etc", "tmp", "proc", "dev"):
        os.makedirs(os.path.join(rootfs, d))
    shutil.copy2(BUSYBOX, os.path.join(rootfs, "bin", "busybox"))
    for a in ("sh", "true"):
        os.symlink("busybox", os.path.join(rootfs, "bin", a))
    home = os.path.join(tmp, "home")
    subprocess.run([sys.executable, "-m", "sandtree", "image", "import", rootfs, "--tag", "busybox", "-q"],
                   env={**os.environ, "SANDTREE_HOME": home}, check=True, stdout=subprocess.DEVNULL)
    return home


def in_process(home: str, n: int) -> list[float]:
    env = {**os.environ}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    r = subprocess.run([sys.executable, "-c", IN_PROCESS, home, str(n + 1)], env=env, check=True,
                       capture_output=True, text=True)
    return sorted(json.loads(r.stdout)[1:])       # (the first: page cache and the seccomp filter's first build)


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
    itself = None
    with tempfile.TemporaryDirectory(prefix="sandtree-startup-") as tmp:
        home = busybox_home(tmp)
        if home is None:
            print("(no `run` row: it needs root and a static busybox)")
        else:
            rows.append(("sandtree run busybox -- true", samples([py, "-m", "sandtree", "run", "-q", "busybox", "--",
                                                                  "true"], n, home)))
            itself = in_process(home, n)
            rows.append(("  the run itself (in a process with its imports done)", itself))
    table = Table(title=f"command-line start-up (ms, {n} fresh processes each)")
    for col in ("what", "p50", "p90", "vs the floor (p50)", "Python before the run (p50 - floor [- the run])"):
        table.add_column(col)
    f50 = statistics.median(floor)
    for name, xs in rows:
        m = statistics.median(xs)
        if xs is floor or xs is itself:
            before = ""
        else:
            less = statistics.median(itself) if name.startswith("sandtree run busybox") else 0.0
            before = f"{(m - f50 - less) * 1e3:.1f} (target <= 100)"
        table.add_row(name, f"{m * 1e3:.1f}", f"{pct(xs, 90) * 1e3:.1f}",
                      "" if xs is itself else f"{m / f50:.1f}x", before)
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
