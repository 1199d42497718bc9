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
    holds = NodeView("holds", cpus=1, running=1, layers=frozenset({"l1", "l2"}))
    empty = NodeView("empty", cpus=8, running=0, layers=frozenset())
    part = NodeView("part", cpus=8, running=0, layers=frozenset({"l1"}))
    assert choose_node([empty, part, holds], ["l1", "l2"]).id == "holds"   # 1.0 < part's 0 + 2 x 1/2
    assert choose_node([empty, part], ["l1", "l2"]).id == "part"
    assert choose_node([empty, part], []).id in ("empty", "part")   # no layers asked: load only
    idle = NodeView("idle", cpus=1, layers=frozenset({"l1", "l2"}))
    assert choose_node([empty, idle], ["l1", "l2"]).id == "idle"      # equal load: the holder, no fetch


def test_locality_gives_way_to_load():
    """A holder two runs per CPU busier than a node that must fetch loses: runs spread (and the
    other node then holds the image too)."""
    holds = NodeView("holds", cpus=1, running=2, layers=frozenset({"l1"}))
    empty = NodeView("empty", cpus=1, running=0, layers=frozenset())
    assert choose_node([holds, empty], ["l1"]).id == "holds"       # a tie (2 vs 0 + 2): no fetch
    holds.running = 3
    assert choose_node([holds, empty], ["l1"]).id == "empty"
    holds.running, holds.sandboxes = 1, 2                           # live sandboxes count as load
    assert choose_node([holds, empty], ["l1"]).id == "empty"


def test_locality_from_cache_contents():
    """The picture the fabric keeps (Fabric.note_layers from each node's Node.held_layers): a
    node's reported cache decides, None (a shared store directory) holds everything."""
    shared = NodeView("shared", cpus=1, running=1)
    cached = NodeView("cached", cpus=1, running=1, layers=frozenset({"a", "b", "c"}))
    cold = NodeView("cold", cpus=1, running=0, layers=frozenset({"x"}))
    assert choose_node([cold, cached], ["a", "b", "c"]).id == "cached"
    assert choose_node([shared, cached], ["a", "b", "c"]).id in ("shared", "cached")
    assert choose_node([cold, shared], ["a"]).id == "shared"


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


def test_node_home_is_its_own_with_s3_objects():
    shared = NodeConfig("/srv/st", "postgresql://u@/db")
    assert shared.home_for("abcdef0123456789ffff") == "/srv/st"      # one store directory for all
    own = NodeConfig("/srv/st/nodes", "postgresql://u@/db", "s3://bucket/p")
    assert own.home_for("abcdef0123456789ffff") == "/srv/st/nodes/node-abcdef0123456789"
    assert own.home_for("abcdef0123456789ffff", "/var/lib/sandtree") == "/var/lib/sandtree"   # SANDTREE_NODE_HOME
