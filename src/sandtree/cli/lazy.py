"""The parser of one command line, built for its verb alone: start-up time. Importing every verb's module and
building ~100 verbs' parsers costs several times the interpreter's own start, and a command line uses one verb. The
top parser still names every verb, in order and with its help line (its usage, `sandtree --help`, "did you mean"
for a mistyped verb), from the verb index (verbindex.py, written from the whole parser by scripts/verbindex.py; the
conformance test holds it and this parser to the whole parser). A command line the index cannot place (an
abbreviated common option before the verb) gets the whole parser, as before."""

from __future__ import annotations

from . import parser as whole, verbindex

__all__ = ["parser_for", "verb_of_argv"]

# The common options that take a value (parser.common_parser): the token after them is not the verb.
_VALUED = ("--home", "--database", "--objects", "--cluster")


def verb_of_argv(argv: list[str]) -> str | None:
    """The verb of a command line as argparse finds it; "" when none is given or -h comes first (the top parser
    answers: naming every verb is enough); None when unsure (the whole parser answers)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-"):
            return a
        if a in ("-h", "--help"):
            return ""
        if a in _VALUED:
            i += 2
        elif a == "--json" or a.split("=", 1)[0] in _VALUED and "=" in a:
            i += 1
        else:
            return None                   # an abbreviation or a mistyped option: argparse's own answer
    return ""


def parser_for(argv: list[str]):
    """The parser for this command line: the given verb's builders run, every other verb only named (a parser
    with nothing in it, never reached: the command line's verb is another)."""
    verb = verb_of_argv(argv)
    index = dict(verbindex.VERBS)
    if verb is None:
        return whole.build_parser()
    common = whole.common_parser()
    p, sub = whole.top_parser(common)
    builders = [b for b in whole.GROUPS + (whole.REST,) if whole.name_of(b) in index.get(verb, ())]
    listed = dict(verbindex.LISTED)
    for w, by in index.items():
        if w in sub.choices:
            continue
        # a builder runs where the verbs it adds first appear (the rows' rest: only this verb's)
        b = next((b for b in builders if whole.name_of(b) == by[0] and (b != whole.REST or w == verb)), None)
        if b is None:
            sub.add_parser(w, add_help=False, **({"help": listed[w]} if w in listed else {}))
        else:
            _run(b, sub, common, verb)
            builders.remove(b)
    for b in builders:                    # the ones adding no verb of their own (the rows' rest under a group)
        _run(b, sub, common, verb)
    return p


def _run(b, sub, common, verb: str) -> None:
    if b == whole.REST:
        whole.builder(b)(sub, common, verb)       # the rows' rest: only this verb's
    else:
        whole.builder(b)(sub, common)
