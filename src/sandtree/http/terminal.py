"""/api/v1/sandboxes/{sid}/terminal: a terminal in a live sandbox over a WebSocket (the web
page's xterm.js, or any client).

The engine's own operation (table row `sandbox_popen`, pty=True: what `sandtree shell` does
in-process) on the caller's view: a tenant reaches only its own sandboxes (any other answers 404
as a nonexistent one), and the view audits it as an interactive exec. This route only relays:
binary frames both ways are the terminal's bytes; a text frame from the client is JSON control,
`{"resize": [cols, rows]}`, or `{"end": true}`: the shell is ended, then the socket closed (so a
client that waits for the close knows the shell is gone: hibernate refuses a sandbox with a
command running). The shell also ends (SIGHUP, then KILL) when the socket closes, and the socket
closes when the shell exits.

A browser cannot set a WebSocket's Authorization header: the page offers its token as the
subprotocol `bearer.<token>` beside `sandtree.terminal` (http/gate.py reads it); the answer
names only `sandtree.terminal`. A WebSocket is not held to the same-origin rule, so an Origin
that is not this server itself is refused: another site's page in a local browser could
otherwise type into a sandbox of a loopback server without tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import signal
import struct
import termios
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, WebSocket
from fastapi.responses import JSONResponse

from .. import defaults as D
from ..errors import Forbidden, InvalidInput, SandtreeError
from ..tasks import until_first
from .gate import STATE_KEY

PROTOCOL = "sandtree.terminal"
_TERM = "xterm-256color"        # what xterm.js speaks

__all__ = ["terminal_router", "PROTOCOL"]


def _winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", max(1, min(rows, 1000)), max(1, min(cols, 1000)), 0, 0))


def terminal_router() -> APIRouter:
    router = APIRouter()

    @router.websocket("/api/v1/sandboxes/{sid}/terminal")
    async def terminal(ws: WebSocket, sid: str, shell: str = "/bin/sh", cols: int = Query(D.TERMINAL_COLS, ge=1, le=1000),
                       rows: int = Query(D.TERMINAL_ROWS, ge=1, le=1000)):
        view = ws.scope["state"][STATE_KEY]
        origin = ws.headers.get("origin")
        if origin and urlsplit(origin).netloc.lower() != ws.headers.get("host", "").lower():
            return await _refuse(ws, Forbidden(f"a terminal is opened only by this server's own page, not {origin}"))
        if not shell.startswith("/") or "\0" in shell:
            return await _refuse(ws, InvalidInput("shell must be an absolute path inside the sandbox"))
        master, slave = pty.openpty()
        try:
            _winsize(master, cols, rows)
            proc = await asyncio.to_thread(view.sandbox_popen, sid, [shell], pty=True, stdin=slave, stdout=slave,
                                           stderr=slave, env={"TERM": _TERM})
        except SandtreeError as exc:
            os.close(master)
            return await _refuse(ws, exc)
        finally:
            os.close(slave)
        await ws.accept(subprotocol=PROTOCOL if PROTOCOL in (ws.scope.get("subprotocols") or ()) else None)
        loop, out = asyncio.get_running_loop(), asyncio.Queue()

        def readable():
            try:
                data = os.read(master, 65536)
            except OSError:                   # EIO: the shell and everything it started are gone
                data = b""
            if not data:
                loop.remove_reader(master)
            out.put_nowait(data)

        loop.add_reader(master, readable)

        async def down():
            while data := await out.get():
                await ws.send_bytes(data)

        async def up():
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                if msg.get("bytes"):
                    await asyncio.to_thread(os.write, master, msg["bytes"])
                elif msg.get("text"):
                    with contextlib.suppress(ValueError, TypeError, KeyError, OSError, AttributeError):
                        control = json.loads(msg["text"])
                        if control.get("end"):        # the shell ended first, then the socket closes
                            return
                        _winsize(master, int(control["resize"][0]), int(control["resize"][1]))

        try:
            await until_first(down(), up())
        finally:
            with contextlib.suppress(OSError):
                loop.remove_reader(master)
            await asyncio.to_thread(_end, proc)
            os.close(master)
            with contextlib.suppress(Exception):
                await ws.close()

    return router


def _end(proc) -> None:
    """The shell gone: asked (SIGHUP, as a closed terminal does), then killed."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, OSError):
            proc.send_signal(signal.SIGHUP)
        try:
            proc.wait(timeout=2)
            return
        except Exception:                      # noqa: BLE001 - TimeoutExpired: it ignored the hangup
            pass
        with contextlib.suppress(ProcessLookupError, OSError):
            proc.kill()
    proc.wait()


async def _refuse(ws: WebSocket, exc: SandtreeError) -> None:
    """Refuse before the handshake: an HTTP answer with the error's status (the ASGI extension),
    else a close whose code is 4000 + that status (what a browser's WebSocket can see)."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(JSONResponse(exc.to_dict(), status_code=exc.http_status))
    else:
        await ws.close(code=4000 + exc.http_status, reason=exc.message[:120])
