"""Verbs made from the operation table's rows: each row on the command line (table.rows: Op.on("cli")) becomes a
verb whose arguments are the row's parameters (types and defaults from the row, help from sandtree.vocabulary)
and whose handler opens the engine, resolves the image arguments, calls engine.<row> and prints the answer
(printers.py). A row's table.cli.Cli says where it differs (its verb's words, its positionals, a printer); a
verb written by hand (Cli(handler=...)) is built by its own module, and the maker leaves it alone.

The run options a row takes (table.options.RunOptions) are spelled by options.RUN_FLAGS, as `run` spells them."""

from __future__ import annotations

import argparse
import sys

from .. import table, vocabulary
from ..table.cli import Cli
from . import options, printers
from .output import open_engine, with_progress

__all__ = ["CALLBACKS", "IMAGE_MAKERS", "add", "add_rest", "call_args", "cli_of", "derived", "flag_of", "group", "kind_of", "make",
           "parameters", "positionals", "resolved", "run", "verb_of"]

# In-process parameters a command line cannot give: a progress callback is drawn as a bar instead (with_progress)
CALLBACKS = ("progress", "on_output", "cancel", "log")
# The printers of a verb that makes an image: it takes -q (its stdout: the ID alone, as without -q)
IMAGE_MAKERS = ("image_made", "committed")


def cli_of(row) -> Cli:
    return row.override("cli") or Cli()


def verb_of(row) -> tuple[str, ...]:
    """The verb's words: Cli.verb, else the row's name with - for _."""
    return tuple((cli_of(row).verb or row.name.replace("_", "-")).split())


def kind_of(param) -> str | None:
    """What a parameter's annotation (a string: the rows use `from __future__ import annotations`) is on the
    command line: str, int, float, bool, pairs (a dict: KEY=VALUE, repeatable), list (repeatable), bytes (a file,
    - for stdin); None: it cannot be typed (an in-process object)."""
    ann = param.annotation
    if ann is param.empty:
        return None
    parts = [p.strip() for p in str(ann).split("|") if p.strip() != "None"]
    base = parts[0] if parts else ""
    if base == "bytes":
        return "bytes"
    if base in ("str", "int", "float", "bool"):
        return base
    if base.startswith("dict"):
        return "pairs"
    if base.startswith("list"):
        return "list"
    return None


def parameters(row) -> list:
    """The row's parameters the verb offers, in order (its **kwargs and callbacks left out, and Cli.omit)."""
    c = cli_of(row)
    return [p for p in row.signature.parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in CALLBACKS and p.name not in c.omit]


def positionals(row) -> dict[str, str]:
    """Positional parameter -> "" / "?" / "+" (Cli.args, else those without a default)."""
    c = cli_of(row)
    if c.args is not None:
        return {a.rstrip("?+"): a[len(a.rstrip("?+")):] for a in c.args}
    return {p.name: "" for p in parameters(row) if p.default is p.empty and p.name not in row.options}


def flag_of(row, name: str) -> str:
    """A flag's long spelling: --the-name (or Cli.dest's name for it)."""
    return "--" + cli_of(row).dest.get(name, name).replace("_", "-")


def _default(row, p):
    """The flag's default: the row's (Cli.defaults where the command line deliberately differs)."""
    c = cli_of(row)
    return c.defaults.get(p.name, None if p.default is p.empty else p.default)


def _help(row, name: str, default) -> str:
    text = vocabulary.describe(row.name, name) or ""
    if default not in (None, (), [], False, True, ""):
        text += f" (default {default})"
    return text.replace("%", "%%")


def _add_param(x, row, p, how: str | None) -> None:
    """One parameter as an argparse argument; how: None for a flag, else its positional's "" / "?" / "+"."""
    c = cli_of(row)
    kind = kind_of(p)
    if kind is None:
        raise TypeError(f"{row.name}: parameter {p.name!r} has no command-line form: omit it (Cli(omit=...)) "
                        "or write the verb by hand (Cli(handler=...))")
    dest = c.dest.get(p.name, p.name)
    default = _default(row, p)
    kw = {"help": _help(row, p.name, default)}
    if p.name in c.choices:
        kw["choices"] = list(c.choices[p.name])
    if kind in ("int", "float"):
        kw["type"] = int if kind == "int" else float
    if how is not None:                                   # a positional
        if how == "?":
            kw.update(nargs="?", default=default)
        elif how == "+":
            kw["nargs"] = "+"
        if kind == "bytes":
            kw["metavar"] = "FILE"
            kw["help"] = (kw["help"] + "; a local file, - for stdin").lstrip("; ")
        x.add_argument(dest, **kw)
        return
    names = [flag_of(row, p.name)] + ([c.short[p.name]] if p.name in c.short else [])
    names.sort(key=len)                                    # argparse lists -i before --ignore-case
    if kind == "bool":
        if default:
            x.add_argument(*names, action=argparse.BooleanOptionalAction, default=True, dest=dest, **kw)
        else:
            x.add_argument(*names, action="store_true", dest=dest, **kw)
        return
    if kind in ("pairs", "list"):
        x.add_argument(*names, action="append", default=[], dest=dest,
                       metavar="KEY=VALUE" if kind == "pairs" else None, **{**kw, "help": kw["help"] + " (repeatable)"})
        return
    if kind == "bytes":
        kw["metavar"] = "FILE"
    x.add_argument(*names, default=default, dest=dest, **kw)


