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


# ---- through the engine, the SDK and `sandtree serve` ------------------------------------------------
import contextlib
import threading

import httpx
import uvicorn
from websockets.asyncio.client import connect as ws_connect

import sandtree
from sandtree.http.server import build_app

from conftest import free_port, wait_for_port
from portnet import WS_ECHO, StandInEgress


@contextlib.contextmanager
def serving(engine):
    """The REST server of `engine` on a free loopback port, in a thread (uvicorn as `sandtree serve`
    runs it: WebSockets by the websockets package); its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        wait_for_port(port, 20)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(10)


@pytest.fixture
def world(tmp_path, rootfs):
    """A store with the busybox image, its engine given the egress client, a live sandbox running
    busybox httpd on 8000 (a page) and a WebSocket echo on 9000."""
    st = sandtree.Sandtree(str(tmp_path / "home"))
    egress = StandInEgress()
    eng = st.engine
    eng._egress = egress                    # (test only: the daemon's client until e14-links is merged)
    img = st.import_image(rootfs, tag="busybox")
    sb = img.start()
    try:
        sb.write("/www/index.html", "hello from the sandbox\n")
        sb.write("/bin/ws-echo", WS_ECHO, mode=0o755)
        sb.exec("httpd -p 8000 -h /www; (nc -ll -p 9000 -e /bin/ws-echo >/dev/null 2>&1 &)")
        yield st, sb, egress
    finally:
        with contextlib.suppress(Exception):
            sb.stop()
        egress.close()
        st.close()


def _get(url: str, **kw) -> httpx.Response:
    return httpx.get(url, timeout=10, trust_env=False, **kw)


def test_a_sandbox_server_answers_only_while_exposed(world):
    st, sb, egress = world
    assert sb.ports() == []
    with serving(st.engine) as base:
        r = _get(f"{base}/api/v1/sandboxes/{sb.id}/ports/8000/index.html")
        assert r.status_code == 404 and "not exposed" in r.json()["message"]
        entry = sb.expose(8000)
        assert entry["port"] == 8000 and entry["path"] == f"/api/v1/sandboxes/{sb.id}/ports/8000/"
        assert entry["url"].startswith("http://127.0.0.1:")
        assert _get(entry["url"] + "/index.html").text == "hello from the sandbox\n"
        r = _get(base + entry["path"] + "index.html")
        assert r.status_code == 200 and r.text == "hello from the sandbox\n"
        assert sb.ports() == [entry]
        assert sb.expose(8000) == entry                     # exposing twice: the same port
        # another port of the same sandbox stays unreachable through the server
        assert _get(f"{base}/api/v1/sandboxes/{sb.id}/ports/9000/").status_code == 404
        sb.unexpose(8000)
        assert sb.ports() == []
        with pytest.raises(httpx.ConnectError):
            _get(entry["url"] + "/index.html")
        assert _get(base + entry["path"]).status_code == 404
    assert [c[0] for c in egress.calls].count("adopt") == 1


def test_a_websocket_through_the_url_and_the_server(world):
    st, sb, _ = world
    entry = sb.expose(9000)

    async def echo(url: str) -> str:
        async with ws_connect(url, proxy=None, open_timeout=10) as ws:
            await ws.send("hi there")
            return await asyncio.wait_for(ws.recv(), 10)
    assert _run(echo("ws://" + entry["url"][len("http://"):] + "/")) == "echo: hi there"
    with serving(st.engine) as base:
        assert _run(echo("ws://" + base[len("http://"):] + entry["path"] + "chat")) == "echo: hi there"


def test_bad_ports_and_stopped_sandboxes_are_refused(world):
    st, sb, _ = world
    from sandtree.errors import Conflict, InvalidInput, NotFound
    for bad in (0, 70000, "80", True):
        with pytest.raises(InvalidInput):
            sb.expose(bad)
    with pytest.raises(NotFound):
        sb.unexpose(8000)
    with pytest.raises(NotFound):
        sb.port_url(8000)
    sb.stop()
    with pytest.raises(Conflict):
        sb.expose(8000)
