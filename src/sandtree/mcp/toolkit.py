"""What every group of MCP tools shares: the engine, registering a tool (engine errors become tool
errors, every parameter described), the host-paths switch, and the recent runs' full output.

Results are compact for a model: ids first, outputs cut at `truncate_output_at` with a marker
that says how to read the rest (get_operation with an offset), from the output kept here.
"""

from __future__ import annotations

import functools
import inspect
from collections import OrderedDict
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from .. import vocabulary
from ..errors import Forbidden, SandtreeError

OUTPUTS_KEPT = 128 << 20          # bytes of recent runs' full output kept for get_operation(offset=)
OUTPUTS_RUNS = 200                # runs whose full output is kept, at most
HOST_PATHS_OFF = ("paths on the server's filesystem are off over MCP HTTP (the caller is not the "
                  "server's user)")


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

    def tool(self, fn):
        """Register `fn` as a tool, through guard()."""
        self.server.tool()(guard(fn))
        return fn

    def no_host_paths(self, what: str) -> None:
        if not self.host_paths:
            raise ToolError(f"{Forbidden.code}: {what}: {HOST_PATHS_OFF}")

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
        if cut_out or cut_err or rec.stdout_truncated or rec.stderr_truncated:
            res["truncated"] = (f"output cut at {limit} characters (stdout {len(rec.stdout)} bytes, stderr "
                                f"{len(rec.stderr)} bytes kept); read the rest with get_operation("
                                f"operation_id='{rec.op}', offset={limit})")
        return res

    def op_view(self, rec: dict, offset: int = 0, limit: int = 8000) -> dict:
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
