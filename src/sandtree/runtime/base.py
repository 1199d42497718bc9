"""The runtime interface: what an isolation tier must do, and the values crossing it.

Runtime is what every tier implements (available, validate_spec, run, close, live); LiveTier
what a tier's live sandboxes implement (Runtime.live() returns it, or raises RuntimeUnavailable
for a tier without them). Both are abstract base classes: a tier missing a method fails at
construction. tests/conformance/test_runtime_interface.py runs one suite against every tier.

A tier takes a RunSpec (the image's layers, the command, inputs and limits) and returns a
RunOutcome whose `changes` is the directory of the run's writes in overlay form (upper dir:
whiteouts, opaque markers, host-shifted ids), open until the outcome is closed. Commit
(engine/runs/commit.py) turns that directory into an image; callers never learn which tier ran.
"""

from __future__ import annotations

import abc
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..defaults import Limits  # noqa: F401 - the limits a RunSpec carries (defined with the defaults)


# Resource limits of every command a sandbox runs (a run, a live exec, its output drain), set by
# helper/command.c's become_command whatever the engine's own were (they were inherited: nofile
# 20000/20000, ...). (soft, hard); None: unlimited, as far as the engine's hard limit goes (an
# rlimit is only ever lowered). What a Limits field bounds (memory, pids, cpus, disk, timeout)
# has a cgroup, a tmpfs or a timer instead, so its rlimit is unlimited. Keep helper/command.c's
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
    # A network namespace to join instead of a new, empty one (an egress link, network/links.py):
    # the caller's fd, which it closes after the run started. Cold start only (a pooled warm helper
    # made its namespace already; a linked one joined its link when it started: `prestarted`).
    netns_fd: int | None = None
    # Files the runtime shows the sandbox read-only and never commits (a link's resolv.conf, its CA
    # bundle): "/etc/resolv.conf" is bound over the image's when that is a regular file; any other
    # path is "/dev/sandtree/<name>" (RUNTIME_DIR, a tmpfs of the runtime's own).
    runtime_files: dict[str, bytes] = field(default_factory=dict)
    # A helper started ahead in a link's namespace (Runtime.take_linked), whose policy the caller
    # set: the run takes it instead of netns_fd/runtime_files (the runtime owns it from here).
    prestarted: object = None
    # Volumes of a live sandbox (engine/volumes.py) for a tier that binds them as it starts (gVisor: its
    # OCI spec's mounts): (host directory, path inside, read-only) each. The namespaces tier's are bound
    # into the running sandbox's mount namespace by the engine before its start returns.
    volumes: list = field(default_factory=list)
    # A container engine runs inside (gVisor only: engine/sandboxes/containers.py): the sandbox's root
    # gets every capability *of gVisor's kernel* (mounts, namespaces, cgroups, raw sockets there are
    # the Sentry's, not the host's) and runsc allows raw sockets in its netstack (--net-raw).
    containers: bool = False


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
    # a live sandbox's command: nothing of the sandbox's but its pid 1 runs any more (gVisor's
    # agent says so), so nothing inside can write to its upper: a pool commits it still running
    quiescent: bool = False
    _close: Callable[[], None] | None = None

    def closing(self, release: Callable[[], None]) -> "RunOutcome":
        """Have close() call `release` (what frees `changes`: the scratch fd, a pooled sandbox)."""
        self._close = release
        return self

    def close(self) -> None:
        if self._close:
            self._close()
            self._close = None
            self.changes = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Runtime(abc.ABC):
    """An isolation tier. Every method is abstract: a tier that lacks one cannot be constructed
    (TypeError), nor can one without a name. The engine holds tiers only through this interface."""

    name: str = ""                   # the tier's name in RunSpec records and the `tier` option

    def __new__(cls, *args, **kwargs):
        if not cls.name:
            raise TypeError(f"{cls.__name__} is a runtime tier without a name")
        return super().__new__(cls)

    @abc.abstractmethod
    def available(self) -> tuple[bool, str]:
        """(can run here, why not)."""

    @abc.abstractmethod
    def validate_spec(self, spec: RunSpec) -> None:
        """Raise InvalidInput (TooLarge for files past the disk) for a spec this tier would refuse,
        before anything starts; the engine asks before it records a run."""

    @abc.abstractmethod
    def run(self, spec: RunSpec) -> RunOutcome:
        """Run to completion (or timeout). Raises SandboxError when the sandbox cannot start and
        CommandNotFound when the command does not exist; a failing command is an outcome."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop what the tier keeps between runs (started helpers, reaper threads). Idempotent;
        runs already returned stay valid until their outcomes are closed."""

    @abc.abstractmethod
    def take_linked(self, provide, retire, fits=None, layers=()) -> object | None:
        """A helper started ahead inside a network link with nothing allowed yet (for
        RunSpec.prestarted: the caller sets the link's policy, then runs), or None (none ready, or
        a tier that keeps none: the caller attaches a link for a cold start). provide() -> (key,
        netns_fd, runtime_files, scope) makes a link (scope: whose runs it served, None: a fresh
        one), retire(key) gives one back; the first call starts the tier's pool of them. fits(scope)
        says which helpers the caller may take (None: any); one taken sees every layer of `layers`
        (the run's: see WarmPool.take). The helper's `key` names its link."""

    @abc.abstractmethod
    def live(self) -> "LiveTier":
        """The tier's live sandboxes, or RuntimeUnavailable (with the reason) for a tier that has
        none. Whether this host can start them is the LiveTier's available()."""


