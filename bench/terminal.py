"""A key's echo through a live sandbox's terminal (sandbox_popen with pty=True), per tier: a key
typed on the caller's pty until its echo is back there, p50 and p90. Two echoes: the terminal's
own (`cat` in cooked mode: the line discipline echoes) and the program's (`cat` with the terminal
raw and no echo: the key goes to cat and back). In the namespaces tier the command's terminal is
one of the sandbox's own devpts, relayed by its entering helper (helper/terminal.c relay_terminal); in
gVisor's, by agent.c --tty inside. bench/cluster.py uses keystroke_ms for its relayed row.

    PYTHONPATH=src .venv/bin/python bench/terminal.py [-n 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import make_rootfs  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import sandtree  # noqa: E402
import workdir  # noqa: E402  (bench/workdir.py)

__all__ = ["keystroke_ms"]

# Keys are typed once the command says "go" (a key typed before the command has its terminal is
# echoed by the caller's, not the sandbox's). The terminal echoes: cat reads whole lines. The
# program echoes: its terminal raw (no echo, no line discipline), cat writes back each byte.
TERMINAL_ECHO = ("sh", "-c", "echo go; exec cat")
PROGRAM_ECHO = ("sh", "-c", "stty raw -echo; echo go; exec cat")


def keystroke_ms(engine, image: str, n: int, argv=TERMINAL_ECHO, tier: str | None = None) -> tuple[float, float]:
    """A key typed into a terminal (sandbox_popen, pty=True, of argv, which says "go" first) until
    its echo is back on the caller's pty: p50, p90 (after 5 keys of warm-up)."""
    import pty
    import select
    sid = engine.sandbox_start(image, **({"tier": tier} if tier else {}))["id"]
    master, slave = pty.openpty()
    try:
        p = engine.sandbox_popen(sid, list(argv), pty=True, stdin=slave, stdout=slave, stderr=slave)
        os.close(slave)
        slave = None
        got = b""
        while b"go" not in got:
            select.select([master], [], [], 10)
            got += os.read(master, 4096)

        def key():
            os.write(master, b"k")
            got = b""
            while b"k" not in got:
                select.select([master], [], [], 10)
                got += os.read(master, 4096)
        times = []
        for i in range(n + 5):
            t = time.perf_counter()
            key()
            if i >= 5:
                times.append((time.perf_counter() - t) * 1000)
        times.sort()
        os.write(master, b"\x04\x04")
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
        return statistics.median(times), times[int(len(times) * 0.9)]
    finally:
        os.close(master)
        if slave is not None:
            os.close(slave)
        engine.sandbox_stop(sid)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=300)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="st-bench-terminal-")
    rows = []
    try:
        st = sandtree.Sandtree(os.path.join(work, "home"))
        image = st.import_image(make_rootfs(os.path.join(work, "rootfs"))).id
        tiers = [r["tier"] for r in st.doctor() if r["available"] and r["tier"] in ("namespaces", "gvisor")]
        for tier in tiers:
            for what, argv in (("the terminal's echo (cat, cooked)", TERMINAL_ECHO),
                               ("the program's echo (cat, raw)", PROGRAM_ECHO)):
                p50, p90 = keystroke_ms(st.engine, image, args.n, argv, tier)
                rows.append((tier, what, f"{p50:.3f}", f"{p90:.3f}"))
        st.close()
    finally:
        workdir.remove_unless_mounted(work)      # never through a mount (PLATFORM.md)
    t = Table(title=f"a key's echo through a live sandbox's terminal (n={args.n}); "
                    f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    for c in ("tier", "echo", "p50 ms", "p90 ms"):
        t.add_column(c)
    for r in rows:
        t.add_row(*r)
    Console().print(t)


if __name__ == "__main__":
    main()
