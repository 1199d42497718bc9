"""The MCP tools made from the operation table: each row on MCP (table/mcp.py: `Mcp` beside the row, or none)
is a tool. A derived tool's signature is the row's (a subset, renamed, with the tool's JSON types where the row
declares them), its defaults the row's, its parameter descriptions the vocabulary's, its body a call of the
row's operation with the answer shaped as the row's Result says. A composite tool names a hand-written body
(`handler`, registered by the groups' modules); its parameters that are a row's are held to that row's name,
type and default (check()), so the composite cannot drift from the operations it calls."""

from __future__ import annotations

import builtins
import functools
import inspect
import types
import typing
from dataclasses import dataclass

from .. import vocabulary
from ..errors import InvalidInput
from ..table import OPS, Op
from ..table.mcp import CORE_MAX, Mcp, tools_of

EMPTY = inspect.Parameter.empty


@dataclass
class Made:
    """A tool as made: its name, the signature it shows, the rows it serves (each with its Mcp), whether
    its body is written by hand."""
    name: str
    signature: inspect.Signature
    rows: list[tuple[Op, Mcp]]
    handler: bool


def tools() -> dict[str, list[tuple[Op, Mcp]]]:
    """Tool name -> the rows it serves, in the table's order."""
    out: dict[str, list[tuple[Op, Mcp]]] = {}
    for row in OPS.values():
        for m in tools_of(row):
            out.setdefault(m.tool(row), []).append((row, m))
    return out


@functools.lru_cache(maxsize=None)
def typeof(text: str):
    """A row annotation (a string: the table's rows use `from __future__ import annotations`) as a type."""
    return eval(text, {"__builtins__": builtins})        # noqa: S307 - the table's own annotation strings


def row_params(row: Op) -> dict[str, inspect.Parameter]:
    """A row's parameters by name (its **options as the parameters they stand for: fork's are run's)."""
    out = {p.name: p for p in row.signature.parameters.values() if p.kind is not p.VAR_KEYWORD}
    if row.kwargs_of:
        out.update({p.name: p for p in row.keyword_options()})
    return out


def row_type(row: Op, m: Mcp, name: str):
    """The type a tool shows for a row parameter: the row's Mcp.types entry, else the row's annotation
    (EMPTY: the row leaves it untyped, as command, memory and network are)."""
    if name in m.types:
        return typeof(m.types[name])
    ann = row_params(row)[name].annotation
    return typeof(ann) if isinstance(ann, str) else ann


def row_default(row: Op, m: Mcp, name: str):
    return m.defaults[name] if name in m.defaults else row_params(row)[name].default


def members(t) -> set:
    """A type's union members by their plain class (dict[str, str] is a dict; None is NoneType)."""
    if t is None:
        return {type(None)}
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return set().union(*(members(a) for a in typing.get_args(t)))
    return {typing.get_origin(t) or t}


def derive(row: Op, m: Mcp) -> tuple[inspect.Signature, dict[str, str]]:
    """A derived tool's signature (keyword parameters: a model names each) and tool name -> row name."""
    own = row_params(row)
    names = m.params if m.params is not None else tuple(own)
    unknown = [n for n in names if n not in own]
    assert not unknown, f"MCP tool of row {row.name}: Mcp.params names {unknown}, not the row's"
    params, back = [], {}
    for n in names:
        t = row_type(row, m, n)
        assert t is not EMPTY and bytes not in members(t), (
            f"row {row.name}: parameter {n} has no JSON type for MCP: declare Mcp(types=...) or leave it out "
            "(Mcp(params=...)), or say via('mcp', Off(why))")
        tn = m.rename.get(n, n)
        params.append(inspect.Parameter(tn, inspect.Parameter.KEYWORD_ONLY, default=row_default(row, m, n),
                                        annotation=t))
        back[tn] = n
    for e in m.extras().values():
        assert e is not None, f"row {row.name}: a derived tool's extra parameters are Param(name, type, default)"
        params.append(inspect.Parameter(e.name, inspect.Parameter.KEYWORD_ONLY, default=e.default,
                                        annotation=typeof(e.type)))
    ret = row.signature.return_annotation
    listy = isinstance(ret, str) and ret.startswith("list") and not (m.result and m.result.key)
    return inspect.Signature(params, return_annotation=list[dict] if listy else dict), back


