"""The runtime interface: what an isolation tier must do, and the values crossing it.

A tier takes a RunSpec (the image's layers, the command, inputs and limits) and returns a
RunOutcome whose `changes` is the directory of the run's writes in overlay form (upper dir:
whiteouts, opaque markers, host-shifted ids), open until the outcome is closed. Commit
(sandtree/commit.py) turns that directory into an image; callers never learn which tier ran.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..defaults import Limits  # noqa: F401 - the limits a RunSpec carries (defined with the defaults)


# Resource limits of every command a sandbox runs (a run, a live exec, its output drain), set by
# helper.c's become_command whatever the engine's own were (they were inherited: nofile
# 20000/20000, ...). (soft, hard); None: unlimited, as far as the engine's hard limit goes (an
# rlimit is only ever lowered). What a Limits field bounds (memory, pids, cpus, disk, timeout)
# has a cgroup, a tmpfs or a timer instead, so its rlimit is unlimited. Keep helper.c's
# command_rlimits the same (tests compare them with /proc/self/limits in a sandbox).
COMMAND_RLIMITS = {
    "nofile": (2048, 2048),          # one process's sockets, so its unaccounted TCP buffers (v1)
    "core": (0, 0),                  # no core dumps
    "memlock": (8 << 20, 8 << 20),   # the kernel's default
    "rtprio": (0, 0),                # no real-time scheduling
    "nice": (0, 0),                  # no priority above the default
    "stack": (8 << 20, None),
    "msgqueue": (819200, 819200),    # the kernel's default
    "sigpending": (4096, 4096),
    "locks": (None, None), "as": (None, None), "data": (None, None), "rss": (None, None),
    "fsize": (None, None), "cpu": (None, None), "nproc": (None, None),
}


@dataclass(frozen=True)
class InjectedFile:
    path: str
    content: bytes
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    source: str | None = None        # a host file (a stored upload) copied in instead of content

    @property
    def size(self) -> int:
        import os
        return os.stat(self.source).st_size if self.source is not None else len(self.content)


@dataclass
class RunSpec:
    argv: list[str]
    layers: list[str]                # layer ids, top first
    root_meta: tuple[int, int, int]  # mode, uid, gid of the image's root dir (sandbox ids)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/"
    stdin: bytes | None = None
    uid: int = 0
    gid: int = 0
    hostname: str = "sandtree"
    files: list[InjectedFile] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)
    on_output: Callable[[str, bytes], None] | None = None
    # Writes parent dirs of injected files (with the image's metadata) into the changes dir.
    prepare_changes: Callable[[str], None] | None = None
    cancel: "threading.Event | None" = None   # set it to kill the run (an operation's cancel)


@dataclass
class RunOutcome:
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
    changes: str | None = None       # upper dir path, valid until close()
    disk_limit: int | None = None    # the run's disk cap (commit refuses larger sparse files)
    _close: Callable[[], None] | None = None

    def close(self) -> None:
        if self._close:
            self._close()
            self._close = None
            self.changes = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Runtime(Protocol):
    name: str

    def available(self) -> tuple[bool, str]:
        """(can run here, why not)."""

    def run(self, spec: RunSpec) -> RunOutcome:
        """Run to completion (or timeout). Raises SandboxError when the sandbox cannot start and
        CommandNotFound when the command does not exist; a failing command is an outcome."""
