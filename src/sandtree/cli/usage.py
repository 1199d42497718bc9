"""A wrong command line, answered as git and docker do: the verb's own usage, the error, and "did you mean"
(the nearest of that verb's flags or words), exit status exits.USAGE. Every parser of `sandtree` is a Parser:
argparse makes a verb's parser of its parent's class."""

from __future__ import annotations

import argparse
import difflib
import re
import sys

from . import exits
from ..errors import InvalidInput

__all__ = ["PROG", "Parser", "nearest", "usage_error"]

PROG = "sandtree"

_VERB = "_sandtree_verb_parser"      # the innermost parser that parsed the command line (set once, innermost first)


def nearest(word: str, choices) -> str | None:
    """The closest of choices to a mistyped word, or None when nothing is close."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


class Parser(argparse.ArgumentParser):
    def parse_known_args(self, args=None, namespace=None):
        ns, extra = super().parse_known_args(args, namespace)
        if not hasattr(ns, _VERB):
            setattr(ns, _VERB, self)
        if extra and self._subparsers is None:
            # a verb's parser: an unknown argument is its error (its usage shown), not the top parser's
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return ns, extra

    def verbs(self) -> dict:
        """Word -> parser of this parser's verbs (its subparsers' choices); {} for a verb's own parser."""
        return {w: p for a in self._actions if isinstance(a.choices, dict) and not a.option_strings
                for w, p in a.choices.items()}

    def _flags(self) -> list[str]:
        return [s for a in self._actions for s in a.option_strings]

    def _words(self) -> list[str]:
        # a subparsers action's choices are its words (a dict: word -> parser)
        return [w for a in self._actions if isinstance(a.choices, dict) for w in a.choices]

    def error(self, message: str):
        hint = None
        m = re.search(r"unrecognized arguments: (\S+)", message)
        if m:
            bad = m.group(1).split("=")[0]
            hint = nearest(bad, self._flags() if bad.startswith("-") else self._words() or self._flags())
        m = re.search(r"invalid choice: '([^']*)'", message)
        if m and hint is None:
            hint = nearest(m.group(1), self._words() or [c for a in self._actions for c in (a.choices or ())])
        self.print_usage(sys.stderr)
        text = f"{self.prog}: error: {message}\n" + (f"did you mean {hint!r}?\n" if hint else "")
        self.exit(exits.USAGE, text)


def usage_error(args, message: str):
    """A handler's verdict that its command line is wrong (e.g. `merge` with one image): that verb's usage and
    exit status exits.USAGE, as argparse's own errors."""
    parser = getattr(args, _VERB, None)
    if parser is None:                   # a namespace not made by parsing: a plain bad input
        raise InvalidInput(message)
    parser.error(message)
