"""`sandtree mcp`: the engine as MCP tools, resources and prompts (official `mcp` SDK, MCPServer).

An adapter like the CLI: every tool is a few lines over engine.Engine (embedded, same process),
and every engine error comes back as a tool error with its message. Results are compact for a
model: ids first, outputs cut at `truncate_output_at` with a marker that says how to read the
rest (get_operation with an offset).

Transports: stdio (default) or streamable HTTP (`--http --port P`). Over HTTP the server is
`sandtree serve`'s equal, not a side door (issue 12 item 4): the same tokens and tenancy
(httpauth.TenantGate turns each HTTP request's bearer token into that tenant's view of the engine,
and every tool call runs as the caller of the request that carried it); a non-loopback bind
without tokens is refused; a session belongs to the tenant that opened it; and the tools that
touch the *server's* filesystem (import_image of a path, upload path=, rsync, download
destination=) are off, since the caller is not the server's user: over HTTP, files come in by
content (upload, then import_image("upload:SHA256") for an image tar) and go out by read_file.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import fnmatch
import functools
import inspect
import json
import logging
import os
import sys
import tempfile
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.resources.templates import ResourceSecurity
from pydantic import Field

from .. import defaults as D
from .. import vocabulary
from ..render import render_text
from ..engine import Engine
from ..errors import Forbidden, SandtreeError
from ..tenancy.gate import CURRENT, JsonLog, RequestEngine, TenantGate, engine_for

LOOPBACK = ("127.0.0.1", "localhost", "::1")
OUTPUTS_KEPT = 128 << 20          # bytes of recent runs' full output kept for get_operation(offset=)
MAX_UPLOAD_IMPORT = 256 << 20     # bytes of an upload import_image("upload:SHA") reads into memory
MAX_READ = 4 << 20                # bytes of a file one read_file call or resource read returns
MAX_FORK, MAX_FORK_PARALLEL = 256, 32      # a fork's commands, and its threads (each holds a run)
TOOL_THREADS = 256                # sync tool calls at once over HTTP (anyio's default: 40, shared)
HOST_PATHS_OFF = ("paths on the server's filesystem are off over MCP HTTP (the caller is not the "
                  "server's user)")

GUIDE = {
    "workflow": """sandtree: every filesystem state is an immutable image with a content ID.
1. Find a base: list_images (tags such as debian:bookworm). import_image only if none fits.
2. run(command, image, disposable=false) -> result_image: the new state. Chain runs on result_image.
   A run that changes nothing returns the same image ID; the same change gives the same ID.
3. Name states with set_tag ({scope}/{purpose}/{base}, e.g. me/deps/debian:bookworm).
4. Inspect without running: list_files, read_file, grep. Files in: upload/rsync, then run(files=...).""",
    "branching": """Explore safely:
- fork(image, commands) runs N variants in parallel from one image; keep the best result_image.
- diff(a, b) shows what differs; merge(ours, theirs) combines two branches (base found from lineage);
  conflicts make no image and fail the call with merge_conflict listing them, unless strategy is
  ours/theirs/markers; __pycache__/, *.pyc and .pytest_cache/ never conflict (ours taken; see ignore).
- branch_create(name, image) then run(image="branch:NAME") advances the branch; rollback(name, steps=1)
  undoes the last run; lineage(image) shows the tree of what came from an image.""",
    "async": """run(..., wait=false) returns an operation_id at once. wait_operations([ids], timeout) waits;
