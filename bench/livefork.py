"""A live fork (sb.fork(n), issue 38) of a sandbox whose process holds 100 MB, side by side with a
hibernate + resume of the same sandbox, in one run, on both tiers: `python bench/bench.py --only
live-fork` (also part of the full `make bench`).

Rows, per tier: the source's stall three ways (what each child reports, `forked_from.stall_ms`;
the longest gap of a counter the source keeps writing (tests/programs/ticker.c), read from
outside by a process of its own polling the file through the sandbox's root; and the same
counter's own view of it), where the stall goes (freeze, the filesystem commit, the checkpoint:
probes around the engine's own steps, which change nothing they wrap); the first child running
and each further one (from the call); fork(4) in all; then memory: 4 children against 4
independent copies (each started from the image and filling its own 100 MB), read from each
sandbox's cgroup (usage, and its memory.stat: anonymous, shmem, the rest of its page cache; the
host's MemAvailable moves with every other process on a shared host, so it is not shown). Every child is checked: the counter one further and the same 100 MB checksum.
Prints a table; asserts nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rich.table import Table

PROGRAMS = os.path.join(os.path.dirname(__file__), "..", "tests", "programs")
ASK = "touch /tmp/ask; while [ -e /tmp/ask ]; do sleep 0.005; done; cat /tmp/answer"
TARGETS = {"stall": "<= 20 ms p50", "first": "<= 150 ms", "further": "<= 50 ms"}

# The outside reader: its own process (no GIL shared with the fork it times), polling every
# 0.2 ms until its stdin closes; prints the longest time the count did not move, in ms.
POLLER = r"""
import os, sys, time, select
fd = os.open(sys.argv[1], os.O_RDONLY)
last, seen, longest = None, time.monotonic(), 0.0
while not select.select([0], [], [], 0)[0]:
    try:
        count = os.pread(fd, 21, 0)
    except OSError:
        count = b""
    now = time.monotonic()
    if count != last and count.strip():
        longest = max(longest, now - seen) if last is not None else longest
        last, seen = count, now
    time.sleep(0.0002)
print(f"{longest * 1e3:.1f}")
"""


def memstate_image(st, work: str):
    """The busybox rootfs with memstate (100 MB of random bytes and a counter, in memory only) and
    ticker, as tests/kernel/test_live_fork.py builds it."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from conftest import make_rootfs
    root = os.path.join(work, "livefork-root")
    if not os.path.isdir(root):
        make_rootfs(root)
        os.makedirs(os.path.join(root, "usr/local/bin"))
        for prog in ("memstate", "ticker"):
            subprocess.run(["cc", "-O2", "-static", "-o", os.path.join(root, "usr/local/bin", prog),
                            os.path.join(PROGRAMS, prog + ".c")], check=True)
    return st.import_image(root)


