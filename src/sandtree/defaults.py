"""Every default a caller can leave out, in one place (the operation table, the engine, the server's
request models, MCP and the CLI read them from here; none writes its own number), and the two
values that carry them across every surface: Limits (a run's resource limits) and RunRecord (what
a run produced: the engine's answer and the remote client's alike)."""

from __future__ import annotations

from dataclasses import dataclass

RUN_TIMEOUT = 300.0                  # seconds of wall clock per run / exec (Limits.timeout)
MCP_TIMEOUT = 30.0                   # an MCP tool call's run: the agent's turn waits on it, and MCP
                                     # clients give up on a call long before 300 s (the caller may pass more)
SANDBOX_IDLE_TIMEOUT = 600           # a live sandbox with no command for this long is stopped
SANDBOX_LIFETIME = 3600              # ... and stopped after this long in any case
PORT_URL_TTL = 3600.0                # seconds a signed URL of an exposed port works (sandbox_port_url)
SANDBOX_IDLE_ACTION = "stop"         # or "hibernate"
GC_RETENTION = 7 * 86400             # an untagged image stays collectable-free this long
EPHEMERAL_TTL = 3600                 # an ephemeral image (a disposable run's end state) nothing uses: gc drops it
GC_GRACE = 600                       # nothing younger than this is ever collected (runs in flight)
RUN_RETRIES_MAX = 10                  # retries= a run may ask for (on a lost cluster node)
LAYER_CACHE_MAX = 20 << 30             # bytes of layers a node caches from S3 objects before LRU eviction
DURABILITY = "strict"                 # or "relaxed": SQLite commits not synced (store/durable.py)
SYNC_TREE_FILES = 8                    # past this many files, a layer is synced by one syncfs, not an fsync each (store/durable.py)
LOG_LIMIT = 1000                     # entries of `log`
AUDIT_LIMIT = 100                    # entries of `audit`
OPERATIONS_LIMIT = 50                # entries of `operations.list`
LINEAGE_MAX_NODES = 2000             # nodes of one lineage tree answer
OUTPUT_HEAD = 4096                   # bytes of a run's stdout/stderr kept in its record (trace export reads them)
POOL_WAIT = 30.0                     # seconds `pool_wait` waits for a pool to fill
WAIT_MAX = 3600.0                    # the longest one wait for an operation may block over HTTP
MERGE_IGNORE = ("__pycache__/", "*.pyc", ".pytest_cache/")   # globs a merge never reports as conflicts
HOSTNAME = "sandtree"
CWD = "/"
FILE_MODE = 0o644
# The inspect-ai sandbox "sandtree" (integrations/inspect_sandbox.py): a sample's sandbox lives the sample's length,
# and an agent's sandbox waits while its model thinks (the engine's 10 min idle stop would end long turns).
INSPECT_IMAGE = "debian:bookworm-python"   # the task image when its config names none (README's example tag)
INSPECT_SANDBOX_LIFETIME = 24 * 3600
INSPECT_SANDBOX_IDLE_TIMEOUT = 3600


@dataclass(frozen=True)
class Limits:
    timeout: float = RUN_TIMEOUT   # seconds of wall clock
    memory: int = 2 << 30            # bytes: processes plus the run's pending writes (tmpfs)
    pids: int = 1024
    cpus: float | None = None        # CPU quota in cores; None: no quota (the timeout bounds it)
    disk: int = 1 << 30              # bytes the run may write (and disk/4096 inodes, at least 1024)
    output: int = 16 << 20           # bytes kept per stream (stdout, stderr); a stream passing it
                                     # stops the run (usage["killed_by"] = "output_limit")


@dataclass
class RunRecord:
    """What a run or an exec produced (the engine's answer and the remote client's alike; the
    public RunResult wraps it)."""
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