get_operation(id) shows status and output; cancel_operation(id) stops a queued or running one.""",
    "live": """A live sandbox stays up between commands (a dev server, a REPL, a shell's cwd):
sandbox_start(image) -> sandbox_id. sandbox_exec(sandbox_id, command) runs in its shell session: cd and
export carry over; background processes (server &) keep running. sandbox_read_file/sandbox_write_file
reach its files while it runs. sandbox_commit(sandbox_id) -> an image of it now (branch from it like any
image). sandbox_hibernate frees its CPU and memory but keeps everything (processes and memory too);
sandbox_resume continues it. sandbox_stop when done (it also stops after idle_timeout or lifetime seconds).""",
    "errors": """Errors name their kind: image_not_found, path_not_found, path_escape (a path leaving the image),
invalid_input (bad arguments; nothing changed), command_not_found, sandbox_error, runtime_unavailable.
A timed-out run reports timed_out=true; an out-of-memory one oom_killed=true.""",
}


def described(fn) -> inspect.Signature:
    """The tool's signature with a description on every parameter, so a model sees what each one
    means: a `name: text` line of the tool's own docstring where the tool means something of its
    own, else the vocabulary's (vocabulary.describe: the operation row's, then the shared meaning)."""
    sig = inspect.signature(fn, eval_str=True)
    own = {}
    for line in (fn.__doc__ or "").splitlines():
        name, sep, text = line.strip().partition(": ")
        if sep and name.isidentifier() and name in sig.parameters:
            own[name] = text.strip()
    params = []
    for p in sig.parameters.values():
        text = own.get(p.name) or vocabulary.describe(fn.__name__, p.name)
        if text is None:
            raise AssertionError(f"MCP tool {fn.__name__}: parameter {p.name} has no description")
        params.append(p.replace(annotation=Annotated[p.annotation, Field(description=text)]))
    return sig.replace(parameters=params)


def _cut(data: bytes, limit: int) -> tuple[str, bool]:
    text = data.decode("utf-8", "replace")
    if len(text) <= limit:
        return text, False
    return text[:limit], True


class _PerRequestServer(MCPServer):
    """Over HTTP: each tool call and resource read runs as the caller of the HTTP request that
    carried it. The tool runs in the session's task, not the request's, so the view TenantGate
    put on that request's scope is set as the current engine here (fails closed without one)."""

    @contextlib.contextmanager
    def _as_caller(self, context):
        request = getattr(getattr(context, "_request_context", None), "request", None)
        if request is None:
            raise RuntimeError("an MCP HTTP call without its HTTP request: refusing to serve unscoped")
        token = CURRENT.set(engine_for(request))
        try:
            yield
        finally:
            CURRENT.reset(token)

    async def call_tool(self, name, arguments, context=None):
        if context is None:                         # nested call: already inside a caller's context
            return await super().call_tool(name, arguments, context)
        with self._as_caller(context):
            return await super().call_tool(name, arguments, context)

    async def read_resource(self, uri, context=None):
        if context is None:
            return await super().read_resource(uri, context)
        with self._as_caller(context):
            return await super().read_resource(uri, context)


