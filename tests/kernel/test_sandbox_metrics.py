"""sandbox_metrics: a live sandbox's CPU, memory and disk over time, from its cgroup and the tmpfs
that holds its upper, on each tier (E2B's get_metrics is this row: tests/e2e/test_e2b_control.py)."""

import time

import pytest


def test_metrics_follow_the_sandbox(bb, each_tier):
    sb = bb.start(memory="256m")
    try:
        first = sb.metrics()
        assert len(first) == 1, "a one-shot engine answers the sample of now"
        m = first[0]
        assert m["mem_total"] == 256 << 20 and 0 < m["mem_used"] <= m["mem_total"]
        assert m["disk_total"] > 0 and 0 <= m["disk_used"] < m["disk_total"]
        assert m["cpu_count"] >= 1 and 0 <= m["cpu_used_pct"] <= 100
        # CPU spent and bytes written show in the next sample
        sb.exec("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; dd if=/dev/zero of=/root/f bs=64k count=64 2>/dev/null")
        later = sb.metrics()
        assert len(later) == 2 and later[1]["timestamp"] > later[0]["timestamp"]
        assert later[1]["disk_used"] >= m["disk_used"] + (4 << 20) - (64 << 10)
        assert later[1]["cpu_used_pct"] > 0
        # a range: none before it started; start > end is refused
        assert sb.metrics(start=0, end=time.time() - 3600) == []
        assert len(sb.metrics(start=later[1]["timestamp"])) == 2          # (the third: of now)
        with pytest.raises(Exception, match="before start"):
            sb.metrics(start=10.0, end=5.0)
        # the engine's timer: samples of every running sandbox, none of ended ones
        engine = sb._st._engine
        assert engine.sandboxes.sample_metrics() >= 1
        assert len(sb.metrics()) == 5                                       # 3, the timer's, now
    finally:
        sb.stop()
    assert sb._st._engine.sandboxes.sample_metrics() >= 0
    assert sb._st._engine.sandboxes._metrics_state()[0].get(sb.id) is None
    assert sb.metrics() == [], "a stopped sandbox: its samples went with it"
