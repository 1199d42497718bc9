"""How the Python SDK's object methods (client/objects.py, client/sdk.py) show a row where they deliberately
differ from it, declared beside the row as `@via("sdk", Sdk(...))`. Everything not named here is the row's: a
method built from a row (client/derive.py) has the row's parameters, kinds and defaults. Imports only the
standard library (the remote client loads the table)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

__all__ = ["Sdk", "keyword"]


@dataclass(frozen=True)
class Sdk:
    """why: the reason the SDK differs (every override says one).
    defaults: parameter -> the SDK's own default (a required parameter of the row may get one).
    keyword: parameters the SDK takes by keyword only (the row takes them by position too).
    spread: a dict parameter of the row that the SDK takes as **name (annotate(score, **meta)).
    kw: what the row's **kw stands for, as the SDK names them (keyword-only inspect.Parameters)."""
    why: str
    defaults: dict = field(default_factory=dict)
    keyword: tuple[str, ...] = ()
    spread: str | None = None
    kw: tuple[inspect.Parameter, ...] = ()


def keyword(name: str, default, annotation=inspect.Parameter.empty) -> inspect.Parameter:
    """A keyword-only parameter for Sdk(kw=...)."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
