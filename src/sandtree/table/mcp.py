"""How a row of the operation table shows as an MCP tool: `Mcp`, declared beside the row with
`@via("mcp", Mcp(...))` (below its @op line). A row without one is a tool of its own name, its parameters and
defaults the row's; a row an agent should not see says `via("mcp", Off(why))`. mcp/maker.py builds the tools
from these (a derived body calls the row's operation; a composite tool names its hand-written body, `handler`,
and the maker holds that body's parameters to the row's). Imports only the standard library (the table's rule)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

__all__ = ["CORE_MAX", "Mcp", "Param", "Result", "REQUIRED", "RUN_JSON", "tools_of"]

REQUIRED = inspect.Parameter.empty      # a Param without a default
# the default profile's tools at most: what a model reads before its first call stays small (its tool list is
# in every request's context), the rest are one `--tools all` away
CORE_MAX = 12

# The JSON types MCP shows for run options the rows leave untyped or type loosely (secrets: also a list of the
# server's stored secrets' names), for Mcp(types=...)
RUN_JSON = {"env": "dict[str, str] | None", "labels": "dict[str, str] | None",
            "network": "bool | str | list[str] | dict | None", "secrets": "dict[str, dict] | list[str] | None",
            "replay": "str | dict | None"}


@dataclass(frozen=True)
class Param:
    """A tool-only parameter of a derived tool (passed on to the row's **kw), or one a handler adds."""
    name: str
    type: str                           # as a row annotation is written: "int", "str | None"
    default: object = REQUIRED


@dataclass(frozen=True)
class Result:
    """The answer's shape as data (applied in this order): `key`: a plain answer wrapped as {key: answer};
    `keep`: the keys kept of a dict (of each dict of a list; value objects as their to_dict()); `echo`: tool
    arguments added to the answer (image arguments as resolved); `rename`: answer key -> the tool's key."""
    key: str | None = None
    keep: tuple[str, ...] = ()
    echo: tuple[str, ...] = ()
    rename: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Mcp:
    """A row's tool. name: the tool's (None: the row's). params: the row parameters it takes (None: all).
    rename: row parameter -> the tool's name for it. defaults / types: row parameter -> the tool's default
    (from defaults.py) / its JSON type ("dict[str, str] | None") where they differ from the row's. extra:
    tool-only parameters (Param; for a handler, their names are enough). resolve: image parameters resolved to
    a full ID before the call, a handler's too (the operations take IDs; the answer names the ID). result: the answer's shape. handler: the tool's body
    is written by hand in mcp/ under this name (a composite: several rows, parameters of its own); the row's
    parameters it takes are still held to the row's. doc: the tool's description for a model (None: the row's
    docstring). core: the tool is in the default profile (`sandtree mcp` without --tools, at most
    CORE_MAX tools): True with every parameter, or the parameters it shows there by the tool's names (the
    others keep their defaults; `--tools all` or the tool's name shows them all)."""
    name: str | None = None
    params: tuple[str, ...] | None = None
    rename: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    types: dict = field(default_factory=dict)
    extra: tuple = ()
    resolve: tuple[str, ...] = ()
    result: Result | None = None
    handler: str | None = None
    doc: str | None = None
    core: bool | tuple[str, ...] = False

    def tool(self, row) -> str:
        return self.name or row.name

    def extras(self) -> dict[str, Param | None]:
        """Tool-only parameter name -> its Param (None: a handler's, typed by its body)."""
        return {(e if isinstance(e, str) else e.name): (None if isinstance(e, str) else e) for e in self.extra}


def tools_of(row) -> tuple[Mcp, ...]:
    """The tools a row is shown by: none (Off), its own (no override), or those declared (an Mcp, or a tuple
    of them when one row serves two tools: read is read_file's and download's)."""
    if not row.on("mcp"):
        return ()
    o = row.override("mcp")
    if o is None:
        return (Mcp(),)
    return o if isinstance(o, tuple) else (o,)
