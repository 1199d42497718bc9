"""A sandbox's process table as its kernel tells it (what `ps` inside would show, read from the
host's /proc, so nothing the sandbox wrote can change it): each process's pid and parent's pid in
the sandbox's pid namespace, its uid in the sandbox's user namespace, state and command line."""

from __future__ import annotations

import os

__all__ = ["process_table"]

_STATES = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped", "t": "tracing-stop",
           "Z": "zombie", "X": "dead", "I": "idle", "P": "parked"}


def _inside_uid(pid: int, host_uid: int) -> int | None:
    """host_uid as the process's user namespace names it (its uid_map), None: unmapped there."""
    try:
        with open(f"/proc/{pid}/uid_map") as f:
            for line in f:
                inside, outside, count = (int(x) for x in line.split())
                if outside <= host_uid < outside + count:
                    return inside + host_uid - outside
    except (OSError, ValueError):
        pass
    return None


def _one(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return None                          # gone meanwhile
    ns_pids = status.get("NSpid", str(pid)).split()
    code = status.get("State", "?").split()[0] if status.get("State") else "?"
    return {"host_pid": pid, "pid": int(ns_pids[-1]), "host_ppid": int(status.get("PPid", "0")),
            "uid": _inside_uid(pid, int(status.get("Uid", "0").split()[0])), "state": _STATES.get(code, code),
            "name": status.get("Name", ""), "argv": argv}


def process_table(pids, pid_ns: str) -> list[dict]:
    """The processes among host `pids` that live in pid namespace `pid_ns` (a readlink of
    /proc/PID/ns/pid), by pid: pid, ppid (0: its parent is outside the sandbox), uid (None:
    unmapped), state, argv (empty for a kernel thread or a zombie: then name is what there is)."""
    found = []
    for pid in pids:
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != pid_ns:
                continue                     # an entering helper, still outside
        except OSError:
            continue
        p = _one(pid)
        if p is not None:
            found.append(p)
    inside = {p["host_pid"]: p["pid"] for p in found}
    return sorted(({"pid": p["pid"], "ppid": inside.get(p["host_ppid"], 0), "uid": p["uid"], "state": p["state"],
                    "name": p["name"], "argv": p["argv"]} for p in found), key=lambda p: p["pid"])
