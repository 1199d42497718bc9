"""choose_node (cluster/scheduling.py): the one scheduling decision, a pure function the layer
cache feeds with what each node reported holding."""

from __future__ import annotations

import pytest

from sandtree.cluster import NodeConfig, NodeView, choose_node
from sandtree.errors import NodeLost


def test_by_load_per_cpu_when_every_node_sees_every_layer():
    a, b = NodeView("a", cpus=4, running=3), NodeView("b", cpus=1, running=1)
    assert choose_node([a, b], ["l1"]).id == "a"            # 0.75 per CPU < 1.0
    b.running = 0
    assert choose_node([a, b], ["l1"]).id == "b"
    b.sandboxes = 2                                          # live sandboxes count as load
    assert choose_node([a, b], ["l1"]).id == "a"


def test_locality_first_then_load():
    holds = NodeView("holds", cpus=1, running=5, layers=frozenset({"l1", "l2"}))
    empty = NodeView("empty", cpus=8, running=0, layers=frozenset())
    part = NodeView("part", cpus=8, running=0, layers=frozenset({"l1"}))
    assert choose_node([empty, part, holds], ["l1", "l2"]).id == "holds"
    assert choose_node([empty, part], ["l1", "l2"]).id == "part"
    assert choose_node([empty, part], []).id in ("empty", "part")   # no layers asked: load only


def test_spread_by_runs_in_flight():
    nodes = [NodeView("a", 1), NodeView("b", 1)]
    picked = []
    for _ in range(4):
        n = choose_node(nodes)
        n.running += 1
        picked.append(n.id)
    assert sorted(picked) == ["a", "a", "b", "b"]


def test_no_node_is_node_lost():
    with pytest.raises(NodeLost, match="no sandtree node"):
        choose_node([], ["l1"])


def test_node_config_is_the_triple():
    c = NodeConfig("/srv/st", "postgresql://u@/db", "s3://bucket/prefix")
    assert (c.home, c.database_url, c.objects_url) == ("/srv/st", "postgresql://u@/db", "s3://bucket/prefix")
    assert NodeConfig("/srv/st").objects_url is None
