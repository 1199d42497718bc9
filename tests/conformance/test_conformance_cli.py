"""The `sandtree` command line against the operation table: every row on the command line (Op.on("cli")) has its
verb (table.cli.Cli says its words, positionals, renames), with the row's parameters (name, positional or flag,
type) and the row's defaults (Cli.defaults where the command line deliberately differs). A verb written by hand
(Cli(handler=...)) must exist, run that handler, and the handler must call the row's operation. Also: the CLI's exit
statuses come from one table (cli/exits.py), and the error tree drawn in errors.py's docstring is the classes' tree.

Each check is a function returning its findings, so the self-tests below plant a missing verb, a parameter drift
and a default drift (and a wrong drawing) and see them caught, as tests/test_architecture.py does for its rules."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import re
from dataclasses import replace

import pytest

from sandtree import errors, table
from sandtree.cli import derive, exits, lazy, options, verbindex
from sandtree.table import rows
from sandtree.table.cli import Cli

cli_main = importlib.import_module("sandtree.cli.main")     # sandtree.cli.main is also the function's name
SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "scripts", "verbindex.py")


# ---- reading the parser ---------------------------------------------------------------------------------------

def verbs(parser: argparse.ArgumentParser, words: tuple = ()) -> dict[tuple, argparse.ArgumentParser]:
    """Every verb's parser by its words (("image", "rm"): ...), groups included."""
    out = {}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                out[words + (name,)] = sp
                out.update(verbs(sp, words + (name,)))
    return out


def _action(x: argparse.ArgumentParser, dest: str):
    return next((a for a in x._actions if a.dest == dest), None)


def _handler(row):
    mod, _, fn = derive.cli_of(row).handler.rpartition(".")
    return getattr(importlib.import_module(f"sandtree.cli.{mod}"), fn)


def _sources(fn) -> str:
    """The handler's module and the command line's modules it uses (a handler may call the row through a helper:
    `shell` through terminal.interactive)."""
    mod = inspect.getmodule(fn)
    used = {inspect.getmodule(v) for v in vars(mod).values() if inspect.ismodule(v) or inspect.isfunction(v)}
    return "\n".join(inspect.getsource(m) for m in {mod} | used
                     if m is not None and m.__name__.startswith("sandtree.cli.") and m is not derive)


# ---- the checks -----------------------------------------------------------------------------------------------

def missing_verbs(ops: dict, parser) -> list[str]:
    """(a) A row on the command line without its verb, or a verb that does not run what the row says."""
    found, out = verbs(parser), []
    for key, row in ops.items():
        if not row.on("cli"):
            continue
        words = derive.verb_of(row)
        x = found.get(words)
        if x is None:
            out.append(f"{key}: no verb `sandtree {' '.join(words)}`")
            continue
        if derive.cli_of(row).handler:
            fn = _handler(row)
            if x.get_default("fn") is not fn:
                out.append(f"{key}: `{' '.join(words)}` does not run {derive.cli_of(row).handler}")
            elif not re.search(rf"\.{row.name}\(", _sources(fn)):
                out.append(f"{key}: {derive.cli_of(row).handler} never calls {row.name}")
        elif x.get_default("fn") is not derive.run or x.get_default("row") != key:
            out.append(f"{key}: `{' '.join(words)}` is not the row's derived verb")
    return out


def _expected_action(kind: str | None):
    """What argparse makes of a parameter of this kind (derive._add_param): a test of the action."""
    return {
        "int": lambda a: a.type is int,
        "float": lambda a: a.type is float,
        "bool": lambda a: a.nargs == 0,
        "pairs": lambda a: isinstance(a, argparse._AppendAction),
        "list": lambda a: isinstance(a, argparse._AppendAction) or a.nargs in ("+", "*"),
        "str": lambda a: a.type is None and a.nargs != 0,
        "bytes": lambda a: a.type is None and a.nargs != 0,
    }.get(kind, lambda a: False)


def _run_option_dest(name: str) -> str:
    return {"output": "max_output", "secrets": "secret"}.get(name, name)


