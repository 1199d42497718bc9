"""Docker's two pattern languages for a build context, as pure functions (context.py walks the
directory): `.dockerignore` patterns (moby/patternmatcher: `**` any number of components, `*` and `?`
within one, `\\` escapes, `[...]` classes, `!` exceptions, the last match wins, a pattern matching a
parent directory matches everything under it) and COPY source globs (Go's filepath.Match, one path
component at a time).

Both are matched by RE2, as Go's regexp does: linear in the name whatever the pattern (Python's re
backtracks: `*a*a*a*a*a*b` against a 120-character name took 41 s, and a context's .dockerignore or
a Dockerfile's COPY source is untrusted input). A name's undecodable bytes are matched as U+FFFD,
one character each (Go's RuneError)."""

from __future__ import annotations

import re

import re2

from ..errors import InvalidInput, TooLarge

__all__ = ["IgnoreRules", "Matcher", "ignore_regex", "glob_regex", "unescape", "where", "META", "MAX_PATTERNS"]

MAX_PATTERNS = 10_000
META = re.compile(r"[*?\[\\]")


def where(line: int) -> str:
    return f"line {line}: " if line else ""


def _text(s: str) -> str:
    """`s` as RE2 (UTF-8) can take it: each undecodable byte (a surrogate escape) as U+FFFD."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class Matcher:
    """A compiled pattern: `match(name)` is true when the whole name matches (linear time)."""
    __slots__ = ("rx",)

    def __init__(self, rx):
        self.rx = rx

    def match(self, name: str) -> bool:
        return self.rx.fullmatch(_text(name)) is not None


def _compile(regex: str, what: str) -> Matcher:
    opts = re2.Options()
    opts.log_errors = False
    opts.dot_nl = True
    opts.max_mem = 8 << 20                      # RE2's own cap on a pattern's automaton
    try:
        return Matcher(re2.compile(_text(regex), opts))
    except re2.error as exc:
        msg = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise InvalidInput(f"{what}: {msg}") from None


def _char_class(body: str) -> str:
    """A pattern's `[...]` (its body) as a regex class: `^` negates; a backslash and `[` are literal."""
    neg = body.startswith("^")
    body = body[1:] if neg else body
    return "[" + ("^" if neg else "") + body.replace("\\", "\\\\").replace("[", "\\[") + "]"


# ---- .dockerignore -------------------------------------------------------------------------------

def ignore_regex(pattern: str) -> Matcher:
    """moby/patternmatcher's compile: '**' any number of components, '*' and '?' within one, '\\'
    escapes the next character, '[...]' a class."""
    out, i, n = "", 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "*":
            if i + 1 < n and pattern[i + 1] == "*":
                i += 2
                if i < n and pattern[i] == "/":
                    i += 1
                out += ".*" if i >= n else "(.*/)?"
                continue
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\":
            i += 1
            out += re.escape(pattern[i]) if i < n else re.escape("\\")
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                raise InvalidInput(f".dockerignore pattern {pattern!r}: unclosed '['")
            out += _char_class(pattern[i + 1:end])
            i = end
        else:
            out += re.escape(ch)
        i += 1
    return _compile(out, f".dockerignore pattern {pattern!r}")


class IgnoreRules:
    """The patterns of a .dockerignore, in order: (exclusion?, regex, text)."""

    def __init__(self, text: str = ""):
        self.patterns: list[tuple[bool, Matcher, str]] = []
        for raw in text.splitlines():
            p = raw.strip()
            if not p or p.startswith("#"):
                continue
            exception = p.startswith("!")
            if exception:
                p = p[1:].strip()
                if not p:
                    continue
            p = _clean_pattern(p)
            self.patterns.append((exception, ignore_regex(p), ("!" if exception else "") + p))
            if len(self.patterns) > MAX_PATTERNS:
                raise TooLarge(f".dockerignore has over {MAX_PATTERNS} patterns")
        self.has_exceptions = any(e for e, _, _ in self.patterns)

    def ignored(self, path: str) -> bool:
        """Is `path` (relative, cleaned) excluded? moby's MatchesOrParentMatches."""
        if path == "." or not self.patterns:
            return False
        parents = path.split("/")[:-1]
        matched = False
        for exception, rx, _ in self.patterns:
            if exception != matched:        # an inclusion already matched / an exception not yet
                continue
            hit = rx.match(path)
            if not hit:
                hit = any(rx.match("/".join(parents[:i + 1])) for i in range(len(parents)))
            if hit:
                matched = not exception
        return matched


def _clean_pattern(p: str) -> str:
    """Go's filepath.Clean, then a leading '/' dropped (patterns are relative to the context)."""
    absolute = p.startswith("/")
    parts: list[str] = []
    for part in p.split("/"):
        if part in ("", "."):
            continue
        if part == ".." and parts and parts[-1] != "..":
            parts.pop()
        elif part == ".." and absolute:
            continue
        else:
            parts.append(part)
    return "/".join(parts) or "."


# ---- source globs --------------------------------------------------------------------------------

def glob_regex(segment: str, source: str, line: int) -> Matcher:
    """One path component of a COPY source as Go's filepath.Match sees it."""
    out, i, n = "", 0, len(segment)
    while i < n:
        ch = segment[i]
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "\\":
            i += 1
            if i >= n:
                raise InvalidInput(f"{where(line)}COPY source {source!r}: a trailing '\\'", line=line)
            out += re.escape(segment[i])
        elif ch == "[":
            end = segment.find("]", i + 2 if segment[i + 1:i + 2] in ("^", "]") else i + 1)
            if end < 0:
                raise InvalidInput(f"{where(line)}COPY source {source!r}: unclosed '['", line=line)
            out += _char_class(segment[i + 1:end])
            i = end
        else:
            out += re.escape(ch)
        i += 1
    return _compile(out, f"{where(line)}COPY source {source!r}")


def unescape(segment: str) -> str:
    return re.sub(r"\\(.)", r"\1", segment)