def make(sub, common, row):
    """The verb's parser, under `sub` (the group's subparsers made once: group())."""
    c = cli_of(row)
    words = verb_of(row)
    for w in words[:-1]:
        sub = group(sub, w)
    help_ = c.help or (row.doc.splitlines()[0] if row.doc else None)
    x = sub.add_parser(words[-1], parents=[common], help=help_.replace("%", "%%") if help_ else None,
                       description=row.doc.replace("%", "%%") or None)
    pos = positionals(row)
    params = {p.name: p for p in parameters(row)}
    for name, how in pos.items():
        _add_param(x, row, params[name], how)
    run_opts = [n for n in row.options if n in params]
    for p in params.values():
        if p.name not in pos and p.name not in run_opts:
            if p.default is p.empty:
                raise TypeError(f"{row.name}: {p.name!r} has no default and is no positional (Cli(args=...))")
            _add_param(x, row, p, None)
    if run_opts:
        options.add_run_options(x, run_opts)
    if c.show in IMAGE_MAKERS:
        options.add_quiet(x)
    x.set_defaults(fn=run, row=_key(row))
    return x


def _key(row) -> str:
    return row.name if row.group == "engine" else f"{row.group}.{row.name}"


def group(sub, name: str, help: str | None = None, parents=()):
    """The subparsers of a verb group (`image`, `branch`, ...), made once: hand-written and derived verbs share it.
    parents: the group's own flags (`cluster` takes the common ones before its verb too)."""
    groups = sub.__dict__.setdefault("_sandtree_groups", {})
    if name not in groups:
        g = sub.add_parser(name, help=help, parents=list(parents))
        groups[name] = g.add_subparsers(dest=f"{name.replace('-', '_')}_command", required=True)
    return groups[name]


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    with open(path, "rb") as f:
        return f.read()


def _value(kind: str | None, v):
    if kind == "pairs":
        return options.pairs(v, "KEY=VALUE") or None
    if kind == "list":
        return list(v) or None
    if kind == "bytes" and v is not None:
        return _read(v)
    return v


def call_args(row, args) -> dict:
    """The engine call's keyword arguments from the parsed command line."""
    c = cli_of(row)
    params = {p.name: p for p in parameters(row)}
    run_opts = [n for n in row.options if n in params]
    kw = {}
    for name, p in params.items():
        if name in run_opts:
            continue
        v = _value(kind_of(p), getattr(args, c.dest.get(name, name)))
        if v is None and p.default is not p.empty:
            continue                                       # absent: the row's default applies
        kw[name] = v
    kw.update(options.run_options(args, run_opts))
    return kw


def resolved(eng, ref):
    """The full image ID(s) of a reference (or a list of them): every verb, derived or by hand, resolves here."""
    if isinstance(ref, (list, tuple)):
        return [eng.resolve(r) for r in ref]
    return eng.resolve(ref)


def run(args):
    """The handler of every derived verb."""
    row = table.OPS[args.row]
    c = cli_of(row)
    eng = open_engine(args)
    kw = call_args(row, args)
    for name in row.images + c.resolve:                     # full IDs: what the output names
        if kw.get(name) is not None:
            kw[name] = resolved(eng, kw[name])
    fn = getattr(eng if row.group == "engine" else getattr(eng, row.group), row.name)
    many = next((n for n, how in positionals(row).items() if how == "+" and kind_of(row.signature.parameters[n])
                 != "list"), None)
    has_progress = "progress" in row.signature.parameters and "progress" not in c.omit

    def one(kwargs):
        if has_progress:
            return with_progress(args, f"{verb_of(row)[-1]}ing", lambda cb: fn(**kwargs, progress=cb))
        return fn(**kwargs)
    result = [one({**kw, many: v}) for v in kw[many]] if many else one(kw)
    return printers.show(c.show, args, kw, result)


def add(sub, common, *names: str) -> None:
    """The derived verbs of these rows, here in --help's order (the rest come last: add_rest)."""
    done = sub.__dict__.setdefault("_sandtree_rows", set())
    for n in names:
        make(sub, common, table.OPS[n])
        done.add(n)


def derived(rows=None) -> list:
    """The rows the maker builds verbs for: on the command line and not written by hand."""
    return [r for k, r in (rows or table.OPS).items() if r.on("cli") and not cli_of(r).handler]


def add_rest(sub, common, verb: str | None = None) -> None:
    """Every derived verb not placed yet (a new row reaches the command line here with no edit); verb: only those
    under that first word (a command line's parser: cli/lazy.py)."""
    done = sub.__dict__.setdefault("_sandtree_rows", set())
    for r in derived():
        if _key(r) not in done and verb in (None, verb_of(r)[0]):
            make(sub, common, r)
            done.add(_key(r))
