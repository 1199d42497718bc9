"""The operation table's rows for live sandboxes and warm pools (see the package's docstring: what the table is).
Imports only defaults.py, options.py and rows.py, as the rest of the table."""

from __future__ import annotations

from .. import defaults as D
from .options import RunOptions
from .rows import Http, op
from .mcp import RUN_JSON, Mcp, Result       # MCP's tools, declared beside the rows (table/mcp.py)
from .rows import Off, via
from .cli import Cli
from .rows import Http, Off, op, via
from .sdk import Sdk

__all__: list[str] = []          # rows only: they register themselves in rows.OPS

_G, _P, _U, _X = "GET", "POST", "PUT", "DELETE"

# ---- live sandboxes ------------------------------------------------------------------------------
@via("cli", Cli("start", dest={"ref": "image", "idle_action": "on_idle", "volumes": "volume"}, choices={"idle_action": ("stop", "hibernate")}, show="sandbox_id"))
@op("run", images=("ref",), audit="sandbox start", http=Http(_P, "/sandboxes", name="start_sandbox", status=201, handler="start_sandbox", body=("ref",) + RunOptions.names() + ("idle_timeout", "lifetime", "idle_action", "volumes", "containers"), rename={"ref": "image"}, model="StartIn", types={**Http.RUN_TYPES, "idle_action": 'Literal["stop", "hibernate"]', "volumes": "dict[str, str] | list[dict] | None"}, defaults=Http.RUN_DEFAULTS, describe={**Http.RUN_DESCRIBE, "labels": "names and values kept with the sandbox (list filters by them)", "tier": "isolation tier (default: the server's; a token may force one)", "timeout": "default seconds per command", "idle_timeout": "seconds without a command before it is stopped", "lifetime": "seconds until it is stopped in any case", "idle_action": "what the idle timeout does: stop it, or hibernate it (resume brings it back)", "volumes": "volumes mounted at start: {name: path} (path:ro read-only) or [{name, path, readonly}]", "containers": "run Docker's engine from the image inside (gvisor tier only)"}), custom_remote=True,
    options=RunOptions.parameters())
@via("mcp", Mcp(rename={"ref": "image"}, params=("ref", "timeout", "memory", "env", "cwd", "idle_timeout", "lifetime",
                                               "idle_action", "labels", "network", "secrets", "volumes", "containers",
                                               "record", "replay"),
                defaults={"timeout": D.MCP_TIMEOUT}, types={"timeout": "float", "memory": "str | None", **RUN_JSON,
                                                           "volumes": "dict[str, str] | list[dict] | None"},
                doc="""Start a live sandbox on an image; it keeps processes and files between sandbox_exec calls.
        Stopped after idle_timeout seconds without a command, or when this MCP session ends.
        timeout: default seconds per command""", core=("image", "network", "idle_timeout")))
def sandbox_start(ref: str, *, idle_timeout: float = D.SANDBOX_IDLE_TIMEOUT, lifetime: float = D.SANDBOX_LIFETIME,
                  idle_action: str = D.SANDBOX_IDLE_ACTION, volumes: dict | list | None = None,
                  containers: bool = False) -> dict:
    """Start a live sandbox on an image: commands run in it one after another, sharing its state.
    timeout: default seconds per command
    volumes: named volumes to mount: {name: path} (path:ro for read-only) or [{name, path, readonly}]
    containers: run Docker's engine (dockerd from the image) inside; implies the gvisor tier"""

@via("cli", Cli("exec", handler="sandboxes.cmd_exec"))
@op("run", audit="exec", http=Http(_P, "/sandboxes/{sid}/exec", name="exec_sandbox", handler="exec_sandbox", body=("command", "env", "cwd", "stdin", "uid", "gid", "timeout", "output"), model="ExecIn", types={"env": "dict[str, str]"}, defaults={"env": {}}, describe={"command": "a string runs in the sandbox's shell session (cd and export carry over); a list is a fresh process"}), custom_remote=True)
@via("mcp", Mcp(handler="sandbox_exec", rename={"sid": "sandbox_id"}, extra=("shell", "truncate_output_at"),
                core=("sandbox_id", "command", "shell", "timeout")))
def sandbox_exec(sid: str, command, *, env: dict | None = None, cwd: str | None = None,
                 stdin: bytes | str | None = None, uid: int | None = None, gid: int | None = None, on_output=None,
                 cancel=None, timeout: float | None = None, output=None):
    """Run a command in a live sandbox (its state carries over to the next).
    cwd: the working directory (default: where the last command left it)
    timeout: seconds for this command (default: the sandbox's)
    output: bytes kept per stream for this command (default: the sandbox's)"""

