"""E2B's SDK, unmodified, against `sandtree serve` on loopback (issue 36): a sandbox's create -> kill
through `e2b` (its REST client, E2B_API_URL at the server's /e2b) vs the same through sandtree's own
SDK over HTTP (sandtree.connect: img.start(), sb.stop()), on the same server and image, sampled in
turn. `python bench/e2bsdk.py [-n N]` (not e2b.py: it would shadow the package) runs it alone; bench.py prints it among the others."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import free_port, make_rootfs, wait_for_port  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import sandtree  # noqa: E402
import workdir  # noqa: E402  (bench/workdir.py)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def e2b_table(rootfs: str, work: str, n: int) -> Table:
    home = os.path.join(work, "home-e2b")
    port = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", home, "serve", "--port", str(port),
                            "--ports-port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "SANDTREE_NETWORK_DEFAULT": "off"})
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    try:
        wait_for_port(port, 30)
        url = f"http://127.0.0.1:{port}"
        os.environ.update(E2B_API_URL=url + "/e2b", E2B_SANDBOX_URL=url + "/e2b/sandbox", E2B_API_KEY="local")
        from e2b import Sandbox                     # (reads its variables per call)
        remote = sandtree.connect(url)
        img = remote.import_image(rootfs, tag="bb")

        def via_e2b() -> float:
            t = time.perf_counter()
            sbx = Sandbox.create("bb")
            sbx.kill()
            return time.perf_counter() - t

        def via_sandtree() -> float:
            t = time.perf_counter()
            sb = img.start()
            sb.stop()
            return time.perf_counter() - t

        rows = {"e2b": [], "sandtree": []}
        via_e2b(), via_sandtree()                   # (untimed: connections and imports)
        for i in range(n):
            for k in (["e2b", "sandtree"] if i % 2 == 0 else ["sandtree", "e2b"]):
                rows[k].append(via_e2b() if k == "e2b" else via_sandtree())
        remote.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        srv.terminate()
        srv.wait(timeout=15)
    table = Table(title=f"E2B's SDK against sandtree serve: create -> kill ({n} samples each, "
                        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    for c in ("what", "p50 ms", "p90 ms", "vs sandtree's SDK p50"):
        table.add_column(c, justify="right" if c != "what" else "left")
    base = statistics.median(rows["sandtree"])
    for name, k in (("sandtree's SDK over HTTP: img.start(), sb.stop()", "sandtree"),
                    ("e2b 2.63 SDK: Sandbox.create(tag), sbx.kill()", "e2b")):
        v = rows[k]
        table.add_row(name, f"{pct(v, 50) * 1e3:.2f}", f"{pct(v, 90) * 1e3:.2f}",
                      f"{statistics.median(v) / base:.2f}x")
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=50)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sandtree-bench-e2b-")
    try:
        Console(width=120).print(e2b_table(make_rootfs(os.path.join(work, "rootfs")), work, args.n))
    finally:
        workdir.remove_unless_mounted(work)


if __name__ == "__main__":
    main()
