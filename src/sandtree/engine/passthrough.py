"""The engine's pass-through methods, made from the operation table's rows.

Many engine operations only hand their call to the part that does the work (a live sandbox's
stop to Sandboxes.stop, a tag to the store). Written by hand, each restated its row's signature a
second time and a third in the call; here the engine says only where the call goes:

    class Engine:
        sandbox_stop = through("sandboxes", "stop")

and the method gets the row's name, docstring and signature (what IDEs, the conformance test and
the surfaces read). A call is bound to the row's signature (an argument the row does not name is a
TypeError, even when the part takes more) and handed on with the row's defaults filled in: the
defaults that run are the row's. tests/conformance/test_conformance.py checks every pass-through's
target takes the row's parameters (positional ones in order, keyword-only ones by name) and gives
none of them another default.
"""

from __future__ import annotations

import inspect
import operator

from ..table import OPS

__all__ = ["through", "passthroughs"]


class through:
    """`name = through("part.path", "method")` in a class body: the row `name`'s method, calling
    self.<part.path>.<method> (method defaults to the row's name) with the caller's arguments."""

    def __init__(self, part: str, method: str | None = None):
        self.part, self.method = part, method

    def __set_name__(self, owner, name: str) -> None:
        row = OPS.get(name)
        if row is None:                      # a typo here would otherwise be a method no row describes
            raise TypeError(f"{owner.__name__}.{name}: no table row named {name!r} to pass through")
        part, method = operator.attrgetter(self.part), self.method or name
        bind = row.signature.bind if "self" not in row.signature.parameters else \
            (lambda *a, **k: row.signature.bind(None, *a, **k))

        def passthrough(engine, /, *args, **kwargs):
            # bound to the row: a parameter the row does not name is a TypeError here, even when the
            # part takes more (an internal `by=`, `ephemeral=`); the row's defaults are the ones used
            call = bind(*args, **kwargs)
            call.apply_defaults()
            pos = call.args[1:] if "self" in row.signature.parameters else call.args
            return getattr(part(engine), method)(*pos, **call.kwargs)

        params = list(row.signature.parameters.values())
        if not params or params[0].name != "self":
            params.insert(0, inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD))
        passthrough.__name__ = name
        passthrough.__qualname__ = f"{owner.__qualname__}.{name}"
        passthrough.__module__ = owner.__module__
        passthrough.__doc__ = row.doc or None
        passthrough.__signature__ = row.signature.replace(parameters=params)
        passthrough.target = (self.part, method)
        setattr(owner, name, passthrough)


def passthroughs(cls) -> dict[str, tuple[str, str]]:
    """name -> (part path, method) of every pass-through method of `cls` (for the conformance test)."""
    out = {}
    for name in dir(cls):
        fn = inspect.getattr_static(cls, name)
        fn = getattr(fn, "__wrapped__", fn)
        if hasattr(fn, "target"):
            out[name] = fn.target
    return out
