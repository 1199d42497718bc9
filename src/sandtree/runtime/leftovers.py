"""Files the live tiers keep in the store directory for a sandbox's helper: deadlines/*.deadline
(the lifetime its helper re-reads, live.py) and agents/*.sock (where a gVisor sandbox's helper
lends pid 1's pipes, gvisor_live.py). A sandbox's engine removes them when it ends the sandbox; an
engine killed with -9 cannot, so `gc` sweeps those no live thing uses:

- a deadline file is in use while a process holds it open (the helper keeps an fd on it) or a
  sandbox row still names it (a hibernated sandbox's, reused at resume);
- an agent socket is in use while a socket is bound to it (/proc/net/unix lists it; the engine
  binds through /proc/self/fd/N/NAME, so the listed path ends with its name) or a row names it;
- nothing younger than the grace is touched (a sandbox being started has its file before its row
  and its helper).
"""

from __future__ import annotations

import os
import time

__all__ = ["named", "sweep"]

_DIRS = {"deadlines": ".deadline", "agents": ".sock"}


def named(handles) -> set[str]:
    """The paths sandbox rows' handles (LiveHandle.to_dict()) name."""
    return {p for h in handles if isinstance(h, dict) for p in (h.get("deadline_file"), h.get("agent")) if p}


def sweep(home: str, named: set[str], grace: float, now: float | None = None) -> int:
    """Removes the leftovers under `home`; `named`: the paths sandbox rows name. Returns how many."""
    now = time.time() if now is None else now
    stale = []
    for sub, suffix in _DIRS.items():
        d = os.path.join(home, sub)
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            continue
        for name in names:
            path = os.path.join(d, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if name.endswith(suffix) and path not in named and now - st.st_mtime >= grace:
                stale.append((sub, name, path))
    if not stale:
        return 0
    opened = _open_paths() if any(sub == "deadlines" for sub, _, _ in stale) else set()
    bound = _bound_names() if any(sub == "agents" for sub, _, _ in stale) else set()
    removed = 0
    for sub, name, path in stale:
        if (sub == "deadlines" and path in opened) or (sub == "agents" and name in bound):
            continue
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def _open_paths() -> set[str]:
    """Every path some process on this machine holds open (readlink of /proc/*/fd/*)."""
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:                      # gone, or not ours to read
            continue
        for fd in fds:
            try:
                out.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
    return out


def _bound_names() -> set[str]:
    """The last component of every bound unix socket's path (/proc/net/unix, this network
    namespace's: the engine's listening sockets are in the host's)."""
    out = set()
    with open("/proc/net/unix") as f:
        next(f, None)
        for line in f:
            parts = line.split()
            if len(parts) >= 8:
                out.add(parts[7].rsplit("/", 1)[-1])
    return out