def build_server(engine: Engine, *, host_paths: bool = True, per_request: bool = False) -> MCPServer:
    """host_paths: whether tools may read and write paths of this machine (stdio: the caller is
    the server's own user; HTTP: off). per_request: `engine` is a RequestEngine, set per call
    from the HTTP request (see _PerRequestServer)."""
    cls = _PerRequestServer if per_request else MCPServer
    server = cls("sandtree", instructions=GUIDE["workflow"] + "\n\n" + GUIDE["branching"])

    def no_host_paths(what: str) -> None:
        if not host_paths:
            raise ToolError(f"{Forbidden.code}: {what}: {HOST_PATHS_OFF}")
    outputs: OrderedDict[str, tuple[bytes, bytes]] = OrderedDict()     # full output of recent runs
    kept = [0]                                                          # bytes in `outputs`

    def remember(op: str, stdout: bytes, stderr: bytes) -> None:
        old = outputs.pop(op, None)
        if old is not None:
            kept[0] -= len(old[0]) + len(old[1])
        outputs[op] = (stdout, stderr)
        kept[0] += len(stdout) + len(stderr)
        # the newest 200 runs within OUTPUTS_KEPT bytes (each run's output is capped, not the sum)
        while len(outputs) > 1 and (len(outputs) > 200 or kept[0] > OUTPUTS_KEPT):
            _, (o, e) = outputs.popitem(last=False)
            kept[0] -= len(o) + len(e)

    def guard(fn):
        """Engine errors become tool errors with their kind and message (never a crash); every
        parameter carries its description from the operation table (described())."""

        @functools.wraps(fn)
        def wrapper(*a, **k):
            try:
                return fn(*a, **k)
            except SandtreeError as exc:
                raise ToolError(f"{exc.code}: {exc.message}") from None
        wrapper.__signature__ = described(fn)
        return wrapper

    def run_result(rec, limit: int) -> dict:
        remember(rec.op, rec.stdout, rec.stderr)
        out, cut_out = _cut(rec.stdout, limit)
        err, cut_err = _cut(rec.stderr, limit)
        res = {"operation_id": rec.op, "result_image": rec.image, "exit_code": rec.exit_code,
               "signal": rec.signal, "timed_out": rec.timed_out, "oom_killed": rec.oom_killed,
               "stdout": out, "stderr": err}
        if cut_out or cut_err or rec.stdout_truncated or rec.stderr_truncated:
            res["truncated"] = (f"output cut at {limit} characters (stdout {len(rec.stdout)} bytes, stderr "
                                f"{len(rec.stderr)} bytes kept); read the rest with get_operation("
                                f"operation_id='{rec.op}', offset={limit})")
        return res

    def files_arg(files: dict[str, str] | None) -> list[dict]:
        return [{"path": p, "sha256": h} for p, h in (files or {}).items()]

    # ---- running ------------------------------------------------------------------------------
    @server.tool()
    @guard
    def run(command: str, image: str, shell: bool = True, env: dict[str, str] | None = None, cwd: str = "/",
            uid: int = 0, gid: int = 0, timeout: float = D.MCP_TIMEOUT, disposable: bool = True, stdin: str | None = None,
            files: dict[str, str] | None = None, directory_state_id: str | None = None, wait: bool = True,
            truncate_output_at: int = 8000, tier: str | None = None, memory: str | None = None,
            pids: int | None = None, cpus: float | None = None, disk: str | None = None) -> dict:
        """Run a command in a fresh sandbox on an image (an ID, a tag, or branch:NAME).

        shell=true runs `command` with /bin/sh -c; false splits it on spaces into argv.
        disposable=false keeps what the command wrote as a new image: result_image (chain further
        runs on it). files: {"/path/in/image": "<sha256 from upload>"}; directory_state_id: a set
        from rsync. wait=false returns {"operation_id"} at once (see wait_operations). memory,
        disk ("512M", "2G"), pids and cpus: the sandbox's limits (default: the server's).
        Returns exit_code, stdout, stderr (cut at truncate_output_at, with a marker), result_image,
        timed_out, oom_killed."""
        cmd = command if shell else command.split()
        opts = dict(env=env, cwd=cwd or "/", uid=uid, gid=gid, timeout=timeout, disposable=disposable,
                    stdin=stdin.encode() if stdin else None, files=files_arg(files),
                    file_set=directory_state_id, tier=tier)
        opts.update({k: v for k, v in (("memory", memory), ("pids", pids), ("cpus", cpus), ("disk", disk))
                     if v is not None})
        if not wait:
            return {"operation_id": engine.operations.submit_run(image, cmd, **opts)}
        return run_result(engine.run(image, cmd, **opts), truncate_output_at)

    @server.tool()
    @guard
    def fork(image: str, commands: list[str], parallel: int = 4, timeout: float = D.MCP_TIMEOUT, disposable: bool = False,
             truncate_output_at: int = 2000) -> list[dict]:
        """Run several commands from the same image concurrently (one branch each); results in order.
        Keep the branch you like by its result_image (disposable=false is the default here)."""
        if not commands:
            raise ToolError("invalid_input: give at least one command")
        if len(commands) > MAX_FORK:
            raise ToolError(f"invalid_input: at most {MAX_FORK} commands in one fork")
        parallel = min(parallel, MAX_FORK_PARALLEL)
        with ThreadPoolExecutor(max(1, min(parallel, len(commands)))) as pool:
            # each branch runs in a copy of this call's context: over HTTP it holds the caller's view
            futs = [pool.submit(contextvars.copy_context().run, engine.run, image, c, timeout=timeout,
                                disposable=disposable) for c in commands]
            recs = [f.result() for f in futs]
        return [dict(run_result(r, truncate_output_at), command=c) for c, r in zip(commands, recs, strict=True)]

    # ---- live sandboxes -------------------------------------------------------------------------
    @server.tool()
    @guard
    def sandbox_start(image: str, timeout: float = D.MCP_TIMEOUT, memory: str | None = None, env: dict[str, str] | None = None,
                      cwd: str = "/", idle_timeout: float = D.SANDBOX_IDLE_TIMEOUT, lifetime: float = D.SANDBOX_LIFETIME,
                      idle_action: str = "stop") -> dict:
        """Start a live sandbox on an image; it keeps processes and files between sandbox_exec calls.
        timeout: default seconds per command; idle_timeout/lifetime: seconds until it is stopped;
        idle_action "hibernate": when idle it is hibernated instead (sandbox_resume continues it)."""
        return engine.sandbox_start(image, timeout=timeout, memory=memory, env=env, cwd=cwd,
                                    idle_timeout=idle_timeout, lifetime=lifetime, idle_action=idle_action)

    @server.tool()
    @guard
    def sandbox_exec(sandbox_id: str, command: str, shell: bool = True, timeout: float | None = None,
                     stdin: str | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
                     truncate_output_at: int = 8000) -> dict:
        """Run a command in a live sandbox. shell=true: in its shell session (cd and export carry over
        to the next call); false: a fresh process (command split on spaces). Background processes
        it starts keep running. Returns exit_code, stdout, stderr."""
        rec = engine.sandbox_exec(sandbox_id, command if shell else command.split(), timeout=timeout,
                                  stdin=stdin, cwd=cwd, env=env)
        res = run_result(rec, truncate_output_at)
        res.pop("result_image")
        return res

    @server.tool()
    @guard
    def sandbox_commit(sandbox_id: str, tag: str | None = None) -> dict:
        """An image of the live sandbox's filesystem now (it keeps running): run, fork or merge it."""
        return {"image": engine.sandbox_commit(sandbox_id, tag=tag), "tag": tag}

    @server.tool()
    @guard
    def sandbox_stop(sandbox_id: str) -> dict:
        """Stop a live sandbox: its processes end and its unsaved files go (sandbox_commit first to keep them)."""
        return engine.sandbox_stop(sandbox_id)

    @server.tool()
    @guard
    def sandbox_hibernate(sandbox_id: str) -> dict:
        """Hibernate a live sandbox: its files are committed and its processes saved with their
        memory, then CPU and memory are freed. sandbox_resume brings it back exactly where it was."""
        return engine.sandbox_hibernate(sandbox_id)

    @server.tool()
    @guard
    def sandbox_resume(sandbox_id: str) -> dict:
        """Resume a hibernated live sandbox: the same processes continue with the same memory and files."""
        return engine.sandbox_resume(sandbox_id)

    @server.tool()
    @guard
    def sandbox_list(all: bool = False) -> list[dict]:
        """Running live sandboxes (all=true: also stopped and expired ones)."""
        return engine.sandbox_list(all=all)

    @server.tool()
    @guard
    def sandbox_read_file(sandbox_id: str, path: str, offset: int = 0, limit: int = 100_000) -> dict:
        """A file of a running live sandbox, as text (binary bytes replaced)."""
        data = engine.sandbox_read(sandbox_id, path)
        chunk = data[offset:offset + limit]
        return {"path": path, "size": len(data), "content": chunk.decode("utf-8", "replace"),
                "truncated": offset + limit < len(data)}

    @server.tool()
    @guard
    def sandbox_write_file(sandbox_id: str, path: str, content: str, mode: int = 0o644) -> dict:
        """Write a text file into a running live sandbox (its directory must exist)."""
        engine.sandbox_write(sandbox_id, path, content.encode(), mode=mode)
        return {"path": path, "size": len(content.encode())}

    # ---- operations ---------------------------------------------------------------------------
    def op_view(rec: dict, offset: int = 0, limit: int = 8000) -> dict:
        view = {"operation_id": rec["id"], "status": rec["status"], "image": rec["source"],
                "result_image": rec["result"], "command": rec["spec"].get("command")}
        o = rec["outcome"] or {}
        view.update({k: o[k] for k in ("exit_code", "signal", "timed_out", "oom_killed", "cancelled",
                                       "error", "message") if k in o})
        if rec["id"] in outputs:
            stdout, stderr = outputs[rec["id"]]
            view["stdout"], cut1 = _cut(stdout[offset:], limit)
            view["stderr"], cut2 = _cut(stderr[offset:], limit)
            if cut1 or cut2:
                view["truncated"] = f"more output: call get_operation again with offset={offset + limit}"
        return view

    @server.tool()
    @guard
    def get_operation(operation_id: str, offset: int = 0) -> dict:
        """Status and result of an operation (run); output from byte `offset` on."""
        rec = engine.operations.get(operation_id)
        done = engine.operations.result(operation_id)
        if done is not None:
            remember(done.op, done.stdout, done.stderr)
        return op_view(rec, offset)

    @server.tool()
    @guard
    def wait_operations(operation_ids: list[str], timeout: float = 60) -> list[dict]:
        """Wait (up to timeout seconds, at most 600) for operations to finish; returns their states."""
        if len(operation_ids) > 1000:
            raise ToolError("invalid_input: at most 1000 operation ids")
        recs = engine.operations.wait(operation_ids, max(0.0, min(float(timeout), 600.0)))
        for op in operation_ids:
            done = engine.operations.result(op)
            if done is not None:
                remember(done.op, done.stdout, done.stderr)
        return [op_view(r) for r in recs]

    @server.tool()
    @guard
    def list_operations(status: str | None = None, limit: int = 20) -> list[dict]:
        """Recent runs, newest first; status: queued, running, done, failed, cancelled."""
        return [op_view(r, limit=200) for r in engine.operations.list(status=status, limit=limit)]

    @server.tool()
    @guard
    def cancel_operation(operation_id: str) -> dict:
        """Cancel a queued or running operation (a running sandbox is killed; nothing is committed)."""
        return op_view(engine.operations.cancel(operation_id))

    # ---- images -------------------------------------------------------------------------------
    @server.tool()
    @guard
    def import_image(source: str, tag: str | None = None) -> dict:
        """Import an image: docker://HOST/NAME:TAG from a registry (see registry_auth),
        `upload:SHA256` (a tar, gz/zst, OCI or docker archive stored with upload), a local
        directory, tar, OCI layout or docker-archive path (stdio only), or `debian:SUITE` to
        bootstrap Debian (slow: tens of seconds). Prefer existing images (list_images)."""
        if source.startswith("debian:"):
            image = engine.bootstrap(source, tag=tag)
        elif source.startswith(("docker://", "oci://")):
            image = engine.pull(source, tag=tag)
        elif source.startswith("upload:"):
            size = engine.upload_info(source[7:])["size"]     # the caller's own, or not found
            if size > MAX_UPLOAD_IMPORT:
                raise ToolError(f"too_large: an upload:SHA import is at most {MAX_UPLOAD_IMPORT >> 20} MiB "
                                "(it passes through memory); import bigger tars with POST /api/v1/images/import")
            data = engine.download(source[7:])
            fd, tmp = tempfile.mkstemp(prefix="sandtree-mcp-", suffix=".tar")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                del data
                image = engine.import_path(tmp, tag=tag)
            finally:
                os.unlink(tmp)
        else:
            no_host_paths("import_image of a path")
            image = engine.import_path(source, tag=tag)
        return {"image": image, "tag": tag}

    @server.tool()
    @guard
    def list_images(tag_prefix: str | None = None, limit: int = 100) -> list[dict]:
        """Images with their tags, newest last; tag_prefix filters by tag."""
        rows = engine.images()
        if tag_prefix:
            rows = [r for r in rows if any(t.startswith(tag_prefix) for t in r["tags"])]
        return [{"image": r["id"], "tags": r["tags"], "files": r["files"], "size": r["size"]} for r in rows[-limit:]]

    @server.tool()
    @guard
    def get_image(image: str) -> dict:
        """One image: id, tags, size, parents and the command that made it."""
        i = engine.resolve(image)
        info = engine.image_info(i)
        return {"image": i, "tags": info["tags"], "files": info["files"], "size": info["size"],
                "parents": info["parents"], "made_by": engine.produced_by(i)[:1]}

    @server.tool()
    @guard
    def set_tag(image: str, tag: str) -> dict:
        """Point a tag at an image (moves it if it exists). Convention: {scope}/{purpose}/{base}."""
        i = engine.resolve(image)
        engine.tag(i, tag)
        return {"image": i, "tag": tag}

    # ---- files --------------------------------------------------------------------------------
    @server.tool()
    @guard
    def upload(content: str | None = None, content_base64: str | None = None, path: str | None = None) -> dict:
        """Store a file once (text, base64, or a local path); returns its sha256 for run(files=...)."""
        if sum(x is not None for x in (content, content_base64, path)) != 1:
            raise ToolError("invalid_input: give exactly one of content, content_base64, path")
        if path is not None:
            no_host_paths("upload path=")
            with open(path, "rb") as f:
                data = f.read()
        elif content_base64 is not None:
            data = base64.b64decode(content_base64, validate=True)
        else:
            data = content.encode()
        digest = engine.upload(data)
        return {"uuid": digest, "sha256": digest, "size": len(data)}

    @server.tool()
    @guard
    def rsync(source: str, destination: str, exclude: list[str] | None = None) -> dict:
        """Sync a local directory into a reusable file set (uploaded once, deduplicated by content),
        injected at `destination` by run(directory_state_id=...)."""
        no_host_paths("rsync")
        if not os.path.isdir(source):
            raise ToolError(f"invalid_input: {source} is not a directory")
        if not destination.startswith("/"):
            raise ToolError("invalid_input: destination must be an absolute path in the image")
        entries = []
        for root, dirs, names in os.walk(source):
            rel_root = os.path.relpath(root, source)
            dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, p) for p in exclude or [])]
            for n in sorted(names):
                if any(fnmatch.fnmatch(n, p) for p in exclude or []):
                    continue
                full = os.path.join(root, n)
                if not os.path.isfile(full) or os.path.islink(full):
                    continue
                with open(full, "rb") as f:
                    digest = engine.upload(f.read())
                rel = n if rel_root == "." else os.path.join(rel_root, n)
                entries.append({"path": destination.rstrip("/") + "/" + rel, "sha256": digest,
                                "mode": os.stat(full).st_mode & 0o7777})
        return {"directory_state_id": engine.file_set_create(entries), "files": len(entries)}

    @server.tool()
    @guard
    def download(image: str, path: str, destination: str) -> dict:
        """Copy one file out of an image to a local path (stdio only: over HTTP use read_file)."""
        no_host_paths("download destination=")
        data = engine.read(engine.resolve(image), path)
        with open(destination, "wb") as f:
            f.write(data)
        return {"destination": destination, "size": len(data)}

    @server.tool()
    @guard
    def list_files(image: str, path: str = "/") -> list[dict]:
        """A directory of an image (no sandbox is started)."""
        return [{k: v for k, v in e.to_dict().items() if k in ("name", "type", "mode", "size", "target")}
                for e in engine.ls(engine.resolve(image), path)]

    @server.tool()
    @guard
    def read_file(image: str, path: str, offset: int = 0, limit: int = 64000) -> dict:
        """Read a file of an image (text, or base64 for binary), from byte `offset`, at most `limit`
        bytes (at most 4 MiB a call: read on with offset)."""
        if offset < 0 or limit < 0:
            raise ToolError("invalid_input: offset and limit are not negative")
        limit = min(limit, MAX_READ)
        i = engine.resolve(image)
        size = engine.stat(i, path).to_dict().get("size", 0)
        data = engine.read(i, path, offset, limit)
        try:
            res = {"content": data.decode("utf-8"), "encoding": "text"}
        except UnicodeDecodeError:
            res = {"content": base64.b64encode(data).decode(), "encoding": "base64"}
        res["size"] = size
        if offset + len(data) < size:
            res["truncated"] = f"{size - offset - len(data)} more bytes: read again with offset={offset + len(data)}"
        return res

    @server.tool()
    @guard
    def grep(image: str, pattern: str, path: str = "/", glob: str | None = None, max_matches: int = 100,
             ignore_case: bool = False) -> list[dict]:
        """Search file contents of an image with a regular expression (no sandbox is started)."""
        return engine.grep(engine.resolve(image), pattern, path, glob=glob, max_matches=max_matches,
                           ignore_case=ignore_case)

    # ---- branching ----------------------------------------------------------------------------
    @server.tool()
    @guard
    def diff(a: str, b: str, patch: bool = False) -> dict:
        """What changed from image a to image b (paths and kinds); patch=true adds a unified text diff."""
        ia, ib = engine.resolve(a), engine.resolve(b)
        res = {"a": ia, "b": ib, "changes": [{"path": c.path, "kind": c.kind} for c in engine.diff(ia, ib)]}
        if patch:
            res["patch"] = engine.patch(ia, ib)
        return res

    @server.tool()
    @guard
    def merge(ours: str, theirs: str, base: str | None = None, strategy: str | None = None,
              ignore: list[str] | None = None, return_conflicts: bool = False) -> dict:
        """Three-way merge of two images (base: their common ancestor unless given). Conflicts make no
        image unless strategy is ours, theirs or markers (conflict markers in text files): the call
        fails with merge_conflict naming them (return_conflicts=true: returned as a list, image null).
        ignore: globs that never conflict, ours taken (default __pycache__/, *.pyc, .pytest_cache/)."""
        return engine.merge(engine.resolve(base) if base else None, engine.resolve(ours), engine.resolve(theirs),
                            strategy=strategy, ignore=ignore, on_conflict="return" if return_conflicts else "raise")

    @server.tool()
    @guard
    def lineage(image: str, format: str = "text") -> dict:
        """The tree of images made from `image` (text or json), with the commands between them."""
        t = engine.lineage_tree(engine.resolve(image))
        if format == "json":
            return {"tree": t}
        if format != "text":
            raise ToolError("invalid_input: format is text or json")
        return {"tree": render_text(t), "ancestry": engine.log(engine.resolve(image), limit=20)}

    @server.tool()
    @guard
    def branch_create(name: str, image: str, force: bool = False) -> dict:
        """A branch: a name that run(image="branch:NAME") advances; rollback moves it back."""
        i = engine.resolve(image)
        engine.branch_create(name, i, force=force)
        return {"branch": name, "image": i}

    @server.tool()
    @guard
    def branch_list() -> dict:
        """Branches and the images they point at."""
        return engine.branches()

    @server.tool()
    @guard
    def rollback(branch: str, steps: int | None = None, to: str | None = None) -> dict:
        """Move a branch back: `steps` moves back in its history, or `to` an ancestor image."""
        return {"branch": branch, "image": engine.rollback(branch, steps=steps, to=engine.resolve(to) if to else None)}

    @server.tool()
    @guard
    def registry_auth(registry_url: str, username: str, token: str) -> dict:
        """Check registry credentials (a read-only personal access token) against the registry's
        /v2/ API and keep them for import_image("docker://..."). "docker://ghcr.io/org/x" -> ghcr.io."""
        host = engine.registry_login(registry_url, username, token)
        return {"status": "success", "registry": host, "message": f"credentials for {host} stored"}

    @server.tool()
    @guard
    def registry_token_obtain(registry_url: str) -> dict:
        """Where to create a read-only token for a registry (then call registry_auth with it)."""
        from ..store.registry import registry_host
        host = registry_host(registry_url)
        pages = {"ghcr.io": "https://github.com/settings/tokens (scope: read:packages)",
                 "registry-1.docker.io": "https://app.docker.com/settings/personal-access-tokens (read-only)",
                 "registry.gitlab.com": "https://gitlab.com/-/user_settings/personal_access_tokens (read_registry)"}
        return {"registry": host, "create_token_at": pages.get(host, f"the web settings of {host}"),
                "next": "registry_auth(registry_url, username, token)"}

    # ---- about --------------------------------------------------------------------------------
    @server.tool()
    @guard
    def whoami() -> dict:
        """This server: embedded engine, its store, tiers, and the default limits of a run."""
        who = engine.whoami()
        res = {"user": who["tenant"], "mode": "remote" if engine.home.startswith("http") else "embedded",
               "store": engine.home, "permissions": who["scopes"], "limits": who["limits"],
               "tiers": engine.doctor()}
        if not host_paths:
            res.pop("store")                # a path on the server's disk: none of an HTTP caller's business
        return res

    @server.tool()
    @guard
    def get_guide(section: str = "workflow") -> str:
        """How to use sandtree well: workflow, branching, async, errors."""
        if section not in GUIDE:
            raise ToolError(f"invalid_input: sections are {', '.join(GUIDE)}")
        return GUIDE[section]

    # ---- resources and prompts ----------------------------------------------------------------
    path_ok = ResourceSecurity(exempt_params=frozenset({"path"}))

    @server.resource("sandtree://image/{image}/read/{+path}", security=path_ok, mime_type="text/plain")
    def resource_read(image: str, path: str) -> str:
        """A file of an image."""
        try:
            data = engine.read(engine.resolve(image), "/" + path, 0, MAX_READ + 1)
            text = data[:MAX_READ].decode("utf-8", "replace")
            return text + ("\n[cut at 4 MiB: read the rest with the read_file tool and an offset]"
                           if len(data) > MAX_READ else "")
        except SandtreeError as exc:
            raise ValueError(f"{exc.code}: {exc.message}") from None

    @server.resource("sandtree://image/{image}/ls/{+path}", security=path_ok, mime_type="application/json")
    def resource_ls(image: str, path: str) -> str:
        """A directory listing of an image."""
        try:
            return json.dumps([e.to_dict() for e in engine.ls(engine.resolve(image), "/" + path)])
        except SandtreeError as exc:
            raise ValueError(f"{exc.code}: {exc.message}") from None

    @server.resource("sandtree://image/{image}/lineage", mime_type="text/plain")
    def resource_lineage(image: str) -> str:
        """The lineage tree under an image."""
        try:
            return render_text(engine.lineage_tree(engine.resolve(image)))
        except SandtreeError as exc:
            raise ValueError(f"{exc.code}: {exc.message}") from None

    @server.resource("sandtree://guide", mime_type="text/markdown")
    def resource_guide() -> str:
        """The agent guide: workflow, branching patterns, async use, errors."""
        return "\n\n".join(f"## {k}\n{v}" for k, v in GUIDE.items())

    @server.prompt()
    def prepare_environment(base: str, setup_commands: str, tag: str) -> str:
        """Build a reusable environment once and tag it."""
        return (f"Prepare a reusable environment on image {base!r}: run each of these setup commands with "
                f"disposable=false, chaining on result_image: {setup_commands}. Check the last one succeeded, "
                f"then set_tag(result_image, {tag!r}). Later work starts from {tag!r}.")

    @server.prompt()
    def tree_search_fix(image: str, test_command: str, candidates: int = 3) -> str:
        """Try several fixes in parallel branches and keep the one whose tests pass."""
        return (f"From image {image!r}, write {candidates} different candidate fixes. Use fork(image, commands) "
                f"with one command per candidate that applies it and then runs {test_command!r}. Compare exit "
                f"codes, keep the passing result_image, diff it against {image!r} to review, and set_tag it.")

    @server.prompt()
    def safe_destructive(image: str, command: str) -> str:
        """Run a risky command where it can be undone."""
        return (f"Create a branch at {image!r} (branch_create), run {command!r} on image='branch:NAME', inspect "
                f"with diff/list_files, and if anything is wrong call rollback(branch, steps=1).")

    return server


