"""Where a run goes: a node's configuration, what the API side knows of each node, and the one
choice. The choice is a pure function so the layer cache (issue 20 item 2) feeds it only data:
which layers each node reported holding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import NodeLost


@dataclass(frozen=True)
class NodeConfig:
    """What a sandtree node is made of. home: its store directory (today every node of one machine
    shares the API's; with the layer cache, each node's own directory, used as its cache).
    database_url: the shared metadata database (postgresql://...; None: SQLite in `home`, which
    only nodes on one machine can share). objects_url: the shared object store (s3://bucket/prefix;
    None: objects live in `home`)."""
    home: str
    database_url: str | None = None
    objects_url: str | None = None


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


def choose_node(nodes: Sequence[NodeView], layers: Iterable[str] = ()) -> NodeView:
    """The node for a run or a sandbox of an image made of `layers`: the one holding most of them
    (locality: no fetch), then the least loaded per CPU (runs in flight plus live sandboxes), then
    the fewest runs in flight.
    NodeLost when there is no node at all."""
    if not nodes:
        raise NodeLost("no sandtree node is alive in the cluster (a Ray node with CPUs runs one)")
    want = frozenset(layers)

    def held(n: NodeView) -> int:
        return len(want) if n.layers is None else len(want & n.layers)

    return max(nodes, key=lambda n: (held(n), -(n.running + n.sandboxes) / max(n.cpus, 1.0), -n.running))
