"""The public API's objects: Image, RunResult, Sandbox, Branch, MergeResult and best_of. Each holds
its Sandtree (client/sdk.py) and reaches the engine through it; none imports the Sandtree class."""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field

from ..errors import InvalidInput
from ..render import render_svg, render_text
from ..defaults import RunRecord
from .derive import method, row_property, rows_of
from .inputs import files_arg, streams

_P = inspect.Parameter

# The SDK's own parameters of the methods that run a command: one callback per stream (E2B's, Modal's habit).
_STREAMS = (_P("on_stdout", _P.KEYWORD_ONLY, default=None, annotation="Callable[[bytes], None] | None"),
           _P("on_stderr", _P.KEYWORD_ONLY, default=None, annotation="Callable[[bytes], None] | None"))


def run_inputs(obj, args: dict, extra: dict) -> None:
    """files= and the output callbacks as users write them (client/inputs.py), as the engine takes them."""
    if "files" in args:
        args["files"] = files_arg(args["files"])
    out = args.pop("on_stdout", None), args.pop("on_stderr", None)        # (in **options: Branch.run)
    on_stdout, on_stderr = extra.get("on_stdout", out[0]), extra.get("on_stderr", out[1])
    if on_stdout is not None or on_stderr is not None:
        args["on_output"] = streams(args.get("on_output"), on_stdout, on_stderr)


def _to_file(obj, target, args: dict, extra: dict):
    """An export written to a file object, or to a path (opened, written, closed)."""
    if isinstance(args["fileobj"], str):
        with open(args["fileobj"], "wb") as f:
            return target(**{**args, "fileobj": f})
    return target(**args)


def _render(tree: dict, format: str):
    if format == "json":
        return tree
    if format == "text":
        return render_text(tree)
    if format == "svg":
        return render_svg(tree)
    raise InvalidInput(f"unknown lineage format {format!r} (json, text, svg)")


def as_run_result(obj, rec, given) -> "RunResult":
    return RunResult.from_record(obj._st, rec)


def as_run_results(obj, recs, given) -> list["RunResult"]:
    return [RunResult.from_record(getattr(obj, "_st", obj), r) for r in recs]


def as_image(obj, image_id, given) -> "Image":
    return Image(getattr(obj, "_st", obj), image_id)


def as_sandbox(obj, info, given) -> "Sandbox":
    return Sandbox(getattr(obj, "_st", obj), info)


def as_dicts(obj, values, given) -> list[dict]:
    return [v.to_dict() if hasattr(v, "to_dict") else v for v in values]


def as_dict(obj, value, given) -> dict:
    return value.to_dict() if hasattr(value, "to_dict") else value


def _by_distance(image, dist: dict) -> list["Image"]:
    """Images nearest first, the image itself left out."""
    return [Image(image._st, i) for i in sorted(dist, key=lambda i: dist[i]) if i != image.id]


def as_none(obj, value, given) -> None:
    return None


def _keep_info(sandbox, info: dict) -> dict:
    sandbox._info = info
    return info


def _encode_data(obj, args: dict, extra: dict) -> None:
    if isinstance(args.get("data"), str):
        args["data"] = args["data"].encode()


def _signal_name(obj, args: dict, extra: dict) -> None:
    args["signal"] = str(args["signal"])

__all__ = ["Image", "RunResult", "Sandbox", "SandboxProcess", "MergeResult", "Branch", "best_of",
           # the SDK's shapes of a row's arguments and results, for the methods made in client/sdk.py too
           "run_inputs", "as_run_result", "as_run_results", "as_image", "as_sandbox", "as_dict", "as_dicts", "as_none"]


