"""envd's Connect-RPC filesystem.Filesystem, on the wheel's own FilesystemASGIApplication and message
classes (the wire is connectrpc's): each method is the sandbox's file rows of the operation table
(sandbox_stat, sandbox_mkdir, sandbox_rename, sandbox_ls, sandbox_remove, sandbox_watch and its
events), called on the caller's engine view (the TenantGate's) in a thread.

E2B's semantics kept where they differ from the rows' defaults: MakeDir answers ALREADY_EXISTS for a
directory that is there; Move makes the destination's parents and replaces what is there (rename(2),
as envd's os.Rename); Remove removes a directory with what is in it, and nothing there is no error
(os.RemoveAll); ListDir's depth
1 is the directory itself. Paths resolve as users.py says."""

from __future__ import annotations

import asyncio
import contextvars
import posixpath

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb as pb
from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication
from protobuf import Oneof
from protobuf.wkt import Timestamp

from ....errors import Ended, PathNotFound, SandtreeError
from ...gate import current_engine
from ..dispatch import SANDBOX_KEY
from . import users
from .app import route
from .rpcerrors import connect_error, rpc, strict_codecs

_SANDBOX: contextvars.ContextVar = contextvars.ContextVar("e2b_envd_sandbox", default=None)
TYPES = {"file": pb.FileType.FILE, "dir": pb.FileType.DIRECTORY, "symlink": pb.FileType.SYMLINK}
EVENTS = {"create": pb.EventType.CREATE, "write": pb.EventType.WRITE, "remove": pb.EventType.REMOVE,
          "rename": pb.EventType.RENAME, "chmod": pb.EventType.CHMOD}
KEEPALIVE = 30.0            # seconds between WatchDir's keepalives (the SDK's header may ask for less)
MAX_LIST_DEPTH = 256
MAX_REMEMBERED = 4096       # polling watchers whose path and include_entry are kept (the oldest forgotten)


def entry_info(e: dict) -> pb.EntryInfo:
    """A sandbox_stat / sandbox_ls entry as envd's EntryInfo (a link: is_symlink, its target made
    absolute as envd gives it; a directory's size 0, as envd reports it)."""
    link = e["kind"] == "symlink"
    target = None
    if link and e.get("target") is not None:
        t = e["target"]
        target = t if t.startswith("/") else posixpath.normpath(posixpath.join(posixpath.dirname(e["path"]), t))
    return pb.EntryInfo(name=e["name"], type=TYPES.get(e["kind"], pb.FileType.UNSPECIFIED), path=e["path"],
                        size=0 if e["kind"] == "dir" else e["size"], mode=e["mode"], permissions=e["permissions"], owner=e["owner"],
                        group=e["group"], modified_time=Timestamp.from_nanos(int(e["mtime"] * 1e9)),
                        symlink_target=target, is_symlink=link)


class _Call:
    """What one call needs: the engine view, the sandbox, the user (resolved in a thread)."""

    def __init__(self, ctx):
        self.engine = current_engine()
        self.sid = _SANDBOX.get()
        self.auth = ctx.request_headers.get("authorization")

    async def do(self, fn, *a, **k):
        return await asyncio.to_thread(fn, *a, **k)

    async def user(self) -> users.User:
        return await self.do(users.resolve, self.engine, self.sid, users.basic_user(self.auth))


