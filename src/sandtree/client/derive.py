"""SDK methods made from the operation table's rows (table/): a method of Image, Sandbox, Branch, Sandtree...
that stands for a row takes the row's parameters, kinds and defaults (less the ones its object fills in: an
Image fills `image`/`ref` with its ID, a Sandbox `sid`), with the row's docstring; what the SDK shows otherwise
is declared: beside the row (`@via("sdk", Sdk(...))`: a default, a keyword-only parameter) or here, with the
method (a parameter's SDK name, SDK-only extras such as on_stdout, the object its result becomes). The signature
is the method's `__signature__` (help(), IDEs and inspect read it); a call is checked against it as a Python
call would be. tests/test_conformance_sdk.py holds the methods to their rows."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

from .. import table
from ..table.sdk import Sdk

__all__ = ["RowProperty", "Spec", "image_id", "method", "place_rest", "row_property", "rows_of", "sdk_parameters"]

_P = inspect.Parameter


@dataclass(frozen=True)
class Spec:
    """What a method made from a row declares (kept on it as __sdk__, for the conformance test)."""
    row: str                                   # the row's key in table.OPS
    bind: tuple[str, ...] = ()                 # row parameters its object fills in
    rename: dict = field(default_factory=dict)  # row parameter -> the SDK's name for it
    extras: tuple[_P, ...] = ()                 # SDK-only parameters (the method's own; not sent to the engine)
    kwargs: str | None = None                  # the SDK's **name for the row's keyword options (Branch.run)
    ids: tuple[str, ...] | None = None         # row parameters an Image may fill (None: the row's images)


def image_id(st, ref) -> str:
    """An image argument as the engine takes it: an Image's ID as it is, a ref (tag, branch, ID prefix) resolved
    once here, for every method made from a row alike."""
    return ref.id if not isinstance(ref, str) and isinstance(getattr(ref, "id", None), str) else st.engine.resolve(ref)


def _image_or(annotation):
    """An image argument's type as the SDK takes it: an Image object too (image_id makes it the ID)."""
    return f"Image | {annotation}" if isinstance(annotation, str) and annotation.startswith("str") else annotation


def sdk_parameters(spec: Spec) -> list[_P]:
    """The method's parameters (self left out): the row's, as its Sdk override and the spec show them."""
    row = table.OPS[spec.row]
    o = row.override("sdk") or Sdk("")
    options = {p.name for p in row.keyword_options()} if spec.kwargs else set()
    ids = row.images if spec.ids is None else spec.ids
    out = []
    for p in row.signature.parameters.values():
        if p.name in spec.bind or p.name == o.spread or (p.name in options and not row.kwargs_of):
            continue
        if p.kind is _P.VAR_KEYWORD:
            out += o.kw                           # what the row's **kw stands for (or, with kwargs, left out)
            continue
        out.append(p.replace(name=spec.rename.get(p.name, p.name),
                             kind=_P.KEYWORD_ONLY if p.name in o.keyword else p.kind,
                             default=o.defaults.get(p.name, p.default),
                             annotation=_image_or(p.annotation) if p.name in ids else p.annotation))
    out += spec.extras
    if spec.kwargs:
        out.append(_P(spec.kwargs, _P.VAR_KEYWORD))
    if o.spread:
        out.append(_P(o.spread, _P.VAR_KEYWORD))
    return sorted(out, key=lambda p: p.kind)     # stable: the row's order within each kind