@rows_of
class Image:
    """An immutable filesystem state. Running a command on it yields a new Image."""

    def __init__(self, st: Sandtree, image_id: str):
        self._st = st
        self.id = image_id

    def __repr__(self) -> str:
        return f"<Image {self.id[:12]}>"

    def __eq__(self, other) -> bool:
        return isinstance(other, Image) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def short_id(self) -> str:
        return self.id[:12]

    tags = row_property("tags", bind={"image": "id"}, wrap=lambda self, r, _: sorted(r))

    run = method("run", bind={"ref": "id"}, extras=_STREAMS, adapt=run_inputs, wrap=as_run_result, note=(
        "A string runs in /bin/sh -c, a list is argv. Unless disposable, what it wrote becomes the new image "
        "`result.image`. network: off (default), \"all\", rules [\"pypi.org\", \"*.pythonhosted.org:443\"], "
        "{\"allow_out\": [...], \"deny_out\": [...]} or \"inherit\"; secrets: {\"NAME\": {\"value\": ..., \"hosts\": "
        "[...]}}, or stored ones by name (st.set_secret): [\"NAME\"] (the sandbox sees a placeholder in $NAME, "
        "requests to those hosts carry the value). files: also {\"/dest\": bytes | str | Path}. "
        "on_stdout/on_stderr(bytes): one stream each."))

    start = method("sandbox_start", bind={"ref": "id"}, adapt=run_inputs, wrap=as_sandbox, note=(
        "Commands enter it with exec/popen/spawn, it keeps its processes and files between them, and commit() "
        "snapshots it while it runs. idle_action \"hibernate\" hibernates it when idle (resume() brings it back)."))

    config = method("image_config", bind={"ref": "id"})
    configure = method("configure", bind={"ref": "id"}, wrap=as_image)
    info = method("image_info", bind={"image": "id"})
    ls = method("ls", bind={"image": "id"}, wrap=as_dicts)
    stat = method("stat", bind={"image": "id"}, wrap=as_dict)
    read = method("read", bind={"image": "id"})

    def read_text(self, path: str) -> str:
        return self.read(path).decode("utf-8", "replace")

    grep = method("grep", bind={"image": "id"})
    export = method("export_tar", bind={"image": "id"}, rename={"fileobj": "fileobj_or_path"}, call=_to_file,
                    note="fileobj_or_path: a file object, or the path of a file to write")
    export_oci = method("export_oci", bind={"image": "id"}, rename={"fileobj": "fileobj_or_path"}, call=_to_file,
                        note="fileobj_or_path: a file object, or the path of a file to write")
    push = method("push", bind={"image": "id"})
    parents = method("parents", bind={"image": "id"}, wrap=lambda self, r, _: _unique(
        Image(self._st, e["parent"]) for e in r))
    children = method("children", bind={"image": "id"}, wrap=lambda self, r, _: _unique(
        Image(self._st, e["child"]) for e in r))
    log = method("log", bind={"image": "id"})
    tag = method("tag", bind={"image": "id"}, wrap=lambda self, r, _: self)
    annotate = method("annotate", bind={"image": "id"})

    def annotations(self) -> dict:
        """The image's annotations: {"score": float | None, "meta": {...}}."""
        return self.info()["annotations"]

    diff = method("diff", bind={"a": "id"}, rename={"b": "other"}, wrap=as_dicts)
    patch = method("patch", bind={"a": "id"}, rename={"b": "other"})
    fork = method("fork", bind={"ref": "id"}, kwargs="run_options", adapt=run_inputs, wrap=as_run_results,
                  note="The options are Image.run's, less the per-run callbacks; results in the commands' order.")
    fork_live = method("fork_from", bind={"ref": "id"}, wrap=lambda self, infos, _: [Sandbox(self._st, i) for i in infos],
                       note="Live sandboxes going on from this image's live state (info()['live']): the "
                            "processes and memory its live fork or hibernation saved.")
    ancestors = method("ancestors", bind={"image": "id"}, wrap=lambda self, r, _: _by_distance(self, r))
    descendants = method("descendants", bind={"image": "id"}, wrap=lambda self, r, _: _by_distance(self, r))
    produced_by = method("produced_by", bind={"image": "id"})
    lineage = method("lineage_tree", bind={"root": "id"}, extras=(_P("format", _P.POSITIONAL_OR_KEYWORD, default="json"),),
                     call=lambda self, target, args, extra: _render(target(**args), extra["format"]),
                     note="format: the tree as a dict (\"json\"), text (\"text\") or SVG (\"svg\")")


@dataclass
class RunResult:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    image: Image | None
    source: Image
    signal: int | None = None
    timed_out: bool = False
    oom_killed: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    usage: dict = field(default_factory=dict)
    operation: str = ""

    @classmethod
    def from_record(cls, st: Sandtree, rec: RunRecord) -> "RunResult":
        return cls(rec.exit_code, rec.stdout, rec.stderr, Image(st, rec.image) if rec.image else None,
                   Image(st, rec.source), rec.signal, rec.timed_out, rec.oom_killed, rec.stdout_truncated,
                   rec.stderr_truncated, rec.usage, rec.op)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    def to_dict(self) -> dict:
        return {"image": self.image.id if self.image else None, "source": self.source.id,
                "exit_code": self.exit_code, "signal": self.signal,
                "stdout": self.stdout.decode("utf-8", "replace"), "stderr": self.stderr.decode("utf-8", "replace"),
                "stdout_truncated": self.stdout_truncated, "stderr_truncated": self.stderr_truncated,
                "timed_out": self.timed_out, "oom_killed": self.oom_killed, "usage": self.usage,
                "operation": self.operation}


