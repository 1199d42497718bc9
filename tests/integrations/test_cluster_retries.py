"""Dispatch.run_operation's retries on a lost node (engine/clustered.py), on a real store and real
runs. The node is a stand-in here (the one thing that cannot be arranged on a real cluster: a
node dying exactly after it committed a run and before it answered); tests/integrations/test_cluster.py kills
real Ray nodes mid-run."""

from __future__ import annotations

import pytest

from sandtree.engine.clustered import Dispatch
from sandtree.errors import NodeLost


class _Node:
    """A fabric of nodes that run on the caller's engine: each call in `plan` says whether that
    attempt commits before its node is lost ('commit'), is lost before ('lost') or answers ('ok')."""

    def __init__(self, engine, plan):
        self.engine, self.plan, self.calls = engine, list(plan), []

    def nodes(self):
        return []

    def run(self, ref, command, *, op_id, options, layers, cancel, avoid, on_output):
        self.calls.append(list(avoid))
        what = self.plan.pop(0)
        if what == "lost":
            raise NodeLost(f"node n{len(self.calls)} was lost during a run: test", node=f"n{len(self.calls)}")
        rec = self.engine.run_operation(ref, command, op_id=op_id, **options)
        if what == "commit":
            raise NodeLost(f"node n{len(self.calls)} was lost during a run: test", node=f"n{len(self.calls)}")
        return rec


def _dispatch(engine, plan):
    fabric = _Node(engine, plan)
    return Dispatch(engine.store, engine.resolve, fabric, lambda: None), fabric


def test_a_lost_node_that_had_not_committed_is_retried_elsewhere(shared_st, bb):
    engine = shared_st._engine
    d, fabric = _dispatch(engine, ["lost", "ok"])
    rec = d.run_operation(bb.id, ["sh", "-c", "echo r > /r"], retries=2)
    assert rec.exit_code == 0 and rec.usage["retried_after_lost"] == ["n1"]
    assert fabric.calls == [[], ["n1"]]                         # the second attempt avoided the lost node
    assert engine.read(rec.image, "/r") == b"r\n"


def test_a_run_committed_just_before_its_node_was_lost_is_not_run_again(shared_st, bb):
    """Its row is done with the image it made: the caller's NodeLost names that image (a retry
    would run the command a second time)."""
    engine = shared_st._engine
    d, fabric = _dispatch(engine, ["commit", "ok"])
    with pytest.raises(NodeLost) as e:
        d.run_operation(bb.id, ["sh", "-c", "echo once >> /log"], retries=2)
    assert len(fabric.calls) == 1
    image, op = e.value.details["image"], e.value.details["operation"]
    assert image and engine.read(image, "/log") == b"once\n"
    assert engine.operations.get(op)["result"] == image and image in str(e.value)
    # without retries the lost node's error is the caller's, as it came
    d, fabric = _dispatch(engine, ["lost"])
    with pytest.raises(NodeLost) as e:
        d.run_operation(bb.id, ["true"])
    assert "image" not in e.value.details
