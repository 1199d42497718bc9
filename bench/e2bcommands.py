"""E2B's SDK, unmodified, running a command in a sandtree live sandbox (issue 36's target: a
`commands.run('true')` round trip <= 5 ms p50): through `e2b` (envd's process service, Connect
over loopback) vs sandtree's own SDK over HTTP (sb.exec(["true"])) on the same server and sandbox,
sampled in turn. `python bench/e2bcommands.py [-n N]` runs it alone; bench.py prints it among the
others."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import free_port, make_rootfs, wait_for_port  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import sandtree  # noqa: E402
import workdir  # noqa: E402  (bench/workdir.py: never a recursive delete through a mount)

VARS = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def commands_table(rootfs: str, work: str, n: int) -> Table:
    # E2B's clients run commands as /bin/bash -l -c: the busybox image gets a bash that is its sh
    root = os.path.join(work, "rootfs-bash")
    shutil.copytree(rootfs, root, symlinks=True)
    with open(os.path.join(root, "bin", "bash"), "w") as f:
        f.write('#!/bin/sh\nexec /bin/sh "$@"\n')
    os.chmod(os.path.join(root, "bin", "bash"), 0o755)
    home = os.path.join(work, "home-e2bcmd")
    port = free_port()
    srv = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", home, "serve", "--port", str(port),
                            "--ports-port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved = {k: os.environ.get(k) for k in VARS}
    sb = None
    try:
        wait_for_port(port, 30)
        url = f"http://127.0.0.1:{port}"
        os.environ.update(E2B_API_URL=url + "/e2b", E2B_SANDBOX_URL=url + "/e2b/sandbox", E2B_API_KEY="local")
        from e2b import ConnectionConfig, Sandbox
        from packaging.version import Version

        from sandtree.http.e2b.wire import ENVD_VERSION
        remote = sandtree.connect(url)
        sb = remote.import_image(root, tag="bb-bash").start()
        try:
            e2b_sb = Sandbox.connect(sb.id)
        except Exception:                           # noqa: BLE001 - no control plane: what it would answer
            e2b_sb = Sandbox(sandbox_id=sb.id, sandbox_domain=None, envd_version=Version(ENVD_VERSION),
                             envd_access_token=None, traffic_access_token=None,
                             connection_config=ConnectionConfig(extra_sandbox_headers={
                                 "E2b-Sandbox-Id": sb.id, "E2b-Sandbox-Port": "49983"}))

        def via_e2b() -> float:
            t = time.perf_counter()
            e2b_sb.commands.run("true")
            return time.perf_counter() - t

        def via_sandtree() -> float:
            t = time.perf_counter()
            sb.exec(["true"])
            return time.perf_counter() - t

        rows = {"e2b commands.run('true')": [], "sandtree sb.exec(['true'])": []}
        for _ in range(3):
            via_e2b(), via_sandtree()               # (untimed: connections, imports, caches)
        for _ in range(n):
            rows["e2b commands.run('true')"].append(via_e2b())
            rows["sandtree sb.exec(['true'])"].append(via_sandtree())
    finally:
        if sb is not None:
            sb.stop()
        srv.terminate()
        srv.wait(15)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    t = Table(title=f"a command's round trip through E2B's SDK, on loopback (n={n}; target: e2b p50 <= 5 ms)")
    for c in ("path", "p50 ms", "p90 ms"):
        t.add_column(c, justify="right" if c != "path" else "left")
    for name, xs in rows.items():
        t.add_row(name, f"{pct(xs, 50) * 1000:.1f}", f"{pct(xs, 90) * 1000:.1f}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=100)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sandtree-bench-")
    try:
        rootfs = make_rootfs(os.path.join(work, "rootfs"))
        Console().print(commands_table(rootfs, work, args.n))
    finally:
        workdir.remove_unless_mounted(work)


if __name__ == "__main__":
    main()
