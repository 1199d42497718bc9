"""The engine: store + runtime + the operations that combine them (see core.Engine)."""

from .core import Engine
from .spec import DEFAULT_ENV, RunRecord, default_idmap, parse_size

__all__ = ["Engine", "RunRecord", "DEFAULT_ENV", "default_idmap", "parse_size"]
