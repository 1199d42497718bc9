"""Live sandboxes and warm pools on the gvisor tier (issue 18), side by side with `runsc do` and
the namespaces tier's, in one process: `python bench/bench.py --only gvisor-live` (also part of the
full `make bench`)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time

from rich.table import Table


def gvisor_live_table(st, img, timeit, pct, n: int = 50, pool_size: int = 4) -> Table:
    """timeit(fn, n) -> seconds per call, pct(xs, p) -> a percentile: bench.py's."""
    def _ms(xs, p):
        return f"{pct(xs, p) * 1e3:.1f}"
    table = Table(title=f"gVisor live sandboxes and pools ({n} samples; targets: pool run <= 20 ms p50, "
                        "live exec <= 10 ms p50)")
    for c in ("what", "p50 ms", "p90 ms", "note"):
        table.add_column(c, justify="left" if c in ("what", "note") else "right")
    gv = {r["tier"]: r for r in st.doctor()}["gvisor"]
    if not gv["available"]:
        table.add_row(f"tier gvisor: unavailable ({gv['reason']})", "-", "-", "")
        return table
    rows = []
    runsc = shutil.which("runsc")
    do = timeit(lambda: subprocess.run([runsc, "--network=none", "--platform=systrap", "do", "/bin/true"]),
                 max(10, n // 5))
    rows.append(("runsc do /bin/true (gVisor's own one-shot)", do, ""))
    cold = timeit(lambda: img.run(["/bin/true"], tier="gvisor"), max(10, n // 5))
    rows.append(("img.run(['/bin/true'], tier='gvisor'), no pool", cold,
                 f"{statistics.median(cold) / statistics.median(do):.2f}x runsc do"))
    starts, stops = [], []
    for _ in range(max(10, n // 5)):
        t = time.perf_counter()
        sb = img.start(tier="gvisor")
        starts.append(time.perf_counter() - t)
        t = time.perf_counter()
        sb.stop()
        stops.append(time.perf_counter() - t)
    rows.append(("img.start(tier='gvisor') (Sentry up, pid 1 waiting)", starts, ""))
    rows.append(("sb.stop() (gvisor)", stops, ""))
    spawntime = _spawntime()
    for tier in ("gvisor", "namespaces"):
        with img.start(tier=tier) as sb:
            for label, cmd in (("sb.exec(['/bin/true'])", ["/bin/true"]), ("sb.exec('true') (shell session)", "true")):
                xs = timeit(lambda: sb.exec(cmd), n)
                rows.append((f"{tier}: {label}", xs, "goal <= 10 ms" if tier == "gvisor" else ""))
            if spawntime is not None:
                # the same program started by a process inside: the sandbox's own floor under an exec
                sb.write("/tmp/spawntime", spawntime, mode=0o755)
                got = sb.exec(["/tmp/spawntime", str(n), "/bin/true"]).stdout.split()
                if len(got) == 2:
                    rows.append((f"{tier}: /bin/true started from inside (vfork+exec+wait: the floor under "
                                 "sb.exec)", tuple(int(v) / 1e6 for v in got), "tests/programs/spawntime.c"))
            xs = timeit(lambda: sb.write("/tmp/f", b"x" * 1024), n)
            rows.append((f"{tier}: sb.write 1 KB while running", xs, ""))
            sb.exec("echo 1 > /tmp/c")
            xs = []
            for i in range(max(10, n // 5)):
                sb.exec(["sh", "-c", f"echo {i} > /tmp/c"])
                t = time.perf_counter()
                sb.commit()
                xs.append(time.perf_counter() - t)
            rows.append((f"{tier}: sb.commit() while running (1 file changed)", xs, ""))
    # a pool of gVisor sandboxes: a run pays for runsc exec + freeze + commit
    eng = st._engine
    st.pool(img, size=pool_size, wait=True, tier="gvisor")
    xs, hits = [], 0
    for _ in range(n):
        eng.pool_wait(img.id)
        t = time.perf_counter()
        r = img.run(["/bin/true"], tier="gvisor")
        xs.append(time.perf_counter() - t)
        hits += bool(r.usage.get("pool"))
    rows.append((f"pool size {pool_size}, gvisor: img.run(['/bin/true']), refilled between runs "
                 f"({hits}/{n} from the pool)", xs, f"{statistics.median(xs) / statistics.median(do):.2f}x runsc do; "
                                                    "goal <= 20 ms"))
    xs, hits = [], 0
    for _ in range(n):
        t = time.perf_counter()
        r = img.run(["/bin/true"], tier="gvisor")
        xs.append(time.perf_counter() - t)
        hits += bool(r.usage.get("pool"))
    rows.append((f"pool size {pool_size}, gvisor: back to back ({hits}/{n} from the pool)", xs, ""))
    st.pool(img, size=0, tier="gvisor")
    for name, xs, note in rows:
        if isinstance(xs, tuple):               # (p50, p90) measured elsewhere
            table.add_row(name, f"{xs[0] * 1e3:.1f}", f"{xs[1] * 1e3:.1f}", note)
        else:
            table.add_row(name, _ms(xs, 50), _ms(xs, 90), note)
    return table


def _spawntime() -> bytes | None:
    """tests/programs/spawntime.c built static, or None without a C compiler."""
    src = os.path.join(os.path.dirname(__file__), "..", "tests", "programs", "spawntime.c")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "spawntime")
        if subprocess.run(["cc", "-O2", "-static", "-o", out, src], capture_output=True).returncode:
            return None
        with open(out, "rb") as f:
            return f.read()
