"""envd's process.Process service (Connect-RPC, the `e2b` wheel's generated ProcessASGIApplication
and messages): E2B's commands and PTYs as the live sandbox's spawned processes (the table's
sandbox_spawn, sandbox_follow, sandbox_stdin, sandbox_signal, sandbox_resize, sandbox_processes).

E2B's pid is the process's number in the sandbox (sandbox_spawn's); its tag is the spawn's tag. The
user is the username of the request's HTTP Basic authorization (E2B's clients send it so), resolved
as the files are (users.py: the sandbox's /etc/passwd, `user` by default where there is one), and a
command starts in its home unless given a cwd, as envd does. A command's output streams as it comes
(sandbox_follow), its end event carries the exit code (-1 and the signal for a killed one, as
envd's Go answers it). Errors are sandtree's, as Connect codes (rpcerrors.py)."""

from __future__ import annotations

import asyncio
import threading

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_pb as pb
from e2b.envd.process.process_connect import ProcessASGIApplication
from protobuf import Oneof

from .... import defaults as D
from ....errors import SandtreeError
from . import users
from .app import here, route
from .rpcerrors import connect_error, rpc, strict_codecs

__all__ = ["ProcessService"]

_KEEPALIVE_HEADER = "keepalive-ping-interval"     # E2B's clients ask for a keepalive event this often (s)
_SIGNALS = {pb.Signal.SIGKILL: "KILL", pb.Signal.SIGTERM: "TERM"}


def _event(kind: str, value, cls=pb.StartResponse):
    return cls(event=pb.ProcessEvent(event=Oneof(kind, value)))


def _end(state: dict):
    code, sig = state.get("exit_code"), state.get("signal")
    if code is not None:
        return pb.ProcessEvent.EndEvent(exit_code=code, exited=True, status=f"exit status {code}")
    return pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status=f"signal: {sig}" if sig else "ended")


def _keepalive(ctx) -> float:
    try:
        return max(1.0, float(ctx.request_headers.get(_KEEPALIVE_HEADER, "")))
    except ValueError:
        return float(D.E2B_KEEPALIVE)


