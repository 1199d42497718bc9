"""The public Python API, in process: Sandtree, Image, RunResult (and aio.py, their async twins).

A thin face over engine.Engine: names and value shapes that read well to a user; no logic of its
own beyond wrapping IDs in objects.

    st = Sandtree()
    img = st.image("debian:bookworm")
    r = img.run("python3 -V")
    r.stdout, r.exit_code, r.image
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from .. import config
from .. import defaults as D
from ..defaults import GC_GRACE, GC_RETENTION, Limits
from ..errors import InvalidInput
from ..hostfiles import local_entries
from ..render import render_svg, render_text
from ..table import RunRecord
from .remote import RemoteEngine


class Sandtree:
    """An image store plus the default sandbox runtime. `home` defaults to $SANDTREE_HOME or
    ~/.local/share/sandtree."""

    def __init__(self, home: str | None = None, *, limits: Limits | None = None, warm: int = 2,
                 tier: str = "namespaces"):
        """warm: sandboxes kept started ahead of runs (namespaces and cgroups ready; a run then
        pays for its overlay, command and commit only). 0 starts every run cold."""
        # The in-process engine loads the store and the runtime (seccomp, cgroups...); imported
        # here so that `import sandtree` and a connect()ed client never load them.
        from ..engine import Engine
        self._engine = Engine(home or config.default_home(), limits=limits, warm=warm, tier=tier)

    @property
    def home(self) -> str:
        return self._engine.home

    def close(self) -> None:
        self._engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # images
    def image(self, ref: "str | Image") -> "Image":
        """An image by ID, unique ID prefix, tag or branch (ImageNotFound if none)."""
        return Image(self, self._id(ref))

    def images(self) -> list["Image"]:
        return [Image(self, r["id"]) for r in self._engine.images()]

    def import_image(self, path: str, *, tag: str | None = None,
                     progress: Callable[[int], None] | None = None) -> "Image":
        """Import a directory, a tar (gz/zst), an OCI layout or a docker-archive tar."""
        return Image(self, self._engine.import_path(path, tag=tag, progress=progress))

    def pull(self, reference: str, *, tag: str | None = None, insecure: bool = False) -> "Image":
        """Pull docker://HOST/NAME:TAG from an OCI registry (digests verified); plain HTTP only for
        loopback registries or insecure=True."""
        return Image(self, self._engine.pull(reference, tag=tag, insecure=insecure))

    def bootstrap(self, spec: str = "debian:bookworm", *, include: list[str] = (), tag: str | None = None,
                  log: Callable[[str], None] | None = None) -> "Image":
        """Build a Debian base image with debootstrap (root only); tagged `spec` unless `tag`."""
        return Image(self, self._engine.bootstrap(spec, include=list(include), tag=tag, log=log))

    def tag(self, image: "Image | str", name: str) -> "Image":
        image_id = self._id(image)
        self._engine.tag(image_id, name)
        return Image(self, image_id)

    def untag(self, name: str) -> None:
        self._engine.untag(name)

    def tags(self) -> dict[str, str]:
        return self._engine.tags()

    def operation(self, op: str) -> dict:
        return self._engine.operation(op)

    # operations: runs started now, awaited later
    def submit(self, image: "Image | str", command, **run_options) -> str:
        """Start a run in the background; returns its operation ID (see wait, cancel, operation)."""
        return self._engine.operations.submit_run(self._id(image), command, **run_options)

    def wait(self, operations: list[str], timeout: float | None = None) -> list[dict]:
        """Wait for operations; their records with a `status` (queued, running, done, failed,
        cancelled) and, once done, `result` (the new image) and `outcome`."""
        return self._engine.operations.wait(list(operations), timeout)

    def cancel(self, operation: str) -> dict:
        """Cancel a queued or running operation; a running sandbox is killed, nothing committed."""
        return self._engine.operations.cancel(operation)

    # live sandboxes
    def sandbox(self, sandbox_id: str) -> "Sandbox":
        """A live sandbox by id (or unique id prefix), started by this or any other process."""
        return Sandbox(self, self._engine.sandbox_info(sandbox_id))

    def sandboxes(self, *, all: bool = False) -> list["Sandbox"]:
        """Running live sandboxes (all=True: stopped and expired ones too)."""
        return [Sandbox(self, d) for d in self._engine.sandbox_list(all=all)]

    def pool(self, image: "Image | str", size: int = 4, *, timeout: float | None = None, memory=None,
             pids: int | None = None, cpus: float | None = None, disk=None, output=None,
             hostname: str = D.HOSTNAME, wait: bool = False) -> dict:
        """Keep `size` sandboxes of `image` started (a golden environment): runs on it with the
        same memory/pids/cpus/disk use one and skip setup; refilled in the background. Calling
        it again resizes; size=0 empties it. wait: until it is full. Returns its stats."""
        stats = self._engine.pool_create(self._id(image), size, timeout=timeout, memory=memory, pids=pids,
                                         cpus=cpus, disk=disk, output=output, hostname=hostname)
        if wait:
            self._engine.pool_wait(stats["image"])
            stats = next(p for p in self._engine.pool_list() if p["image"] == stats["image"])
        return stats

    def pools(self) -> list[dict]:
        """The warm pools: image, size, ready, served, misses."""
        return self._engine.pool_list()

    def whoami(self) -> dict:
        """The caller's tenant, scopes and run limits (in-process: "local", every scope)."""
        return self._engine.whoami()

    def share(self, image) -> dict:
        """Make an image this tenant owns visible to every tenant (by its ID); unshare undoes it."""
        return self._engine.share(self._id(image))

    def unshare(self, image) -> dict:
        return self._engine.unshare(self._id(image))

    def audit(self, *, tenant: str | None = None, limit: int = 100) -> list[dict]:
        """Who ran what on which image, newest first (a tenant sees its own records)."""
        return self._engine.audit(tenant=tenant, limit=limit)

    def doctor(self) -> list[dict]:
        """The isolation tiers this host can run, and why not the others."""
        return self._engine.doctor()

    def fsck(self, *, verify_content: bool = True) -> dict:
        return self._engine.fsck(verify_content=verify_content)

    def gc(self, *, retention: float = GC_RETENTION, grace: float = GC_GRACE) -> dict:
        """Remove untagged images older than `retention` seconds (and what only they used)."""
        return self._engine.gc(retention=retention, grace=grace)

    def remove(self, image: "Image | str", *, force: bool = False) -> None:
        self._engine.remove_image(self._id(image), force=force)

    def _id(self, image: "Image | str") -> str:
        return image.id if isinstance(image, Image) else self._engine.resolve(image)

    # diff and merge
    def diff(self, a: "Image | str", b: "Image | str") -> list[dict]:
        """What changed from a to b: added, removed, modified, type_changed, metadata_changed."""
        return [c.to_dict() for c in self._engine.diff(self._id(a), self._id(b))]

    def patch(self, a: "Image | str", b: "Image | str") -> str:
        """The unified text patch from a to b (binary files are named, not shown)."""
        return self._engine.patch(self._id(a), self._id(b))

    def merge(self, base: "Image | str | None", ours: "Image | str", theirs: "Image | str", *,
              strategy: str | None = None, ignore: list[str] | None = None,
              on_conflict: str = "raise") -> "MergeResult":
        """Three-way merge. base=None: the nearest common ancestor from lineage. Conflicts make no
        image unless strategy is "ours", "theirs" or "markers": then MergeConflict is raised (its
        .details["conflicts"] lists them), or with on_conflict="return" a result with image None.
        ignore: globs that never conflict, ours taken there (None: __pycache__/, *.pyc,
        .pytest_cache/; [] for none)."""
        res = self._engine.merge(self._id(base) if base is not None else None, self._id(ours),
                                 self._id(theirs), strategy=strategy, ignore=ignore, on_conflict=on_conflict)
        return MergeResult(Image(self, res["image"]) if res["image"] else None,
                           Image(self, res["base"]) if res["base"] else None, res["conflicts"],
                           res.get("ignored", []))

    # branches
    def branch(self, name: str, from_: "Image | str | None" = None, *, force: bool = False) -> "Branch":
        """The branch `name`; with from_, create it there (force: move an existing one)."""
        if from_ is not None:
            self._engine.branch_create(name, self._id(from_), force=force)
        else:
            self._engine.branch_head(name)
        return Branch(self, name)

    def branches(self) -> dict[str, "Branch"]:
        return {name: Branch(self, name) for name in self._engine.branches()}

    def rollback(self, branch: "Branch | str", *, to: "Image | str | None" = None,
                 steps: int | None = None) -> "Image":
        """Move a branch back to an ancestor (to=) or N moves back in its history (steps=)."""
        name = branch.name if isinstance(branch, Branch) else branch
        target = self._engine.rollback(name, to=self._id(to) if to is not None else None, steps=steps)
        return Image(self, target)

    # many runs from one image
    def map(self, image: "Image | str", commands: list, *, parallel: int = 4, **run_options) -> list["RunResult"]:
        """Run each command from the same image concurrently (Engine.fork: one operation each,
        every command checked before any runs); results in the commands' order. The options
        are Image.run's, less the per-run callbacks."""
        if "files" in run_options:
            run_options["files"] = files_arg(run_options["files"])
        recs = self._engine.fork(self._id(image), commands, parallel=parallel, **run_options)
        return [RunResult._of(self, r) for r in recs]

    # lineage
    def common_ancestor(self, a: "Image | str", b: "Image | str") -> "Image | None":
        found = self._engine.common_ancestor(self._id(a), self._id(b))
        return Image(self, found) if found else None

    def path(self, a: "Image | str", b: "Image | str") -> list["Image"]:
        """The images from a to b along lineage edges."""
        return [Image(self, i) for i in self._engine.lineage_path(self._id(a), self._id(b))]

    # bundles
    def bundle(self, path: str, images: list, *, with_ancestry: bool = False) -> dict:
        """Write images (and, with_ancestry, every ancestor) into one verifiable file."""
        return self._engine.bundle_create(path, [self._id(i) for i in images], with_ancestry=with_ancestry)

    def import_bundle(self, path: str) -> dict:
        """Import a bundle: same image IDs and lineage as where it was made; verified first."""
        return self._engine.bundle_import(path)


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
        return sorted(self._st._engine.tags(self.id))

    def run(self, command, *, timeout: float | None = None, memory=None, pids: int | None = None,
            cpus: float | None = None, disk=None, output=None, env: dict | None = None, cwd: str = "/",
            stdin: bytes | str | None = None, uid: int = 0, gid: int = 0, hostname: str = D.HOSTNAME,
            files: list | dict | None = None, disposable: bool = False,
            on_output: Callable[[str, bytes], None] | None = None, tier: str | None = None,
            on_stdout: Callable[[bytes], None] | None = None,
            on_stderr: Callable[[bytes], None] | None = None) -> "RunResult":
        """Run `command` (a string runs in /bin/sh -c, a list is argv) in a fresh sandbox on this
        image. Unless disposable, what it wrote becomes the new image `result.image`.
        on_output(stream, bytes) sees both streams as they come; on_stdout/on_stderr(bytes) one each."""
        return self._run_ref(self.id, command, timeout=timeout, memory=memory, pids=pids, cpus=cpus,
                             disk=disk, output=output, env=env, cwd=cwd, stdin=stdin, uid=uid, gid=gid,
                             hostname=hostname, files=files_arg(files), disposable=disposable,
                             on_output=streams(on_output, on_stdout, on_stderr), tier=tier)

    def start(self, *, timeout: float | None = None, memory=None, pids: int | None = None,
              cpus: float | None = None, disk=None, output=None, env: dict | None = None, cwd: str = "/",
              hostname: str = D.HOSTNAME, files: list | dict | None = None,
              idle_timeout: float = D.SANDBOX_IDLE_TIMEOUT,
              lifetime: float = D.SANDBOX_LIFETIME, idle_action: str = D.SANDBOX_IDLE_ACTION, tier: str | None = None) -> "Sandbox":
        """Start a live sandbox on this image: commands enter it with exec/popen, it keeps its
        processes and files between them, and commit() snapshots it while it runs. timeout
        bounds each command; idle_timeout and lifetime (seconds) bound the sandbox; idle_action
        "hibernate" hibernates it when idle instead of stopping it (resume() brings it back)."""
        return Sandbox(self._st, self._st._engine.sandbox_start(
            self.id, timeout=timeout, memory=memory, pids=pids, cpus=cpus, disk=disk, output=output, env=env,
            cwd=cwd, hostname=hostname, files=files_arg(files), idle_timeout=idle_timeout, lifetime=lifetime,
            idle_action=idle_action, tier=tier))

    def _run_ref(self, ref: str, command, **options) -> "RunResult":
        rec = self._st._engine.run(ref, command, **options)
        return RunResult._of(self._st, rec)

    def ls(self, path: str = "/") -> list[dict]:
        return [e.to_dict() for e in self._st._engine.ls(self.id, path)]

    def stat(self, path: str) -> dict:
        return self._st._engine.stat(self.id, path).to_dict()

    def read(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        return self._st._engine.read(self.id, path, offset, limit)

    def read_text(self, path: str) -> str:
        return self.read(path).decode("utf-8", "replace")

    def grep(self, pattern: str, path: str = "/", *, glob: str | None = None, max_matches: int = 1000,
             ignore_case: bool = False) -> list[dict]:
        return self._st._engine.grep(self.id, pattern, path, glob=glob, max_matches=max_matches,
                                     ignore_case=ignore_case)

    def export(self, fileobj_or_path, path: str = "/") -> None:
        """Write the image (or the subtree at `path`) as a tar."""
        if isinstance(fileobj_or_path, str):
            with open(fileobj_or_path, "wb") as f:
                self._st._engine.export_tar(self.id, f, path)
        else:
            self._st._engine.export_tar(self.id, fileobj_or_path, path)

    def parents(self) -> list["Image"]:
        return _unique(Image(self._st, e["parent"]) for e in self._st._engine.parents(self.id))

    def children(self) -> list["Image"]:
        return _unique(Image(self._st, e["child"]) for e in self._st._engine.children(self.id))

    def log(self) -> list[dict]:
        return self._st._engine.log(self.id)

    def tag(self, name: str) -> "Image":
        return self._st.tag(self, name)

    def diff(self, other: "Image | str") -> list[dict]:
        return self._st.diff(self, other)

    def patch(self, other: "Image | str") -> str:
        return self._st.patch(self, other)

    def fork(self, commands: list, *, parallel: int = 4, **run_options) -> list["RunResult"]:
        """Run each command from this image concurrently (one branch each); results in order."""
        return self._st.map(self, commands, parallel=parallel, **run_options)

    def ancestors(self) -> list["Image"]:
        """Every ancestor, nearest first."""
        dist = self._st._engine.ancestors(self.id)
        return [Image(self._st, i) for i in sorted(dist, key=lambda i: dist[i]) if i != self.id]

    def descendants(self) -> list["Image"]:
        dist = self._st._engine.descendants(self.id)
        return [Image(self._st, i) for i in sorted(dist, key=lambda i: dist[i]) if i != self.id]

    def produced_by(self) -> list[dict]:
        """The operations whose result is this image (runs, merges, imports)."""
        return self._st._engine.produced_by(self.id)

    def lineage(self, format: str = "json"):
        """The lineage tree under this image: a dict ("json"), text ("text") or SVG ("svg")."""
        t = self._st._engine.lineage_tree(self.id)
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
    def _of(cls, st: Sandtree, rec: RunRecord) -> "RunResult":
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
        self._info = self._st._engine.sandbox_info(self.id)
        return self._info

    @property
    def state(self) -> str:
        return self.info()["state"]

    def exec(self, command, *, env: dict | None = None, cwd: str | None = None, stdin: bytes | str | None = None,
             uid: int = 0, gid: int = 0, timeout: float | None = None, output=None,
             on_output: Callable[[str, bytes], None] | None = None,
             on_stdout: Callable[[bytes], None] | None = None,
             on_stderr: Callable[[bytes], None] | None = None) -> "RunResult":
        """Run a command inside to its exit (background processes it starts keep running).
        result.image is None: commit() makes images. on_stdout/on_stderr(bytes): one stream each."""
        rec = self._st._engine.sandbox_exec(self.id, command, env=env, cwd=cwd, stdin=stdin, uid=uid, gid=gid,
                                            timeout=timeout, output=output,
                                            on_output=streams(on_output, on_stdout, on_stderr))
        return RunResult._of(self._st, rec)

    def popen(self, argv, *, env: dict | None = None, cwd: str | None = None, uid: int = 0, gid: int = 0,
              pty: bool = False, stdin=-1, stdout=-1, stderr=-1):
        """A process inside, shaped like subprocess.Popen (pipes by default; pass a terminal's fd
        with pty=True for an interactive program): stdin/stdout/stderr, wait, communicate,
        send_signal, kill. In process only."""
        return self._st._engine.sandbox_popen(self.id, argv, env=env, cwd=cwd, uid=uid, gid=gid, pty=pty,
                                              stdin=stdin, stdout=stdout, stderr=stderr)

    def read(self, path: str) -> bytes:
        """A file as the sandbox sees it now."""
        return self._st._engine.sandbox_read(self.id, path)

    def read_text(self, path: str) -> str:
        return self.read(path).decode("utf-8", "replace")

    def write(self, path: str, data: bytes | str, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
        """Write a file into the running sandbox (its directory must exist)."""
        self._st._engine.sandbox_write(self.id, path, data.encode() if isinstance(data, str) else data,
                                       mode=mode, uid=uid, gid=gid)

    def commit(self, *, tag: str | None = None) -> Image:
        """An image of its filesystem now (processes frozen for the instant, then thawed); it
        can be run, forked and merged like any image while the sandbox goes on."""
        return Image(self._st, self._st._engine.sandbox_commit(self.id, tag=tag))

    def stop(self) -> None:
        """Kill every process and free its memory and scratch space (commit first to keep its files)."""
        self._info = self._st._engine.sandbox_stop(self.id)

    def hibernate(self) -> dict:
        """Save it whole and free its CPU and memory: its files become an image (a commit) and its
        processes a checkpoint, memory included (CRIU). resume() brings them back where they were."""
        self._info = self._st._engine.sandbox_hibernate(self.id)
        return self._info

    def resume(self) -> dict:
        """Bring a hibernated sandbox back: the same processes, memory and files, running again."""
        self._info = self._st._engine.sandbox_resume(self.id)
        return self._info

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


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
        return Image(self._st, self._st._engine.branch_head(self.name))

    def run(self, command, **options) -> RunResult:
        """Run on the branch's head and advance the branch to the result (Conflict if another run
        moved it meanwhile; that run's image is kept, not applied)."""
        options["on_output"] = streams(options.get("on_output"), options.pop("on_stdout", None),
                                       options.pop("on_stderr", None))
        options["files"] = files_arg(options.get("files"))
        return RunResult._of(self._st, self._st._engine.run(f"branch:{self.name}", command, **options))

    def rollback(self, *, to: "Image | str | None" = None, steps: int | None = None) -> Image:
        return self._st.rollback(self, to=to, steps=steps)

    def log(self) -> list[dict]:
        """Every move of this branch (the reflog), oldest first."""
        return self._st._engine.branch_log(self.name)

    def delete(self) -> None:
        self._st._engine.branch_delete(self.name)


def best_of(results: list[RunResult], score, *, keep_losers: bool = False) -> RunResult:
    """The result with the highest score(result). Unless keep_losers, the other results' images
    are removed (when nothing names them), leaving only the winner's line."""
    if not results:
        from ..errors import InvalidInput
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


def connect(url: str, *, token: str | None = None) -> Sandtree:
    """The same API, served by a `sandtree serve` at `url` instead of an in-process engine."""
    st = Sandtree.__new__(Sandtree)
    st._engine = RemoteEngine(url, token)
    return st


def files_arg(files):
    """`files=` as E2B and Modal users write it, as the engine's list of {path, content, mode}:
    {"/dest": bytes | str} for one file, {"/dest": Path} for a local file (its mode kept) or a
    whole local directory (its tree under /dest). A list of dicts passes as it is."""
    if files is None or isinstance(files, (list, tuple)):
        return files
    if not isinstance(files, dict):
        raise InvalidInput("files is a list of {path, content | sha256, mode} or a {path: bytes | str | Path} dict")
    out = []
    for dest, value in files.items():
        if not isinstance(dest, str) or not dest.startswith("/"):
            raise InvalidInput(f"a file's path inside the sandbox must be absolute, not {dest!r}")
        if isinstance(value, (bytes, bytearray, str)):
            if dest.endswith("/"):
                raise InvalidInput(f"{dest!r} names a directory: give a file's path, or a local directory as a Path")
            out.append({"path": dest, "content": bytes(value) if not isinstance(value, str) else value})
        elif isinstance(value, os.PathLike):
            out += local_entries(os.fspath(value), dest)
        else:
            raise InvalidInput(f"files[{dest!r}] must be bytes, str or a path, not {type(value).__name__}")
    return out


def streams(on_output, on_stdout, on_stderr):
    """One on_output(stream, bytes) callback from E2B/Modal-style per-stream ones (None: none)."""
    if on_stdout is None and on_stderr is None:
        return on_output
    per = {"stdout": on_stdout, "stderr": on_stderr}

    def fan_out(stream: str, chunk: bytes) -> None:
        if on_output is not None:
            on_output(stream, chunk)
        if per.get(stream) is not None:
            per[stream](chunk)
    return fan_out


def _unique(images):
    seen, out = set(), []
    for i in images:
        if i.id not in seen:
            seen.add(i.id)
            out.append(i)
    return out