def parameter_drift(ops: dict, parser) -> list[str]:
    """(b) A derived verb's argument whose name, kind (positional or flag) or type differs from the row's."""
    found, out = verbs(parser), []
    for key, row in ops.items():
        if not row.on("cli") or derive.verb_of(row) not in found:
            continue
        x, c = found[derive.verb_of(row)], derive.cli_of(row)
        if c.handler:                            # a verb by hand: at least the run options the row shares
            dests = {a.dest for a in x._actions}
            out += [f"{key}: run option {n} has no flag" for n in row.options if _run_option_dest(n) not in dests]
            continue
        pos = derive.positionals(row)
        dests = {a.dest for a in x._actions}
        for p in derive.parameters(row):
            if p.name in row.options:
                if _run_option_dest(p.name) not in dests:
                    out.append(f"{key}: run option {p.name} has no flag")
                continue
            a = _action(x, c.dest.get(p.name, p.name))
            if a is None:
                out.append(f"{key}: parameter {p.name} has no argument")
                continue
            if (p.name in pos) == bool(a.option_strings):
                out.append(f"{key}: {p.name} is {'a flag' if a.option_strings else 'a positional'}, the row says "
                           f"{'positional' if p.name in pos else 'flag'}")
            if not _expected_action(derive.kind_of(p))(a):
                out.append(f"{key}: {p.name}'s argument (type {getattr(a.type, '__name__', a.type)}, nargs "
                           f"{a.nargs}) is not the row's {p.annotation}")
            if a.option_strings and a.option_strings[-1] != derive.flag_of(row, p.name):
                out.append(f"{key}: {p.name} is spelled {a.option_strings[-1]}, not {derive.flag_of(row, p.name)}")
        extra = {a.dest for a in x._actions if not a.option_strings} - {c.dest.get(n, n) for n in pos}
        if extra:
            out.append(f"{key}: positionals the row lacks: {sorted(extra)}")
    return out


def default_drift(ops: dict, parser) -> list[str]:
    """(c) A derived verb's default that is not the row's (nor the Cli.defaults it declares beside the row)."""
    found, out = verbs(parser), []
    for key, row in ops.items():
        if not row.on("cli") or derive.verb_of(row) not in found:
            continue
        x, c = found[derive.verb_of(row)], derive.cli_of(row)
        if c.handler:                            # a verb by hand: the defaults its row's Cli declares
            for name, want in c.defaults.items():
                a = _action(x, c.dest.get(name, name))
                if a is None or a.default != want:
                    out.append(f"{key}: {name} defaults to {getattr(a, 'default', None)!r} on the command line, "
                               f"{want!r} beside the row")
            continue
        for p in derive.parameters(row):
            a = _action(x, _run_option_dest(p.name) if p.name in row.options else c.dest.get(p.name, p.name))
            if a is None or (p.default is p.empty and p.name not in c.defaults):
                continue
            want = c.defaults.get(p.name, p.default)
            if p.name in row.options:            # absent on the command line: the row's own default applies
                ok = a.default in (None, []) or a.default == want
            elif derive.kind_of(p) in ("pairs", "list") and a.option_strings:
                ok = a.default == [] and want in (None, (), [])
            else:
                ok = a.default == want
            if not ok:
                out.append(f"{key}: {p.name} defaults to {a.default!r} on the command line, {want!r} in the row")
    return out


def test_every_row_on_the_command_line_has_its_verb():
    assert missing_verbs(table.OPS, cli_main.build_parser()) == []


def test_derived_verbs_take_the_rows_parameters():
    assert parameter_drift(table.OPS, cli_main.build_parser()) == []


def test_derived_verbs_take_the_rows_defaults():
    assert default_drift(table.OPS, cli_main.build_parser()) == []


def test_every_printer_a_row_names_exists():
    from sandtree.cli import printers
    named = {k: derive.cli_of(r).show for k, r in table.OPS.items() if derive.cli_of(r).show}
    assert {k: v for k, v in named.items() if v not in printers.PRINTERS} == {}
    assert set(printers.PRINTERS) <= set(named.values())                  # and none is left unused


def test_run_flags_spell_every_run_option():
    assert options.RUN_OPTIONS == tuple(options.RUN_FLAGS) == table.RunOptions.names()      # order too


def test_a_cli_default_of_its_own_comes_from_defaults_py():
    """A verb's deliberate default (Cli.defaults) is a named limit of defaults.py, not a literal."""
    from sandtree import defaults as D
    named = [v for k, v in vars(D).items() if k.isupper()]
    for key, row in table.OPS.items():
        for name, v in derive.cli_of(row).defaults.items():
            assert v in named, (key, name, v)


# ---- planted drift: each check catches its own ------------------------------------------------------------------

def _plant():
    @rows.op("list")
    def planted_verb(name: str, *, count: int = 3, label: str | None = None) -> dict:
        """A planted row."""
    return "planted_verb"


def test_self_test_a_planted_row_without_a_verb_is_caught():
    parser = cli_main.build_parser()                   # made before the row exists: the verb is missing
    key = _plant()
    try:
        assert missing_verbs({key: table.OPS[key]}, parser) == [f"{key}: no verb `sandtree planted-verb`"]
        assert missing_verbs({key: table.OPS[key]}, cli_main.build_parser()) == []   # a new row gets its verb
    finally:
        del rows.OPS[key]


