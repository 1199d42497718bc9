"""Plain values more than one layer shares: the default environment of a command, sizes as
people write them (the engine's limits, a tenant's limits, the server's upload cap), and the hint a failed
step's output earns when it tried to reach the network without one (a build's RUN, an evaluation's run):
runs have no network by default, so `pip install` fails with a resolver's words."""

from __future__ import annotations

import re

from .defaults import RUN_RETRIES_MAX
from .errors import InvalidInput

DEFAULT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm"}

UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
         "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


def check_retries(n) -> int:
    """A run's retries= (how many times a run on a cluster node that was lost is run again on
    another): an int from 0 to defaults.RUN_RETRIES_MAX."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= RUN_RETRIES_MAX:
        raise InvalidInput(f"retries must be an integer from 0 to {RUN_RETRIES_MAX}, not {n!r}")
    return n


def parse_size(v) -> int:
    if isinstance(v, bool):
        raise InvalidInput(f"bad size {v!r}")
    try:
        if isinstance(v, (int, float)):
            n = int(v)
        else:
            s = str(v).strip().lower()
            num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
            unit = s[len(num):].strip()
            n = int(float(num) * UNITS[unit])
    except (ValueError, KeyError, OverflowError):       # (OverflowError: "1e400", "9" * 400: infinity)
        raise InvalidInput(f"bad size {str(v)[:40]!r} (use e.g. 512M, 2G)") from None
    if n <= 0:
        raise InvalidInput(f"size must be positive, not {v!r}")
    return n


LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}$")
MAX_LABELS, MAX_LABEL_VALUE = 64, 256


def check_labels(labels) -> dict[str, str]:
    """labels= (E2B's metadata, Modal's tags): at most 64 names of up to 63 letters, digits and
    _.-/ with text values of up to 256 characters; {} for None. InvalidInput otherwise."""
    if labels is None:
        return {}
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise InvalidInput(f"labels is a dict of at most {MAX_LABELS} name: text pairs")
    for k, v in labels.items():
        if not isinstance(k, str) or not LABEL_KEY.match(k):
            raise InvalidInput(f"bad label name {k!r} (letters, digits and _.-/, at most 63)", label=str(k)[:80])
        if not isinstance(v, str) or len(v) > MAX_LABEL_VALUE or "\0" in v:
            raise InvalidInput(f"label {k!r} must be text of at most {MAX_LABEL_VALUE} characters", label=k)
    return dict(labels)


def labels_match(have: dict, want: dict | None) -> bool:
    return not want or all(have.get(k) == v for k, v in want.items())


def check_kind(kind) -> str:
    """An operation kind as operations.list takes it (run, import, exec, commit, merge, ...)."""
    if not isinstance(kind, str) or not kind.isidentifier() or len(kind) > 32:
        raise InvalidInput(f"an operation kind is a word like run or import, not {kind!r}")
    return kind


def newest_page(infos: list[dict], limit, offset) -> list[dict]:
    """A page of records with a `created` time, newest first (limit 1 to 1000, offset from 0)."""
    for name, v, lo, hi in (("limit", limit, 1, 1000), ("offset", offset, 0, 1 << 40)):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise InvalidInput(f"{name} must be an integer from {lo} to {hi}, not {v!r}")
    infos.sort(key=lambda i: (-i["created"], i.get("sha256", "")))
    return infos[offset:offset + limit]


def not_utf8(value) -> str | None:
    """The first string in a JSON value (keys included) that UTF-8 cannot carry, else None. JSON's
    escapes let a body hold a lone surrogate (\\ud800), which Python's json takes; kept, it fails
    every answer that echoes it (a run's command broke the operations list for good)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return v
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return None


def name_values(pairs: list[str], what: str) -> dict[str, str]:
    """NAME=VALUE strings (a repeated flag or query parameter) as a dict; a pair without `=` or a name
    is InvalidInput naming `what` (the flag or parameter it came in)."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidInput(f"{what} wants NAME=VALUE, not {pair!r}")
        out[name] = value
    return out

# The words of the usual tools (glibc, busybox, curl, wget, pip/urllib3, apt, git, npm) when no name resolves
# or no route leaves: what a sandbox with no network answers them
SIGNS = (b"temporary failure in name resolution", b"name or service not known", b"bad address '",
         b"could not resolve host", b"could not resolve", b"network is unreachable", b"no servers could be reached",
         b"getaddrinfo", b"newconnectionerror", b"failed to establish a new connection", b"eai_again",
         b"nodename nor servname", b"unable to resolve host")

NETWORK_HINT = ("hint: the step could not reach the network; runs have none by default: pass --network all or an "
                "allow-list (--network pypi.org,*.pythonhosted.org; network= in Python, RUN --network=... in a "
                "Dockerfile)")


def network_hint(*outputs: bytes) -> str | None:
    """NETWORK_HINT when a run with no network printed one of SIGNS (case ignored), else None."""
    text = b"\n".join(o or b"" for o in outputs).lower()
    return NETWORK_HINT if any(s in text for s in SIGNS) else None