@via("cli", Cli("shell", handler="sandboxes.cmd_shell"))
@op("run", audit="exec", local="pipes or a terminal to a process need the engine in-process; over HTTP use exec")
@via("mcp", Off("pipes or a terminal to a process need the engine in-process: sandbox_spawn and sandbox_process"))
def sandbox_popen(sid: str, argv, *, env: dict | None = None, cwd: str | None = None, uid: int | None = None,
                  gid: int | None = None, pty: bool = False, stdin=-1, stdout=-1, stderr=-1):
    """Start a process in a live sandbox with pipes (or a terminal) to it, like subprocess.Popen (-1: PIPE)."""

_PROC = "/sandboxes/{sid}/processes"    # sid: a live sandbox, or a live run (its operation ID: Contree's instance)
@via("cli", Cli("spawn", handler="processes.cmd_spawn"))
@op("run", audit="sandbox spawn", http=Http(_P, _PROC, body=("command", "env", "cwd", "uid", "gid", "stdin",
                                                           "stdin_open", "output", "user", "tag", "pty", "cols", "rows"), result="pid", name="spawn_process", status=201, model="ProcessIn", model_doc="A process started in a live sandbox without waiting (table.sandbox_spawn).", describe={"command": "a string runs in /bin/sh -c, a list is argv", "stdin_open": "keep its stdin open for writes (POST .../stdin)", "pty": "a terminal is its stdin, stdout and stderr (resize: POST .../resize)"}, bounds={"uid": {"ge": 0, "lt": 65536}, "gid": {"ge": 0, "lt": 65536}, "cols": {"ge": 1, "le": D.TERMINAL_MAX_SIDE}, "rows": {"ge": 1, "le": D.TERMINAL_MAX_SIDE}}))
@via("mcp", Mcp(handler="sandbox_spawn", rename={"sid": "sandbox_id"}, extra=("shell",)))
def sandbox_spawn(sid: str, command, *, env: dict | None = None, cwd: str | None = None, uid: int | None = None,
                  gid: int | None = None, stdin: bytes | str | None = None, stdin_open: bool = False,
                  output=None, user: str | None = None, tag: str | None = None, pty: bool = False,
                  cols: int = D.TERMINAL_COLS, rows: int = D.TERMINAL_ROWS) -> int:
    """Start a process in a live sandbox without waiting for it; its number (a live run's command is 1).
    sid: a live sandbox's ID, or a running live run's operation ID
    stdin_open: keep its stdin open for sandbox_stdin (else it is closed after `stdin`)
    output: bytes of its output kept per stream (default: the server's)
    user: run as this user of the image's /etc/passwd (NAME or NAME:GROUP), instead of uid and gid
    tag: a name to find it by among the sandbox's processes (unique among the running ones)
    pty: a terminal is its stdin, stdout and stderr (its output is one stream, stdout)
    cols: the terminal's columns (pty)
    rows: the terminal's rows (pty)"""

@via("cli", Off("a terminal's size is its window's: `sandtree shell` resizes its own"))
@op("run", audit="sandbox resize", http=Http(_P, _PROC + "/{pid}/resize", body=("cols", "rows"), name="resize_process", status=204, model="ResizeIn", bounds={"cols": {"ge": 1, "le": D.TERMINAL_MAX_SIDE}, "rows": {"ge": 1, "le": D.TERMINAL_MAX_SIDE}}))
@via("mcp", Off("an agent's processes have no terminal window to resize"))
def sandbox_resize(sid: str, pid: int, cols: int, rows: int) -> None:
    """Resize the terminal of a process spawned with pty (it gets SIGWINCH).
    cols: the terminal's columns
    rows: the terminal's rows"""

@via("cli", Cli("procs", handler="processes.cmd_procs"))
@op("list", http=Http(_G, _PROC, name="list_processes"))
@via("mcp", Mcp(rename={"sid": "sandbox_id"}, doc="The processes sandbox_spawn started in a live sandbox: pid, tag, command, running or how each ended."))
def sandbox_processes(sid: str) -> list[dict]:
    """The processes spawned in a live sandbox (sandbox_spawn), oldest first: pid, tag, command, cwd, env, state."""

@via("cli", Off("`sandtree proc --wait` prints a process's output; following it needs the engine in-process"))
@op("list", local="it calls back with each chunk of output: the engine in-process (over HTTP: GET the process)")
@via("mcp", Off("an MCP call answers once: sandbox_process tells the output so far"))
def sandbox_follow(sid: str, pid: int, on_output, *, replay: bool = False, cancel=None) -> dict:
    """Call on_output(stream, chunk) with what a spawned process writes until it exits (or `cancel`, an
    Event, is set); its state then. stream: stdout, stderr, or pty (a terminal's).
    replay: what it wrote so far first (kept up to its output cap)"""

@via("cli", Cli("top", show="top"))
@op("list", http=Http(_G, "/sandboxes/{sid}/ps", name="sandbox_ps"))
@via("mcp", Mcp(rename={"sid": "sandbox_id"}, doc="Every process running in a live sandbox, as its kernel tells: pid, ppid, user, state, command line."))
def sandbox_ps(sid: str) -> list[dict]:
    """Every process of a live sandbox as the kernel tells it (not only spawned ones): pid and ppid inside
    the sandbox, uid, user, state, command line (argv)."""

