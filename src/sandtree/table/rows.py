"""What a row of the operation table (sandtree/table/) is: an operation's HTTP binding (Http), the row itself
(Op), the decorator that declares one (op) into OPS, and the surfaces a row reaches (SURFACES; `via` declares a
surface's override or absence beside the row). Imports only the standard library (the remote client loads it)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace

__all__ = ["Http", "Off", "Op", "OPS", "SURFACES", "op", "via"]

# The surfaces derived from the rows, beside the Python ones (Engine, the tenant views, the remote client: every row
# reaches those). A row reaches each of these unless it says otherwise (via(surface, Off(why))).
SURFACES = ("rest", "mcp", "cli", "sdk")


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
    # How the REST server shows the row (http/derived.py makes its route from all of the above and these):
    name: str | None = None         # the route's name (OpenAPI operationId and summary), when not the row's
    status: int = 200               # the answer's status (a row answering None without `echo`: 204 empty)
    names: dict = field(default_factory=dict)       # argument -> its name in the route's path ({ref} for image)
    echo: dict = field(default_factory=dict)        # argument -> answer key: the (resolved) argument, beside result
    model: str | None = None        # the body model's name in OpenAPI (default: the row's name in CamelCase + In)
    optional_body: bool = False     # the body may be left out (all its fields have defaults)
    bounds: dict = field(default_factory=dict)      # argument -> {ge, le, lt}: what the wire refuses (422)
    types: dict = field(default_factory=dict)       # argument -> the wire's type (an annotation), wider than the row's
    defaults: dict = field(default_factory=dict)    # argument -> the wire's default where the row has none
    handler: str | None = None      # a hand-written route of http/ (a stream, a file, a spooled body): its name
    # What OpenAPI says where the wire's meaning is more than the row's docstring (a 404, a request body, a field
    # of the route's own): the route's description, its body model's, and arguments' (argument -> text).
    doc: str | None = None
    model_doc: str | None = None
    describe: dict = field(default_factory=dict)

    # How the bodies of POST /runs, /fork and /sandboxes have always taken the run options (options.py), for those
    # rows' Http to share (class attributes, not fields): env and labels JSON objects of text ({} for none), files a
    # list ([] for none), where the rows take None; secrets also a list of stored secrets' names (the row says dict).
    RUN_TYPES = {"env": "dict[str, str]", "labels": "dict[str, str]", "secrets": "SecretsIn"}
    RUN_DEFAULTS = {"env": {}, "labels": {}, "files": []}
    RUN_DESCRIBE = {"ref": "an image ID, prefix, tag, or branch:NAME",
                    "command": "a string runs in /bin/sh -c; a list is argv",
                    "cwd": "working directory (default: the image's WORKDIR, else /)",
                    "uid": "user id (default: the image's USER, else 0)",
                    "labels": "names and values kept with the run (its operation's spec)"}


@dataclass(frozen=True)
class Off:
    """A row's absence from a surface, with the reason (coverage is data: the conformance test holds each
    surface to the rows that do not say Off for it)."""
    why: str


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
    options: tuple[str, ...] = ()       # the RunOptions (table/options.py) it takes, as keyword-only parameters
    kwargs_of: str | None = None        # its **options are this row's keyword-only parameters (fork: run's)
    via: dict = field(default_factory=dict)   # surface -> that surface's override of the row, or Off(why)

    def on(self, surface: str) -> bool:
        """Whether the row reaches a derived surface (REST also needs an HTTP binding)."""
        assert surface in SURFACES, surface
        if isinstance(self.via.get(surface), Off):
            return False
        return surface != "rest" or self.http is not None

    def override(self, surface: str):
        """The surface's override declared beside the row (None: the row as it is)."""
        o = self.via.get(surface)
        return None if isinstance(o, Off) else o

    def keyword_options(self) -> list[inspect.Parameter]:
        """What its **options take (kwargs_of's keyword-only parameters), else its own keyword-only ones."""
        sig = OPS[self.kwargs_of].signature if self.kwargs_of else self.signature
        return [p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY]

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
       local: str | None = None, group: str = "engine", custom_remote: bool = False, caller: bool = False,
       options: tuple[inspect.Parameter, ...] = (), kwargs_of: str | None = None):
    """Declare the decorated signature as an operation (the function itself is never called). `options`: shared
    keyword-only parameters (RunOptions.parameters()) added to the signature, after its own."""
    def deco(fn):
        sig = inspect.signature(fn)
        if options:
            params = list(sig.parameters.values())
            assert not {p.name for p in options} & {p.name for p in params}, fn.__name__   # declared twice
            tail = [p for p in params if p.kind is p.VAR_KEYWORD]
            sig = sig.replace(parameters=[p for p in params if p not in tail] + list(options) + tail)
        assert all(a in sig.parameters for a in images), (fn.__name__, images)   # (HTTP: test_conformance)
        key = fn.__name__ if group == "engine" else f"{group}.{fn.__name__}"
        OPS[key] = Op(fn.__name__, sig, inspect.getdoc(fn) or "", scope, tuple(images), audit, admin, http, local,
                      group, custom_remote, caller, tuple(p.name for p in options), kwargs_of,
                      dict(getattr(fn, "__via__", {})))
        fn.__op_key__ = key
        return fn
    return deco


def via(surface: str, override):
    """Declare beside a row how a derived surface shows it: an override object of that surface's own kind (a
    rename, a subset, a result shape, a CLI positional), or Off(why) when the surface leaves it out. Written
    below @op (read when the row is made) or above it (the made row is updated)."""
    assert surface in SURFACES, surface

    def deco(fn):
        key = getattr(fn, "__op_key__", None)
        if key is None:
            fn.__via__ = {**getattr(fn, "__via__", {}), surface: override}
        else:
            row = OPS[key]
            OPS[key] = replace(row, via={**row.via, surface: override})
        return fn
    return deco