def method(row: str, *, bind: dict | None = None, rename: dict | None = None, extras: tuple[_P, ...] = (),
           kwargs: str | None = None, ids: tuple[str, ...] | None = None, adapt: Callable | None = None,
           call: Callable | None = None, wrap: Callable | None = None, note: str = "") -> Callable:
    """A method standing for `row`. bind: row parameter -> what fills it (an attribute name of the object, or
    a function of it). ids: row parameters whose Image (or ref string) becomes an image ID (default: the row's
    image arguments). adapt(obj, args, extras): turns the SDK's shapes into the engine's (in place). call(obj,
    target, args, extras): instead of target(**args) (one SDK method for several engine paths). wrap(obj,
    result, given): the value returned (an Image, a RunResult...). note: the SDK's words after the row's doc."""
    bind = dict(bind or {})
    spec = Spec(row, tuple(bind), dict(rename or {}), tuple(extras), kwargs, None if ids is None else tuple(ids))
    r = table.OPS[row]
    o = r.override("sdk") or Sdk("")
    # what a call returns: the wrap's declared type (an Image, a RunResult...), else the row's own
    returns = inspect.signature(wrap).return_annotation if wrap is not None else r.signature.return_annotation
    sig = inspect.Signature([_P("self", _P.POSITIONAL_OR_KEYWORD)] + sdk_parameters(spec), return_annotation=returns)
    back = {v: k for k, v in spec.rename.items()}
    extra = {p.name for p in extras}
    ids = tuple(r.images) if ids is None else ids

    def fn(self, *args, **kw):
        b = sig.bind(self, *args, **kw)
        b.apply_defaults()
        given = dict(b.arguments)
        del given["self"]
        st = getattr(self, "_st", self)
        call_args, extra_args = {}, {}
        for name, value in given.items():
            if name in extra:
                extra_args[name] = value
            elif name == kwargs:
                call_args.update(value)
            elif name == o.spread:
                call_args[name] = value or None
            else:
                call_args[back.get(name, name)] = value
        for name, source in bind.items():
            call_args[name] = source(self) if callable(source) else getattr(self, source)
        for name in ids:
            if call_args.get(name) is not None and name not in bind:
                call_args[name] = image_id(st, call_args[name])
        if adapt is not None:
            adapt(self, call_args, extra_args)
        engine = st.engine if r.group == "engine" else getattr(st.engine, r.group)
        target = getattr(engine, r.name)
        result = call(self, target, call_args, extra_args) if call is not None else target(**call_args)
        return wrap(self, result, given) if wrap is not None else result

    fn.__signature__ = sig
    fn.__doc__ = r.doc + (f"\n\n{note}" if note else "")
    fn.__name__ = fn.__qualname__ = r.name
    fn.__sdk__ = spec
    return fn


class RowProperty(property):
    """A property standing for a row (Branch.head: branch_head); __sdk__ as a method's."""


def row_property(row: str, *, bind: dict, wrap: Callable | None = None) -> property:
    fn = method(row, bind=bind, wrap=wrap)
    prop = RowProperty(fn, doc=fn.__doc__)
    prop.__sdk__ = fn.__sdk__
    return prop


def place_rest(cls, classes) -> list[str]:
    """Every row on the SDK that no method of `classes` stands for becomes a method of `cls` under the row's own
    name, the row as it is (its parameters and answer): a new row reaches the SDK with no edit in client/, as a new
    row reaches the command line (cli/derive.py add_rest). Returns the keys placed."""
    made = {v.__sdk__.row for c in classes for v in vars(c).values() if hasattr(v, "__sdk__")}
    placed = []
    for key, row in table.OPS.items():
        if row.on("sdk") and key not in made:
            assert not hasattr(cls, row.name), f"{cls.__name__}.{row.name} is not row {key}'s: place the row by hand"
            fn = method(key)
            fn.__qualname__, fn.__module__ = f"{cls.__name__}.{row.name}", cls.__module__
            setattr(cls, row.name, fn)
            placed.append(key)
    return placed


def rows_of(cls):
    """Class decorator: the made methods take the names they are given in the class (help(), repr)."""
    for attr, value in vars(cls).items():
        if inspect.isfunction(value) and hasattr(value, "__sdk__"):
            value.__name__, value.__qualname__, value.__module__ = attr, f"{cls.__name__}.{attr}", cls.__module__
    return cls