@via("cli", Cli("proc", handler="processes.cmd_proc"))
@via("sdk", Sdk("proc.write(data) streams: it leaves stdin open (proc.close_stdin() or close=True ends it)",
                defaults={"close": False}))
@op("run", audit="sandbox stdin", http=Http(_P, _PROC + "/{pid}/stdin", query=("close",), content="data", name="process_stdin", status=204, doc="The request body is written to the process's stdin; close=false keeps it open."))
@via("mcp", Mcp(name="sandbox_process", handler="sandbox_process", rename={"sid": "sandbox_id", "data": "stdin", "close": "close_stdin"},
                types={"data": "str | None"}, defaults={"data": None, "close": False}))
def sandbox_stdin(sid: str, pid: int, data: bytes | str = b"", *, close: bool = True) -> None:
    """Write to a spawned process's open stdin, then close it (close=False: keep it open)."""

@via("cli", Cli("proc", handler="processes.cmd_proc"))
@via("sdk", Sdk("proc.signal() asks it to end (TERM); proc.kill() sends KILL", defaults={"signal": "TERM"}))
@op("run", audit="sandbox signal", http=Http(_P, _PROC + "/{pid}/signal", body=("signal",), name="process_signal", status=204, model="SignalIn", optional_body=True, types={"signal": "str | int"}))
@via("mcp", Mcp(name="sandbox_process", handler="sandbox_process", rename={"sid": "sandbox_id"},
                types={"signal": "str | None"}, defaults={"signal": None}))
def sandbox_signal(sid: str, pid: int, signal: str = "KILL") -> None:
    """Signal a spawned process's group (signal: a number or a name, TERM or SIGTERM)."""

@via("cli", Cli("proc", handler="processes.cmd_proc"))
@op("list", http=Http(_G, _PROC + "/{pid}", name="get_process"))
@via("mcp", Mcp(handler="sandbox_process", rename={"sid": "sandbox_id"}, extra=("truncate_output_at",)))
def sandbox_process(sid: str, pid: int) -> dict:
    """A spawned process: running, exit code, signal, its output so far (text and base64)."""

@via("cli", Cli("commit", dest={"sid": "sandbox"}, show="committed"))
@op("run", audit="sandbox commit", http=Http(_P, "/sandboxes/{sid}/commit", body=("tag",), result="image", name="commit_sandbox", status=201, model="CommitIn", optional_body=True))
@via("mcp", Mcp(rename={"sid": "sandbox_id"}, result=Result(key="image", echo=("tag",)),
                doc="An image of the live sandbox's filesystem now (it keeps running): run, fork or merge it."))
def sandbox_commit(sid: str, *, tag: str | None = None) -> str:
    """An image of a live sandbox's filesystem as it is now."""

@via("cli", Cli("stop", args=("sid+",), dest={"sid": "sandboxes"}, show="states"))
@op("run", audit="sandbox stop", http=Http(_P, "/sandboxes/{sid}/stop", name="stop_sandbox"))
@via("mcp", Mcp(rename={"sid": "sandbox_id"}, doc="Stop a live sandbox: its processes end and its unsaved files go "
                                     "(sandbox_commit first to keep them).", core=True))
def sandbox_stop(sid: str) -> dict:
    """Stop a live sandbox (its state is gone unless committed)."""

@via("cli", Cli("hibernate", args=("sid+",), dest={"sid": "sandboxes"}, show="hibernated"))
@op("run", audit="sandbox hibernate", http=Http(_P, "/sandboxes/{sid}/hibernate", name="hibernate_sandbox"))
@via("mcp", Mcp(rename={"sid": "sandbox_id"}, doc="""Hibernate a live sandbox: its files are committed and its processes saved with their
        memory, then CPU and memory are freed. sandbox_resume brings it back exactly where it was."""))
def sandbox_hibernate(sid: str) -> dict:
    """Write a live sandbox's processes and files to disk and free its memory (CRIU)."""

@via("cli", Cli("resume", args=("sid+",), dest={"sid": "sandboxes"}, show="states"))
@op("run", audit="sandbox resume", http=Http(_P, "/sandboxes/{sid}/resume", name="resume_sandbox"))
@via("mcp", Mcp(rename={"sid": "sandbox_id"}, doc="Resume a hibernated live sandbox: the same processes continue with the same "
                                     "memory and files."))
def sandbox_resume(sid: str) -> dict:
    """Bring a hibernated sandbox back where it was."""

