"""The plain values every engine part and adapter shares: the record of a run, the default
environment of a command, sizes as people write them. Imports nothing but the error table, so
a client that only reads records need not load the engine's machinery."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidInput

DEFAULT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm"}

UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
         "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40}



@dataclass
class RunRecord:
    """What a run produced; the public RunResult wraps it."""
    op: str
    source: str
    image: str | None
    exit_code: int | None
    signal: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    oom_killed: bool
    usage: dict
    cancelled: bool = False


def parse_size(v) -> int:
    if isinstance(v, bool):
        raise InvalidInput(f"bad size {v!r}")
    if isinstance(v, (int, float)):
        n = int(v)
    else:
        s = str(v).strip().lower()
        num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = s[len(num):].strip()
        try:
            n = int(float(num) * UNITS[unit])
        except (ValueError, KeyError):
            raise InvalidInput(f"bad size {v!r} (use e.g. 512M, 2G)") from None
    if n <= 0:
        raise InvalidInput(f"size must be positive, not {v!r}")
    return n


