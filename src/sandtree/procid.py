"""Process identity: a pid names a process only together with its start time and pid namespace.

Whoever cleans up after a dead engine (its operation rows, its cgroups, its staging dirs) must
tell "its owner is gone" from "its pid now belongs to someone else" and from "its owner lives in
another pid namespace, where this pid means another process". A pid alone tells none of these:
pids are reused (pid_max is 32,768 here), and an engine in a pid namespace of its own shares the
cgroup filesystem and the store with engines outside it.

So an owner is (pid, start time, pid namespace), each as seen through this process's /proc:

- the pid and start time (clock ticks since boot, field 22 of /proc/PID/stat) are /proc/self's,
  not os.getpid()'s, so they hold even when /proc belongs to another pid namespace;
- the namespace is that of the /proc (its pid 1's), else our own.

`alive()` answers True (alive), False (verifiably dead: no such pid, or another start time, in
the same namespace) or None (cannot tell: another namespace). Callers remove only what is False.
Names written by older engines (a pid alone) are judged by the pid alone, as they were.

Written into names as `PID-START-NS-` (owner_prefix); into operation rows as owner_pid,
owner_start, owner_ns and owner_boot: the machine's boot id (/proc/sys/kernel/random/boot_id), since
engines on several machines may share one database (API replicas) and a pid namespace's inode is
not unique across machines (every host's first one is 4026531836). An owner of another boot (another
machine, or this one before a reboot) is None to alive(): its heartbeat decides (engine/runs/heartbeat.py).

The same holds for a pid read from a cgroup's member list: by the time it is signalled it may
have exited and been reused outside the group. `signal_member` pins it with a pidfd and
signals it only if it is still in the group.
"""

from __future__ import annotations

import os
import re
import select
import signal
from dataclasses import dataclass

_NS = re.compile(r"^pid:\[(\d+)\]$")


def start_time(pid: int | str) -> int | None:
    """Field 22 of /proc/PID/stat, or None if there is no such process (or it is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(b")") + 2:].split()
    if rest[0] == b"Z":
        return None
    return int(rest[19])


def _ns_inode(link: str) -> int | None:
    try:
        m = _NS.match(os.readlink(link))
    except OSError:
        return None
    return int(m.group(1)) if m else None


def proc_namespace() -> int:
    """The pid namespace the pids of /proc are numbered in (0 if it cannot be read)."""
    return _ns_inode("/proc/1/ns/pid") or _ns_inode("/proc/self/ns/pid") or 0


_BOOT: list[str] = []


def boot_id() -> str | None:
    """This machine's boot id (random per boot), None where it cannot be read."""
    if not _BOOT:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _BOOT.append(f.read().strip())
        except OSError:
            _BOOT.append("")
    return _BOOT[0] or None


@dataclass(frozen=True)
class Owner:
    pid: int
    start: int | None = None         # None: written by an older engine (a pid alone)
    ns: int | None = None
    boot: str | None = None          # None: written by an older engine (or a name: names are local)

    @classmethod
    def me(cls) -> "Owner":
        pid = int(os.readlink("/proc/self"))
        return cls(pid, start_time("self"), proc_namespace(), boot_id())

    def key(self) -> str:
        """Its heartbeat row's key (engine/runs/heartbeat.py)."""
        return f"{self.boot}-{self.pid}-{self.start}-{self.ns}"

    def prefix(self) -> str:
        return f"{self.pid}-{self.start}-{self.ns}-"

    def to_dict(self) -> dict:
        return {"owner_pid": self.pid, "owner_start": self.start, "owner_ns": self.ns, "owner_boot": self.boot}

    @classmethod
    def from_dict(cls, d: dict) -> "Owner | None":
        pid, start, ns, boot = d.get("owner_pid"), d.get("owner_start"), d.get("owner_ns"), d.get("owner_boot")
        if not _is_int(pid):
            return None
        return cls(pid, start if _is_int(start) else None, ns if _is_int(ns) else None,
                   boot if isinstance(boot, str) and boot else None)

    @classmethod
    def from_name(cls, name: str) -> "Owner | None":
        """The owner a name begins with: `PID-START-NS-...` or, from older engines, `PID-...`."""
        parts = name.split("-")
        if len(parts) >= 4 and all(p.isdigit() for p in parts[:3]):
            return cls(int(parts[0]), int(parts[1]), int(parts[2]))
        if len(parts) >= 2 and parts[0].isdigit():
            return cls(int(parts[0]))
        return None

    def alive(self) -> bool | None:
        """True: this very process runs; False: it verifiably does not; None: cannot tell here."""
        if self.boot is not None and self.boot != boot_id():
            return None                          # another machine's (or before a reboot)
        if self.start is None:                   # an older engine's record: the pid alone
            return os.path.exists(f"/proc/{self.pid}")
        if self.ns is not None and self.ns != proc_namespace():
            return None
        return start_time(self.pid) == self.start


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def owner_prefix() -> str:
    """`PID-START-NS-` of this process, to begin the names of what it owns."""
    return Owner.me().prefix()


def dead_owner(name: str) -> bool:
    """True only if `name` begins with an owner that is verifiably gone."""
    o = Owner.from_name(name)
    return o is not None and o.alive() is False


def signal_member(pid: int, group_dir: str, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to `pid` only while it is in the cgroup at `group_dir` (a pid read from
    cgroup.procs may have been reused since). True if sent."""
    fd = signal_member_pidfd(pid, group_dir, sig)
    if fd is None:
        return False
    os.close(fd)
    return True


def signal_member_pidfd(pid: int, group_dir: str, sig: int = signal.SIGKILL) -> int | None:
    """signal_member, returning the pidfd it was sent through (the caller closes it; it turns
    readable once the process has exited), or None if not sent."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    sent = False
    try:
        # the group as /proc/PID/cgroup names it: the path below the hierarchy's root (its
        # last two components suffice here: `sandtree/<name>`, our own parent's)
        tail = "/" + "/".join(os.path.normpath(group_dir).split("/")[-2:])
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                member = any(line.rstrip("\n").split(":", 2)[-1].endswith(tail) for line in f)
        except OSError:
            return None
        p = select.poll()
        p.register(fd, select.POLLIN)
        if not member or p.poll(0):               # exited (and maybe reused) while we read
            return None
        signal.pidfd_send_signal(fd, sig)
        sent = True
        return fd
    except ProcessLookupError:
        return None
    finally:
        if not sent:
            os.close(fd)
