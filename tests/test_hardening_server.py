"""Hardening of the server, MCP and engine plumbing (issue 12, items 4, 9, 11, 12, 17, 18).

Each test here failed before its fix; the item number is in the test's docstring.
"""

from __future__ import annotations

import threading

from sandtree.engine import Engine


# ---- item 11: lazily made engine parts ------------------------------------------------------------
def test_engine_parts_made_once_under_a_thread_barrier(tmp_path):
    """Item 11: 30 threads touching `operations` / `sandboxes` first at once get one instance.
    Repeated on fresh engines: one trial loses the race only most of the time."""
    home = str(tmp_path / "home")
    for trial in range(10):
        engine = Engine(home, warm=0)
        try:
            for part in ("operations", "sandboxes"):
                barrier = threading.Barrier(30)
                seen, lock = [], threading.Lock()

                def touch(part=part, barrier=barrier, seen=seen, lock=lock):
                    barrier.wait()
                    obj = getattr(engine, part)
                    with lock:
                        seen.append(obj)
                threads = [threading.Thread(target=touch) for _ in range(30)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert len(seen) == 30
                distinct = len({id(o) for o in seen})      # all kept alive: ids are distinct objects
                assert distinct == 1, f"trial {trial}: {distinct} {part} instances"
                assert getattr(engine, part) is seen[0]
        finally:
            engine.close()
