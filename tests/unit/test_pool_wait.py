"""Pool.take's wait for a start under way (engine/warm/pools.py START_WAIT, issue 18 item 5).

The scheduling alone, with a stand-in for the live tier whose starts take a set time: real starts
take 3-10 ms here depending on the load, which would make the bounds below a matter of luck. The
real pools are tested in test_live.py (test_warm_pool_runs_like_a_run and the relay test)."""

from __future__ import annotations

import os
import tempfile
import time
import types

from sandtree.engine.warm import pools
from sandtree.procid import start_time
from sandtree.runtime.base import Limits, RunSpec


class SlowStarts:
    """What Pool's fillers call on a live tier: a start takes `delay` seconds."""

    def __init__(self, delay: float):
        self.delay, self.started, self.stopped = delay, 0, 0

    def start(self, spec, lifetime, *, detach, tier):
        time.sleep(self.delay)
        self.started += 1
        # (its "pid 1" is this process: Ready pins it with a pidfd checked against its start time)
        return types.SimpleNamespace(init_pid=os.getpid(), init_start=start_time(os.getpid()), cg=lambda: None)

    def enter_ahead(self, h, relay=None):
        return None

    def scratch(self, h):
        return os.open(tempfile.gettempdir(), os.O_RDONLY | os.O_DIRECTORY)

    def stop(self, h, wait=2.0):
        self.stopped += 1


def _pool(delay: float) -> tuple[pools.Pool, SlowStarts]:
    live = SlowStarts(delay)
    template = RunSpec(argv=["sandtree-init"], layers=[], root_meta=(0o755, 0, 0), limits=Limits())
    pool = pools.Pool(live, "img", template, 1)
    assert pool.wait_ready(10)
    return pool, live


def test_a_run_waits_for_a_start_under_way_not_longer_than_start_wait():
    pool, live = _pool(0.002)
    try:
        first = pool.take()                        # the only ready one: its replacement starts now
        t = time.monotonic()
        second = pool.take()                       # none ready, one starting: waited for
        assert first is not None and second is not None and pool.misses == 0
        assert time.monotonic() - t < 1.0
        pool.returned()
        pool.returned()
    finally:
        pool.close()
    assert live.stopped == live.started - 2        # the pool stopped all but the two taken
    pool, live = _pool(0.2)                        # a start slower than START_WAIT
    try:
        assert pool.take() is not None
        t = time.monotonic()
        assert pool.take() is None and pool.misses == 1            # runs cold after the wait
        assert pools.START_WAIT * 0.9 <= time.monotonic() - t < 0.15
        assert pool.waiting == 0
        pool.returned()
    finally:
        pool.close()
    assert live.stopped == live.started - 1


def test_a_run_does_not_wait_for_a_start_another_run_waits_for():
    pool, live = _pool(0.2)
    try:
        assert pool.take() is not None
        with pool.cv:
            pool.waiting = pool.size               # (as if another run already waited for it)
        t = time.monotonic()
        assert pool.take() is None
        assert time.monotonic() - t < pools.START_WAIT / 2
        with pool.cv:
            pool.waiting = 0
        pool.returned()
    finally:
        pool.close()
