"""A live sandbox's processes, found again from any engine process: the handle that names them
(pids with their start times, the cgroup, the pid namespace they are numbered in) and opening
their /proc files without ever mistaking a later process that got the same pid.
"""

from __future__ import annotations

import os
import select
import signal
from dataclasses import asdict, dataclass, field, replace

from ..errors import NotFound
from .cgroups import RunCgroup
from ..procid import start_time


@dataclass
class LiveHandle:
    helper_pid: int
    helper_start: int            # start times (clock ticks since boot): a pid is ours only if
    init_pid: int                # its start time still matches
    init_start: int
    cgroup: dict | None          # {"version": ..., "dirs": {...}}
    # the pid namespace these pids are numbered in (procid.proc_namespace; None: an older row,
    # taken as ours). An engine in another pid namespace cannot judge them: see foreign().
    ns: int | None = None
    deadline_file: str | None = None     # what its helper reads when its lifetime is up (retime)
    tier: str = "namespaces"             # whose LiveTier runs it (runtime/livetiers.py)
    agent: str | None = None             # gvisor: the socket its helper lends pid 1's pipes on
    proc: object = field(default=None, repr=False, compare=False)   # not detached: our child

    def to_dict(self) -> dict:
        # (the process object itself is never copied: a pool's sandbox has one, with locks)
        return {k: v for k, v in asdict(replace(self, proc=None)).items() if k != "proc"}

    @classmethod
    def from_dict(cls, d: dict) -> "LiveHandle":
        return cls(**d)

    def cg(self) -> RunCgroup | None:
        return RunCgroup(self.cgroup["version"], dict(self.cgroup["dirs"])) if self.cgroup else None


def open_of(pid: int, start: int, name: str, flags: int) -> int:
    """open(/proc/PID/NAME) of the process (pid, start time), never of a later one with its pid:
    a pidfd checked against the start time pins the process; if it has not exited once the open
    is done, the pid named it all along (a pid is reused only after its process is gone)."""
    try:
        pfd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        raise NotFound("the live sandbox is no longer running") from None
    try:
        if start_time(pid) != start:
            raise NotFound("the live sandbox is no longer running")
        try:
            fd = os.open(f"/proc/{pid}/{name}", flags | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound("the live sandbox is no longer running") from None
        if exited(pfd):
            os.close(fd)
            raise NotFound("the live sandbox is no longer running")
        return fd
    finally:
        os.close(pfd)


def exited(pidfd: int) -> bool:
    """A pidfd polls readable once its process has exited (poll: fds above 1024 are fine)."""
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    return bool(p.poll(0))


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return int(data[data.rindex(b")") + 2:].split()[1])


def kill_pid(pid: int, start: int | None, sig: int = signal.SIGKILL) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return
    try:
        if start is None or start_time(pid) == start:
            signal.pidfd_send_signal(fd, sig)
    finally:
        os.close(fd)