def plain(value):
    """Value objects (an Entry, a Change) as their dicts, in lists too."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value.to_dict() if hasattr(value, "to_dict") else value


def shape(answer, m: Mcp, args: dict):
    r = m.result
    if r is None:
        return plain(answer)
    if r.key:
        answer = {r.key: answer}
    answer = plain(answer)
    if r.keep:
        answer = ([{k: v for k, v in a.items() if k in r.keep} for a in answer] if isinstance(answer, list)
                  else {k: v for k, v in answer.items() if k in r.keep})
    if r.echo:
        answer = {**{e: args[e] for e in r.echo}, **(answer or {})}
    if r.rename:
        answer = {r.rename.get(k, k): v for k, v in answer.items()}
    return answer


def resolving(served: list[tuple[Op, Mcp]]) -> tuple[str, ...]:
    """The tool's names of the image arguments its rows resolve (Mcp.resolve, renamed)."""
    return tuple(dict.fromkeys(m.rename.get(n, n) for _, m in served for n in m.resolve))


def resolved(engine, kw: dict, names: tuple[str, ...]) -> dict:
    """The tool's arguments with the image references among `names` as full IDs: resolved here, once for
    every tool (derived or by hand), so a body passes IDs to the operations and its answer names them."""
    return {k: engine.resolve(v) if k in names and v is not None else v for k, v in kw.items()}


def handled(toolkit, fn, names: tuple[str, ...]):
    """A hand-written body called with its image arguments resolved (resolved())."""
    if not names:
        return fn

    @functools.wraps(fn)
    def call(**kw):
        return fn(**resolved(toolkit.engine, kw, names))
    return call


def body(toolkit, name: str, row: Op, m: Mcp, back: dict[str, str]):
    """A derived tool's body: the row's operation called with the tool's arguments, the answer shaped."""
    extra = m.extras()
    names = resolving([(row, m)])

    def call(**kw):
        engine = toolkit.engine
        kw = resolved(engine, kw, names)
        args = {back[k]: v for k, v in kw.items() if k in back}
        args.update({k: v for k, v in kw.items() if k in extra})
        target = engine.operations if row.group == "operations" else engine
        return shape(getattr(target, row.name)(**args), m, kw)
    call.__name__ = call.__qualname__ = name
    return call


def describe(name: str, param: str, doc: str, served: list[tuple[Op, Mcp]]) -> str | None:
    """A tool parameter's description: a `param: text` line of the tool's own description, else the
    vocabulary's under the tool's names (a row of the tool's name, `tool.param`, then the shared meaning of
    the tool's name for it: sandbox_id says "from sandbox_start" where the row's sid does not), else the
    row's meaning of the parameter it stands for (vocabulary.describe of the row)."""
    for line in doc.splitlines():
        k, sep, text = line.strip().partition(": ")
        if sep and k == param:
            return text.strip()
    text = vocabulary.describe(name, param)
    if text:
        return text
    for row, m in served:
        back = {v: k for k, v in m.rename.items()}.get(param, param)
        text = vocabulary.describe(row.name, back) if back in row_params(row) else None
        if text:
            return text
    return None


def check(made: Made) -> list[str]:
    """Where a tool differs from the rows it serves: a parameter that is neither a row's nor declared the
    tool's own (Mcp.extra), a type that is not the row's (a tool may narrow it: str of bytes | str), a
    default that is not the row's (nor declared in Mcp.defaults)."""
    out = []
    for p in made.signature.parameters.values():
        mine = False
        for row, m in made.rows:
            rp = {v: k for k, v in m.rename.items()}.get(p.name, p.name)
            if p.name in m.extras():
                mine = True
                e = m.extras()[p.name]
                if e is not None and (members(p.annotation) != members(typeof(e.type)) or p.default != e.default):
                    out.append(f"{made.name}.{p.name}: not as its Mcp.extra declares it ({e})")
                continue
            if rp not in row_params(row):
                continue
            mine = True
            want = row_type(row, m, rp)
            if want is not EMPTY and not members(p.annotation) <= members(want):
                out.append(f"{made.name}.{p.name}: type {p.annotation} is not row {row.name}'s {rp} ({want})")
            default = row_default(row, m, rp)
            if default is not EMPTY and p.default != default:
                out.append(f"{made.name}.{p.name}: default {p.default!r} is not row {row.name}'s {rp} ({default!r})")
        if not mine:
            out.append(f"{made.name}.{p.name}: neither a parameter of its row(s) "
                       f"({', '.join(r.name for r, _ in made.rows)}) nor declared the tool's own (Mcp.extra)")
    return out


