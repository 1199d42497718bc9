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
        bash = os.path.join(rootfs, "bin", "bash")  # envd runs commands with bash -l -c: busybox's sh stands in
        if not os.path.exists(bash):
            with open(bash, "w") as f:
                f.write('#!/bin/sh\nexec /bin/sh "$@"\n')
            os.chmod(bash, 0o755)
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

        def via_e2b_cmd() -> float:
            t = time.perf_counter()
            sbx = Sandbox.create("bb")
            sbx.commands.run("true")
            sbx.kill()
            return time.perf_counter() - t

        def via_sandtree_cmd() -> float:
            t = time.perf_counter()
            sb = img.start()
            sb.exec(["true"])
            sb.stop()
            return time.perf_counter() - t

        ways = {"e2b": via_e2b, "sandtree": via_sandtree, "e2b_cmd": via_e2b_cmd, "sandtree_cmd": via_sandtree_cmd}
        rows = {k: [] for k in ways}
        for fn in ways.values():
            fn()                                    # (untimed: connections and imports)
        for i in range(n):
            for k in (list(ways) if i % 2 == 0 else list(ways)[::-1]):
                rows[k].append(ways[k]())
        remote.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        srv.terminate()
        srv.wait(timeout=15)
    table = Table(title=f"E2B's SDK against sandtree serve: create (-> a first command) -> kill ({n} samples each, "
                        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    for c in ("what", "p50 ms", "p90 ms", "vs sandtree's SDK p50"):
        table.add_column(c, justify="right" if c != "what" else "left")
    for name, k, b in (("sandtree's SDK over HTTP: img.start(), sb.stop()", "sandtree", "sandtree"),
                       ("e2b 2.63 SDK: Sandbox.create(tag), sbx.kill()", "e2b", "sandtree"),
                       ("sandtree's SDK: start, exec(['true']), stop", "sandtree_cmd", "sandtree_cmd"),
                       ("e2b 2.63 SDK: create, commands.run('true'), kill (E2B's cold start: ~150 ms)",
                        "e2b_cmd", "sandtree_cmd")):
        v = rows[k]
        table.add_row(name, f"{pct(v, 50) * 1e3:.2f}", f"{pct(v, 90) * 1e3:.2f}",
                      f"{statistics.median(v) / statistics.median(rows[b]):.2f}x")
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
