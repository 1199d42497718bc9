"""engine.operations as one tenant sees it: only its own operations exist. Made from the table's
operations rows like the tenant view (derive.py); written by hand only where a rule is real."""

from __future__ import annotations

from .. import table
from ..values import check_kind
from ..errors import SandtreeError
from .derive import install
from .limits import check_slots
from .tenant import check_public_registry


class TenantOperations:
    """engine.operations as one tenant sees it: only its own operations exist."""

    # Process-wide counters /metrics reads: no tenant's data in them.
    _SHARED = ("lock", "counts", "latency_buckets", "latency", "latency_sum", "queue_depth")

    def __init__(self, view):
        self.view = view

    @property
    def inner(self):
        return self.view.engine.operations

    def __getattr__(self, name):
        if name in self._SHARED:
            return getattr(self.inner, name)
        raise AttributeError(name)

    def _check(self, op) -> None:
        self.view.own_op(op)

    def _allow(self, row) -> None:                  # the view's token, the view's rules
        self.view._allow(row)

    def _resolve(self, ref: str) -> str:             # an image reference, as the view resolves it
        return self.view.resolve(ref)

    def _call_row(self, row, args: dict):
        return self.view._call_row(row, args, self.inner)

    def submit_pull(self, reference: str, *, tag: str | None = None,
                    credentials: tuple[str, str] | None = None) -> str:
        """An import operation of this tenant: the image becomes its own, the tag its own name."""
        self.view.need_scope("import")
        ref = self.view.check_pull(reference, tag, credentials)
        imported = self.view.imported
        op = self.inner.submit_pull(reference, then=lambda image: imported("pull", image, tag, {"reference": str(ref)}),
                                    check_host=check_public_registry)     # redirects and realms too
        self.view.claim(op)
        return op

    def submit_run(self, ref: str, command, **options) -> str:    # rule: run slots, its branch advances
        target = self.view.target_of(ref)
        opts = self.view.run_options(options, image=target)
        branch = self.view.branch_of(ref)
        source = self.view.head_of(branch) if branch is not None else target
        # one tenant's submissions are counted and recorded one at a time, so two cannot both
        # take the last free slot
        with self.view.tenancy.tenant_lock(self.view.tenant.name):
            check_slots(self.view.tenancy, self.view.tenant)
            try:
                op = self.inner.submit_run(target, command, **opts)
            except SandtreeError as exc:
                raise self.view.plain_error(exc) from None
            self.view.claim(op)
        self.view.audit_run(source, command, op, opts.get("env"), branch, opts.get("network"))
        return op

    def future(self, op: str):                      # rule: only its own operations exist
        self._check(op)
        return self.inner.future(op)

    def get(self, op: str) -> dict:                 # rule: told with its own branch names
        self._check(op)
        return self._plain_rec(self.inner.get(op))

    def _plain_rec(self, rec: dict) -> dict:
        """An operation record with the tenant's own name for a branch it ran on."""
        o = rec.get("outcome")
        if isinstance(o, dict) and isinstance(o.get("message"), str):
            rec["outcome"] = {**o, "message": o["message"].replace(self.view.ns_name(""), "")}
        return rec

    def wait(self, ops: list[str], timeout: float | None = None) -> list[dict]:    # rule: only its own, all first
        for op in ops:
            self._check(op)
        return [self._plain_rec(r) for r in self.inner.wait(ops, timeout)]

    def events_after(self, op: str, after: int, timeout: float):
        self._check(op)
        return self.inner.events_after(op, after, timeout)

    def list(self, *, status: str | None = None, limit: int = 50, kind: str = "run") -> list[dict]:  # rule: its own
        rows = self.view.db.query("SELECT o.id FROM operations o JOIN tenant_ops w ON w.op=o.id WHERE w.tenant=? "
                                  "AND o.kind=? ORDER BY o.started DESC LIMIT ?",
                                  (self.view.tenant.name, check_kind(kind), max(1, min(limit, 1000)) * (4 if status else 1)))
        out = [self.get(r[0]) for r in rows]
        if status:
            out = [o for o in out if o["status"] == status]
        return out[:limit]

    def close(self) -> None:
        pass


install(TenantOperations, table.OPERATIONS_OPS)
