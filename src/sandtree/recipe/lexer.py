"""A Dockerfile's text as BuildKit's parser sees it, before any instruction means anything: parser
directives (`# syntax=`, `# escape=`), logical lines (continuations joined, comment lines dropped, the
first physical line's number kept), words with quotes, and ARG/ENV expansion ($V, ${V}, ${V:-x},
${V-x}, ${V:+x}, ${V+x}, ${V:?msg}, ${V?msg}) with Docker's quoting rules (nothing expands inside
'...'; the escape character makes the next character literal). The canonical quoting of a word for a
step's text (`quote`) lives here too. dockerfile.py gives the instructions their meaning."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidInput

__all__ = ["Line", "directives_and_lines", "split_words", "expand", "quote", "word", "MAX_TEXT_BYTES", "MAX_LINES",
           "MAX_WORD_CHARS", "MAX_NESTING"]

MAX_TEXT_BYTES = 1 << 20        # a Dockerfile larger than this is refused
MAX_LINES = 2000                # instructions
# Expansion is bounded too (a review found `ENV A=$A$A` on 40 lines asks for 2^40 bytes, and
# `${A:-${A:-...}}` nested 500 deep raised RecursionError after quadratic scanning): a word expands
# to at most as much as a whole Dockerfile may hold, through at most this many nested ${...}.
MAX_WORD_CHARS = 1 << 20
MAX_NESTING = 32
_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.*?)\s*$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Line:
    number: int          # the first physical line (1-based)
    instruction: str     # upper case
    rest: str            # the arguments, continuations joined, stripped


def directives_and_lines(text: str) -> tuple[dict, list[Line]]:
    """The parser directives and the logical instruction lines of a Dockerfile."""
    if len(text.encode("utf-8", "surrogateescape")) > MAX_TEXT_BYTES:
        raise InvalidInput(f"the Dockerfile is over {MAX_TEXT_BYTES} bytes")
    if "\0" in text:
        raise InvalidInput("the Dockerfile contains a NUL byte")
    physical = text.lstrip("\ufeff").split("\n")
    directives: dict[str, str] = {}
    i = 0
    while i < len(physical):                       # directives: only at the very top
        m = _DIRECTIVE.match(physical[i].strip())
        if not m or m.group(1).lower() in directives:
            break
        directives[m.group(1).lower()] = m.group(2)
        i += 1
    escape = directives.get("escape", "\\")
    if escape not in ("\\", "`"):
        raise InvalidInput(f"line {i}: the escape directive takes \\ or `, not {escape!r}", line=i)
    lines: list[Line] = []
    while i < len(physical):
        raw = physical[i].rstrip("\r")
        i += 1
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        start, parts = i, []
        cur = raw.strip()
        while True:
            body = cur.rstrip()
            if body.endswith(escape):                    # BuildKit: escape + blanks at the end
                parts.append(body[:-1])
                if i >= len(physical):
                    break
                cur = physical[i].rstrip("\r")
                i += 1
                while cur.strip().startswith("#") or not cur.strip():   # comments/blank lines inside
                    if i >= len(physical):
                        cur = ""
                        break
                    cur = physical[i].rstrip("\r")
                    i += 1
                continue
            parts.append(cur)
            break
        joined = "".join(parts).strip()
        word, _, rest = joined.partition(" ")
        if "\t" in word:
            word, _, more = word.partition("\t")
            rest = more + " " + rest
        lines.append(Line(start, word.upper(), rest.strip()))
        if len(lines) > MAX_LINES:
            raise InvalidInput(f"the Dockerfile has over {MAX_LINES} instructions")
    return directives, lines


def split_words(text: str, escape: str, line: int) -> list[str]:
    """Words separated by whitespace; quotes and escapes kept (expand() removes them), so
    `"a b"` stays one word."""
    words, cur, quote_ch, i, in_word = [], "", None, 0, False
    while i < len(text):
        ch = text[i]
        if quote_ch is None and ch.isspace():
            if in_word:
                words.append(cur)
            cur, in_word = "", False
            i += 1
            continue
        in_word = True
        if ch == escape and quote_ch != "'" and i + 1 < len(text):
            cur += ch + text[i + 1]
            i += 2
            continue
        if ch in "'\"":
            if quote_ch is None:
                quote_ch = ch
            elif quote_ch == ch:
                quote_ch = None
        cur += ch
        i += 1
    if quote_ch is not None:
        raise InvalidInput(f"line {line}: unmatched {quote_ch} in {text[:80]!r}", line=line)
    if in_word:
        words.append(cur)
    return words


def expand(word: str, env: dict, escape: str, line: int, _depth: int = 0) -> str:
    """One word with its quotes removed and its variables replaced (Docker's ProcessWord);
    InvalidInput past MAX_WORD_CHARS or MAX_NESTING."""
    if _depth > MAX_NESTING:
        raise InvalidInput(f"line {line}: substitutions nested over {MAX_NESTING} deep", line=line)
    out, i, n = [], 0, len(word)
    size = 0
    quote_ch = None
    while i < n:
        ch = word[i]
        if quote_ch == "'":
            if ch == "'":
                quote_ch = None
            else:
                out.append(ch)
            i += 1
        elif ch == escape and i + 1 < n:
            nxt = word[i + 1]
            if quote_ch == '"' and nxt not in ('"', "$", escape):
                out.append(ch)                 # inside "...": only \" \$ \\ are escapes
            out.append(nxt)
            i += 2
        elif ch in "'\"" and quote_ch is None:
            quote_ch = ch
            i += 1
        elif ch == '"' and quote_ch == '"':
            quote_ch = None
            i += 1
        elif ch == "$":
            value, i = _variable(word, i + 1, env, escape, line, _depth)
            size += len(value)
            if size > MAX_WORD_CHARS:
                raise InvalidInput(f"line {line}: a word expands to over {MAX_WORD_CHARS} characters", line=line)
            out.append(value)
        else:
            out.append(ch)
            i += 1
    if quote_ch is not None:
        raise InvalidInput(f"line {line}: unmatched {quote_ch} in {word[:80]!r}", line=line)
    return "".join(out)


def _variable(word: str, i: int, env: dict, escape: str, line: int, depth: int) -> tuple[str, int]:
    """The value of the variable that starts at word[i] (just after '$'), and where it ends."""
    if i < len(word) and word[i] == "{":
        end = _closing_brace(word, i, line)
        inner = word[i + 1:end]
        m = _NAME.match(inner)
        if not m:
            raise InvalidInput(f"line {line}: bad substitution ${{{inner}}}", line=line)
        name, op = m.group(0), inner[m.end():]
        value = env.get(name)
        if not op:
            return value or "", end + 1
        for form in (":-", ":+", ":?", "-", "+", "?"):
            if op.startswith(form):
                arg = expand(op[len(form):], env, escape, line, depth + 1)
                unset_or_empty = not value if form.startswith(":") else value is None
                if form.endswith("-"):
                    return (arg if unset_or_empty else value), end + 1
                if form.endswith("+"):
                    return ("" if unset_or_empty else arg), end + 1
                if unset_or_empty:
                    raise InvalidInput(f"line {line}: {name}: {arg or 'is not set'}", line=line)
                return value, end + 1
        raise InvalidInput(f"line {line}: unsupported substitution ${{{inner}}} (forms: ${{V}}, ${{V:-x}}, "
                           "${V:+x}, ${V:?x})", line=line)
    m = _NAME.match(word, i)
    if not m:
        return "$", i                                 # a lone '$' is itself
    return env.get(m.group(0)) or "", m.end()


def _closing_brace(word: str, i: int, line: int) -> int:
    depth = 0
    for j in range(i, len(word)):
        if word[j] == "{":
            depth += 1
        elif word[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise InvalidInput(f"line {line}: missing '}}' in {word[:80]!r}", line=line)


_PLAIN = re.compile(r"^[A-Za-z0-9_./:@%+,=-]+$")   # the Python builder's (recipe/texts.py) plain set
_BARE = re.compile(r'^[^\s"\'\\]+$')


def quote(s: str) -> str:
    """An ENV/LABEL value as a step's text writes it: bare when plain, else in double quotes with
    \\ " $ escaped (what Docker reads back as `s`: an unescaped $ would expand)."""
    if _PLAIN.match(s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def word(s: str) -> str:
    """A COPY/WORKDIR/FROM word as written (globs and all), quoted only when it could not be read
    back as one word."""
    return s if _BARE.match(s) and "$" not in s else quote(s)
