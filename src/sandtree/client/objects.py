"""The public API's objects: Image, RunResult, Sandbox, Branch, MergeResult and best_of. Each holds
its Sandtree (client/sdk.py) and reaches the engine through it; none imports the Sandtree class."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .. import defaults as D
from ..errors import InvalidInput
from ..render import render_svg, render_text
from ..defaults import RunRecord
from .inputs import files_arg, streams

__all__ = ["Image", "RunResult", "Sandbox", "SandboxProcess", "MergeResult", "Branch", "best_of"]


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

    @property
    def tags(self) -> list[str]:
        return sorted(self._st.engine.tags(self.id))

    def run(self, command, *, timeout: float | None = None, memory=None, pids: int | None = None,
            cpus: float | None = None, disk=None, output=None, env: dict | None = None, cwd: str | None = None,
            stdin: bytes | str | None = None, uid: int | None = None, gid: int | None = None, hostname: str = D.HOSTNAME,
            files: list | dict | None = None, disposable: bool = False,
            on_output: Callable[[str, bytes], None] | None = None, tier: str | None = None,
            on_stdout: Callable[[bytes], None] | None = None,
            on_stderr: Callable[[bytes], None] | None = None, labels: dict | None = None, network=None,
            secrets: dict | None = None, retries: int = 0) -> "RunResult":
        """Run `command` (a string runs in /bin/sh -c, a list is argv) in a fresh sandbox on this
        image. Unless disposable, what it wrote becomes the new image `result.image`. labels: names
        and values kept with the run (st.operation(result.operation)["spec"]["labels"]).
        network: off (default), "all", rules ["pypi.org", "*.pythonhosted.org:443"], {"allow_out": [...],
        "deny_out": [...]} or "inherit"; secrets: {"NAME": {"value": ..., "hosts": [...]}}, or stored ones
        by name (st.set_secret): ["NAME"] or {"NAME": {"stored": True, "hosts": [fewer hosts]}} (the
        sandbox sees a placeholder in $NAME, requests to those hosts carry the value).
        on_output(stream, bytes) sees both streams as they come; on_stdout/on_stderr(bytes) one each.
        retries: on a cluster, run it again on another node (at most this many times) if its node is
        lost before the run committed anything (0: the run fails with NodeLost)."""
        return self._run_ref(self.id, command, timeout=timeout, memory=memory, pids=pids, cpus=cpus,
                             disk=disk, output=output, env=env, cwd=cwd, stdin=stdin, uid=uid, gid=gid,
                             hostname=hostname, files=files_arg(files), disposable=disposable,
                             on_output=streams(on_output, on_stdout, on_stderr), tier=tier, labels=labels,
                             network=network, secrets=secrets, retries=retries)

    def start(self, *, timeout: float | None = None, memory=None, pids: int | None = None,
              cpus: float | None = None, disk=None, output=None, env: dict | None = None, cwd: str | None = None,
              hostname: str = D.HOSTNAME, files: list | dict | None = None,
              idle_timeout: float = D.SANDBOX_IDLE_TIMEOUT,
              lifetime: float = D.SANDBOX_LIFETIME, idle_action: str = D.SANDBOX_IDLE_ACTION, tier: str | None = None,
              labels: dict | None = None, network=None, secrets: dict | None = None) -> "Sandbox":
        """Start a live sandbox on this image: commands enter it with exec/popen, it keeps its
        processes and files between them, and commit() snapshots it while it runs. timeout
        bounds each command; idle_timeout and lifetime (seconds) bound the sandbox; idle_action
        "hibernate" hibernates it when idle instead of stopping it (resume() brings it back)."""
        return Sandbox(self._st, self._st.engine.sandbox_start(
            self.id, timeout=timeout, memory=memory, pids=pids, cpus=cpus, disk=disk, output=output, env=env,
            cwd=cwd, hostname=hostname, files=files_arg(files), idle_timeout=idle_timeout, lifetime=lifetime,
            idle_action=idle_action, tier=tier, labels=labels, network=network, secrets=secrets))

    def _run_ref(self, ref: str, command, **options) -> "RunResult":
        rec = self._st.engine.run(ref, command, **options)
        return RunResult.from_record(self._st, rec)

    def config(self):
        """The image's config (ImageConfig: env, cwd, user, entrypoint, cmd, expose, labels): what
        its runs get by default. Empty for an image without one."""
        return self._st.engine.image_config(self.id)

    def configure(self, config, *, tag: str | None = None) -> "Image":
        """This image with `config` (an ImageConfig; e.g. img.config().replace(cwd="/app"))."""
        return Image(self._st, self._st.engine.configure(self.id, config, tag=tag))

    def ls(self, path: str = "/") -> list[dict]:
        return [e.to_dict() for e in self._st.engine.ls(self.id, path)]

    def stat(self, path: str) -> dict:
        return self._st.engine.stat(self.id, path).to_dict()

    def read(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        return self._st.engine.read(self.id, path, offset, limit)

    def read_text(self, path: str) -> str:
        return self.read(path).decode("utf-8", "replace")

    def grep(self, pattern: str, path: str = "/", *, glob: str | None = None, max_matches: int = 1000,
             ignore_case: bool = False) -> list[dict]:
        return self._st.engine.grep(self.id, pattern, path, glob=glob, max_matches=max_matches,
                                     ignore_case=ignore_case)

    def export(self, fileobj_or_path, path: str = "/") -> None:
        """Write the image (or the subtree at `path`) as a tar."""
        if isinstance(fileobj_or_path, str):
            with open(fileobj_or_path, "wb") as f:
                self._st.engine.export_tar(self.id, f, path)
        else:
            self._st.engine.export_tar(self.id, fileobj_or_path, path)

    def export_oci(self, fileobj_or_path, *, name: str | None = None) -> dict:
        """Write the image as an OCI image layout tar (skopeo's oci-archive:, podman load);
        {image, digest, layers}. name: the layout index's ref name."""
        if isinstance(fileobj_or_path, str):
            with open(fileobj_or_path, "wb") as f:
                return self._st.engine.export_oci(self.id, f, name=name)
        return self._st.engine.export_oci(self.id, fileobj_or_path, name=name)

    def push(self, reference: str, *, insecure: bool = False) -> dict:
        """Push the image to docker://HOST[:PORT]/NAME[:TAG]: its layers as OCI layers (stable
        digests: an unchanged image uploads nothing), its config as the OCI config;
        {reference, digest, layers, uploaded, bytes, seconds}."""
        return self._st.engine.push(self.id, reference, insecure=insecure)

    def parents(self) -> list["Image"]:
        return _unique(Image(self._st, e["parent"]) for e in self._st.engine.parents(self.id))

    def children(self) -> list["Image"]:
        return _unique(Image(self._st, e["child"]) for e in self._st.engine.children(self.id))

    def log(self) -> list[dict]:
        return self._st.engine.log(self.id)

    def tag(self, name: str) -> "Image":
        return self._st.tag(self, name)

    def annotate(self, score: float | None = None, **meta) -> dict:
        return self._st.annotate(self, score, **meta)

    def annotations(self) -> dict:
        return self._st.annotations(self)

    def diff(self, other: "Image | str") -> list[dict]:
        return self._st.diff(self, other)

    def patch(self, other: "Image | str") -> str:
        return self._st.patch(self, other)

    def fork(self, commands: list, *, parallel: int = 4, **run_options) -> list["RunResult"]:
        """Run each command from this image concurrently (one branch each); results in order."""
        return self._st.map(self, commands, parallel=parallel, **run_options)

    def ancestors(self) -> list["Image"]:
        """Every ancestor, nearest first."""
        dist = self._st.engine.ancestors(self.id)
        return [Image(self._st, i) for i in sorted(dist, key=lambda i: dist[i]) if i != self.id]

    def descendants(self) -> list["Image"]:
        dist = self._st.engine.descendants(self.id)
        return [Image(self._st, i) for i in sorted(dist, key=lambda i: dist[i]) if i != self.id]

    def produced_by(self) -> list[dict]:
        """The operations whose result is this image (runs, merges, imports)."""
        return self._st.engine.produced_by(self.id)

    def lineage(self, format: str = "json"):
        """The lineage tree under this image: a dict ("json"), text ("text") or SVG ("svg")."""
        t = self._st.engine.lineage_tree(self.id)
        if format == "json":
            return t
        if format == "text":
            return render_text(t)
        if format == "svg":
            return render_svg(t)
        raise InvalidInput(f"unknown lineage format {format!r} (json, text, svg)")


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

    def info(self) -> dict:
        """State (running, stopped, expired, gone), image, last commit, memory in use, limits."""
        self._info = self._st.engine.sandbox_info(self.id)
        return self._info

    @property
    def state(self) -> str:
        return self.info()["state"]

    def exec(self, command, *, env: dict | None = None, cwd: str | None = None, stdin: bytes | str | None = None,
             uid: int | None = None, gid: int | None = None, timeout: float | None = None, output=None,
             on_output: Callable[[str, bytes], None] | None = None,
             on_stdout: Callable[[bytes], None] | None = None,
             on_stderr: Callable[[bytes], None] | None = None) -> "RunResult":
        """Run a command inside to its exit (background processes it starts keep running).
        result.image is None: commit() makes images. on_stdout/on_stderr(bytes): one stream each."""
        rec = self._st.engine.sandbox_exec(self.id, command, env=env, cwd=cwd, stdin=stdin, uid=uid, gid=gid,
                                            timeout=timeout, output=output,
                                            on_output=streams(on_output, on_stdout, on_stderr))
        return RunResult.from_record(self._st, rec)

    def popen(self, argv, *, env: dict | None = None, cwd: str | None = None, uid: int | None = None,
              gid: int | None = None, pty: bool = False, stdin=-1, stdout=-1, stderr=-1):
        """A process inside, shaped like subprocess.Popen (pipes by default; pass a terminal's fd
        with pty=True for an interactive program): stdin/stdout/stderr, wait, communicate,
        send_signal, kill. In process only."""
        return self._st.engine.sandbox_popen(self.id, argv, env=env, cwd=cwd, uid=uid, gid=gid, pty=pty,
                                              stdin=stdin, stdout=stdout, stderr=stderr)

    def spawn(self, command, *, env: dict | None = None, cwd: str | None = None, uid: int | None = None,
              gid: int | None = None, stdin: bytes | str | None = None, stdin_open: bool = False,
              output=None) -> "SandboxProcess":
        """Start a process inside without waiting for it (in process and over a server alike):
        write to its stdin (stdin_open=True keeps it open), signal it, ask its state and output."""
        pid = self._st.engine.sandbox_spawn(self.id, command, env=env, cwd=cwd, uid=uid, gid=gid, stdin=stdin,
                                            stdin_open=stdin_open, output=output)
        return SandboxProcess(self._st, self.id, pid)

    def read(self, path: str) -> bytes:
        """A file as the sandbox sees it now."""
        return self._st.engine.sandbox_read(self.id, path)

    def read_text(self, path: str) -> str:
        return self.read(path).decode("utf-8", "replace")

    def write(self, path: str, data: bytes | str, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
        """Write a file into the running sandbox (missing parent directories are made)."""
        self._st.engine.sandbox_write(self.id, path, data.encode() if isinstance(data, str) else data,
                                       mode=mode, uid=uid, gid=gid)

    def set_timeout(self, timeout: float) -> dict:
        """Stop the sandbox `timeout` seconds from now (sooner or later than its lifetime said)."""
        self._info = self._st.engine.sandbox_set_timeout(self.id, timeout)
        return self._info

    def set_network(self, network) -> dict:
        """Replace the running sandbox's network policy (as img.start(network=...) takes it);
        connections the new one forbids are cut. Only for a sandbox started with network."""
        self._info = self._st.engine.sandbox_set_network(self.id, network)
        return self._info

    def expose(self, port: int) -> dict:
        """Make `port` of the sandbox reachable: {port, url (http://127.0.0.1:<host port>, on the engine's
        host), path (the port under `sandtree serve`, behind the token)}. E2B's get_host(port)."""
        return self._st.engine.sandbox_expose(self.id, port)

    def unexpose(self, port: int) -> None:
        """Make an exposed port unreachable again."""
        self._st.engine.sandbox_unexpose(self.id, port)

    def ports(self) -> list[dict]:
        """The exposed ports: {port, url, path} each (url None while the sandbox is not running)."""
        return self._st.engine.sandbox_ports(self.id)

    def port_url(self, port: int, *, ttl: float = D.PORT_URL_TTL) -> str:
        """A signed URL of an exposed port that works without a token for `ttl` seconds (absolute
        through a server; in-process, the path under `sandtree serve`)."""
        return self._st.engine.sandbox_port_url(self.id, port, ttl=ttl)

    def ls(self, path: str = "/") -> list[dict]:
        """A directory as the sandbox sees it now: name, kind, size, mode of each entry."""
        return self._st.engine.sandbox_ls(self.id, path)

    def exists(self, path: str) -> bool:
        return self._st.engine.sandbox_exists(self.id, path)

    def remove(self, path: str) -> None:
        """Remove a file, a link or an empty directory."""
        self._st.engine.sandbox_remove(self.id, path)

    def mkdir(self, path: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        """Make a directory and any missing parents."""
        self._st.engine.sandbox_mkdir(self.id, path, mode=mode, uid=uid, gid=gid)

    def commit(self, *, tag: str | None = None) -> Image:
        """An image of its filesystem now (processes frozen for the instant, then thawed); it
        can be run, forked and merged like any image while the sandbox goes on."""
        return Image(self._st, self._st.engine.sandbox_commit(self.id, tag=tag))

    def stop(self) -> None:
        """Kill every process and free its memory and scratch space (commit first to keep its files)."""
        self._info = self._st.engine.sandbox_stop(self.id)

    def hibernate(self) -> dict:
        """Save it whole and free its CPU and memory: its files become an image (a commit) and its
        processes a checkpoint, memory included (CRIU). resume() brings them back where they were."""
        self._info = self._st.engine.sandbox_hibernate(self.id)
        return self._info

    def resume(self) -> dict:
        """Bring a hibernated sandbox back: the same processes, memory and files, running again."""
        self._info = self._st.engine.sandbox_resume(self.id)
        return self._info

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class SandboxProcess:
    """A process started with Sandbox.spawn: `pid` is its number in the sandbox (1, 2, ...)."""

    def __init__(self, st: Sandtree, sid: str, pid: int):
        self._st, self.sandbox_id, self.pid = st, sid, pid

    def __repr__(self) -> str:
        return f"<SandboxProcess {self.pid} of {self.sandbox_id[:12]}>"

    def write(self, data: bytes | str, *, close: bool = False) -> None:
        """Write to its stdin (close=True: then close it)."""
        self._st.engine.sandbox_stdin(self.sandbox_id, self.pid, data, close=close)

    def close_stdin(self) -> None:
        self._st.engine.sandbox_stdin(self.sandbox_id, self.pid, b"", close=True)

    def signal(self, signal: str | int = "TERM") -> None:
        """Signal its process group (a number or a name: TERM, SIGTERM)."""
        self._st.engine.sandbox_signal(self.sandbox_id, self.pid, str(signal))

    def kill(self) -> None:
        self.signal("KILL")

    def state(self) -> dict:
        """running, exit_code, signal, timed_out, stdout/stderr so far (text; *_base64: exact)."""
        return self._st.engine.sandbox_process(self.sandbox_id, self.pid)

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


class Branch:
    """A movable name for a line of work: each run made on it moves it (compare-and-swap)."""

    def __init__(self, st: Sandtree, name: str):
        self._st = st
        self.name = name

    def __repr__(self) -> str:
        return f"<Branch {self.name} at {self.head.short_id}>"

    @property
    def head(self) -> Image:
        return Image(self._st, self._st.engine.branch_head(self.name))

    def run(self, command, **options) -> RunResult:
        """Run on the branch's head and advance the branch to the result (Conflict if another run
        moved it meanwhile; that run's image is kept, not applied)."""
        options["on_output"] = streams(options.get("on_output"), options.pop("on_stdout", None),
                                       options.pop("on_stderr", None))
        options["files"] = files_arg(options.get("files"))
        return RunResult.from_record(self._st, self._st.engine.run(f"branch:{self.name}", command, **options))

    def rollback(self, *, to: "Image | str | None" = None, steps: int | None = None) -> Image:
        return self._st.rollback(self, to=to, steps=steps)

    def log(self) -> list[dict]:
        """Every move of this branch (the reflog), oldest first."""
        return self._st.engine.branch_log(self.name)

    def delete(self) -> None:
        self._st.engine.branch_delete(self.name)


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
