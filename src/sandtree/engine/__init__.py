"""The engine: store + runtime + the operations that combine them (see core.Engine)."""

from .core import Engine
from .spec import default_idmap
from ..defaults import RunRecord
from ..values import DEFAULT_ENV, parse_size

__all__ = ["Engine", "RunRecord", "DEFAULT_ENV", "default_idmap", "parse_size"]
