"""Write src/sandtree/cli/verbindex.py, the verb index the command line's parser is built from (cli/lazy.py): each
verb of the whole parser in its order with the builders (parser.GROUPS, parser.REST) that add to it, and the verbs
`sandtree --help` lists with their help lines. Run it after adding, moving or rewording a verb (or a table row on
the command line); tests/conformance/test_conformance_cli.py fails while the index is stale.

    PYTHONPATH=src .venv/bin/python scripts/verbindex.py
"""

from __future__ import annotations

import os
import pprint

from sandtree.cli import parser as whole

PATH = os.path.join(os.path.dirname(__file__), os.pardir, "src", "sandtree", "cli", "verbindex.py")


def _paths(p, prefix: tuple) -> set:
    out = {prefix}
    for w, q in p.verbs().items():
        out |= _paths(q, prefix + (w,))
    return out


def compute() -> tuple:
    """(VERBS, LISTED) of the whole parser, built builder by builder: a builder adds to a verb when the verb's
    words under it change."""
    common = whole.common_parser()
    p, sub = whole.top_parser(common)
    builders: dict[str, list[str]] = {}
    before: dict = {}
    for b in whole.GROUPS + (whole.REST,):
        whole.builder(b)(sub, common)
        now = {w: _paths(q, (w,)) for w, q in p.verbs().items()}
        for verb, paths in now.items():
            if before.get(verb) != paths:
                builders.setdefault(verb, []).append(whole.name_of(b))
        before = now
    verbs = tuple((v, tuple(builders[v])) for v in sub.choices)
    assert all(a.metavar == a.dest for a in sub._choices_actions), "an alias: the index has no place for it"
    listed = tuple((a.dest, a.help) for a in sub._choices_actions)
    return verbs, listed


def text() -> str:
    verbs, listed = compute()
    return ('"""The verb index of `sandtree` (cli/lazy.py), written by scripts/verbindex.py from the whole parser: each '
            'verb with\nthe builders adding to it, and the verbs `sandtree --help` lists with their help. Do not edit."""'
            f"\n\nVERBS = {pprint.pformat(verbs, width=116)}\n\nLISTED = {pprint.pformat(listed, width=116)}\n")


if __name__ == "__main__":
    new = text()
    with open(PATH, "w") as f:
        f.write(new)
