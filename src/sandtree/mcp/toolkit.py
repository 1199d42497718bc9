"""What every group of MCP tools shares: the engine, registering a tool (engine errors become tool
errors, every parameter described), the host-paths switch, and the recent runs' full output.

Results are compact for a model: ids first, outputs cut at `truncate_output_at` with a marker
that says how to read the rest (get_operation with an offset), from the output kept here.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import shlex
from collections import OrderedDict
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from pydantic import Field

from .. import defaults as D, vocabulary
from ..errors import Forbidden, InvalidInput, SandtreeError

OUTPUTS_KEPT = 128 << 20          # bytes of recent runs' full output kept for get_operation(offset=)
OUTPUTS_RUNS = 200                # runs whose full output is kept, at most
# the MCP session a tool call belongs to, and the engine as its caller sees it: (None, None) over stdio (one session,
# the toolkit's engine); over HTTP the session's id and the tenant's view (transport.PerRequestServer sets it)
SESSION: contextvars.ContextVar = contextvars.ContextVar("sandtree_mcp_session", default=(None, None))
HOST_PATHS_OFF = ("paths on the server's filesystem are off over MCP HTTP (the caller is not the "
                  "server's user)")


def error_text(exc: SandtreeError) -> str:
    """What a model reads of an engine error: the error class's own code, then its message (every MCP
    error is one of sandtree.errors: no code is written in mcp/)."""
    return f"{exc.code}: {exc.message}"


def described(fn, describe=None, name: str | None = None) -> inspect.Signature:
    """The tool's signature with a description on every parameter, so a model sees what each one means:
    `describe(param)` (maker.describe: the tool's own `name: text` lines, the vocabulary's for this tool,
    the row's, the shared meaning), else the vocabulary's for a tool of no row."""
    sig = fn if isinstance(fn, inspect.Signature) else inspect.signature(fn, eval_str=True)
    name = name or getattr(fn, "__name__", "?")
    if describe is None:
        own = {}
        for line in (fn.__doc__ or "").splitlines():
            key, sep, text = line.strip().partition(": ")
            if sep and key.isidentifier() and key in sig.parameters:
                own[key] = text.strip()
        describe = lambda p: own.get(p) or vocabulary.describe(name, p)   # noqa: E731
    params = []
    for p in sig.parameters.values():
        text = describe(p.name)
        if text is None:
            raise AssertionError(f"MCP tool {name}: parameter {p.name} has no description")
        params.append(p.replace(annotation=Annotated[p.annotation, Field(description=text)]))
    return sig.replace(parameters=params)


def guard(fn, signature: inspect.Signature | None = None):
    """Engine errors become tool errors with their code and message (never a crash); every parameter
    carries its description (described()). A list comes back as one JSON array, as text and as structured
    content {"result": [...]} (the SDK would make one text block of each item)."""

    @functools.wraps(fn)
    def wrapper(*a, **k):
        try:
            out = fn(*a, **k)
        except SandtreeError as exc:
            raise ToolError(error_text(exc)) from None
        if isinstance(out, list):
            text = json.dumps(out, default=str)
            return CallToolResult(content=[TextContent(type="text", text=text)],
                                  structured_content={"result": json.loads(text)})
        return out
    wrapper.__signature__ = signature or described(fn)
    return wrapper


def narrowed(fn, signature: inspect.Signature, shown: tuple[str, ...]):
    """A tool showing only the parameters `shown` (the core profile's, Mcp(core=...)); the others are passed
    with their defaults, so the body is the full tool's."""
    params = signature.parameters
    missing = [n for n in shown if n not in params]
    assert not missing, f"MCP tool {fn.__name__}: its core parameters {missing} are not its parameters"
    hidden = {n: p.default for n, p in params.items() if n not in shown}
    required = [n for n, d in hidden.items() if d is inspect.Parameter.empty]
    assert not required, f"MCP tool {fn.__name__}: the core profile hides its required parameters {required}"

    @functools.wraps(fn)
    def call(**kw):
        return fn(**{**hidden, **kw})
    return call, signature.replace(parameters=[p for n, p in params.items() if n in shown])


def followed(fn, hook):
    @functools.wraps(fn)
    def call(**kw):
        out = fn(**kw)
        hook(out)
        return out
    return call


def untitled(schema):
    """A JSON schema without pydantic's titles (each a property's name again, title-cased): a model reads
    every character of every tool's schema, these say nothing."""
    if isinstance(schema, dict):
        return {k: ({p: untitled(v) for p, v in val.items()} if k in ("properties", "$defs") else untitled(val))
                for k, val in schema.items() if not (k == "title" and isinstance(val, str))}
    if isinstance(schema, list):
        return [untitled(v) for v in schema]
    return schema


class Server(MCPServer):
    """The MCP server, its tools listed without titles (untitled()); toolkit: its Toolkit (build_server)."""
    toolkit: "Toolkit | None" = None

    async def list_tools(self):
        return [t.model_copy(update={"input_schema": untitled(t.input_schema),
                                     "output_schema": untitled(t.output_schema) if t.output_schema else None})
                for t in await super().list_tools()]


def argv(command: str | list[str], shell: bool) -> str | list[str]:
    """A tool's command as the engine takes it: a list is the argv; a string runs with /bin/sh -c, or with
    shell=false is split as a shell would split it (`python3 -c 'print(1)'` is three words, not four)."""
    if isinstance(command, list) or shell:
        return command
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise InvalidInput(f"command: {exc} (shell=false splits it as a shell would)") from None
    if not words:
        raise InvalidInput("command: empty")
    return words


def cut(data: bytes, limit: int) -> tuple[str, bool]:
    text = data.decode("utf-8", "replace")
    if len(text) <= limit:
        return text, False
    return text[:limit], True


class Toolkit:
    """One per server. host_paths: whether tools may read and write paths of this machine (stdio:
    the caller is the server's own user; HTTP: off). remote: the engine is a `sandtree serve`
    elsewhere (client.remote.RemoteEngine)."""

    def __init__(self, server: MCPServer, engine, *, host_paths: bool, remote: bool):
        self.server, self.engine, self.host_paths, self.remote = server, engine, host_paths, remote
        self.outputs: OrderedDict[str, tuple[bytes, bytes]] = OrderedDict()   # full output of recent runs
        self.kept = 0                                                        # bytes in `outputs`
        self.handlers: dict = {}                  # composite tools' bodies by name (maker.make registers them)
        self.own: dict = {}                       # tools of no operation (the guide), by name
        self.afters: dict = {}                    # tool name -> called with each answer (after())
        self.started: dict = {}                   # session -> {sandbox it started and did not stop: its engine}

    def tool(self, fn):
        """`fn` is a tool of no operation (the guide: what the server says about itself), registered by
        maker.make() when the profile has it (add_own)."""
        self.own[fn.__name__] = fn
        return fn

    def add_own(self, fn) -> None:
        self.server.add_tool(guard(fn), name=fn.__name__, description=inspect.cleandoc(fn.__doc__ or ""))

    def handler(self, fn):
        """A composite tool's hand-written body, registered as a tool by maker.make() under the name of the
        row(s) that declare it (Mcp(handler=...) beside the row), its parameters held to theirs."""
        assert fn.__name__ not in self.handlers, fn.__name__
        self.handlers[fn.__name__] = fn
        return fn

    def after(self, name: str, hook) -> None:
        """`hook(answer)` after each call of tool `name` that answers (a group's bookkeeping on a made tool)."""
        assert name not in self.afters, name
        self.afters[name] = hook

    def started_here(self, sid: str) -> None:
        """A live sandbox this tool call's session started (sandbox_start's answer)."""
        session, view = SESSION.get()
        self.started.setdefault(session, {})[sid] = view or self.engine

    def stopped_here(self, sid: str) -> None:
        self.started.get(SESSION.get()[0], {}).pop(sid, None)

    def end_session(self, session=None) -> list[str]:
        """A session is over (stdio: the client closed our stdin, or died; HTTP: it deleted its session): stop
        the live sandboxes it started and left running, rather than leave them to their idle timeout, each as
        the caller that started it. Returns their IDs."""
        stopped = []
        for sid, engine in sorted(self.started.pop(session, {}).items()):
            try:
                engine.sandbox_stop(sid)
                stopped.append(sid)
            except SandtreeError:             # stopped meanwhile (its idle timeout, the CLI): nothing to do
                pass
        return stopped

    def register(self, fn, name: str, doc: str, signature: inspect.Signature, describe,
                 shown: tuple[str, ...] | None = None) -> None:
        """Register a made tool (maker.make): through guard(), every parameter described; shown: only these
        parameters (narrowed())."""
        if shown is not None:
            fn, signature = narrowed(fn, signature, shown)
        if name in self.afters:
            fn = followed(fn, self.afters[name])
        # the docstring's indentation is no part of what a model reads
        self.server.add_tool(guard(fn, described(signature, describe, name)), name=name, description=inspect.cleandoc(doc))

    def no_host_paths(self, what: str) -> None:
        if not self.host_paths:
            raise Forbidden(f"{what}: {HOST_PATHS_OFF}")

    def remember(self, op: str, stdout: bytes, stderr: bytes) -> None:
        old = self.outputs.pop(op, None)
        if old is not None:
            self.kept -= len(old[0]) + len(old[1])
        self.outputs[op] = (stdout, stderr)
        self.kept += len(stdout) + len(stderr)
        # the newest runs within OUTPUTS_KEPT bytes (each run's output is capped, not the sum)
        while len(self.outputs) > 1 and (len(self.outputs) > OUTPUTS_RUNS or self.kept > OUTPUTS_KEPT):
            _, (o, e) = self.outputs.popitem(last=False)
            self.kept -= len(o) + len(e)

    def remember_done(self, op: str) -> None:
        """Keep a finished operation's full output, if the engine still has it."""
        done = self.engine.operations.result(op)
        if done is not None:
            self.remember(done.op, done.stdout, done.stderr)

    def run_result(self, rec, limit: int) -> dict:
        self.remember(rec.op, rec.stdout, rec.stderr)
        out, cut_out = cut(rec.stdout, limit)
        err, cut_err = cut(rec.stderr, limit)
        res = {"operation_id": rec.op, "result_image": rec.image, "exit_code": rec.exit_code,
               "signal": rec.signal, "timed_out": rec.timed_out, "oom_killed": rec.oom_killed,
               "stdout": out, "stderr": err}
        if rec.usage.get("tape"):                   # record=true: the egress tape's ID (tape_show, replay)
            res["tape"] = rec.usage["tape"]
        if cut_out or cut_err or rec.stdout_truncated or rec.stderr_truncated:
            res["truncated"] = (f"output cut at {limit} characters (stdout {len(rec.stdout)} bytes, stderr "
                                f"{len(rec.stderr)} bytes kept); read the rest with get_operation("
                                f"operation_id='{rec.op}', offset={limit})")
        return res

    def op_view(self, rec: dict, offset: int = 0, limit: int = D.MCP_OUTPUT_CHARS) -> dict:
        view = {"operation_id": rec["id"], "status": rec["status"], "image": rec["source"],
                "result_image": rec["result"], "command": rec["spec"].get("command")}
        o = rec["outcome"] or {}
        view.update({k: o[k] for k in ("exit_code", "signal", "timed_out", "oom_killed", "cancelled",
                                       "error", "message") if k in o})
        if rec["id"] in self.outputs:
            stdout, stderr = self.outputs[rec["id"]]
            view["stdout"], cut1 = cut(stdout[offset:], limit)
            view["stderr"], cut2 = cut(stderr[offset:], limit)
            if cut1 or cut2:
                view["truncated"] = f"more output: call get_operation again with offset={offset + limit}"
        return view