class LiveTier(abc.ABC):
    """Live sandboxes of a tier: started once, entered by any number of commands, frozen,
    committed, hibernated, stopped. A handle (the tier's own type, stored by the engine as its
    to_dict()) names one across engine processes; handle() turns the stored form back."""

    @abc.abstractmethod
    def available(self) -> tuple[bool, str]:
        """(can start live sandboxes here, why not)."""

    @abc.abstractmethod
    def handle(self, stored: dict):
        """The handle whose to_dict() was `stored`."""

    @abc.abstractmethod
    def start(self, spec: RunSpec, lifetime: float, *, detach: bool = True, restore: str | None = None):
        """Start a sandbox on spec's image, limits, env and files; return its handle. detach: it
        outlives this process. restore: a checkpoint dir (see hibernate) to bring back instead."""

    @abc.abstractmethod
    def stop(self, h, wait: float = 5.0, *, idle: bool = False) -> None:
        """Kill every process of the sandbox and free what it holds. idle: their end (freeing
        their memory, done by the dying processes themselves) yields the CPU to everyone else."""

    @abc.abstractmethod
    def retime(self, h, deadline: float) -> None:
        """The sandbox now lives until `deadline` (epoch seconds), earlier or later than before."""

    @abc.abstractmethod
    def alive(self, h) -> bool:
        """Still running, and still the sandbox the handle named (not a reused pid)."""

    @abc.abstractmethod
    def foreign(self, h) -> bool:
        """Started where this engine cannot judge it (another pid namespace): neither entered
        nor declared gone."""

    @abc.abstractmethod
    def exec(self, h, spec: RunSpec, ahead=None) -> RunOutcome:
        """Run spec.argv inside the sandbox to its exit (output, status, timeout, cancel)."""

    @abc.abstractmethod
    def popen(self, h, spec: RunSpec, *, stdin=None, stdout=None, stderr=None, pty: bool = False,
              ahead=None):
        """Start spec.argv inside the sandbox and return (process, report fd, report so far)."""

    @abc.abstractmethod
    def returncode(self, report: bytes, fallback: int | None) -> int | None:
        """Popen's returncode of a command popen started, from what it reported: 127 (126) if it
        could not be executed, -N for signal N, else its exit status (fallback: none reported)."""

    @abc.abstractmethod
    def enter_ahead(self, h, relay: tuple[int, int] | None = None):
        """A process that has joined the sandbox and waits for its command (a faster exec).
        relay (uid, gid): the command's output relay started ahead too, for those ids (a sandbox
        never hibernated: a warm pool's)."""

    @abc.abstractmethod
    def signal_command(self, proc, sig: int) -> None:
        """Signal a command started by popen (its whole process group)."""

    def hold_program(self, h) -> tuple[str | None, str | None, bool]:
        """The program that holds a spawned command's stdio inside the sandbox (hold.c, a mode
        of sandtree-agent): (its path inside, when the sandbox has it), else (None, the host file
        to copy in); (None, None): not on this tier. The third: the holder is started by exec
        (pid 1's descendant), not by popen (hold.c: gVisor)."""
        return None, None, False

    @abc.abstractmethod
    def scratch(self, h) -> int:
        """An fd of the sandbox's scratch dir (its changes so far are `u` in it); caller closes."""

    @abc.abstractmethod
    def root(self, h) -> int:
        """An O_PATH fd of the sandbox's root as its processes see it; caller closes."""

    @abc.abstractmethod
    def own_mounts(self, h) -> set[int]:
        """Mount ids of the sandbox's own filesystems (for confined file access: openat2.py)."""

    @abc.abstractmethod
    def freeze(self, h, frozen: bool = True, *, checkpoint: bool = False) -> bool:
        """Freeze (thaw) every process of the sandbox; False if it cannot be frozen. checkpoint:
        frozen for a dump that follows (a tier whose checkpointer needs the sandbox to answer
        stops it its own way: gVisor)."""

    @abc.abstractmethod
    def frozen(self, h) -> bool:
        """Whether the sandbox is frozen now."""

    @abc.abstractmethod
    def memory(self, h) -> int | None:
        """Bytes of memory the sandbox uses now (None: not measured)."""

    @abc.abstractmethod
    def stats(self, h) -> dict | None:
        """The sandbox's resource counters as a run reports them (oom_killed, memory_peak,
        cpu_usage_ns); None: not measured (no cgroups)."""

    def usage(self, h) -> dict | None:
        """Counters a metrics sample reads now: cpu_ns, memory, cache, disk_used, disk_total
        (None: not measured here)."""
        return None

    @abc.abstractmethod
    def processes(self, h) -> list[dict]:
        """The sandbox's processes as its kernel tells them (pstable.process_table's shape)."""

    @abc.abstractmethod
    def lingering(self, h) -> bool:
        """Whether processes besides the sandbox's own pid 1 run in it (a command left one)."""

    def adopt_available(self) -> tuple[bool, str]:
        """(a running sandbox started without network can be given a link, why not): the one an
        exposed port needs (the egress daemon's `adopt` of its network namespace), which a policy
        given later (set_network) routes to the egress path."""
        return True, ""

    @abc.abstractmethod
    def hibernate_available(self, link: bool = False) -> tuple[bool, str]:
        """(can checkpoint sandboxes here, why not); link: one in a network link (a policy's)."""

    @abc.abstractmethod
    def outsiders(self, h) -> list[int]:
        """Processes of the sandbox a checkpoint cannot hold (busy execs): none, to hibernate."""

    def end_spawners(self, h) -> int:
        """End the sandbox's command spawners (hold.c --spawn), any engine process's, before a
        checkpoint, which cannot hold the engine's socket each holds; how many. None here."""
        return 0

    @abc.abstractmethod
    def dump_finished(self, h, images: str) -> bool:
        """Whether `images` holds a whole checkpoint of the sandbox (one whose dumper died after
        writing it is hibernated, not lost)."""

    @abc.abstractmethod
    def dump(self, h, images: str, ghost_limit: int, link: bool = False, leave_running: bool = False,
             meanwhile: Callable[[], Any] | None = None) -> Any:
        """Checkpoint the sandbox's processes into `images` (frozen and committed by the caller
        first; on failure it runs on). CRIU's ends them; a tier whose checkpoint leaves them
        (gVisor's, paused) leaves their stop to the caller (alive(h) says which).
        leave_running (a live fork): every tier leaves them, still frozen: the caller thaws them.
        meanwhile: the caller's commit of the frozen sandbox, called while the checkpoint is taken
        where that cannot change what it reads, else first; its result is returned (its error
        raised once the checkpoint has ended)."""