class Probes:
    """Times of the engine's own steps during one fork: each wrapped method records (name, start,
    end) and returns what it returned. Removed by close()."""

    def __init__(self, sandboxes):
        self.marks: list[tuple[str, float, float]] = []
        self._undo = []
        for obj, names in ((sandboxes.live, ("freeze", "dump", "start")), (sandboxes, ("_snapshot",))):
            for name in names:
                self._wrap(obj, name)

    def _wrap(self, obj, name):
        f = getattr(obj, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                self.marks.append((name, t, time.perf_counter()))
        setattr(obj, name, timed)
        self._undo.append((obj, name))

    def of(self, name):
        return [(a, b) for n, a, b in self.marks if n == name]

    def close(self):
        for obj, name in self._undo:
            delattr(obj, name)


def _until(sb, command: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not sb.exec(command).ok:
        if time.monotonic() > end:
            raise RuntimeError(f"not in {timeout} s: {command}")
        time.sleep(0.02)


def _memory(st, sids) -> dict:
    """Summed over sandboxes `sids`: their cgroups' usage and memory.stat's anon/cache/shmem."""
    out = {"usage": 0, "anon": 0, "file": 0, "shmem": 0}
    for sid in sids:
        cg = st._engine.sandboxes._row(sid)["handle"].cg()
        out["usage"] += cg.memory_current() or 0
        if cg.version == "v1":
            with open(os.path.join(cg.dirs["memory"], "memory.stat")) as f:
                kv = dict(line.split() for line in f if line.strip())
            out["anon"] += int(kv.get("total_rss", kv.get("rss", 0)))
            out["file"] += int(kv.get("total_cache", kv.get("cache", 0)))
            out["shmem"] += int(kv.get("total_shmem", kv.get("shmem", 0)))
        else:
            with open(os.path.join(cg.dirs["unified"], "memory.stat")) as f:
                kv = dict(line.split() for line in f if line.strip())
            out["anon"] += int(kv.get("anon", 0))
            out["file"] += int(kv.get("file", 0))
            out["shmem"] += int(kv.get("shmem", 0))
    return out


def _tick_path(st, sb) -> str:
    """The counter file as the host sees it: the sandbox's root (namespaces: its pid 1's; gVisor:
    the host overlay its Sentry serves, writes passed through)."""
    h = st._engine.sandboxes._row(sb.id)["handle"]
    if h.tier == "gvisor":
        return f"/proc/{h.helper_pid}/root/tmp/r/tmp/tick"
    return f"/proc/{h.init_pid}/root/tmp/tick"


def tier_rows(st, img, tier: str, rounds: int, children: int, mb: int) -> dict:
    """One tier's samples (seconds; memory in bytes): see the module doc."""
    eng = st._engine.sandboxes
    out = {k: [] for k in ("stall", "outside", "inside", "freeze", "commit", "dump", "first", "further",
                           "total", "hibernate", "resume")}
    sb = img.start(lifetime=3600, tier=tier, memory="512m")
    try:
        assert sb.exec(f"memstate {mb} >/dev/null 2>&1 &").ok
        assert sb.exec("ticker /tmp/tick >/dev/null 2>&1 &").ok
        _until(sb, "test -e /tmp/ready && test -s /tmp/tick")
        count, total = sb.exec(ASK).stdout.split()
        count = int(count)
        for r in range(rounds):
            assert sb.exec("touch /tmp/tick-reset").ok
            _until(sb, "! test -e /tmp/tick-reset")
            poller = subprocess.Popen([sys.executable, "-c", POLLER, _tick_path(st, sb)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
            time.sleep(0.2)
            probes = Probes(eng)
            try:
                t0 = time.perf_counter()
                kids = sb.fork(children)
                t1 = time.perf_counter()
            finally:
                probes.close()
            time.sleep(0.1)
            outside, _ = poller.communicate("")
            try:
                if r == 0:
                    out["children_memory"] = _memory(st, [k.id for k in kids])
                out["stall"].append(kids[0].info()["forked_from"]["stall_ms"] / 1e3)
                out["outside"].append(float(outside) / 1e3)
                out["inside"].append(int(sb.exec("cat /tmp/tick").stdout.split()[1]) / 1e6)
                [(f0, f1)] = probes.of("freeze")[:1]
                out["freeze"].append(f1 - f0)
                out["commit"].append(sum(b - a for a, b in probes.of("_snapshot")))
                out["dump"].append(sum(b - a for a, b in probes.of("dump")))
                ready = [b for a, b in probes.of("start")]
                out["first"].append(ready[0] - t0)
                out["further"] += [b - a for a, b in zip(ready, ready[1:])]
                out["total"].append(t1 - t0)
                for k in kids:          # each child goes on from the fork: one further, the same bytes
                    got = k.exec(ASK).stdout.split()
                    if got != [str(count + 1).encode(), total]:
                        raise RuntimeError(f"a child lost the state: {got}, not {count + 1} {total}")
            finally:
                for k in kids:
                    k.stop()
            if sb.exec(ASK).stdout.split() != [str(count + 1).encode(), total]:
                raise RuntimeError("the source lost its state")
            count += 1
        # hibernate + resume of the same sandbox, in the same run
        for _ in range(rounds):
            t = time.perf_counter()
            sb.hibernate()
            out["hibernate"].append(time.perf_counter() - t)
            t = time.perf_counter()
            sb.resume()
            out["resume"].append(time.perf_counter() - t)
            if sb.exec(ASK).stdout.split() != [str(count + 1).encode(), total]:
                raise RuntimeError("resume lost the state")
            count += 1
    finally:
        sb.stop()
    # the same number of independent copies: each started from the image, filling its own MB
    copies = [img.start(lifetime=600, tier=tier, memory="512m") for _ in range(children)]
    try:
        for c in copies:
            assert c.exec(f"memstate {mb} >/dev/null 2>&1 &").ok
        for c in copies:
            _until(c, "test -e /tmp/ready")
        out["copies_memory"] = _memory(st, [c.id for c in copies])
    finally:
        for c in copies:
            c.stop()
    return out


def livefork_table(st, work: str, pct, rounds: int = 5, children: int = 4, mb: int = 100) -> Table:
    """pct(xs, p): bench.py's percentile."""
    img = memstate_image(st, work)
    tiers = {}
    for tier in ("namespaces", "gvisor"):
        try:
            ok, why = st._engine._live.hibernate_available(tier)
        except Exception as exc:          # (a tier not on this host at all)
            ok, why = False, str(exc)
        tiers[tier] = tier_rows(st, img, tier, rounds, children, mb) if ok else why
    table = Table(title=f"live fork: sb.fork({children}) of a sandbox whose process holds {mb} MB, and "
                        f"hibernate + resume of it ({rounds} rounds; ms)")
    table.add_column("what")
    for tier in tiers:
        table.add_column(f"{tier} p50", justify="right")
        table.add_column(f"{tier} p90", justify="right")
    table.add_column("target")

    def row(label, key, target=""):
        cells = []
        for got in tiers.values():
            if isinstance(got, str) or not got.get(key):
                cells += ["-", "-"]
            else:
                cells += [f"{pct(got[key], 50) * 1e3:.1f}", f"{pct(got[key], 90) * 1e3:.1f}"]
        table.add_row(label, *cells, target)

    row("source stall (forked_from.stall_ms)", "stall", TARGETS["stall"])
    row("  seen outside: longest gap of its counter", "outside")
    row("  seen inside: the counter's own longest gap", "inside")
    row("  of which: freeze", "freeze")
    row("  of which: filesystem commit (namespaces: during the checkpoint)", "commit")
    row("  of which: checkpoint (leave running)", "dump")
    row("first child running (from the call)", "first", TARGETS["first"])
    row("each further child", "further", TARGETS["further"])
    row(f"fork({children}) in all", "total")
    row("hibernate (same sandbox)", "hibernate")
    row("resume", "resume")

    def mem(label, key, field):
        cells = []
        for got in tiers.values():
            if isinstance(got, str):
                cells += ["-", ""]
            else:
                m = got[key]
                v = m if field is None else m.get(field, 0)
                cells += [f"{m['anon'] / 2**20:.0f} / {m['shmem'] / 2**20:.0f} / "
                          f"{(m['file'] - m['shmem']) / 2**20:.0f} MiB"
                          if field == "split" else f"{v / 2**20:.0f} MiB", ""]
        table.add_row(label, *cells, "")

    for who, key in ((f"{children} children", "children"), (f"{children} independent copies", "copies")):
        mem(f"{who}: cgroup usage", f"{key}_memory", "usage")
        mem(f"{who}: anonymous / shmem / other page cache", f"{key}_memory", "split")
    notes = [f"{tier}: unavailable ({why})" for tier, why in tiers.items() if isinstance(why, str)]
    table.caption = ("Targets from issue 38 (namespaces). Memory: each child's pages are its own (CRIU restores "
                     "into anonymous memory, runsc into each Sentry's memory file: shmem), so a child costs what "
                     "an independent copy does; only the image files' page cache is shared. "
                     + " ".join(notes))
    return table
