"""A sandtree cluster on Ray: each Ray node with CPUs becomes a sandtree node, an
actor owning that node's Engine; an API-side engine sends runs and live sandboxes to them.

Below the engine, like tenancy/: nothing here imports the engine. The engine makes its Fabric and
hands it the function that makes a node's engine (engine/clustered.py), so the node actor builds an
Engine on its own machine without this package knowing the class (dependency inversion).
"""

from .fabric import Fabric
from .node import Node
from .relay import RelayedProcess
from .scheduling import NodeConfig, NodeView, choose_node

__all__ = ["Fabric", "Node", "NodeConfig", "RelayedProcess", "NodeView", "choose_node"]
