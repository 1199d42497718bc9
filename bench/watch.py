"""A watch event's latency: a file written in a live sandbox until its event is in the watcher's hands,
p50 and p90 (issue target: <= 50 ms). Rows:

- in-process, per tier: a process of the sandbox appends to a file (a shell spawned once, told by a
  line on its stdin), sandbox_watch_events waiting; from the stdin write to the event returned.
- E2B's SDK (AsyncSandbox.files.watch_dir, the WatchDir stream) against `sandtree serve` on loopback:
  from files.write's call to on_event (the write's own HTTP request included).

    PYTHONPATH=src .venv/bin/python bench/watch.py [-n 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import make_rootfs, serve_process  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import sandtree  # noqa: E402
import workdir  # noqa: E402  (bench/workdir.py)


def _p(times: list[float]) -> tuple[float, float]:
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9)]


def engine_ms(engine, image: str, n: int, tier: str) -> tuple[float, float]:
    sid = engine.sandbox_start(image, tier=tier)["id"]
    try:
        engine.sandbox_exec(sid, "mkdir -p /w")
        pid = engine.sandbox_spawn(sid, "while read line; do echo $line >> /w/f; done", stdin_open=True)
        wid = engine.sandbox_watch(sid, "/w")["watch"]
        times = []
        for i in range(n + 5):
            t = time.perf_counter()
            engine.sandbox_stdin(sid, pid, b"x\n", close=False)
            while not any(e["type"] == "write" for e in engine.sandbox_watch_events(sid, wid, timeout=10)["events"]):
                pass
            if i >= 5:
                times.append((time.perf_counter() - t) * 1000)
            time.sleep(0.002)
            engine.sandbox_watch_events(sid, wid)              # what else the append gave (none left over)
        engine.sandbox_unwatch(sid, wid)
        return _p(times)
    finally:
        engine.sandbox_stop(sid)


def e2b_ms(url: str, st, image: str, n: int) -> tuple[float, float]:
    os.environ.update(E2B_API_URL=url + "/e2b", E2B_SANDBOX_URL=url + "/e2b/sandbox", E2B_API_KEY="unused")
    from e2b import AsyncSandbox, ConnectionConfig
    from e2b.sandbox.filesystem.watch_handle import FilesystemEventType
    from packaging.version import Version
    sb = st.image(image).start()

    async def main():
        cc = ConnectionConfig(extra_sandbox_headers={"E2b-Sandbox-Id": sb.id, "E2b-Sandbox-Port": "49983"})
        s = AsyncSandbox(sandbox_id=sb.id, envd_version=Version("0.6.4"), envd_access_token=None,
                         sandbox_domain=None, connection_config=cc)
        await s.files.make_dir("/w")
        got: asyncio.Queue = asyncio.Queue()
        h = await s.files.watch_dir("/w", lambda ev: got.put_nowait(time.perf_counter())
                                    if ev.type == FilesystemEventType.WRITE else None, timeout=0)
        times = []
        for i in range(n + 5):
            t = time.perf_counter()
            await s.files.write(f"/w/f{i}", b"x")
            seen = await asyncio.wait_for(got.get(), 10)
            if i >= 5:
                times.append((seen - t) * 1000)
        await h.stop()
        return _p(times)
    try:
        return asyncio.run(main())
    finally:
        sb.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="st-bench-watch-")
    rows = []
    try:
        home = os.path.join(work, "home")
        st = sandtree.Sandtree(home)
        image = st.import_image(make_rootfs(os.path.join(work, "rootfs"))).id
        tiers = [r["tier"] for r in st.doctor() if r["available"] and r["tier"] in ("namespaces", "gvisor")]
        for tier in tiers:
            p50, p90 = engine_ms(st.engine, image, args.n, tier)
            rows.append((f"in-process, {tier}", "a sandbox process's append -> sandbox_watch_events", f"{p50:.2f}",
                         f"{p90:.2f}"))
        st.close()
        try:
            import e2b  # noqa: F401
        except ImportError:
            rows.append(("E2B SDK", "(the e2b extra is not installed)", "-", "-"))
        else:
            with serve_process(home) as url:
                remote = sandtree.connect(url)
                p50, p90 = e2b_ms(url, remote, image, args.n)
                remote.close()
            rows.append(("E2B SDK, loopback", "files.write called -> watch_dir's on_event", f"{p50:.2f}",
                         f"{p90:.2f}"))
    finally:
        workdir.remove_unless_mounted(work)      # never through a mount (PLATFORM.md)
    t = Table(title=f"a watch event after a write (n={args.n}; target <= 50 ms); "
                    f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    for c in ("where", "from -> to", "p50 ms", "p90 ms"):
        t.add_column(c)
    for r in rows:
        t.add_row(*r)
    Console().print(t)


if __name__ == "__main__":
    main()
