"""What a row of the operation table (sandtree/table/) is: an operation's HTTP binding (Http), the row itself
(Op), and the decorator that declares one (op) into OPS. Imports only the standard library (the remote
client loads it)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

__all__ = ["Http", "Op", "OPS", "op"]


@dataclass(frozen=True)
class Http:
    """Where an operation lives under /api/v1. `{name}` in the path is an argument (`{name:path}`: it may
    hold slashes); `query`/`body` name the arguments sent as query parameters / JSON fields (None values
    are left out: the server's defaults are the table's); `content` is the argument sent as the raw request
    body; `const` adds fixed JSON fields (or query parameters for a GET); `result` is the key of the JSON
    answer that is the return value; `raw`: the answer is bytes; `data`: dicts come back as value objects
    (to_dict()), as the engine's Entry and Change are; `drop`: in-process-only arguments (callbacks) a
    remote call accepts and cannot send; `rename`: arguments whose wire field is named otherwise."""
    method: str
    path: str
    query: tuple[str, ...] = ()
    body: tuple[str, ...] = ()
    whole_body: str | None = None
    content: str | None = None
    const: dict = field(default_factory=dict)
    result: str | None = None
    raw: bool = False
    data: bool = False
    drop: tuple[str, ...] = ()
    rename: dict = field(default_factory=dict)      # argument -> its field name on the wire


@dataclass(frozen=True)
class Op:
    name: str
    signature: inspect.Signature
    doc: str
    scope: str | None                   # the token scope a tenant needs (None: any valid token)
    images: tuple[str, ...] = ()        # arguments that name images (tenant visibility)
    audit: str | None = None            # audit action of a call (None: a read, not audited)
    admin: bool = False                 # only an admin token (Forbidden for a tenant)
    http: Http | None = None            # None: in-process only (over HTTP: RuntimeUnavailable)
    local: str | None = None            # why it is in-process only
    group: str = "engine"               # "engine": engine.<name>; "operations": engine.operations.<name>
    custom_remote: bool = False         # the remote client writes this one by hand (a stream, a tar)
    caller: bool = False                # the answer depends on who asks (Tenancy.<name>(..., by=tenant))

    def bind(self, *args, **kwargs) -> dict:
        """The call's arguments by name, defaults applied; TypeError as a Python call would."""
        b = self.signature.bind(*args, **kwargs)
        b.apply_defaults()
        out = dict(b.arguments)
        for p in (p for p in self.signature.parameters.values() if p.kind is p.VAR_KEYWORD):
            out.update(out.pop(p.name, {}))                 # **options collected under their own names
        return out


OPS: dict[str, Op] = {}


def op(scope: str | None, *, images=(), audit: str | None = None, admin: bool = False, http: Http | None = None,
       local: str | None = None, group: str = "engine", custom_remote: bool = False, caller: bool = False):
    """Declare the decorated signature as an operation (the function itself is never called)."""
    def deco(fn):
        sig = inspect.signature(fn)
        assert all(a in sig.parameters for a in images), (fn.__name__, images)   # (HTTP: test_conformance)
        key = fn.__name__ if group == "engine" else f"{group}.{fn.__name__}"
        OPS[key] = Op(fn.__name__, sig, inspect.getdoc(fn) or "", scope, tuple(images), audit, admin, http, local,
                      group, custom_remote, caller)
        return fn
    return deco