@rows_of
class Sandbox:
    """A live sandbox. exec(str) runs in its shell session (cwd and exported variables carry
    over); exec(list) runs a fresh process. Use as a context manager to stop it at the end."""

    def __init__(self, st: Sandtree, info: dict):
        self._st = st
        self.id: str = info["id"]
        self._info = info

    def __repr__(self) -> str:
        return f"<Sandbox {self.id[:12]} of {self._info['image'][:12]}>"

    @property
    def image(self) -> Image:
        """The image it was started from."""
        return Image(self._st, self._info["image"])

    info = method("sandbox_info", bind={"sid": "id"}, wrap=lambda self, r, _: _keep_info(self, r),
                  note="state: running, stopped, expired, gone (or hibernated).")

    @property
    def state(self) -> str:
        return self.info()["state"]

    exec = method("sandbox_exec", bind={"sid": "id"}, extras=_STREAMS, adapt=run_inputs, wrap=as_run_result,
                  note="A string runs in its shell session (cwd and exported variables carry over), a list is a "
                       "fresh process; background processes it starts keep running. result.image is None: "
                       "commit() makes images. on_stdout/on_stderr(bytes): one stream each.")
    popen = method("sandbox_popen", bind={"sid": "id"},
                   note="stdin/stdout/stderr, wait, communicate, send_signal, kill; pass a terminal's fd with "
                        "pty=True for an interactive program. In process only.")
    spawn = method("sandbox_spawn", bind={"sid": "id"}, wrap=lambda self, pid, _: SandboxProcess(self._st, self.id, pid),
                   note="A SandboxProcess: write to its stdin, signal it, ask its state and output.")
    processes = method("sandbox_processes", bind={"sid": "id"}, note="The ones spawn started (and their state).")
    ps = method("sandbox_ps", bind={"sid": "id"}, note="Every process inside, as its kernel tells (pid, ppid, "
                                                        "user, state, argv).")
    follow = method("sandbox_follow", bind={"sid": "id"}, note="In process only.")
    read = method("sandbox_read", bind={"sid": "id"})

    def read_text(self, path: str) -> str:
        return self.read(path).decode("utf-8", "replace")

    write = method("sandbox_write", bind={"sid": "id"}, adapt=_encode_data)
    set_timeout = method("sandbox_set_timeout", bind={"sid": "id"}, wrap=lambda self, r, _: _keep_info(self, r))
    set_network = method("sandbox_set_network", bind={"sid": "id"}, wrap=lambda self, r, _: _keep_info(self, r),
                         note="network: as img.start(network=...) takes it. Only for a sandbox started with one.")
    metrics = method("sandbox_metrics", bind={"sid": "id"}, note="E2B's get_metrics: samples of CPU, memory, disk.")
    expose = method("sandbox_expose", bind={"sid": "id"}, note="E2B's get_host(port).")
    unexpose = method("sandbox_unexpose", bind={"sid": "id"})
    ports = method("sandbox_ports", bind={"sid": "id"})
    port_url = method("sandbox_port_url", bind={"sid": "id"})
    run_code = method("sandbox_run_code", bind={"sid": "id"},
                      note="As a notebook cell: state persists per context (E2B's run_code). on_output(message): "
                           "stdout/stderr/result/error messages as they come, in process only.")
    create_code_context = method("sandbox_code_context_create", bind={"sid": "id"})
    list_code_contexts = method("sandbox_code_contexts", bind={"sid": "id"})
    restart_code_context = method("sandbox_code_context_restart", bind={"sid": "id"})
    remove_code_context = method("sandbox_code_context_remove", bind={"sid": "id"})
    ls = method("sandbox_ls", bind={"sid": "id"})
    exists = method("sandbox_exists", bind={"sid": "id"})
    remove = method("sandbox_remove", bind={"sid": "id"})
    mkdir = method("sandbox_mkdir", bind={"sid": "id"})
    stat = method("sandbox_stat", bind={"sid": "id"})
    rename = method("sandbox_rename", bind={"sid": "id"})
    watch = method("sandbox_watch", bind={"sid": "id"},
                   note="Its watch id: watch_events(id, timeout=...) takes what happened since, unwatch(id) ends it.")
    watch_events = method("sandbox_watch_events", bind={"sid": "id"})
    unwatch = method("sandbox_unwatch", bind={"sid": "id"})
    commit = method("sandbox_commit", bind={"sid": "id"}, wrap=as_image,
                    note="Processes are frozen for the instant, then thawed; the image can be run, forked and "
                         "merged like any while the sandbox goes on.")
    stop = method("sandbox_stop", bind={"sid": "id"}, wrap=lambda self, r, _: _keep_info(self, r) and None)
    hibernate = method("sandbox_hibernate", bind={"sid": "id"}, wrap=lambda self, r, _: _keep_info(self, r))
    resume = method("sandbox_resume", bind={"sid": "id"}, wrap=lambda self, r, _: _keep_info(self, r))
    fork = method("sandbox_fork", bind={"sid": "id"}, wrap=lambda self, infos, _: [Sandbox(self._st, i) for i in infos],
                  note="Each child is a Sandbox of its own; this one runs on.")

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc):
        self.stop()


