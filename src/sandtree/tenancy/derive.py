"""The tenant view's methods, made from the operation table (sandtree/table.py).

Every row becomes a method of TenantView with the row's signature and doc. The row's `admin`
refuses a tenant, its `scope` is required of the token (Forbidden naming it), then:

* a method the view writes by hand (a tenant rule that is real: see view.py) runs as written;
* any other runs the one generic call: every argument in the row's `images` must be an image the
  tenant sees (else ImageNotFound, as for an image that does not exist); the arguments below
  that name a tenant's own things are checked (and a sandbox prefix or a ref name turned into
  what the engine calls it); lineage rows are answered by branching/lineage's queries through
  the tenant's filter; anything else by the engine; the row's `audit` action is recorded.
"""

from __future__ import annotations

import inspect

from ..branching import lineage
from ..errors import Forbidden, SandtreeError
from ..store.names import check_tag
from ..table import Op
from . import auditing
from .limits import capped

_SELF = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)

# Arguments that name something a tenant owns, by parameter name: (view, value) -> what the
# engine is given (NotFound, as for a thing that does not exist, when it is another's).
OWN_ARGS = {
    "sid": lambda v, x: v._sandbox(x),
    "digest": lambda v, x: v._own_blob("upload", x),
    "set_id": lambda v, x: v._own_blob("file_set", x),
    "op": lambda v, x: v._own_op(x),
    "files": lambda v, x: (v._check_files(x), x)[1],
    "file_set": lambda v, x: x if x is None else v._own_blob("file_set", x),
}
# Rows whose `name` is an existing tag or branch of the tenant: the engine is given its stored
# (namespaced) name, and errors come back with the tenant's own.
REFS = {"untag": "tag", "branch_head": "branch", "branch_log": "branch", "branch_delete": "branch"}
# Rows whose answer becomes the tenant's: an upload, a file set (tenant_blobs kind). Their
# `digest` is the one expected of the new upload, not one the tenant must own already.
KEEPS = {"upload": "upload", "upload_file": "upload", "file_set_create": "file_set"}
# Rows whose answer is an image the tenant made: it owns it, and the engine's operation of this
# kind that made it becomes the tenant's (lineage and audit show it).
MAKES = {"import_path": "import", "sandbox_hibernate": "commit"}
# The lineage rows: branching/lineage's query, given the tenant's filter instead of the engine's
# unfiltered one (store, bound arguments, filter) -> answer.
LINEAGE = {
    "parents": lambda s, a, v: lineage.edges(s, a["image"], up=True, visible=v),
    "children": lambda s, a, v: lineage.edges(s, a["image"], up=False, visible=v),
    "ancestors": lambda s, a, v: lineage.ancestors(s, a["image"], v),
    "descendants": lambda s, a, v: lineage.descendants(s, a["image"], v),
    "common_ancestor": lambda s, a, v: lineage.common_ancestor(s, a["a"], a["b"], v),
    "lineage_path": lambda s, a, v: lineage.path(s, a["a"], a["b"], v),
    "produced_by": lambda s, a, v: lineage.produced_by(s, a["image"], v),
    "log": lambda s, a, v: lineage.log(s, a["image"], a["limit"], v),
    "lineage_tree": lambda s, a, v: lineage.tree(s, a["root"], max_nodes=a["max_nodes"], visible=v, via=_via(s)),
}


def _via(store):
    """A tenant's tree labels an edge by its operation's command (or what it imported)."""
    def via(op: str) -> dict:
        s = lineage.op_summary(store, op)
        return {"command": s.get("command") or s.get("kind"), "exit_code": s.get("exit_code")}
    return via


def call(target, row: Op, args: dict):
    """target.<row>(...) with bound arguments: positional ones by position, the rest by name."""
    pos = [args.pop(p.name) for p in row.signature.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    return getattr(target, row.name)(*pos, **args)


def signed(fn, row: Op, owner: str):
    """`fn` shows the row's name, doc and signature (the conformance test compares them)."""
    fn.__name__, fn.__qualname__, fn.__doc__ = row.name, f"{owner}.{row.name}", row.doc
    fn.__signature__ = row.signature.replace(parameters=[_SELF] + list(row.signature.parameters.values()))
    return fn


def allow(view, row: Op) -> None:
    """A row's admin and scope, checked on the view's token."""
    if row.admin:
        raise Forbidden(f"{row.name.replace('_', ' ')} is for the server's administrator "
                        "(a token with the admin scope)", scope="admin")
    if row.scope is not None:
        view._need(row.scope)


def generic(view, row: Op, args: dict, target):
    """One tenant call of a row that needs no rule written by hand (on `target`: the engine or its
    operations)."""
    shown = dict(args)                                  # what the audit records: the tenant's names
    for a in row.images:
        if args.get(a) is not None:
            args[a] = shown[a] = view._see(args[a])
    for a, own in OWN_ARGS.items():
        if a in args and not (a == "digest" and row.name in KEEPS):
            args[a] = own(view, args[a])
    if "sid" in args:
        shown["sid"] = args["sid"]
    if row.name in REFS:
        args["name"] = view._ref_name(REFS[row.name], args["name"])
    tag = args.get("tag")
    if tag is not None:                     # the engine makes it untagged; the tenant's tag names it
        check_tag(tag)
        args["tag"] = None
    if row.scope == "run":
        args = capped(view.tenant.limits, view.engine.default_limits, args, set(args))
    try:
        query = LINEAGE.get(row.name)
        answer = query(view.engine.store, args, view._visibility()) if query else call(target, row, dict(args))
    except SandtreeError as exc:
        raise view._plain(exc) from None
    if row.name in KEEPS:
        view._keep_blob(KEEPS[row.name], answer)
    if hasattr(answer, "op") and hasattr(answer, "source"):           # a run's or exec's: its operation
        view._claim(answer.op)
    rec = auditing.entry(row, shown, answer)
    if row.name in MAKES and rec["result"]:
        view._own(rec["result"])
        rec["op"] = view._claim_op(MAKES[row.name], rec["result"]) or rec["op"]
        if tag is not None:
            view._write_tag(tag, rec["result"], row.audit)
    if row.audit is not None:
        view._audit(row.audit, **rec)
    return answer


def _own_method(row: Op, own, view_of):
    def method(self, *a, **k):
        allow(view_of(self), row)
        return own(self, *a, **k)
    return method


def _generic_method(row: Op, view_of, target_of):
    def method(self, *a, **k):
        view = view_of(self)
        allow(view, row)
        return generic(view, row, row.bind(*a, **k), target_of(view))
    return method


def install(cls, rows: dict, view_of=lambda self: self, target_of=lambda view: view.engine) -> None:
    """Give `cls` a method per row: its own (hand-written, in the class or a base) behind the
    row's admin and scope check, else the generic call. view_of(self): the TenantView whose
    tenant calls; target_of(view): what the row's method is called on."""
    for row in rows.values():
        own = getattr(cls, row.name, None)
        method = _own_method(row, own, view_of) if own is not None else _generic_method(row, view_of, target_of)
        setattr(cls, row.name, signed(method, row, cls.__name__))
