"""AdminView: an admin token (or the store's operator) uses the whole engine, unfiltered; every
operation with an `audit` action in the table is recorded, by the same rule as a tenant's
(auditing.py). A method the table does not list passes through to the engine."""

from __future__ import annotations

from .. import table
from ..table import Op
from . import auditing
from .derive import call, signed


def _audited(row: Op, target_of):
    def method(self, *a, **k):
        args = row.bind(*a, **k)                   # a wrong call is a TypeError, as in Python
        answer = getattr(target_of(self), row.name)(*a, **k)
        self.tenancy.record(self.tenant, row.audit, **auditing.entry(row, args, answer))
        return answer
    return method


def _asked(row: Op):
    def method(self, *a, **k):
        return call(self.tenancy, row, {**row.bind(*a, **k), "by": self.tenant})
    return method


def _install(cls, rows: dict, target_of) -> None:
    """Per row `cls` does not write by hand: a caller row answered by the tenancy with the admin
    as the caller (it records what it audits itself); else an audited method where the row has
    an audit action."""
    for row in rows.values():
        if row.name in cls.__dict__:
            continue
        if row.caller:
            setattr(cls, row.name, signed(_asked(row), row, cls.__name__))
        elif row.audit is not None:
            setattr(cls, row.name, signed(_audited(row, target_of), row, cls.__name__))


class AdminView:
    """An admin token: the whole engine, unfiltered, with its runs and changes audited."""

    def __init__(self, tenancy, tenant):
        self.tenancy, self.tenant, self.engine = tenancy, tenant, tenancy.engine
        self._ops = AdminOperations(self)

    def __getattr__(self, name):
        return getattr(self.engine, name)

    @property
    def operations(self):
        return self._ops

    def close(self) -> None:
        pass




class AdminOperations:
    """engine.operations for an admin: everything, submitted runs and cancels audited."""

    def __init__(self, view: AdminView):
        self.view = view
        self.tenancy, self.tenant = view.tenancy, view.tenant

    def __getattr__(self, name):
        return getattr(self.view.engine.operations, name)

    def submit_run(self, ref: str, command, **options) -> str:
        source = self.view.engine.resolve(ref)        # before: a run on a branch moves it
        op = self.view.engine.operations.submit_run(ref, command, **options)
        self.tenancy.record(self.tenant, "run", image=source, op=op,
                            detail={"command": auditing.masked(command, options.get("env"))})
        return op

    def close(self) -> None:
        pass


_install(AdminView, table.ENGINE_OPS, lambda self: self.engine)
_install(AdminOperations, table.OPERATIONS_OPS, lambda self: self.view.engine.operations)
