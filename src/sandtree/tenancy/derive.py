"""The tenant view's methods, made from the operation table (sandtree/table/).

Every row becomes a method of TenantView with the row's signature and doc. The row's `admin`
refuses a tenant, its `scope` is required of the token (Forbidden naming it), then:

* a method the view writes by hand (a tenant rule that is real: see view.py) runs as written;
* any other runs the one generic call (TenantSight._call_row, sight.py): every argument in the
  row's `images` must be an image the tenant sees (else ImageNotFound, as for an image that does
  not exist); arguments naming a tenant's own things (a sandbox, an upload, a file set, an
  operation) must be its own, and a sandbox prefix or a ref name becomes what the engine calls
  it; resources are capped by the tenant's limits; lineage rows are answered by
  branching/lineage's queries through the tenant's filter, the rest by the engine; what the call
  makes becomes the tenant's (the tables below); a row of per-principal rows is answered with the
  tenant's own (AS_PRINCIPAL); the row's `audit` action is recorded.
"""

from __future__ import annotations

import inspect

from ..branching import lineage
from ..errors import RuntimeUnavailable
from ..table import Op
from ..table.imagerefs import resolved, resolved_call

_SELF = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)

# Rows whose `name` is an existing tag or branch of the tenant: the engine is given its stored
# (namespaced) name, and errors come back with the tenant's own.
REFS = {"untag": "tag", "branch_head": "branch", "branch_log": "branch", "branch_delete": "branch"}
# Rows whose answer becomes the tenant's: an upload, a file set (tenant_blobs kind). Their
# `digest` is the one expected of the new upload, not one the tenant must own already.
KEEPS = {"upload": "upload", "upload_file": "upload", "file_set_create": "file_set"}
# Rows whose answer is an image the tenant made: it owns it, and the engine's operation of this
# kind that made it becomes the tenant's (lineage and audit show it).
MAKES = {"import_path": "import", "sandbox_hibernate": "commit", "configure": "configure",
         "volume_snapshot": "volume snapshot"}
# Rows whose rows in the store are each principal's (engine/images/annotations.py): the engine's
# `<name>_as(principal, ...)` answers a tenant's call, with the tenant's own.
AS_PRINCIPAL = {"annotate"}
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
        return {"command": s.get("command") or s.get("kind"), "exit_code": s.get("exit_code"), "seconds": s.get("seconds")}
    return via


def call(target, row: Op, args: dict, principal: str | None = None):
    """target.<row>(...) with bound arguments: positional ones by position, the rest by name
    (principal: target.<row>_as(principal, ...), AS_PRINCIPAL's)."""
    pos = [args.pop(p.name) for p in row.signature.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    if principal is not None:
        return getattr(target, f"{row.name}_as")(principal, *pos, **args)
    return getattr(target, row.name)(*pos, **args)


def signed(fn, row: Op, owner: str):
    """`fn` shows the row's name, doc and signature (the conformance test compares them)."""
    fn.__name__, fn.__qualname__, fn.__doc__ = row.name, f"{owner}.{row.name}", row.doc
    fn.__signature__ = row.signature.replace(parameters=[_SELF] + list(row.signature.parameters.values()))
    return fn


def _own_method(row: Op, own):
    def method(self, *a, **k):
        self._allow(row)
        # after the scope check (a token without the scope learns nothing of a name): a tag, prefix
        # or branch in an image argument becomes the ID the tenant's own resolve finds
        a, k = resolved_call(self._resolve, row.signature, row.images, a, k) if row.images else (a, k)
        return own(self, *a, **k)
    return method


def starts_runs(row: Op) -> bool:
    """A row that runs commands on an image: for a tenant that takes its run slots and limits,
    advances its branch and makes the runs its own, which the generic call does not do."""
    return row.scope == "run" and "ref" in row.images


def _unwritten_method(row: Op):
    def method(self, *a, **k):
        self._allow(row)
        row.bind(*a, **k)
        raise RuntimeUnavailable(f"{row.name} is not available to a tenant yet (its tenant rules are unwritten)")
    return method


def _generic_method(row: Op):
    def method(self, *a, **k):
        self._allow(row)
        # the generic call takes image IDs only (sight.py `_see`): every image argument resolved here
        return self._call_row(row, resolved(self._resolve, row.images, row.bind(*a, **k), keep=()))
    return method


def install(cls, rows: dict) -> None:
    """Give `cls` a method per row: its own (hand-written, in the class or a base) behind the
    row's admin and scope check (cls._allow), else the generic call (cls._call_row: sight.py). A
    row that starts runs is never generic: written by hand or refused (fails closed; the test of
    the views names any such row)."""
    for row in rows.values():
        own = getattr(cls, row.name, None)
        if own is not None:
            method = _own_method(row, own)
        elif starts_runs(row) and not row.admin:
            method = _unwritten_method(row)
        else:
            method = _generic_method(row)
        setattr(cls, row.name, signed(method, row, cls.__name__))
