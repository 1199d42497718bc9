"""The optional dependencies of the extras (`postgresql`: psycopg, `cluster`: Ray), imported on
first use rather than with the module that uses them: an engine on SQLite without a cluster never
needs them, and importing them cost every CLI call and `import sandtree` ~0.35 s (Ray ~0.25 s,
psycopg ~0.09 s). Each user turns a missing one into its own typed error saying which extra to
install (pandas' import_optional_dependency is the same idea)."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["load"]


def load(name: str) -> ModuleType | None:
    """Module `name`, imported now if not yet; None when it is not installed."""
    try:
        return importlib.import_module(name)   # optional by definition: loaded when a caller asks
    except ImportError:
        return None