@via("cli", Cli("sandbox fork", short={"n": "-n"}, show="states"))
@op("run", audit="sandbox fork", http=Http(_P, "/sandboxes/{sid}/fork", name="fork_sandbox", status=201, body=("n", "idle_timeout", "lifetime", "idle_action", "labels", "memory", "cpus", "pids", "timeout"), model="ForkSandboxIn", types={"idle_action": 'Literal["stop", "hibernate"] | None', "labels": "dict[str, str] | None", "memory": "int | str | None", "cpus": "float | None", "pids": "int | None", "timeout": "float | None", "idle_timeout": "float | None", "lifetime": "float | None"}, bounds={"n": {"ge": 1, "le": D.LIVE_FORK_MAX}}, describe={"n": "how many children", "idle_timeout": "each child's (default: the source's)", "lifetime": "each child's seconds to live (default: what the source has left)", "idle_action": "each child's (default: the source's)", "labels": "each child's labels (default: the source's)"}))
@via("mcp", Mcp(rename={"sid": "sandbox_id"}, params=("sid", "n", "idle_timeout", "lifetime"),
                doc="""Fork a running live sandbox: n new live sandboxes continue from its processes, memory, open
        files and shell session as they are now (tree-of-thought from mid-session), while it runs on. Each child
        is a sandbox of its own: sandbox_exec, sandbox_commit, sandbox_stop it like any. Returns the children."""))
def sandbox_fork(sid: str, n: int = 1, *, idle_timeout: float | None = None, lifetime: float | None = None,
                 idle_action: str | None = None, labels: dict | None = None, memory: int | str | None = None,
                 cpus: float | None = None,
                 pids: int | None = None, timeout: float | None = None) -> list[dict]:
    """N live sandboxes that continue from a running one's processes, memory and files (it runs on).
    n: how many children (each restored from one checkpoint of the source, taken in one short stall)
    idle_timeout, lifetime, idle_action, labels: each child's (default: the source's; lifetime: what it has left)
    memory, cpus, pids, timeout: each child's limits (default: the source's)"""

@via("cli", Cli("sandbox fork-from", short={"n": "-n"}, show="states"))
@op("run", images=("ref",), audit="fork from", http=Http(_P, "/images/{ref:path}/fork", name="fork_from", status=201, body=("n", "idle_timeout", "lifetime", "idle_action", "labels", "memory", "cpus", "pids", "timeout"), model="ForkFromIn", types={"idle_action": 'Literal["stop", "hibernate"] | None', "labels": "dict[str, str] | None", "memory": "int | str | None", "cpus": "float | None", "pids": "int | None", "timeout": "float | None", "idle_timeout": "float | None", "lifetime": "float | None"}, bounds={"n": {"ge": 1, "le": D.LIVE_FORK_MAX}}, describe={"n": "how many sandboxes", "idle_timeout": "each one's (default: the source's)", "lifetime": "each one's seconds to live (default: the source's)", "idle_action": "each one's (default: the source's)", "labels": "each one's labels (default: the source's)"}))
@via("mcp", Mcp(rename={"ref": "image"}, params=("ref", "n", "idle_timeout", "lifetime"),
                doc="""Start live sandboxes from an image's live state: the image a sandbox_fork or a hibernation
        committed keeps its processes' checkpoint, so n new live sandboxes go on from that moment (memory,
        processes, shell session), as often as wanted: explore the tree of live states like the tree of images.
        image_info and lineage_tree say which images have one ("live": true). Returns the sandboxes."""))
def fork_from(ref: str, n: int = 1, *, idle_timeout: float | None = None, lifetime: float | None = None,
              idle_action: str | None = None, labels: dict | None = None, memory: int | str | None = None,
              cpus: float | None = None, pids: int | None = None, timeout: float | None = None) -> list[dict]:
    """N live sandboxes that go on from an image's live state: the processes, memory and files of the
    sandbox whose live fork or hibernation committed it (image_info's "live": true), at that moment.
    n: how many sandboxes (each restored from the kept checkpoint)
    idle_timeout, lifetime, idle_action, labels: each one's (default: the source sandbox's)
    memory, cpus, pids, timeout: each one's limits (default: the source sandbox's)"""

@via("cli", Cli("sandbox info"))
@op("list", http=Http(_G, "/sandboxes/{sid}", name="get_sandbox"))
@via("mcp", Off("sandbox_list shows each sandbox's state"))
def sandbox_info(sid: str) -> dict:
    """A live sandbox's state, image, limits and times."""

@via("cli", Cli("ps", dest={"labels": "label"}, show="ps"))
@op("list", http=Http(_G, "/sandboxes", query=("all", "labels"), rename={"labels": "label"}, name="list_sandboxes", describe={"labels": "NAME=VALUE: only sandboxes with this label (repeatable)"}))
@via("mcp", Mcp(types={"labels": "dict[str, str] | None"},
                doc="Running live sandboxes (all=true: also stopped and expired ones)."))
def sandbox_list(*, all: bool = False, labels: dict | None = None) -> list[dict]:
    """Live sandboxes (all: stopped ones too; labels: only those with every one of these)."""

@via("cli", Cli("sandbox cat", show="bytes"))
@op("list", http=Http(_G, "/sandboxes/{sid}/file", query=("path",), raw=True, name="read_sandbox_file"))
@via("mcp", Mcp(name="sandbox_read_file", handler="sandbox_read_file", rename={"sid": "sandbox_id"}, extra=("offset", "limit")))
def sandbox_read(sid: str, path: str) -> bytes:
    """A file's bytes, read from a live sandbox."""