def test_self_test_a_handler_that_never_calls_its_row_is_caught():
    """merge_preview once reached the command line only on paper (a handler that called merge alone)."""
    parser = cli_main.build_parser()
    row = table.OPS["merge_preview"]
    planted = replace(row, name="merge_squash", via={**row.via, "cli": Cli("merge", handler="branching.cmd_merge")})
    assert missing_verbs({"merge_squash": planted}, parser) == \
        ["merge_squash: branching.cmd_merge never calls merge_squash"]


def test_self_test_a_planted_parameter_drift_is_caught():
    key = _plant()
    try:
        parser = cli_main.build_parser()
        ops = {key: table.OPS[key]}
        assert parameter_drift(ops, parser) == []
        x = verbs(parser)[("planted-verb",)]
        _action(x, "count").type = None                   # --count no longer an int
        assert parameter_drift(ops, parser) == [f"{key}: count's argument (type None, nargs None) is not the "
                                                "row's int"]
        _action(x, "count").type = int
        rows.OPS[key] = replace(rows.OPS[key], signature=rows.OPS[key].signature.replace(parameters=[
            *rows.OPS[key].signature.parameters.values(),
            inspect.Parameter("extra", inspect.Parameter.KEYWORD_ONLY, default=1, annotation="int")]))
        assert parameter_drift({key: rows.OPS[key]}, parser) == [f"{key}: parameter extra has no argument"]
    finally:
        del rows.OPS[key]


def test_self_test_a_hand_written_verb_s_default_drift_is_caught():
    parser = cli_main.build_parser()
    _action(verbs(parser)[("fork",)], "parallel").default = 8
    assert default_drift({"fork": table.OPS["fork"]}, parser) == [
        f"fork: parallel defaults to 8 on the command line, {derive.cli_of(table.OPS['fork']).defaults['parallel']!r} "
        "beside the row"]


def test_self_test_a_hand_written_verb_lacking_a_run_option_is_caught():
    parser = cli_main.build_parser()
    run = verbs(parser)[("run",)]
    run._actions = [a for a in run._actions if a.dest != "pids"]
    assert parameter_drift({"run": table.OPS["run"]}, parser) == ["run: run option pids has no flag"]


def test_self_test_a_planted_default_drift_is_caught():
    key = _plant()
    try:
        parser = cli_main.build_parser()
        ops = {key: table.OPS[key]}
        assert default_drift(ops, parser) == []
        _action(verbs(parser)[("planted-verb",)], "count").default = 4          # the surface drifts
        assert default_drift(ops, parser) == [f"{key}: count defaults to 4 on the command line, 3 in the row"]
        parser = cli_main.build_parser()
        sig = rows.OPS[key].signature
        rows.OPS[key] = replace(rows.OPS[key], signature=sig.replace(parameters=[   # the row drifts
            p.replace(default=5) if p.name == "count" else p for p in sig.parameters.values()]))
        assert default_drift({key: rows.OPS[key]}, parser) == [
            f"{key}: count defaults to 3 on the command line, 5 in the row"]
    finally:
        del rows.OPS[key]


# ---- exit statuses: one table ----------------------------------------------------------------------------------

def test_exit_statuses_come_from_one_table():
    """No verb module spells an exit status as a number or leaves by SystemExit (exits.py is the table; bad input
    is InvalidInput, so `run` answers 125 for it as for every sandtree error), and the table keeps the statuses
    users script against."""
    assert exits.EXITS == {"ok": 0, "error": 1, "no": 1, "usage": 2, "timeout": 124, "error_in_command": 125,
                           "signal": 128, "interrupted": 130}
    import pathlib
    cli_dir = pathlib.Path(derive.__file__).parent
    literal = re.compile(r"(return|error_status=)\s*(\d+\b|\d+ if .* else \d+)|SystemExit\(|sys\.exit\((?!main\(\)\))")
    found = [f"{f.name}:{i}: {line.strip()}" for f in sorted(cli_dir.glob("*.py")) if f.name != "exits.py"
             for i, line in enumerate(f.read_text().splitlines(), 1) if literal.search(line)]
    assert found == []


def test_a_sandtree_error_exits_with_the_table_s_status(tmp_path, capsys):
    """A real command line against a real (empty) store: an unknown image is a sandtree error, exit 1."""
    rc = cli_main.main(["--home", str(tmp_path), "image", "info", "no-such-image"])
    assert rc == exits.ERROR and "error:" in capsys.readouterr().err


# ---- the error tree drawn in errors.py is the classes' tree -----------------------------------------------------

def drawn_tree(doc: str) -> dict[str, str | None]:
    """class -> its parent, as errors.py's docstring draws them."""
    out, stack = {}, []
    for line in doc.splitlines():
        m = re.match(r"^    ([│├└─ ]*)([A-Z]\w+)(?:\s|$)", line)
        if not m:
            if out:
                break                                   # the drawing ended
            continue
        depth = len(m.group(1)) // 4
        stack[depth:] = [m.group(2)]
        out[m.group(2)] = stack[depth - 1] if depth else None
    return out


