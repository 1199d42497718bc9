"""Containers inside a gVisor sandbox (docs/containers.md): a sandbox with the engine ready (start ->
`docker version` answers), `docker run --rm bb true` inside, and Compose up of the two-service test app
(tests/kernel/test_containers.py: build, up, the app's test against the server, down). The image is one
built by recipes/docker.Dockerfile (its RUN reaches Debian's mirror, so it is not built here):

    PYTHONPATH=src .venv/bin/python bench/containers.py --home HOME --image IMAGE [-n 5]

Not in `make bench`: the image needs the network. A warm pool of such sandboxes does not exist yet."""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "kernel"))
from test_containers import APP_DOCKERFILE, APP_TEST, COMPOSE, UP_TEST_DOWN, busybox_rootfs  # noqa: E402

from sandtree.engine import Engine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", required=True)
    ap.add_argument("--image", required=True)
    ap.add_argument("-n", type=int, default=5)
    args = ap.parse_args()
    e = Engine(args.home, warm=0)
    with tempfile.TemporaryDirectory() as d:
        bb = e.import_path(busybox_rootfs(os.path.join(d, "root")), tag="bb-inner")
    buf = io.BytesIO()
    e.export_tar(bb, buf)
    files = [{"path": "/bb.tar", "content": buf.getvalue()}, {"path": "/proj/compose.yaml", "content": COMPOSE},
             {"path": "/proj/Dockerfile", "content": APP_DOCKERFILE}, {"path": "/proj/test.sh", "content": APP_TEST}]
    rows: dict[str, list[float]] = {"start, engine ready": [], "docker run --rm bb true": [],
                                    "compose build+up+test+down": []}
    try:
        for _ in range(args.n):
            t = time.perf_counter()
            sb = e.sandbox_start(args.image, containers=True, files=files)
            rows["start, engine ready"].append(time.perf_counter() - t)
            try:
                assert e.sandbox_exec(sb["id"], "docker import /bb.tar bb:latest").exit_code == 0
                t = time.perf_counter()
                assert e.sandbox_exec(sb["id"], "docker run --rm bb:latest true").exit_code == 0
                rows["docker run --rm bb true"].append(time.perf_counter() - t)
                t = time.perf_counter()
                r = e.sandbox_exec(sb["id"], UP_TEST_DOWN)
                assert r.exit_code == 0, r.stdout[-2000:]
                rows["compose build+up+test+down"].append(time.perf_counter() - t)
            finally:
                e.sandbox_stop(sb["id"])
    finally:
        e.close()
    print(f"load {os.getloadavg()[0]:.1f}, n={args.n}")
    for name, xs in rows.items():
        print(f"{name:32s} p50 {statistics.median(xs):6.2f} s   min {min(xs):6.2f} s")


if __name__ == "__main__":
    main()
