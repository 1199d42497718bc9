"""Request body caps for `sandtree serve`: no body is read past its cap.

One ASGI middleware, inside httpauth.TenantGate (so the caller's tenant is known), counts the bytes
of every request body as the route reads them. Upload routes (a file, an image tar, a build context
tar, a file into a live sandbox, Contree's uploads) may send up to the tenant's `max_upload` limit, else the
server's (`serve --max-upload`, DEFAULT_MAX_UPLOAD); every other route takes JSON and gets
MAX_JSON_BODY. A Content-Length over the cap is answered 413 before anything is read; a body that
grows past it while streaming makes the route's read raise TooLarge (413 through the error table),
and the upload routes delete what they had written. What a route keeps of a body is its own affair:
the upload routes (REST and Contree's) stream to a file in the store (spool, below), never to memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import re

from ..errors import DiskFull, TooLarge
from .gate import STATE_KEY

DEFAULT_MAX_UPLOAD = 1 << 30          # bytes of one upload, unless a tenant's limit says otherwise
CAP_KEY = "sandtree.body_cap"          # scope key: this request's body cap, in bytes
MAX_JSON_BODY = 32 << 20              # bytes of any other request body (JSON of runs, file sets...)
# Refusing a body: HTTP/1.1 can only stop a client that is still sending by closing, and closing with
# unread bytes makes the kernel send a reset, which the client reports instead of our 413. So the rest
# of a refused body is read and dropped first, up to these bounds (nginx's lingering close does the
# same); past them the connection is closed anyway, as a flood deserves.
DRAIN_BYTES = 64 << 20
DRAIN_SECONDS = 10.0
# (E2B's envd /files: under the one sandbox URL, or at the root for a host-addressed sandbox: e2b/dispatch.py)
UPLOAD_PATHS = re.compile(r"^(/api/v1/files|/api/v1/images/import|/api/v1/builds|/api/v1/sandboxes/[^/]+/file"
                          r"|/v1/files|/e2b/sandbox/files|/files)/?$")


def upload_cap(scope, default: int) -> int:
    """The caller's upload cap: its tenant's max_upload if set, else the server's."""
    view = (scope.get("state") or {}).get(STATE_KEY)
    limits = getattr(getattr(view, "tenant", None), "limits", None) or {}
    return int(limits.get("max_upload") or default)


class BodyLimit:
    def __init__(self, app, max_upload: int = DEFAULT_MAX_UPLOAD, max_json: int = MAX_JSON_BODY):
        self.app, self.max_upload, self.max_json = app, max_upload, max_json

    def cap(self, scope) -> tuple[int, str]:
        if UPLOAD_PATHS.match(scope.get("path", "")):
            return upload_cap(scope, self.max_upload), "upload"
        return self.max_json, "request body"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cap, what = self.cap(scope)
        scope[CAP_KEY] = cap                     # for a route whose body inflates (a gzip upload): the same cap
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > cap:
            if not _expects_continue(scope):     # a client waiting for 100 Continue has sent nothing
                await _drain(receive)
            return await _too_large(send, TooLarge(f"{what} of {int(length)} bytes is over the {cap}-byte cap",
                                                   limit=cap), scope)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap:
                    if message.get("more_body"):
                        await _drain(receive)
                    raise TooLarge(f"{what} is over the {cap}-byte cap", limit=cap)
            return message
        await self.app(scope, counted, send)


def _expects_continue(scope) -> bool:
    return dict(scope.get("headers") or []).get(b"expect", b"").lower() == b"100-continue"


async def _drain(receive) -> None:
    """Read and drop what is left of a refused body, within DRAIN_BYTES and DRAIN_SECONDS."""
    async def rest():
        left = DRAIN_BYTES
        while left > 0:
            message = await receive()
            if message["type"] != "http.request":
                return
            left -= len(message.get("body", b""))
            if not message.get("more_body"):
                return
    with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
        await asyncio.wait_for(rest(), DRAIN_SECONDS)


async def _too_large(send, exc: TooLarge, scope) -> None:
    shape = exc.to_dict()
    if scope.get("path", "").startswith("/e2b/") or scope.get("path") == "/files":
        shape["code"] = exc.http_status                  # E2B's clients read {"code", "message"}
    body = json.dumps(shape).encode()
    await send({"type": "http.response.start", "status": exc.http_status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def staged_file(stage, prefix: str) -> str:
    """A new file in a staging dir of the store's tmp/ (`stage`: LayerDirs.stage), on the store's
    disk. The dir is named for this process, so after a kill -9 the next engine's clean_stale
    removes it; unstage() removes it otherwise."""
    return os.path.join(stage(prefix), "body")


def unstage(path: str) -> None:
    """Remove a staged file and its dir: nothing else is ever in it (no recursive delete, so
    nothing here can cross a mount)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(os.path.dirname(path))


async def spool(request, stage) -> tuple[str, str, int]:
    """A request body streamed into a staged file (never memory), hashed as it comes: (path,
    sha256, size); unstage(path) when done. The body's cap is bodylimit.BodyLimit's (TooLarge
    while streaming); on any error nothing is left."""
    path = staged_file(stage, "upload")
    h, size = hashlib.sha256(), 0
    try:
        with open(path, "xb") as f:
            async for chunk in request.stream():
                h.update(chunk)
                f.write(chunk)
                size += len(chunk)
    except BaseException as exc:
        unstage(path)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull("disk full: the upload was not stored") from None
        raise
    return path, h.hexdigest(), size