class ProcessService:
    """process.Process on the sandbox envd's app (app.py) named for this request."""

    # ---- streams ---------------------------------------------------------------------------------
    async def _follow(self, engine, sid: str, pid: int | None, ctx, cls, replay: bool, begin=None):
        """StartEvent, then the process's output as DataEvents (keepalives between), then EndEvent.
        begin(): starts the process (its pid) in the follower's thread first, so a command's start
        and its following cost one hop to a thread, not two (its errors come before any event)."""
        loop, queue, cancel = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()

        def heard(stream: str, chunk: bytes) -> None:            # (the engine's pump thread)
            loop.call_soon_threadsafe(queue.put_nowait, (stream, chunk))

        def follow(pid):
            if begin is not None:
                pid = begin()
                loop.call_soon_threadsafe(queue.put_nowait, ("start", pid))
            return engine.sandbox_follow(sid, pid, heard, replay=replay, cancel=cancel)
        follower = asyncio.ensure_future(asyncio.to_thread(follow, pid))
        follower.add_done_callback(lambda _: queue.put_nowait(None))
        every = _keepalive(ctx)
        try:
            if begin is not None:
                item = await queue.get()
                if item is None:                  # it did not start: its error, before any event
                    try:
                        follower.result()
                    except SandtreeError as exc:
                        raise connect_error(exc) from None
                    raise ConnectError(Code.INTERNAL, "the process did not start")
                pid = item[1]
            yield _event("start", pb.ProcessEvent.StartEvent(pid=pid), cls)
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), every)
                except asyncio.TimeoutError:
                    yield _event("keepalive", pb.ProcessEvent.KeepAlive(), cls)
                    continue
                if item is None:
                    break
                stream, chunk = item
                yield _event("data", pb.ProcessEvent.DataEvent(output=Oneof(stream, chunk)), cls)
            try:
                state = follower.result()
            except SandtreeError as exc:
                raise connect_error(exc) from None
            yield _event("end", _end(state), cls)
        finally:
            cancel.set()                     # the client went away: the process goes on, unfollowed

    def start(self, request: pb.StartRequest, ctx):
        return self._start(request, ctx)

    async def _start(self, request: pb.StartRequest, ctx):
        engine, sid = here()
        config = request.process
        if config is None or not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is required")
        size = request.pty.size if request.has_field("pty") and request.pty.size is not None else None
        # an absent stdin is true (envd's default, for older clients); a terminal's is its input
        keep_stdin = request.stdin if request.has_field("stdin") else True
        authorization = ctx.request_headers.get("authorization")
        cwd = config.cwd if config.has_field("cwd") and config.cwd else None
        tag = request.tag if request.has_field("tag") and request.tag else None

        def begin() -> int:                  # (in the follower's thread)
            user = users.resolve(engine, sid, users.basic_user(authorization))
            return engine.sandbox_spawn(
                sid, [config.cmd, *config.args], env=dict(config.envs) or None,
                cwd=user.path(cwd) if cwd else user.home, uid=user.uid, gid=user.gid, tag=tag,
                stdin_open=keep_stdin, **({"pty": True, "cols": size.cols, "rows": size.rows} if size is not None else {}))
        async for event in self._follow(engine, sid, None, ctx, pb.StartResponse, replay=True, begin=begin):
            yield event

    def connect(self, request: pb.ConnectRequest, ctx):
        return self._connect(request, ctx)

    async def _connect(self, request: pb.ConnectRequest, ctx):
        engine, sid = here()
        try:
            pid = await self._pid(engine, sid, request.process)
        except SandtreeError as exc:
            raise connect_error(exc) from None
        async for event in self._follow(engine, sid, pid, ctx, pb.ConnectResponse, replay=False):
            yield event

    # ---- unary -----------------------------------------------------------------------------------
    async def _pid(self, engine, sid: str, selector) -> int:
        """The running process a ProcessSelector names (by pid or tag), else NOT_FOUND."""
        which = selector.selector if selector is not None else None
        if which is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "a process (pid or tag) is required")
        procs = await asyncio.to_thread(engine.sandbox_processes, sid)
        key = "pid" if which.field == "pid" else "tag"
        for p in procs:
            if p.get(key) == which.value and p["running"]:
                return p["pid"]
        raise ConnectError(Code.NOT_FOUND, f"process with {key} {which.value!r} not found")

    @rpc
    async def list(self, request: pb.ListRequest, ctx) -> pb.ListResponse:
        engine, sid = here()
        procs = await asyncio.to_thread(engine.sandbox_processes, sid)
        return pb.ListResponse(processes=[
            pb.ProcessInfo(pid=p["pid"], tag=p.get("tag"), config=pb.ProcessConfig(
                cmd=p["argv"][0], args=p["argv"][1:], envs=p.get("env") or {}, cwd=p.get("cwd")))
            for p in procs if p["running"]])

    @rpc
    async def update(self, request: pb.UpdateRequest, ctx) -> pb.UpdateResponse:
        engine, sid = here()
        pid = await self._pid(engine, sid, request.process)
        if request.has_field("pty") and request.pty.size is not None:
            await asyncio.to_thread(engine.sandbox_resize, sid, pid, request.pty.size.cols, request.pty.size.rows)
        return pb.UpdateResponse()

    @rpc
    async def send_input(self, request: pb.SendInputRequest, ctx) -> pb.SendInputResponse:
        engine, sid = here()
        pid = await self._pid(engine, sid, request.process)
        data = request.input.input.value if request.input is not None and request.input.input is not None else b""
        await asyncio.to_thread(engine.sandbox_stdin, sid, pid, data, close=False)
        return pb.SendInputResponse()

    @rpc
    async def stream_input(self, requests, ctx) -> pb.StreamInputResponse:
        """The first message names the process (start), the next ones are its input, in order."""
        engine, sid, pid = *here(), None
        async for message in requests:
            event = message.event
            if event is None or event.field == "keepalive":
                continue
            if event.field == "start":
                pid = await self._pid(engine, sid, event.value.process)
            elif pid is None:
                raise ConnectError(Code.INVALID_ARGUMENT, "the input stream starts by naming its process")
            else:
                data = event.value.input.input.value if event.value.input and event.value.input.input else b""
                await asyncio.to_thread(engine.sandbox_stdin, sid, pid, data, close=False)
        return pb.StreamInputResponse()

    @rpc
    async def send_signal(self, request: pb.SendSignalRequest, ctx) -> pb.SendSignalResponse:
        engine, sid = here()
        sig = _SIGNALS.get(request.signal)
        if sig is None:
            raise ConnectError(Code.INVALID_ARGUMENT, f"unsupported signal {request.signal!r} (SIGTERM, SIGKILL)")
        which = request.process.selector if request.process is not None else None
        # a pid goes to the engine as given: one that ended or never was is its NotFound
        pid = which.value if which is not None and which.field == "pid" else \
            await self._pid(engine, sid, request.process)
        await asyncio.to_thread(engine.sandbox_signal, sid, pid, sig)
        return pb.SendSignalResponse()

    @rpc
    async def close_stdin(self, request: pb.CloseStdinRequest, ctx) -> pb.CloseStdinResponse:
        engine, sid = here()
        pid = await self._pid(engine, sid, request.process)
        await asyncio.to_thread(engine.sandbox_stdin, sid, pid, b"", close=True)
        return pb.CloseStdinResponse()


route("/process.Process/")(ProcessASGIApplication(ProcessService(), codecs=strict_codecs()))