class Filesystem:
    """filesystem.Filesystem (the wheel's protocol), one sandbox's at a time (dispatch.py names it)."""

    @rpc
    async def stat(self, request: pb.StatRequest, ctx) -> pb.StatResponse:
        c = _Call(ctx)
        path = (await c.user()).path(request.path)
        return pb.StatResponse(entry=entry_info(await c.do(c.engine.sandbox_stat, c.sid, path)))

    @rpc
    async def make_dir(self, request: pb.MakeDirRequest, ctx) -> pb.MakeDirResponse:
        c = _Call(ctx)
        u = await c.user()
        path = u.path(request.path)
        if await c.do(c.engine.sandbox_exists, c.sid, path):
            raise ConnectError(Code.ALREADY_EXISTS, f"path already exists: {path}")
        await c.do(c.engine.sandbox_mkdir, c.sid, path, uid=u.uid, gid=u.gid)
        return pb.MakeDirResponse(entry=entry_info(await c.do(c.engine.sandbox_stat, c.sid, path)))

    @rpc
    async def move(self, request: pb.MoveRequest, ctx) -> pb.MoveResponse:
        c = _Call(ctx)
        u = await c.user()
        source, destination = u.path(request.source), u.path(request.destination)
        if not await c.do(c.engine.sandbox_exists, c.sid, source):
            raise PathNotFound(f"source file not found: {source}", path=source)
        parent = posixpath.dirname(destination)
        if not await c.do(c.engine.sandbox_exists, c.sid, parent):
            await c.do(c.engine.sandbox_mkdir, c.sid, parent, uid=u.uid, gid=u.gid)
        moved = await c.do(c.engine.sandbox_rename, c.sid, source, destination, replace=True)
        return pb.MoveResponse(entry=entry_info(moved))

    @rpc
    async def list_dir(self, request: pb.ListDirRequest, ctx) -> pb.ListDirResponse:
        c = _Call(ctx)
        path = (await c.user()).path(request.path)
        depth = request.depth or 1
        if depth > MAX_LIST_DEPTH:
            raise ConnectError(Code.INVALID_ARGUMENT, f"depth must be at most {MAX_LIST_DEPTH}")
        top = await c.do(c.engine.sandbox_stat, c.sid, path)
        if top["kind"] == "symlink":                      # envd lists what a link to a directory names
            path = entry_info(top).symlink_target or path
            top = await c.do(c.engine.sandbox_stat, c.sid, path)
        if top["kind"] != "dir":
            raise ConnectError(Code.INVALID_ARGUMENT, f"path is not a directory: {path}")
        entries = await c.do(c.engine.sandbox_ls, c.sid, path, depth=depth)
        return pb.ListDirResponse(entries=[entry_info(e) for e in entries])

    @rpc
    async def remove(self, request: pb.RemoveRequest, ctx) -> pb.RemoveResponse:
        c = _Call(ctx)
        path = (await c.user()).path(request.path)
        try:
            await c.do(c.engine.sandbox_remove, c.sid, path, recursive=True)
        except PathNotFound:
            pass                                          # nothing there: done, as envd's os.RemoveAll
        return pb.RemoveResponse()

    async def watch_dir(self, request: pb.WatchDirRequest, ctx):
        try:
            c = _Call(ctx)
            path = await self._watched(c, request.path)
            w = await c.do(c.engine.sandbox_watch, c.sid, path, recursive=request.recursive)
        except SandtreeError as exc:
            raise connect_error(exc) from None
        every = _keepalive(ctx)
        try:
            yield pb.WatchDirResponse(event=Oneof("start", pb.WatchDirResponse.StartEvent()))
            while True:
                try:
                    got = await c.do(c.engine.sandbox_watch_events, c.sid, w["watch"], timeout=every)
                except Ended:
                    return
                except SandtreeError as exc:
                    raise connect_error(exc) from None
                if not got["events"]:
                    yield pb.WatchDirResponse(event=Oneof("keepalive", pb.WatchDirResponse.KeepAlive()))
                for ev in await self._events(c, path, got["events"], request.include_entry):
                    yield pb.WatchDirResponse(event=Oneof("filesystem", ev))
        finally:
            try:
                await c.do(c.engine.sandbox_unwatch, c.sid, w["watch"])
            except SandtreeError:
                pass                                      # ended with its sandbox

    @rpc
    async def create_watcher(self, request: pb.CreateWatcherRequest, ctx) -> pb.CreateWatcherResponse:
        c = _Call(ctx)
        path = await self._watched(c, request.path)
        w = await c.do(c.engine.sandbox_watch, c.sid, path, recursive=request.recursive)
        _INCLUDE[(c.sid, w["watch"])] = (path, request.include_entry)
        while len(_INCLUDE) > MAX_REMEMBERED:             # watchers never removed (they expire in the engine)
            _INCLUDE.pop(next(iter(_INCLUDE)))
        return pb.CreateWatcherResponse(watcher_id=w["watch"])

    @rpc
    async def get_watcher_events(self, request: pb.GetWatcherEventsRequest, ctx) -> pb.GetWatcherEventsResponse:
        c = _Call(ctx)
        got = await c.do(c.engine.sandbox_watch_events, c.sid, request.watcher_id, timeout=0.0)
        path, include = _INCLUDE.get((c.sid, request.watcher_id), ("/", False))
        return pb.GetWatcherEventsResponse(events=await self._events(c, path, got["events"], include))

    @rpc
    async def remove_watcher(self, request: pb.RemoveWatcherRequest, ctx) -> pb.RemoveWatcherResponse:
        c = _Call(ctx)
        await c.do(c.engine.sandbox_unwatch, c.sid, request.watcher_id)
        _INCLUDE.pop((c.sid, request.watcher_id), None)
        return pb.RemoveWatcherResponse()

    @staticmethod
    async def _watched(c: _Call, given: str) -> str:
        path = (await c.user()).path(given)
        top = await c.do(c.engine.sandbox_stat, c.sid, path)
        if top["kind"] != "dir":
            raise ConnectError(Code.INVALID_ARGUMENT, f"path {path} not a directory")
        return path

    @staticmethod
    async def _events(c: _Call, path: str, events: list[dict], include: bool) -> list[pb.FilesystemEvent]:
        out = []
        for ev in events:
            kind = EVENTS.get(ev["type"])
            if kind is None:
                continue                                  # (an inotify queue overflow: E2B has no such event)
            entry = None
            if include and ev["type"] not in ("remove", "rename"):
                try:
                    entry = entry_info(await c.do(c.engine.sandbox_stat, c.sid, f"{path.rstrip('/')}/{ev['name']}"))
                except SandtreeError:
                    entry = None                          # gone again already
            out.append(pb.FilesystemEvent(name=ev["name"], type=kind, entry=entry))
        return out


_INCLUDE: dict[tuple[str, str], tuple[str, bool]] = {}     # (sandbox, watch) -> (its path, include_entry)


def _keepalive(ctx) -> float:
    """Seconds between keepalives: the SDK's Keepalive-Ping-Interval header, else KEEPALIVE."""
    try:
        asked = float(ctx.request_headers.get("keepalive-ping-interval") or KEEPALIVE)
    except ValueError:
        asked = KEEPALIVE
    return min(max(asked, 1.0), KEEPALIVE)


_app = FilesystemASGIApplication(Filesystem(), codecs=strict_codecs())


@route(_app.path + "/")
async def filesystem(scope, receive, send):
    """The Connect service, told which sandbox this request is for (dispatch.py's scope key)."""
    token = _SANDBOX.set(scope[SANDBOX_KEY][0])
    try:
        await _app(scope, receive, send)
    finally:
        _SANDBOX.reset(token)