def core() -> dict[str, tuple[str, ...] | None]:
    """The default profile, as declared beside the rows (Mcp(core=...)): tool name -> the parameters it shows
    there (None: all). A tool of several rows is in it when one of them says so (those that say agree)."""
    out = {}
    for name, served in tools().items():
        marks = {m.core for _, m in served if m.core}
        assert len(marks) <= 1, f"MCP tool {name}: its rows disagree on its core profile ({marks})"
        if marks:
            mark = marks.pop()
            out[name] = None if mark is True else tuple(mark)
    assert len(out) <= CORE_MAX, f"the core MCP profile has {len(out)} tools (at most {CORE_MAX}): {sorted(out)}"
    return out


def select(spec: str | None, names) -> dict[str, tuple[str, ...] | None]:
    """`--tools`: "core" (the default: core()), "all", or a comma list of tool names (each with every
    parameter) and "core". Tool name -> the parameters it shows (None: all); an unknown name is refused."""
    names = list(names)
    if spec is None or spec.strip() == "core":
        return core()
    if spec.strip() == "all":
        return dict.fromkeys(names)
    out: dict[str, tuple[str, ...] | None] = {}
    asked = [w.strip() for w in spec.split(",") if w.strip()]
    unknown = [w for w in asked if w not in names and w not in ("core", "all")]
    if unknown or not asked:
        raise InvalidInput(f"--tools: unknown tool(s) {', '.join(unknown) or '(none named)'}; say core (the default), "
                           f"all, or a comma list of: {', '.join(sorted(names))}")
    if "all" in asked:
        return dict.fromkeys(names)
    if "core" in asked:
        out.update(core())
    out.update(dict.fromkeys(w for w in asked if w != "core"))      # named: every parameter
    return out


def make(toolkit, spec: str | None = None) -> dict[str, Made]:
    """Make every row's tool (handlers: toolkit.handlers, by name), each checked against its rows (a drift is a
    programming error: AssertionError), and register those `spec` selects (select()) on the toolkit's server,
    with the guide's own tools it selects."""
    made: dict[str, Made] = {}
    chosen = select(spec, [*tools(), *toolkit.own])
    for name, served in tools().items():
        hands = {m.handler for _, m in served}
        assert len(hands) == 1, f"MCP tool {name}: its rows disagree on its handler ({hands})"
        hand = hands.pop()
        if hand is None:
            assert len(served) == 1, f"MCP tool {name}: a derived tool serves one row ({[r.name for r, _ in served]})"
            row, m = served[0]
            sig, back = derive(row, m)
            fn = body(toolkit, name, row, m, back)
            doc = m.doc or row.doc
        else:
            fn = toolkit.handlers.get(hand)
            assert fn is not None, f"MCP tool {name}: no handler {hand} in mcp/ (Toolkit.handler)"
            sig = inspect.signature(fn, eval_str=True)
            doc = fn.__doc__ or ""                        # as written: what a model has always read
            fn = handled(toolkit, fn, resolving(served))
        made[name] = Made(name, sig, served, hand is not None)
        problems = check(made[name])
        assert not problems, "\n".join(problems)
        if name in chosen:
            toolkit.register(fn, name, doc, sig, lambda p, name=name, doc=doc, served=served: describe(name, p, doc, served),
                             shown=chosen[name])
    for name, fn in toolkit.own.items():
        if name in chosen:
            toolkit.add_own(fn)
    unclaimed = set(toolkit.handlers) - {m.handler for rows in tools().values() for _, m in rows}
    assert not unclaimed, f"MCP handlers no row names (Mcp(handler=...) beside the row): {sorted(unclaimed)}"
    return made


__all__ = ["EMPTY", "Made", "body", "check", "core", "derive", "describe", "handled", "make", "members", "plain", "resolved",
           "resolving", "row_default", "row_params", "row_type", "select", "shape", "tools", "typeof"]
