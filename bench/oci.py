"""`make bench` rows for OCI out (issue 15): pushing an image to a real registry on loopback
(Debian's docker-registry, started here on a free port with a temp storage dir, stopped after):
the first push of a 3-layer image (a busybox base, a run writing 20 MB, a config step), a push
of the unchanged image (the issue's target: <= 100 ms), the same image under a new tag (every
blob HEAD-checked, none uploaded), a push after the layer digest cache is dropped (every layer
written again to learn its digest), and an OCI layout export. Asserts only that what it measured
happened (an unchanged push uploads nothing).

    PYTHONPATH=src .venv/bin/python bench/oci.py [-n 50]
"""

from __future__ import annotations

import argparse
import io
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
from sandtree.store.imageconfig import ImageConfig  # noqa: E402


def _registry(root: str):
    port = free_port()
    with open(os.path.join(root, "config.yml"), "w") as f:
        f.write(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
                f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n")
    proc = subprocess.Popen(["docker-registry", "serve", os.path.join(root, "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port)
    return proc, f"127.0.0.1:{port}"


def oci_table(st: sandtree.Sandtree, img: sandtree.Image, work: str, n: int = 50) -> Table:
    table = Table(title="OCI push and export (issue 15), registry on loopback")
    for c in ("what", "p50 ms", "p90 ms", "note"):
        table.add_column(c, justify="right" if c != "what" else "left")
    if not shutil.which("docker-registry"):
        table.add_row("skipped: docker-registry is not installed (scripts/install-deps)", "-", "-", "")
        return table
    big = img.run("head -c 20000000 /dev/urandom > /big && mkdir -p /.sandtree").image
    cfg = ImageConfig(env={"MODE": "bench"}, cwd="/", cmd=("/bin/sh",))
    top = big.run("cat > /.sandtree/config.json && chmod 644 /.sandtree/config.json", stdin=cfg.to_json()).image
    eng = st.engine
    proc, host = _registry(tempfile.mkdtemp(dir=work, prefix="registry-"))
    try:
        t = time.perf_counter()
        first = eng.push(top.id, f"docker://{host}/bench/app:1")
        table.add_row(f"first push ({first['layers']} layers, {first['bytes'] / 1e6:.1f} MB)",
                      f"{(time.perf_counter() - t) * 1e3:.1f}", "", f"{first['uploaded']} blobs uploaded")
        xs = []
        for _ in range(n):
            t = time.perf_counter()
            res = eng.push(top.id, f"docker://{host}/bench/app:1")
            xs.append(time.perf_counter() - t)
            assert res["uploaded"] == 0, res
        xs.sort()
        table.add_row("push of the unchanged image", f"{xs[len(xs) // 2] * 1e3:.2f}",
                      f"{xs[int(len(xs) * 0.9)] * 1e3:.2f}", "0 uploaded; target <= 100 ms")
        ys = []
        for i in range(min(n, 20)):
            t = time.perf_counter()
            assert eng.push(top.id, f"docker://{host}/bench/app:t{i}")["uploaded"] == 0
            ys.append(time.perf_counter() - t)
        ys.sort()
        table.add_row("same image, new tag (every blob HEAD-checked)", f"{ys[len(ys) // 2] * 1e3:.2f}",
                      f"{ys[int(len(ys) * 0.9)] * 1e3:.2f}", "0 uploaded")
        eng.store.db.connection(write=True).execute("DELETE FROM oci_layers")
        t = time.perf_counter()
        eng.push(top.id, f"docker://{host}/bench/app:nocache")
        table.add_row("new tag, layer digest cache dropped (layers rewritten)",
                      f"{(time.perf_counter() - t) * 1e3:.1f}", "", "")
        t = time.perf_counter()
        top.export_oci(io.BytesIO())
        table.add_row("export_oci to memory (OCI layout tar)", f"{(time.perf_counter() - t) * 1e3:.1f}", "", "")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=50)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sandtree-bench-oci-")
    try:
        with sandtree.Sandtree(os.path.join(work, "home")) as st:
            img = st.import_image(make_rootfs(os.path.join(work, "rootfs")))
            Console().print(oci_table(st, img, work, args.n))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