@rows_of
class SandboxProcess:
    """A process started with Sandbox.spawn: `pid` is its number in the sandbox (1, 2, ...)."""

    def __init__(self, st: Sandtree, sid: str, pid: int):
        self._st, self.sandbox_id, self.pid = st, sid, pid

    def __repr__(self) -> str:
        return f"<SandboxProcess {self.pid} of {self.sandbox_id[:12]}>"

    write = method("sandbox_stdin", bind={"sid": "sandbox_id", "pid": "pid"})

    def close_stdin(self) -> None:
        self.write(b"", close=True)

    signal = method("sandbox_signal", bind={"sid": "sandbox_id", "pid": "pid"}, adapt=_signal_name)

    def kill(self) -> None:
        self.signal("KILL")

    state = method("sandbox_process", bind={"sid": "sandbox_id", "pid": "pid"})
    resize = method("sandbox_resize", bind={"sid": "sandbox_id", "pid": "pid"},
                    note="Its terminal's size (spawned with pty=True).")

    def wait(self, timeout: float | None = None, poll: float = 0.02) -> dict:
        """Its state once it has exited (TimeoutError after `timeout` seconds)."""
        end = None if timeout is None else time.monotonic() + timeout
        while (v := self.state())["running"]:
            if end is not None and time.monotonic() > end:
                raise TimeoutError(f"process {self.pid} still runs after {timeout} s")
            time.sleep(poll)
        return v


@dataclass
class MergeResult:
    image: Image | None              # None: conflicts, no strategy, on_conflict="return"; nothing made
    base: Image | None
    conflicts: list[dict]
    ignored: list[str] = field(default_factory=list)   # both changed; an ignore glob took ours

    @property
    def ok(self) -> bool:
        return self.image is not None


@rows_of
class Branch:
    """A movable name for a line of work: each run made on it moves it (compare-and-swap)."""

    def __init__(self, st: Sandtree, name: str):
        self._st = st
        self.name = name

    def __repr__(self) -> str:
        return f"<Branch {self.name} at {self.head.short_id}>"

    head = row_property("branch_head", bind={"name": "name"}, wrap=as_image)
    run = method("run", bind={"ref": lambda b: f"branch:{b.name}"}, kwargs="options", adapt=run_inputs,
                 wrap=as_run_result, note="On the branch's head; the branch moves to the result (Conflict if another "
                                        "run moved it meanwhile; that run's image is kept, not applied). The options "
                                        "are Image.run's.")
    rollback = method("rollback", bind={"name": "name"}, ids=("to",), wrap=as_image)
    log = method("branch_log", bind={"name": "name"})
    delete = method("branch_delete", bind={"name": "name"}, wrap=as_none)


def best_of(results: list[RunResult], score, *, keep_losers: bool = False) -> RunResult:
    """The result with the highest score(result). Unless keep_losers, the other results' images
    are removed (when nothing names them), leaving only the winner's line."""
    if not results:
        raise InvalidInput("best_of needs at least one result")
    winner = max(results, key=score)
    if not keep_losers:
        for r in results:
            if r is winner or r.image is None or r.image == winner.image or r.image == r.source:
                continue
            try:
                r.image._st.remove(r.image)
            except Exception:          # noqa: BLE001 - named by a tag or branch: keep it
                pass
    return winner


def _unique(images):
    seen, out = set(), []
    for i in images:
        if i.id not in seen:
            seen.add(i.id)
            out.append(i)
    return out
