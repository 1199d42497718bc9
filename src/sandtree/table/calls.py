"""The one path by which a surface's own code (a composite handler, a foreign protocol's route) runs an operation: by
its row. `call_row(engine, "sandbox_stat", sid, path)` looks the row up in the table, binds the arguments to the row's
signature (a call that drifted from its row is a TypeError naming the row, before anything runs) and calls the row's
method on the engine-like object given (the Engine, a tenant view, the remote client; an "operations" row on its
ledger, target.operations). A surface that writes `engine.sandbox_stat(...)` restates the operation by hand: nothing ties that call to the
row, and scripts/restatements.py counts it. The literal row names and keywords of every call_row() in the surfaces are
also checked without running them (tests/conformance/test_restatements.py). Imports only the standard library and
rows.py (the remote client loads the table)."""

from __future__ import annotations

import functools

from .rows import OPS

__all__ = ["call_row", "calling_row"]


def _method(target, key: str):
    row = OPS.get(key)
    if row is None:
        raise KeyError(f"no table row {key!r}")
    owner = target if row.group == "engine" else getattr(target, row.group)      # "operations": its ledger
    return row, getattr(owner, row.name)


def call_row(target, key: str, /, *args, **kwargs):
    """Run the row `key` ("sandbox_exec", "operations.get") on `target` with these arguments, bound to the row's
    signature first."""
    row, fn = _method(target, key)
    try:
        row.signature.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{key}: {e}") from None
    return fn(*args, **kwargs)


def calling_row(target, key: str, /):
    """call_row() of the row `key` on `target`, to be called later (in a thread: Plumbing.call, run_in_threadpool)."""
    if key not in OPS:                          # an unknown row fails here, where the call is written
        raise KeyError(f"no table row {key!r}")
    return functools.partial(call_row, target, key)
