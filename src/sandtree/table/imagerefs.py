"""Image arguments taken as any reference: every row's `images` resolved once, where it is called.

A row names the arguments that are images (`images=("a", "b")`). Whatever a caller holds, a unique
prefix, a tag, `branch:NAME` or a bare branch name, becomes the image ID through the callee's own
`resolve` before the operation runs: the engine's (every name of the store) and a tenant view's
(only what the tenant sees, its own names). So no surface resolves a reference before calling (they
did, by hand, in some 80 places) and every surface accepts the same references. A full ID is passed
as it is: the operation checks it as it always did (and the empty tree's hash, a merge's base when
two images share no ancestor, is no image to resolve).
"""

from __future__ import annotations

import functools
import inspect
import re

__all__ = ["KEPT", "resolve_image_arguments", "resolved", "resolved_call"]

_FULL_ID = re.compile(r"[0-9a-f]{64}")


# An argument named `ref` is left to an operation written to take it: there the reference itself
# means something (a run on a branch advances that branch), and the operation resolves it.
KEPT = ("ref",)


def resolved(resolve, names: tuple[str, ...], arguments: dict, keep: tuple[str, ...] = KEPT) -> dict:
    """`arguments` (bound, by name) with each of `names` (but `keep`) that is a reference resolved."""
    for name in names:
        if name in keep:
            continue
        value = arguments.get(name)
        if isinstance(value, str) and not _FULL_ID.fullmatch(value):
            arguments[name] = resolve(value)
    return arguments


def resolved_call(resolve, sig: inspect.Signature, names: tuple[str, ...], args: tuple, kwargs: dict):
    """(args, kwargs) of a call to a function of signature `sig`, its image references resolved; as
    given when they do not bind (the function's own TypeError then says what is wrong)."""
    try:
        call = sig.bind(*args, **kwargs)
    except TypeError:
        return args, kwargs
    resolved(resolve, names, call.arguments)
    return call.args, call.kwargs


def _resolving(fn, names: tuple[str, ...]):
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        args, kwargs = resolved_call(self.resolve, sig, names, (self, *args), kwargs)
        return fn(*args, **kwargs)
    return method


def resolve_image_arguments(cls, rows: dict) -> None:
    """Wrap every method of `cls` whose row (in `rows`) names image arguments (the engine's)."""
    for name, row in rows.items():
        if row.images and hasattr(cls, name):
            setattr(cls, name, _resolving(getattr(cls, name), row.images))
