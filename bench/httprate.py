"""16 HTTP clients running /bin/true through `sandtree serve` (issue 18's HTTP target): runs per
second and the CPU per run of the server process itself and of its sandboxes (reaped children),
from /proc. `bench.py --only http` prints just this row; the full bench has it too."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

CLIENTS = 16


def cpu(pid: int) -> tuple[float, float]:
    """(the process's own CPU seconds, its reaped children's)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def http_rate(rimg, server_pid: int, n_runs: int = 320) -> dict:
    """rimg: an image of a sandtree.connect()ed server whose process is server_pid. After a
    warm-up of 64 runs: runs/s, server and sandbox CPU ms per run, the load average."""
    def run(_):
        return rimg.run(["/bin/true"])
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(run, range(64)))
    c0, load, t0 = cpu(server_pid), os.getloadavg()[0], time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(run, range(n_runs)))
    took, c1 = time.perf_counter() - t0, cpu(server_pid)
    return {"rate": n_runs / took, "server_ms": (c1[0] - c0[0]) / n_runs * 1e3,
            "sandboxes_ms": (c1[1] - c0[1]) / n_runs * 1e3, "load": load}


def http_row(table, rimg, server_pid: int) -> None:
    r = http_rate(rimg, server_pid)
    table.add_row(f"{CLIENTS} HTTP clients, /bin/true runs per second", f"{r['rate']:.0f}/s", "",
                  f"CPU per run: server {r['server_ms']:.2f} ms, its sandboxes {r['sandboxes_ms']:.2f} ms; "
                  f"load {r['load']:.1f}")
