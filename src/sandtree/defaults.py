"""Every default a caller can leave out, in one place (the operation table, the engine, the server's
request models, MCP and the CLI read them from here; none writes its own number), and the two
values that carry them across every surface: Limits (a run's resource limits) and RunRecord (what
a run produced: the engine's answer and the remote client's alike)."""

from __future__ import annotations

from dataclasses import dataclass

RUN_TIMEOUT = 300.0                  # seconds of wall clock per run / exec (Limits.timeout)
MCP_TIMEOUT = 30.0                   # an MCP tool call's run: the agent's turn waits on it, and MCP
                                     # clients give up on a call long before 300 s (the caller may pass more)
MCP_READ_LIMIT = 64000               # bytes one MCP read_file call returns unless it asks otherwise
MCP_GREP_MATCHES = 100               # matching lines one MCP grep call returns unless it asks otherwise
MCP_OPERATIONS_LIMIT = 20            # operations one MCP list_operations call returns unless it asks otherwise
MCP_FORK_PARALLEL = 4                # an MCP fork's branches at once unless it asks otherwise
MCP_WAIT = 60                        # seconds one MCP wait_operations call waits unless it asks otherwise
MCP_OUTPUT_CHARS = 8000              # characters of stdout and stderr an MCP run or exec answers unless told
MCP_FORK_OUTPUT_CHARS = 2000         # ... of each branch of an MCP fork (several answers in one turn)
MCP_IMAGES_LIMIT = 100               # images one MCP list_images call returns unless it asks otherwise
MCP_SANDBOX_READ_LIMIT = 100_000     # bytes one MCP sandbox_read_file call returns unless it asks otherwise
SANDBOX_IDLE_TIMEOUT = 600           # a live sandbox with no command for this long is stopped
SANDBOX_LIFETIME = 3600              # ... and stopped after this long in any case
LIVE_FORK_MAX = 16                   # children of one live fork (each a restore of one checkpoint)
LIVE_FORK_RESTORES = 2               # ... restored at once (each a CRIU or runsc restore: CPU-bound)
LIVE_STATE_KEEP_WAIT = 600.0         # seconds fork_from (and an engine closing) waits for a live state a live fork is still keeping
LIVE_STATE_RETENTION = 86400         # a live fork's or hibernation's checkpoint kept with its image (fork_from):
                                     # gc removes it after this long, or with its image (it holds memory)
PORT_URL_TTL = 3600.0                # seconds a signed URL of an exposed port works (sandbox_port_url)
SANDBOX_PORTS = 32                   # exposed ports one sandbox may have at once (each a listener of the
                                     # store's one egress daemon, shared by every tenant's runs)
TENANT_PORTS = 64                    # ... and one tenant, over all its sandboxes (its max_ports limit's default)
# Egress tapes (network/tape.py, engine/tapes.py): the request headers a replay compares besides method,
# URL and body (others, such as User-Agent or Date, vary between runs that mean the same request)
TAPE_MATCH_HEADERS = ("content-type", "authorization", "range")
TAPE_MAX_REQUEST_BODY = 64 << 20    # bytes of one taped request's body (held in memory to be matched)
TAPE_MAX_MISSES = 50                # distinct missed requests a replay reports
TAPE_SHOW_LIMIT = 1000              # exchanges tape_show lists by default
SANDBOX_IDLE_ACTION = "stop"         # or "hibernate"
CONTAINERS_ENGINE_START = 90.0       # seconds a containers=True sandbox's dockerd may take to answer (its
                                     # state restored from a commit first: a big one takes a while)
CONTAINERS_STATE_SAVE = 300.0        # seconds a commit of such a sandbox may take to save the engine's state
METRICS_INTERVAL = 5.0               # seconds between a server's samples of each live sandbox's CPU, memory, disk
METRICS_WINDOW = 3600.0              # ... kept this long (in the serving process's memory), E2B's get_metrics
E2B_READY_TIMEOUT = 60.0             # seconds an E2B template's ready command may take to succeed at create
INTERPRETER_START_WAIT = 30.0        # seconds a code context's kernel (python3 in the sandbox) has to start
INTERPRETER_INTERRUPT_GRACE = 2.0    # seconds interrupted code (a timeout, a cancel) has to stop before its
                                     # kernel is killed (the context then starts afresh)
SANDBOX_WATCHES = 16                 # directory watches one live sandbox may have at once (sandbox_watch)
WATCH_DIRS = 8192                    # directories one recursive watch marks (inotify watches are the host's)
WATCH_EVENTS = 10000                 # events a watch keeps until they are taken (older ones are dropped)
WATCH_IDLE = 600                     # a watch nobody asked for events this long is removed
WATCH_WAIT_MAX = 60                  # seconds one sandbox_watch_events call may wait for an event
VOLUME_QUOTA = 1 << 30               # bytes all of one tenant's volumes hold together (its max_volumes limit's default)
VOLUME_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"   # a volume's name (per tenant)
VOLUME_FORBIDDEN = ("/proc", "/dev", "/sys")          # paths a volume is never mounted on or under
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
CLI_AUDIT_LINES = 50                 # entries `sandtree audit` shows (a screenful; the row's AUDIT_LIMIT: an API page)
CLI_FORK_PARALLEL = 4                # branches `sandtree fork` runs at once (the row's None: all of them)
OUTPUT_HEAD = 4096                   # bytes of a run's stdout/stderr kept in its record (trace export reads them)
POOL_WAIT = 30.0                     # seconds `pool_wait` waits for a pool to fill
POOL_SIZE = 4                        # sandboxes a pool keeps started when the caller names no size (SDK, REST)
BUILD_SOURCE_DATE_EPOCH = 315532800  # a build's SOURCE_DATE_EPOCH unless its recipe sets one (1980-01-01 UTC:
                                     # the earliest time a zip member can carry; docs/builds.md, reproducible)
