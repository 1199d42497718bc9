"""`make bench` row for issue 20's cold-start target: a 120 MB Debian-like image on a node whose
layer cache is empty, its layers fetched from S3 on loopback (SeaweedFS, tests/s3server.py), time
to the first command done (goal <= 2 s), two ways on the same image in the same sample: its
layer's EROFS image downloaded and mounted (store/erofs.py), and its tar unpacked (a node that
cannot mount EROFS). The node's engine is open and warm already (a cluster
node is a running process: it ran a small image first, so its helpers are built); the image's
layer is not in its cache. Each sample is a fresh node home on the same database and bucket.

Peers, the floors under it on the same bytes: one GET of the layer object to /dev/null (the S3
server's and boto3's speed here) and GNU tar extracting the same tar from a local file.

    PYTHONPATH=src .venv/bin/python bench/coldstart.py [-n 5]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import make_rootfs  # noqa: E402
from s3server import S3Server  # noqa: E402

from rich.table import Table  # noqa: E402

import sandtree  # noqa: E402
import workdir  # noqa: E402  (bench/workdir.py)

MB = 1 << 20


def debian_like(path: str, total: int = 120 * MB, seed: int = 20) -> str:
    """A busybox rootfs plus `total` bytes shaped like a Debian base: ~9,000 files, most a few KB
    (docs, locales, Python modules, configs), ~100 of 0.2-1.2 MB (shared libraries, binaries),
    incompressible (the layer tar is not compressed either way)."""
    make_rootfs(path)
    rnd = random.Random(seed)
    big = [int(rnd.uniform(0.2, 1.2) * MB) for _ in range(100)]
    small_total = total - sum(big)
    n_small = 9000
    sizes = [max(64, int(rnd.lognormvariate(8.0, 1.2))) for _ in range(n_small)]
    scale = small_total / sum(sizes)
    sizes = [max(1, int(s * scale)) for s in sizes]
    sizes[-1] += total - sum(big) - sum(sizes)
    for i, size in enumerate(big):
        d = os.path.join(path, "usr", "lib", "x86_64-linux-gnu")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"lib{i}.so.1"), "wb") as f:
            f.write(os.urandom(size))
    for i, size in enumerate(sizes):
        d = os.path.join(path, "usr", "share", f"pkg{i // 60}", f"d{i % 7}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}"), "wb") as f:
            f.write(os.urandom(size))
    return path


def coldstart_rows(work: str, n: int = 5) -> tuple[list[tuple[str, list[float], str]], dict]:
    """(what, seconds samples, note) rows and facts about the image."""
    os.makedirs(work, exist_ok=True)
    s3 = S3Server().start()
    saved = {k: os.environ.get(k) for k in s3.env()}
    os.environ.update(s3.env())
    rows = []
    try:
        url = f"s3://{s3.new_bucket()}/bench"
        db = f"sqlite:///{os.path.join(work, 'shared.db')}"
        root = debian_like(os.path.join(work, "debian-like"))
        origin = sandtree.Sandtree(os.path.join(work, "origin"), database=db, objects=url, warm=0)
        image = origin.import_image(root)
        small = origin.import_image(make_rootfs(os.path.join(work, "small")))   # warms a node up
        row = origin.engine.store.image(image.id)
        facts = {"bytes": row.size, "files": row.files, "layers": len(row.layers),
                 "mkfs": origin.engine.store.cache.timings.get("mkfs.erofs", 0.0)}
        has_image = origin.engine.store.db.one("SELECT erofs_size FROM layer_objects WHERE layer=?",
                                               (row.layers[-1],))[0] is not None
        objects = origin.engine.store.objects
        [layer] = row.layers[-1:]
        tar = os.path.join(work, "layer.tar")
        objects.client.download_file(objects.bucket, objects.prefix + f"layers/{layer}.tar", tar)
        cold, opened, fetches, gets, untar = [], [], [], [], []
        cold_tar, fetches_tar = [], []
        for i in range(n):                       # each sample beside its floors: the load here moves
            for how in ("erofs", "tar"):         # the same image, by its EROFS image, then by its tar
                home = os.path.join(work, f"node-{i}-{how}")
                t0 = time.perf_counter()
                node = sandtree.Sandtree(home, database=db, objects=url, warm=0)
                t1 = time.perf_counter()
                if how == "tar":
                    node.engine.store.cache.mount_images = False     # as a node that cannot mount it
                node.engine.run(small.id, ["/bin/true"], disposable=True)   # a running node: helpers built
                fetched = node.engine.store.cache.fetched
                node.engine.store.cache.timings.clear()
                t1b = time.perf_counter()
                rec = node.engine.run(image.id, ["/bin/true"], disposable=True)
                t2 = time.perf_counter()
                assert rec.exit_code == 0 and node.engine.store.cache.fetched == fetched + len(row.layers)
                assert ("mount" in node.engine.store.cache.timings) == (how == "erofs" and has_image)
                if how == "erofs":
                    opened.append(t1 - t0)
                (cold if how == "erofs" else cold_tar).append(t2 - t1b)
                (fetches if how == "erofs" else fetches_tar).append(node.engine.store.cache.timings)
                node.close()                     # unmounts its images (nothing uses them)
                _remove(home)
            t = time.perf_counter()
            body = objects.client.get_object(Bucket=objects.bucket, Key=objects.prefix + f"layers/{layer}.tar")["Body"]
            while body.read(MB):
                pass
            gets.append(time.perf_counter() - t)
            dest = os.path.join(work, f"untar-{i}")
            os.makedirs(dest)
            t = time.perf_counter()
            subprocess.run(["tar", "--warning=no-unknown-keyword", "-xf", tar, "-C", dest], check=True)
            untar.append(time.perf_counter() - t)
            _remove(dest)
        warm_node = sandtree.Sandtree(os.path.join(work, "node-warm"), database=db, objects=url, warm=0)
        warm_node.engine.run(image.id, ["/bin/true"], disposable=True)
        warm = []
        for _ in range(n):
            t = time.perf_counter()
            warm_node.engine.run(image.id, ["/bin/true"], disposable=True)
            warm.append(time.perf_counter() - t)
        facts["object_bytes"] = os.path.getsize(tar)
        facts["image_bytes"] = origin.engine.store.db.one("SELECT erofs_size FROM layer_objects WHERE layer=?",
                                                          (layer,))[0] or 0
        warm_node.close()
        origin.close()
        load = os.getloadavg()[0]
        gets_med = statistics.median(gets)
        for how, xs, ph in (("EROFS image, mounted", cold, fetches), ("tar, unpacked", cold_tar, fetches_tar)):
            paired = statistics.median(c / (g + u) for c, g, u in zip(xs, gets, untar))
            rows.append((f"cold start, layer by its {how}: first /bin/true on a node with an empty cache "
                         f"({facts['bytes'] / 1e6:.0f} MB, {facts['files']} files, {facts['layers']} layer(s))", xs,
                         f"goal <= 2 s; {statistics.median(xs) / gets_med:.1f}x one GET, "
                         f"{paired:.2f}x GET + tar -x (paired); load {load:.1f}"))
            phases = {k: statistics.median([t.get(k, 0.0) for t in ph]) for k in ph[0]}
            rows.append(("  of which fetching the layers (" + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in phases.items())
                         + ")", [sum(t.values()) for t in ph], ""))
        rows.append(("the same run, layers cached (the node's second run)", warm, ""))
        rows.append(("floor: one GET of the layer object to /dev/null", gets,
                     f"{facts['object_bytes'] / statistics.median(gets) / 1e6:.0f} MB/s"))
        rows.append(("floor: GNU tar -x of the same tar from a local file", untar, ""))
        rows.append(("opening a node's engine (boto3, HEAD bucket; not in the cold start)", opened, ""))
        rows.append(("at upload: mkfs.erofs of the layer (once, on the importing node)", [facts["mkfs"]],
                     f"image {facts['image_bytes'] / 1e6:.0f} MB beside the {facts['object_bytes'] / 1e6:.0f} MB tar"))
        return rows, facts
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3.stop()


def _remove(path: str) -> None:
    """rm -rf, never through a mount (PLATFORM.md): a node's images are unmounted by its close()."""
    with open("/proc/self/mountinfo") as f:
        if any(line.split()[4].startswith(path + "/") or line.split()[4] == path for line in f):
            raise RuntimeError(f"{path} still has a mount: not removed")
    shutil.rmtree(path)


def coldstart_table(work: str, n: int = 5) -> Table:
    rows, _ = coldstart_rows(work, n)
    t = Table(title=f"cold start from S3 on loopback (issue 20; n={n}; {os.cpu_count()} CPUs; "
                    f"load average {os.getloadavg()[0]:.1f} at the end: file creation, the floor here, slows with it)")
    for c in ("what", "p50 ms", "max ms", "note"):
        t.add_column(c, justify="left" if c in ("what", "note") else "right")
    for name, xs, note in rows:
        t.add_row(name, f"{statistics.median(xs) * 1e3:.0f}", f"{max(xs) * 1e3:.0f}", note)
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=5)
    args = ap.parse_args()
    from rich.console import Console
    work = tempfile.mkdtemp(prefix="st-bench-cold-")
    try:
        Console(width=160).print(coldstart_table(work, args.n))
    finally:
        workdir.remove_unless_mounted(work)      # never through a mount (PLATFORM.md)


if __name__ == "__main__":
    main()