def main(home: str, *, http: bool = False, host: str = "127.0.0.1", port: int = 8765, url: str | None = None,
         token: str | None = None) -> None:
    """url: use the engine of a `sandtree serve` there instead of one in this process."""
    if url:

        from ..client.remote import RemoteEngine
        if http and host not in LOOPBACK:
            # every HTTP caller would act with this process's one token: loopback only
            raise SystemExit(f"sandtree mcp --http --url: listens on loopback only (asked for {host})")
        logging.getLogger("httpx").setLevel(logging.WARNING)   # not a log line per engine call
        engine = RemoteEngine(url, token)
    else:
        engine = Engine(home)
    try:
        if not http:
            build_server(engine).run("stdio")
        elif url:
            _serve_http(build_server(engine, host_paths=False), None, host, port)
        else:
            tokens = engine.tenancy.configured()
            if host not in LOOPBACK and not tokens:
                raise SystemExit("sandtree mcp --http: no tokens are configured, so it listens on loopback only "
                                 f"(asked for {host}); create one with `sandtree token create --tenant NAME`")
            server = build_server(RequestEngine(), host_paths=False, per_request=True)
            _serve_http(server, engine, host, port)
    finally:
        engine.close()


def _serve_http(server: MCPServer, engine: Engine | None, host: str, port: int) -> None:
    """engine: the one the TenantGate authenticates against (None: a remote engine, no gate)."""

    import uvicorn
    app = server.streamable_http_app(host=host)
    if engine is not None:
        app = TenantGate(SessionOwners(app), engine, JsonLog(sys.stderr))
        auth = "tokens" if engine.tenancy.configured() else "none: no tokens configured, loopback only"
        print(f"sandtree mcp: http://{host}:{port}/mcp (auth: {auth})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


class SessionOwners:
    """ASGI middleware behind TenantGate: an MCP session belongs to the tenant that opened it.
    A request naming another tenant's session id gets the answer an unknown session gets (404),
    so a leaked or guessed session id is worth nothing to another token."""

    MAX = 10000                              # sessions remembered (the SDK caps live ones lower)

    def __init__(self, app):
        self.app = app
        self.owners: OrderedDict[bytes, str] = OrderedDict()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            # sync tools run on anyio's thread limiter (40 tokens): 40 callers waiting on runs
            # would stall every tenant's tools; the limit is per event loop, set here in it
            anyio.to_thread.current_default_thread_limiter().total_tokens = TOOL_THREADS
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        view = engine_for_scope(scope)
        who = getattr(getattr(view, "tenant", None), "name", None) or "-"
        sid = dict(scope.get("headers") or []).get(b"mcp-session-id")
        if sid is not None and self.owners.get(sid, who) != who:
            body = json.dumps({"jsonrpc": "2.0", "id": None,
                               "error": {"code": -32600, "message": "Session not found"}}).encode()
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            return await send({"type": "http.response.body", "body": body})

        async def send_owned(message):
            if message["type"] == "http.response.start":
                for k, v in message.get("headers") or []:
                    if k.lower() == b"mcp-session-id" and v not in self.owners:
                        self.owners[v] = who
                        while len(self.owners) > self.MAX:
                            self.owners.popitem(last=False)
            await send(message)
        await self.app(scope, receive, send_owned)


def engine_for_scope(scope):
    from ..tenancy.gate import STATE_KEY
    view = scope.get("state", {}).get(STATE_KEY)
    if view is None:
        raise RuntimeError("no TenantGate in front of the MCP app: refusing to serve unscoped")
    return view