FORK_PARALLEL = 4                    # commands the SDK's img.fork / st.map run at once when no parallel is given
GREP_MAX_MATCHES = 1000              # matching lines `grep` returns at most
BOOTSTRAP_SPEC = "debian:bookworm"   # what the SDK's st.bootstrap() builds when no spec is given
SHUTDOWN_GRACE = 10.0                # seconds `serve` waits on requests in flight after SIGTERM; then they are
                                     # dropped and the engine's runs cancelled (their sandboxes killed)
DURATION_MAX = 30 * 86400            # seconds any timeout, lifetime or idle timeout may ask (finite: Infinity is refused)
# The most a run's or a sandbox's limits may ask, whatever the surface (the engine refuses more):
# what the kernel's interfaces take (pids.max stops at PID_MAX_LIMIT, a CFS quota at ~2^44 us, a
# size must fit a 64-bit page count), not policy: a tenant's limits are the policy
LIMITS_MAX = {"timeout": float(DURATION_MAX), "memory": 1 << 50, "pids": 1 << 22, "cpus": 4096.0,
              "disk": 1 << 50, "output": 1 << 40}
# `sandtree serve`'s connections (http/connlimits.py; `serve --header-timeout` etc. change them)
HEADER_BYTES = 64 << 10              # bytes of one request's line and headers (more: 431, closed)
HEADER_COUNT = 200                   # headers of one request
HEADER_TIMEOUT = 15.0                # seconds a request's line and headers may take to come (then 408, closed)
KEEP_ALIVE = 5.0                     # seconds an idle connection stays open between requests
CLIENT_CONNECTIONS = 256             # connections one client address may hold at once (0: no cap)
SERVER_CONNECTIONS = 4096            # connections at once in all (at most the server's open-file limit less a reserve)
WAIT_MAX = 3600.0                    # the longest one wait for an operation may block over HTTP
OPERATION_WAIT = 60.0                # ... and how long it blocks when the caller names no timeout (REST)
GREP_MAX_MATCHES = 1000              # lines one grep answers at most unless asked for more
MERGE_IGNORE = ("__pycache__/", "*.pyc", ".pytest_cache/")   # globs a merge never reports as conflicts
HOSTNAME = "sandtree"
TERMINAL_COLS, TERMINAL_ROWS = 80, 24     # a live sandbox's terminal (WebSocket) when the page names no size
TERMINAL_MAX_SIDE = 1000                  # columns or rows of a terminal at most (a sandbox process's pty)
PROCESS_TAG_MAX = 256                     # characters of a spawned process's tag (E2B's command tags)
E2B_KEEPALIVE = 50                        # seconds between keepalive events of an E2B process stream (unless asked)
# What a run's command and environment may hold, refused (invalid_input) before anything starts.
# Sizes are UTF-8 bytes. Within what execve(2) takes inside a sandbox (its stack rlimit is 8 MiB:
# argv + envp up to 2 MiB; one string up to MAX_ARG_STRLEN, 128 KiB with its NUL), with room for
# the runtime's own options and its "_ST_" prefix on each variable (runtime/validate.py).
COMMAND_MAX_BYTES = 256 << 10        # all arguments of the command (each counts its length + 1)
COMMAND_MAX_ARGS = 8192              # arguments of the command
ARG_MAX_BYTES = 127 << 10            # one argument (a `sh -c` script is one)
ENV_MAX_BYTES = 256 << 10            # all variables (each counts NAME=VALUE + 1)
ENV_MAX_VARS = 4096                  # variables
ENV_VAR_MAX_BYTES = 127 << 10        # one variable's NAME=VALUE
PATH_MAX_BYTES = 4095                # the working directory (the kernel's PATH_MAX, less its NUL)
RUNTIME_ROOM = 16 << 10              # bytes (and RUNTIME_ROOM // 256 arguments or variables) the engine adds
                                     # beyond the caller's (a live sandbox's shell session, an egress link's proxy
                                     # settings): checked with this room once added, the caller's without it
CWD = "/"
FILE_MODE = 0o644
# The inspect-ai sandbox "sandtree" (integrations/inspect_sandbox.py): a sample's sandbox lives the sample's length,
# and an agent's sandbox waits while its model thinks (the engine's 10 min idle stop would end long turns).
INSPECT_IMAGE = "debian:bookworm-python"   # the task image when its config names none (README's example tag)
INSPECT_SANDBOX_LIFETIME = 24 * 3600
INSPECT_SANDBOX_IDLE_TIMEOUT = 3600
# Harbor's environment (integrations/harbor.py): a trial's sandbox outlives no trial by much (Harbor's own
# timeouts end a trial first); an agent waiting on a model for an hour without a command is idle.
HARBOR_SANDBOX_LIFETIME = 24 * 3600
HARBOR_SANDBOX_IDLE_TIMEOUT = 3600
HARBOR_TAG = "harbor/{trial}"           # each trial's final image: {trial}, {task}, {session}
HARBOR_RECORD = "sandtree.json"         # in the trial's directory: the images of its environments


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
