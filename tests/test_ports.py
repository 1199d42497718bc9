"""Port exposure (issue 14, item 5): network/expose.py's relay, the engine's rows, the server's
proxy under /api/v1/sandboxes/{sid}/ports/{port}/ (HTTP and WebSocket), signed URLs.

Real sockets only: servers run in network namespaces the test made (portnet.py) or in live
sandboxes; every connection is to 127.0.0.1 or into those namespaces."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from sandtree.network import netns
from sandtree.network.expose import expose

from portnet import LinkPair, echo, http_hello


@pytest.fixture
def pair():
    p = LinkPair(index=201)
    yield p
    p.close()


def _run(coro):
    return asyncio.run(coro)


async def _client(port: int, data: bytes) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    w.write_eof()
    out = await asyncio.wait_for(r.read(), 5)
    w.close()
    return out


def test_expose_relays_to_the_sandbox_and_counts_bytes(pair):
    pair.serve(7000, echo)

    async def main():
        host = netns.current()
        try:
            ex = await expose(pair.link, 7000, pair.router_fd, host)
        finally:
            import os
            os.close(host)
        try:
            payload = b"x" * 300_000
            got = await _client(ex.host_port, payload)
            assert got == payload
            await asyncio.sleep(0.05)
            s = ex.stats()
            assert (s["connections"], s["bytes_in"], s["bytes_out"]) == (1, len(payload), len(payload))
            return ex.host_port
        finally:
            ex.close()
    port = _run(main())
    with pytest.raises(OSError):                     # closed: nothing listens there any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_an_exposed_port_with_nothing_listening_resets(pair):
    async def main():
        host = netns.current()
        ex = await expose(pair.link, 7001, pair.router_fd, host)
        try:
            r, w = await asyncio.open_connection("127.0.0.1", ex.host_port)
            w.write(b"hello")
            try:
                got = await asyncio.wait_for(r.read(), 5)
            except ConnectionResetError:
                got = b""
            assert got == b""
            assert ex.stats()["failed"] == 1 and ex.stats()["connections"] == 0
        finally:
            ex.close()
    _run(main())


def test_only_the_exposed_port_is_relayed(pair):
    """The listener relays to its own port only (another port of the sandbox is not reachable
    through it), and listens on the host's loopback only."""
    pair.serve(7002, http_hello(b"seven-two"))
    pair.serve(7003, http_hello(b"seven-three"))

    async def main():
        host = netns.current()
        ex = await expose(pair.link, 7002, pair.router_fd, host)
        try:
            got = await _client(ex.host_port, b"GET / HTTP/1.0\r\n\r\n")
            assert b"seven-two" in got and b"seven-three" not in got
            assert [s.getsockname()[0] for s in ex.server.sockets] == ["127.0.0.1"]
        finally:
            ex.close()
    _run(main())


def test_close_cuts_open_relays(pair):
    pair.serve(7004, echo)

    async def main():
        host = netns.current()
        ex = await expose(pair.link, 7004, pair.router_fd, host)
        r, w = await asyncio.open_connection("127.0.0.1", ex.host_port)
        w.write(b"ping")
        assert await asyncio.wait_for(r.read(4), 5) == b"ping"
        ex.close()
        t0 = time.monotonic()
        try:
            rest = await asyncio.wait_for(r.read(), 5)
        except ConnectionResetError:
            rest = b""
        assert rest == b"" and time.monotonic() - t0 < 2
    _run(main())


def test_bad_ports_are_refused(pair):
    async def main():
        for bad in (0, 65536, -1, "80", True):
            with pytest.raises(ValueError):
                await expose(pair.link, bad, pair.router_fd, pair.router_fd)
    _run(main())
