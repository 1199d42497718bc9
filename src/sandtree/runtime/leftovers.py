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

A sandbox whose engine was killed after its helper started and before its row was written runs
on with no row (nothing lists, reaches or stops it) until its lifetime. Its deadline file, named
after the engine that made it (procid owner prefix), tells it: held open by a helper of this
store, named by no row, its maker dead. `reap_unrecorded` (every engine's reap: a restarted
server's first) kills such a sandbox (its cgroups' processes) and removes its cgroups and file.
"""

from __future__ import annotations

import os
import signal
import time

from ..procid import dead_owner, start_time
from .cgroups import ROOT, PARENT, RunCgroup, detect

__all__ = ["named", "sweep", "unrecorded_candidates", "reap_unrecorded"]

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


def unrecorded_candidates(home: str) -> list[str]:
    """Deadline files made by engines that are verifiably dead (cheap: no /proc scan); those no
    row names are reap_unrecorded's."""
    d = os.path.join(home, "deadlines")
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    return [os.path.join(d, n) for n in names if n.endswith(".deadline") and dead_owner(n)]


def reap_unrecorded(home: str, candidates: list[str], named: set[str]) -> int:
    """Kills the sandboxes whose helpers hold one of `candidates` (less those `named` by a row):
    only a helper of this store (its executable in `home`/bin) is taken, with every process of
    its live cgroups, which are then removed; the files go too. Returns how many sandboxes."""
    paths = {p for p in candidates if p not in named}
    if not paths:
        return 0
    helpers = os.path.join(os.path.realpath(home), "bin") + "/"
    holders: dict[int, str] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if not os.readlink(f"/proc/{pid}/exe").startswith(helpers):
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in paths:
                        holders[int(pid)] = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    pass
        except OSError:                      # gone, or not ours to read
            continue
    version = detect()
    for pid in holders:
        start = start_time(pid)
        cg = _live_group(pid, version)
        if cg is not None:
            if _frozen(cg):
                try:
                    cg.freeze(False, timeout=1.0)       # frozen processes cannot even die
                except OSError:
                    pass
            cg.kill_all()
        try:
            fd = os.pidfd_open(pid)
            try:
                if start is not None and start_time(pid) == start:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            finally:
                os.close(fd)
        except OSError:
            pass
        if cg is not None:
            cg.remove(wait=2.0)
    for p in set(holders.values()):          # (one no helper held is gc's sweep's, after its grace)
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    return len(holders)


def _frozen(cg: RunCgroup) -> bool:
    try:
        return cg.is_frozen()
    except OSError:
        return False


def _live_group(pid: int, version: str | None) -> RunCgroup | None:
    """The live sandbox's cgroups (`sandtree/live-...`) process `pid` is in, as a RunCgroup."""
    if version is None:
        return None
    dirs = {}
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        parts = path.strip("/").split("/")
        if len(parts) != 2 or parts[0] != PARENT or not parts[1].startswith("live-"):
            continue
        if version == "v2" and controllers == "":
            dirs["unified"] = os.path.join(ROOT, path.strip("/"))
        elif version == "v1" and controllers:
            for c in controllers.split(","):
                d = os.path.join(ROOT, c, path.strip("/"))
                if os.path.isdir(d):
                    dirs[c] = d
                    break
    return RunCgroup(version, dirs) if dirs else None