def class_tree(root: type) -> dict[str, str | None]:
    out = {root.__name__: None}
    for c in root.__subclasses__():
        out[c.__name__] = root.__name__
        out.update({k: v for k, v in class_tree(c).items() if v is not None})
    return out


def test_the_error_tree_drawn_in_errors_py_is_the_classes_tree():
    assert drawn_tree(errors.__doc__) == class_tree(errors.SandtreeError)


def test_self_test_a_class_missing_from_the_drawing_is_caught():
    drawing = errors.__doc__.replace("    │   ├── NotReady", "    │   ├── NotReadyYet")
    assert drawn_tree(drawing) != class_tree(errors.SandtreeError)
    lacking = "\n".join(line for line in errors.__doc__.splitlines() if "StoreUnavailable" not in line)
    assert set(class_tree(errors.SandtreeError)) - set(drawn_tree(lacking)) == {"StoreUnavailable"}

    class Base(Exception):
        pass

    class Child(Base):
        pass

    class Grandchild(Child):
        pass
    assert drawn_tree("    Base\n    └── Child\n        └── Grandchild\n") == class_tree(Base)
    assert drawn_tree("    Base\n    ├── Child\n    └── Grandchild\n") != class_tree(Base)


# ---- the parser of one command line (cli/lazy.py) ------------------------------------------------------------

def _shape(p: argparse.ArgumentParser):
    """What a parser accepts and says: its arguments (every attribute argparse acts on) and its defaults."""
    def one(a):
        choices = sorted(a.choices) if isinstance(a.choices, dict) else a.choices
        return (type(a).__name__, a.option_strings, a.dest, a.nargs, a.const, repr(a.default), a.type, choices,
                a.required, a.help, a.metavar)
    return [one(a) for a in p._actions], p._defaults, p.format_usage(), p.format_help()


def lazy_drift(whole: argparse.ArgumentParser) -> list[str]:
    """Where the parser built for a command line (only its verb's builders run: lazy.parser_for) differs from the
    whole parser: `sandtree --help` (every verb named, in order, with its help) and each verb's and group's parser
    reached by its words."""
    found = []
    if _shape(lazy.parser_for([])) != _shape(whole):
        found.append("sandtree")
    for words, sp in verbs(whole).items():
        p = lazy.parser_for(list(words))
        if p.format_usage() != whole.format_usage():
            found.append(f"{' '.join(words)}: the top usage")
        q = p
        for w in words:
            q = q.verbs().get(w) if q is not None else None
        if q is None or _shape(q) != _shape(sp):
            found.append(" ".join(words))
    return found


def test_one_verbs_parser_is_the_whole_parsers_part():
    assert lazy_drift(cli_main.build_parser()) == []


def test_the_verb_index_is_current():
    """cli/verbindex.py is written by scripts/verbindex.py: a verb added, moved or reworded rewrites it."""
    spec = importlib.util.spec_from_file_location("verbindex_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with open(script.PATH) as f:
        assert f.read() == script.text(), "stale: `PYTHONPATH=src .venv/bin/python scripts/verbindex.py`"


def test_lazy_drift_catches_a_stale_index(monkeypatch):
    whole = cli_main.build_parser()
    monkeypatch.setattr(verbindex, "LISTED", tuple((v, "old words" if v == "run" else h) for v, h in verbindex.LISTED))
    monkeypatch.setattr(verbindex, "VERBS", tuple((v, ("images.add_image",) if v == "fork" else b)
                                                  for v, b in verbindex.VERBS))
    found = lazy_drift(whole)
    assert "sandtree" in found and "fork" in found and "run" not in found, found


@pytest.mark.parametrize("argv", [
    ["--home", "/x", "run", "img", "--memory", "1G"], ["run", "img", "true"], ["--json", "image", "list"], ["--home=/x", "ps"],
    ["--ho", "/x", "ps"], ["--database", "sqlite:///x", "branch", "create", "b", "img"], ["run", "img", "--json"],
    ["sandbox", "ls", "sb1", "/"], ["--cluster", "auto", "cluster", "status"],
])
def test_a_command_line_parses_alike(argv):
    """The parser for a command line parses it as the whole parser does (verb_of_argv finds argparse's verb, or
    says it is unsure and the whole parser answers: an abbreviated --ho)."""
    def parsed(p):
        ns = vars(p.parse_args(argv))
        ns.pop("_sandtree_verb_parser")
        return ns
    assert parsed(lazy.parser_for(argv)) == parsed(cli_main.build_parser())
