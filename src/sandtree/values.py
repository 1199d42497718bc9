"""Plain values more than one layer shares: the default environment of a command, and sizes as
people write them (the engine's limits, a tenant's limits, the server's upload cap)."""

from __future__ import annotations

from .errors import InvalidInput

DEFAULT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm"}

UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
         "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


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


