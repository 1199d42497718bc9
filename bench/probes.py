"""`make bench` rows that were timing probes in the tests (they asserted nothing of behaviour; tests
keep only assertions of behaviour): an egress link's attach with the daemon's pool warm, and the
cost of a per-link CA's leaf (made for a new host name, then cached). The attach rows need root and
nft (the daemon makes namespaces and veths on a temporary store, stopped afterwards); without them
they are skipped, saying why. Prints the numbers; asserts only that the measured thing happened.

    PYTHONPATH=src .venv/bin/python bench/probes.py [--attaches 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from sandtree.network.ca import CA
from sandtree.network.client import Egress

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def attach_times(n: int) -> list[float] | str:
    """Seconds of each of n attaches (each link released, the pool given time to refill), or why not."""
    if os.geteuid() != 0 or not shutil.which("nft"):
        return "needs root and nft"
    home = tempfile.mkdtemp(prefix="st-bench-probes-")
    subprocess.run([sys.executable, "-m", "sandtree.network.daemon", "--home", home, "--grace", "1.5",
                    "--idle", "600"], env=dict(os.environ, PYTHONPATH=SRC), check=True, timeout=30)
    eg = Egress(home)
    times = []
    try:
        for i in range(n):
            t = time.perf_counter()
            link = eg.attach(f"p{i}", None)
            times.append(time.perf_counter() - t)
            link.close()
            eg.release(f"p{i}")
            time.sleep(0.01)                          # the pool refills (a link takes 5-7 ms to make)
    finally:
        eg.stop_daemon()
        shutil.rmtree(home, ignore_errors=True)       # (the daemon has exited: nothing is mounted there)
    return times


def leaf_times(made: int = 20, cached: int = 1000) -> tuple[list[float], float]:
    """Seconds to make a leaf context for each of `made` new host names; the mean of `cached` asks
    for one already made."""
    ca = CA.new("m", hosts=["*.example.org"])
    times = []
    for i in range(made):
        t = time.perf_counter()
        ca.server_context(f"h{i}.example.org")
        times.append(time.perf_counter() - t)
    first = ca.server_context("h1.example.org")
    t = time.perf_counter()
    for _ in range(cached):
        assert ca.server_context("h1.example.org") is first
    return times, (time.perf_counter() - t) / cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attaches", type=int, default=200)
    a = ap.parse_args()
    made, cached = leaf_times()
    print(f"leaf made: p50 {statistics.median(made) * 1e3:.2f} ms; cached: {cached * 1e6:.1f} us")
    times = attach_times(a.attaches)
    if isinstance(times, str):
        print(f"egress attach: skipped ({times})")
        return
    times.sort()
    print(f"egress attach, warm pool: p50 {statistics.median(times) * 1e3:.3f} ms, "
          f"p90 {times[int(len(times) * 0.9) - 1] * 1e3:.3f} ms ({len(times)} attaches)")


if __name__ == "__main__":
    main()