@via("cli", Cli("sandbox write"))
@op("run", audit="sandbox write", http=Http(_U, "/sandboxes/{sid}/file", query=("path", "mode", "uid", "gid"), content="data", name="write_sandbox_file", handler="write_sandbox_file"))
@via("mcp", Mcp(name="sandbox_write_file", handler="sandbox_write_file", rename={"sid": "sandbox_id", "data": "content"},
                types={"data": "str"}))
def sandbox_write(sid: str, path: str, data: bytes, *, mode: int = D.FILE_MODE, uid: int = 0, gid: int = 0) -> None:
    """Write a file into a live sandbox (missing parent directories are made)."""

@via("cli", Cli("sandbox timeout"))
@op("run", audit="sandbox set timeout", http=Http(_P, "/sandboxes/{sid}/timeout", body=("timeout",), name="set_sandbox_timeout", model="TimeoutIn", doc="The sandbox now stops `timeout` seconds from now (E2B's set_timeout)."))
@via("mcp", Off("a sandbox's idle_timeout and lifetime are set by sandbox_start"))
def sandbox_set_timeout(sid: str, timeout: float) -> dict:
    """The live sandbox now stops `timeout` seconds from now (sooner or later than it would have).
    timeout: seconds from now until the sandbox is stopped"""

@via("cli", Cli("sandbox metrics"))
@op("list", http=Http(_G, "/sandboxes/{sid}/metrics", query=("start", "end"), name="sandbox_metrics"))
@via("mcp", Mcp(rename={"sid": "sandbox_id"}, types={"start": "float | None", "end": "float | None"},
                doc="A live sandbox's CPU, memory and disk use over time (samples, oldest first)."))
def sandbox_metrics(sid: str, *, start: float | None = None, end: float | None = None) -> list[dict]:
    """A live sandbox's resource use over time: samples (timestamp, cpu_count, cpu_used_pct, mem_used,
    mem_total, mem_cache, disk_used, disk_total; bytes), oldest first, one of now while it runs.
    A server samples each every few seconds and keeps an hour (E2B's get_metrics).
    start: epoch seconds: samples from then (default: all kept)
    end: epoch seconds: samples until then (default: now)"""

@via("cli", Cli("network", handler="sandboxes.cmd_set_network"))
@op("run", audit="sandbox set network", http=Http(_P, "/sandboxes/{sid}/network", body=("network",), name="set_sandbox_network", model="NetworkSetIn", doc="Replace the live sandbox's network policy (connections it now forbids are cut); one started without network is given it, and off takes it away again."))
@via("mcp", Mcp(rename={"sid": "sandbox_id"}, types={"network": RUN_JSON["network"]}, defaults={"network": None},
                doc="""Replace a live sandbox's network policy; connections the new policy forbids are cut. A
        sandbox started without network is given it (off: no egress at all again; gVisor's cannot)."""))
def sandbox_set_network(sid: str, network) -> dict:
    """Replace a live sandbox's network policy: connections the new one forbids are cut. A sandbox
    started without network is given it (its own namespace gets a link to the egress path), and
    network off takes it away again (no egress at all); gVisor's tier cannot (RuntimeUnavailable)."""

@via("cli", Cli("sandbox ls", args=("sid", "path?")))
@op("list", http=Http(_G, "/sandboxes/{sid}/ls", query=("path", "depth"), name="list_sandbox_dir", bounds={"depth": {"ge": 1, "le": 256}}))
@via("mcp", Off("sandbox_exec runs ls, test -e, rm and mkdir -p in the sandbox"))
def sandbox_ls(sid: str, path: str = "/", *, depth: int = 1) -> list[dict]:
    """A directory of a live sandbox: name, path, kind, size, mode, permissions, uid, gid, owner, group, mtime, target of each entry.
    depth: also list subdirectories this deep (1: the directory alone; links are not followed)"""

@via("cli", Cli("sandbox exists"))
@op("list", http=Http(_G, "/sandboxes/{sid}/exists", query=("path",), result="exists", name="sandbox_path_exists", echo={"path": "path"}))
@via("mcp", Off("sandbox_exec runs ls, test -e, rm and mkdir -p in the sandbox"))
def sandbox_exists(sid: str, path: str) -> bool:
    """Whether a path exists in a live sandbox."""

@via("cli", Cli("sandbox rm"))
@op("run", audit="sandbox remove", http=Http(_X, "/sandboxes/{sid}/file", query=("path", "recursive"), name="remove_sandbox_file", status=204, doc="Remove a file, a link or an empty directory.", describe={"recursive": "remove a directory with what is in it (never crossing into a mount)"}))
@via("mcp", Off("sandbox_exec runs ls, test -e, rm and mkdir -p in the sandbox"))
def sandbox_remove(sid: str, path: str, *, recursive: bool = False) -> None:
    """Remove a file, a link or an empty directory of a live sandbox (recursive: a directory and everything in it).
    recursive: remove a directory with what is in it (never crossing into a mount)"""

