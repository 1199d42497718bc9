"""Where a run goes: a node's configuration, what the API side knows of each node, and the one
choice. The choice is a pure function so the layer cache feeds it only data:
which layers each node reported holding."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import NodeLost


@dataclass(frozen=True)
class NodeConfig:
    """What a sandtree node is made of. database_url: the shared metadata database
    (postgresql://...; sqlite:///path only for nodes of one machine). objects_url: the shared object
    store (s3://bucket/prefix), or None: objects live in the one store directory `home`, which
    every node then shares (one machine, or a shared filesystem). With objects_url, `home` is the
    directory under which each node keeps a home of its own (home_for): its layer cache, work dirs
    and live sandboxes' files, as on a machine of its own."""
    home: str
    database_url: str | None = None
    objects_url: str | None = None

    def home_for(self, node_id: str, override: str | None = None) -> str:
        """The store directory of node `node_id`: `override` (the node's SANDTREE_NODE_HOME) when
        set, else `home` itself without S3 objects (shared), else home/node-<first 16 of its ID>."""
        if override:
            return override
        if not self.objects_url:
            return self.home
        return os.path.join(self.home, f"node-{node_id[:16]}")


@dataclass
class NodeView:
    """The API side's picture of a node. id: the Ray node ID. cpus: its Ray CPU resource.
    running: calls this process has in flight on it. sandboxes: live sandboxes it started there.
    layers: the layer IDs it reported holding
    (None: it sees every layer, as nodes sharing one store directory do)."""
    id: str
    cpus: float
    running: int = 0
    sandboxes: int = 0
    layers: frozenset[str] | None = None
    address: str = ""


LOCALITY_WEIGHT = 2.0   # a node missing all of an image's layers counts as this many more runs per CPU


def choose_node(nodes: Sequence[NodeView], layers: Iterable[str] = ()) -> NodeView:
    """The node for a run or a sandbox of an image made of `layers`: the lowest load per CPU (runs
    in flight plus live sandboxes), where a node missing some of the layers counts the fetch as
    LOCALITY_WEIGHT x the share it misses (so a node holding the image wins until it is two runs
    per CPU busier than one that must fetch: locality without piling every run on one node); ties
    go to the node holding more of them, then to fewer runs in flight.
    NodeLost when there is no node at all."""
    if not nodes:
        raise NodeLost("no sandtree node is alive in the cluster (a Ray node with CPUs runs one)")
    want = frozenset(layers)

    def held(n: NodeView) -> int:
        return len(want) if n.layers is None else len(want & n.layers)

    def cost(n: NodeView) -> float:
        missing = (len(want) - held(n)) / len(want) if want else 0.0
        return (n.running + n.sandboxes) / max(n.cpus, 1.0) + LOCALITY_WEIGHT * missing

    return min(nodes, key=lambda n: (cost(n), -held(n), n.running))
