"""Exposed ports of a sandbox: a listener on the host's loopback per exposed port,
each accepted connection relayed to the sandbox's address on that port.

The relay's socket towards the sandbox is made in the router namespace (the one that holds the
link's other end), so the connection enters the sandbox through its link like any other inbound
packet, and nothing of the host is routed into a sandbox: only 127.0.0.1:<host port> -> this
process -> link.address:port. An unexposed port has no listener, so it is unreachable from the
host. Runs on the egress daemon's event loop; bytes and connections are counted per exposure."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from . import netns
from .state import LinkState

__all__ = ["Exposure", "expose", "CHUNK", "CONNECT_TIMEOUT"]

CHUNK = 256 * 1024           # bytes per read of a relay (one read, one write: back-pressure by drain);
                             # measured here 1.2-1.8 GB/s through a relay (64 KiB: 0.8 GB/s)
CONNECT_TIMEOUT = 5.0        # seconds to reach the sandbox's port (an address on a veth: instant or never)


class Exposure:
    """One exposed port: its host listener, its open relays and what went through them."""

    def __init__(self, link: LinkState, port: int, server: asyncio.AbstractServer, host_port: int):
        self.link, self.port, self.server, self.host_port = link, port, server, host_port
        self.connections = 0          # relayed connections (the sandbox accepted them)
        self.failed = 0               # connections the sandbox refused (nothing listens there)
        self.bytes_in = 0             # host -> sandbox
        self.bytes_out = 0            # sandbox -> host
        self.open: set = set()        # writers of open relays (both ends), closed by close()

    def close(self) -> None:
        """Stop listening and cut the open relays (the port is unreachable from now on)."""
        self.server.close()
        for w in list(self.open):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self.open.clear()

    def stats(self) -> dict:
        return {"port": self.port, "host_port": self.host_port, "connections": self.connections,
                "failed": self.failed, "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "open": len(self.open) // 2}


def _socket_in(fd: int, *, listen: bool) -> socket.socket:
    """A TCP socket made in namespace `fd` (a socket stays where it was made): for the listener,
    bound to 127.0.0.1 on a free port of that namespace."""
    with netns.entered(fd):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setblocking(False)
        if listen:
            s.bind(("127.0.0.1", 0))
            s.listen(128)
        return s
    except BaseException:
        s.close()
        raise


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count) -> None:
    try:
        while data := await reader.read(CHUNK):
            count(len(data))
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()                  # half-close: the other side may still answer
    except (ConnectionError, OSError):
        writer.transport.abort()


async def expose(link: LinkState, port: int, router_fd: int, host_fd: int) -> Exposure:
    """Listen on 127.0.0.1:<a free port> of the host namespace (host_fd) and relay each connection
    to link.address:port through a socket made in the router namespace (router_fd)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"a port is 1..65535, not {port!r}")
    loop = asyncio.get_running_loop()
    exposure: Exposure | None = None

    async def relay(creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        ex = exposure
        s = _socket_in(router_fd, listen=False)
        try:
            await asyncio.wait_for(loop.sock_connect(s, (link.address, port)), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError):
            s.close()
            ex.failed += 1
            cwriter.transport.abort()           # a reset: as if the port itself had refused
            return
        sreader, swriter = await asyncio.open_connection(sock=s, limit=CHUNK)
        ex.connections += 1
        ex.open.update((cwriter, swriter))

        def inbound(n: int) -> None:
            ex.bytes_in += n

        def outbound(n: int) -> None:
            ex.bytes_out += n
        try:
            await asyncio.gather(_pump(creader, swriter, inbound), _pump(sreader, cwriter, outbound))
        except asyncio.CancelledError:
            pass                                # (the loop is ending: the relay ends with it, quietly)
        finally:
            for w in (cwriter, swriter):
                ex.open.discard(w)
                w.close()

    lsock = _socket_in(host_fd, listen=True)
    host_port = lsock.getsockname()[1]
    server = await asyncio.start_server(relay, sock=lsock, limit=CHUNK)
    exposure = Exposure(link, port, server, host_port)
    return exposure