@via("cli", Cli("sandbox mkdir"))
@op("run", audit="sandbox mkdir", http=Http(_P, "/sandboxes/{sid}/mkdir", query=("path", "mode", "uid", "gid"), name="make_sandbox_dir", echo={"path": "path"}, doc="Make a directory and any missing parents (mkdir -p).", bounds={"mode": {"ge": 0, "le": 0o7777}, "uid": {"ge": 0, "lt": 65536}, "gid": {"ge": 0, "lt": 65536}}))
@via("mcp", Off("sandbox_exec runs ls, test -e, rm and mkdir -p in the sandbox"))
def sandbox_mkdir(sid: str, path: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
    """Make a directory of a live sandbox and any missing parents (mkdir -p)."""

@via("cli", Cli("sandbox stat"))
@op("list", http=Http(_G, "/sandboxes/{sid}/stat", query=("path",), name="stat_sandbox_path"))
@via("mcp", Off("sandbox_exec runs stat, mv and inotifywait in the sandbox"))
def sandbox_stat(sid: str, path: str) -> dict:
    """A path of a live sandbox as the kernel says (a link is not followed).
    Its name, kind, path, size, mode, permissions, uid, gid, owner, group, mtime and a link's target."""

@via("cli", Cli("sandbox mv"))
@op("run", audit="sandbox rename", http=Http(_P, "/sandboxes/{sid}/rename", body=("source", "destination", "replace"), name="rename_sandbox_path", model="RenameIn", doc="Move a file or a directory within the sandbox (409 when the destination exists, unless replace)."))
@via("mcp", Off("sandbox_exec runs stat, mv and inotifywait in the sandbox"))
def sandbox_rename(sid: str, source: str, destination: str, *, replace: bool = False) -> dict:
    """Move a file, a link or a whole directory of a live sandbox to another path of it; the moved entry (as sandbox_stat).
    replace: replace an existing destination (else it is refused)"""

_WATCH = "/sandboxes/{sid}/watches"
@via("cli", Cli("sandbox watch", handler="sandboxes.cmd_watch"))
@op("list", http=Http(_P, _WATCH, body=("path", "recursive"), name="watch_sandbox_dir", status=201, model="WatchIn", doc="Watch a directory: take its events with GET .../watches/{watch}/events (?stream=true: as they come)."))
@via("mcp", Off("a watch is a stream for programs (REST, SDK, CLI); sandbox_exec runs find -newer or inotifywait"))
def sandbox_watch(sid: str, path: str, *, recursive: bool = False) -> dict:
    """Watch a directory of a live sandbox (recursive: and every directory below it) for inotify events; its watch id.
    recursive: also the directories below it, those made later included"""

@via("cli", Cli("sandbox watch", handler="sandboxes.cmd_watch"))
@op("list", http=Http(_G, _WATCH + "/{watch}/events", query=("timeout",), name="sandbox_watch_events", handler="sandbox_watch_events", bounds={"timeout": {"ge": 0, "le": D.WATCH_WAIT_MAX}}))
@via("mcp", Off("a watch is a stream for programs (REST, SDK, CLI); sandbox_exec runs find -newer or inotifywait"))
def sandbox_watch_events(sid: str, watch: str, *, timeout: float = 0.0) -> dict:
    """A watch's events since the last call, waiting up to `timeout` seconds for one: {events: [{name, type, time}], dropped}.
    type: create, write, remove, rename or chmod; name: the path below the watched directory.
    timeout: seconds to wait for the first event"""

@via("cli", Cli("sandbox watch", handler="sandboxes.cmd_watch"))
@op("list", http=Http(_X, _WATCH + "/{watch}", name="unwatch_sandbox_dir", status=204))
@via("mcp", Off("a watch is a stream for programs (REST, SDK, CLI); sandbox_exec runs find -newer or inotifywait"))
def sandbox_unwatch(sid: str, watch: str) -> None:
    """Stop a watch of a live sandbox."""

@via("cli", Cli("port", handler="sandboxes.cmd_port"))
@op("run", audit="sandbox expose", http=Http(_P, "/sandboxes/{sid}/ports/{port}", name="expose_port", status=201, doc="Make a port of the sandbox reachable: its loopback URL on the host and its path here."))
@via("mcp", Mcp(name="sandbox_port", handler="sandbox_port", rename={"sid": "sandbox_id"}))
def sandbox_expose(sid: str, port: int) -> dict:
    """Make a live sandbox's port reachable: {port, url (on the host's loopback), path (under the server)}."""

@via("cli", Cli("port", handler="sandboxes.cmd_port"))
@op("run", audit="sandbox unexpose", http=Http(_X, "/sandboxes/{sid}/ports/{port}", name="unexpose_port", status=204))
@via("mcp", Mcp(name="sandbox_port", handler="sandbox_port", rename={"sid": "sandbox_id"}, extra=("close",)))
def sandbox_unexpose(sid: str, port: int) -> None:
    """Make an exposed port of a live sandbox unreachable again."""

@via("cli", Cli("port", handler="sandboxes.cmd_port"))
@op("run", http=Http(_G, "/sandboxes/{sid}/ports", name="list_ports"))
@via("mcp", Off("sandbox_port answers a port's URLs when it exposes it"))
def sandbox_ports(sid: str) -> list[dict]:
    """A live sandbox's exposed ports: {port, url, path} each (url None while it is not running)."""

@via("cli", Cli("port", handler="sandboxes.cmd_port"))
@op("run", http=Http(_P, "/sandboxes/{sid}/port-url/{port}", query=("ttl",), result="url", name="port_url", handler="port_url"))
@via("mcp", Mcp(name="sandbox_port", handler="sandbox_port", rename={"sid": "sandbox_id", "ttl": "url_ttl"},
                types={"ttl": "float | None"}, defaults={"ttl": None}))
def sandbox_port_url(sid: str, port: int, *, ttl: float = D.PORT_URL_TTL) -> str:
    """A signed URL of an exposed port under the server, usable without a token for `ttl` seconds."""

# ---- the code interpreter: code run in contexts whose state persists (engine/sandboxes/interpreter.py) ----------
_CODE = "/sandboxes/{sid}/code"
@via("cli", Cli("sandbox code", omit=("on_output", "cancel"), show="code"))
@op("run", audit="sandbox run code", http=Http(_P, _CODE, body=("code", "context", "language", "env", "timeout"), drop=("on_output", "cancel"), name="run_code", model="RunCodeIn", types={"env": "dict[str, str]"}, defaults={"env": {}}, describe={"code": "Python source; the value of its last expression is its main result", "context": "a code context's ID (default: the language's default context of the sandbox)", "timeout": "seconds; past them the code is interrupted (its context's state is kept)"}))
@via("mcp", Mcp(rename={"sid": "sandbox_id"}, params=("sid", "code", "context", "language", "env", "timeout"),
                types={"env": "dict[str, str] | None", "timeout": "float | None"},
                doc="""Run Python code in a live sandbox's interpreter, as in a notebook cell: variables, imports and
        functions persist between calls (per context). Answers the stdout and stderr it wrote, its results (the
        last expression's value as text, html, png (base64), json ...; matplotlib figures as PNG) and its error
        (name, value, traceback). timeout: seconds, then the code is interrupted."""))
def sandbox_run_code(sid: str, code: str, *, context: str | None = None, language: str | None = None,
                     env: dict | None = None, timeout: float | None = None, on_output=None, cancel=None) -> dict:
    """Run code in a live sandbox's code interpreter (state persists per context, as a notebook's):
    {results, logs: {stdout, stderr}, error: {name, value, traceback}, execution_count, context, timed_out}.
    code: Python source, as a notebook cell: the value of its last expression is its main result
    context: a code context's ID (default: the language's default context of the sandbox)
    language: python (default); a context has its own
    env: environment variables for this execution only
    timeout: seconds; past them the code is interrupted (KeyboardInterrupt) and the context kept
    on_output: called with each message as the code writes it ({type: stdout|stderr|result|error, ...})
    cancel: a threading.Event; set, the code is interrupted"""

@via("cli", Cli("sandbox context create"))
@op("run", audit="sandbox code context", http=Http(_P, _CODE + "/contexts", body=("language", "cwd"), name="create_code_context", status=201, model="CodeContextIn", optional_body=True))
@via("mcp", Off("sandbox_run_code's default context keeps state between calls"))
def sandbox_code_context_create(sid: str, *, language: str | None = None, cwd: str | None = None) -> dict:
    """A new code context of a live sandbox (its own state): {id, language, cwd}.
    language: python (default)
    cwd: its working directory (default: the sandbox's)"""

@via("cli", Cli("sandbox context ls"))
@op("list", http=Http(_G, _CODE + "/contexts", name="list_code_contexts"))
@via("mcp", Off("sandbox_run_code's default context keeps state between calls"))
def sandbox_code_contexts(sid: str) -> list[dict]:
    """The code contexts of a live sandbox: {id, language, cwd} each."""

@via("cli", Cli("sandbox context restart"))
@op("run", audit="sandbox code context restart", http=Http(_P, _CODE + "/contexts/{context}/restart", name="restart_code_context"))
@via("mcp", Off("sandbox_run_code's default context keeps state between calls"))
def sandbox_code_context_restart(sid: str, context: str) -> dict:
    """Drop a code context's state (a fresh interpreter, the same ID, language and cwd)."""

@via("cli", Cli("sandbox context rm"))
@op("run", audit="sandbox code context remove", http=Http(_X, _CODE + "/contexts/{context}", name="remove_code_context", status=204))
@via("mcp", Off("sandbox_run_code's default context keeps state between calls"))
def sandbox_code_context_remove(sid: str, context: str) -> None:
    """Remove a code context of a live sandbox (its interpreter ends)."""

# ---- warm pools -----------------------------------------------------------------------------------
_POOL = ("size",) + RunOptions.LIMITS
@via("cli", Off("a warm pool lives in a serving process: `sandtree serve --pool IMAGE=SIZE` (a one-shot command keeps none)"))
@via("sdk", Sdk("st.pool(image) keeps a few started", defaults={"size": D.POOL_SIZE}))
@op(None, admin=True, images=("ref",), http=Http(_U, "/pools/{ref:path}", body=_POOL, name="put_pool", names={"ref": "image"}, model="PoolIn", defaults={"size": D.POOL_SIZE}, describe={"tier": "its sandboxes' isolation tier (default: the server's); only runs on that tier take them"}),
    options=RunOptions.parameters(*RunOptions.LIMITS))
@via("mcp", Off("warm pools are the operator's: a run uses one when its image and limits match"))
def pool_create(ref: str, size: int) -> dict:
    """Keep `size` sandboxes of an image started; runs on it with these limits (and tier) use them."""

@via("cli", Off("a warm pool lives in a serving process: `sandtree serve --pool IMAGE=SIZE` (a one-shot command keeps none)"))
@via("sdk", Off("st.pool(image, wait=True)"))
@op(None, admin=True, images=("ref",), http=Http(_U, "/pools/{ref:path}", body=_POOL + ("wait_timeout",), const={"wait": True}, names={"ref": "image"}, defaults={"size": D.POOL_SIZE}, describe={"wait": "answer once the pool is full", "wait_timeout": "with wait: seconds to wait for the pool to fill"}),
    options=RunOptions.parameters(*RunOptions.LIMITS))
@via("mcp", Off("warm pools are the operator's: a run uses one when its image and limits match"))
def pool_and_wait(ref: str, size: int, *, wait_timeout: float = D.POOL_WAIT) -> dict:
    """pool_create, then wait until the pool is full (at most wait_timeout seconds); its stats.
    wait_timeout: seconds to wait for the pool to fill"""

@via("cli", Off("a warm pool lives in a serving process: `sandtree serve --pool IMAGE=SIZE` (a one-shot command keeps none)"))
@op("list", http=Http(_G, "/pools", name="list_pools"))
@via("mcp", Off("warm pools are the operator's: a run uses one when its image and limits match"))
def pool_list() -> list[dict]:
    """The warm pools and how full they are."""

@via("cli", Off("a warm pool lives in a serving process: `sandtree serve --pool IMAGE=SIZE` (a one-shot command keeps none)"))
@via("sdk", Off("st.pool(image, wait=True) waits as it makes the pool"))
@op(None, admin=True, images=("ref",), http=Http(_P, "/pools/{ref:path}/wait", query=("timeout",), result="ready", name="wait_pool", names={"ref": "image"}, bounds={"timeout": {"ge": 0, "le": 600}}))
@via("mcp", Off("warm pools are the operator's: a run uses one when its image and limits match"))
def pool_wait(ref: str, timeout: float = D.POOL_WAIT) -> bool:
    """Wait until a pool is full; whether it filled in time."""

@via("cli", Off("a warm pool lives in a serving process: `sandtree serve --pool IMAGE=SIZE` (a one-shot command keeps none)"))
@via("sdk", Off("st.pool(image, 0) empties a pool; st.engine.pool_remove forgets it"))
@op(None, admin=True, images=("ref",), http=Http(_X, "/pools/{ref:path}", name="delete_pool", names={"ref": "image"}, status=204))
@via("mcp", Off("warm pools are the operator's: a run uses one when its image and limits match"))
def pool_remove(ref: str) -> None:
    """Stop a pool's sandboxes and forget it."""

@via("cli", Off("a warm pool lives in a serving process: `sandtree serve --pool IMAGE=SIZE` (a one-shot command keeps none)"))
@via("sdk", Off("st.pool(recipe): a recipe given to st.pool is built and pooled"))
@op(None, admin=True, audit="build", local="a recipe's context is a directory of this machine (a server: serve --pool DOCKERFILE --watch)",
    options=RunOptions.parameters(*RunOptions.LIMITS, exclude=("tier",)))
@via("mcp", Off("warm pools are the operator's: a run uses one when its image and limits match"))
def pool_recipe(recipe, size: int = 4, *, tag: str | None = None, wait: bool = False, wait_timeout: float = D.POOL_WAIT,
                build_network=None, progress=None) -> dict:
    """Build a Recipe (cache hits when unchanged) and keep a pool of its result under `tag`; a new ID rolls the pool over.
    tag: the pool's tag (default pool/<hash of the recipe's steps>); it moves once the new pool is full
    build_network: the policy of RUN steps that name none; network: the pooled sandboxes' policy"""
