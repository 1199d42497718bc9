"""The kernel relay of decided, opaque connections (network/fastpath.py, sockmap.py: a BPF sockhash
with an SK_SKB verdict program) against the test-made internet (tests/netlab.py): the bytes are
exact, counted, ends and half-closes pass in order, a policy change cuts it, and where the kernel
path is off or a connection cannot be paired the splice relay carries it. Every packet stays in
namespaces this test made."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from sandtree.network import fastpath, sockmap
from sandtree.network.proxy import recheck
from sandtree.network.state import Usage

from netlab import ProxyRig, netlab

pytestmark = pytest.mark.skipif(bool(sockmap.reason()), reason=sockmap.reason() or "")


@pytest.fixture(scope="module")
def eg():
    fastpath.choose("kernel")                  # what the daemon's --relay kernel does
    with netlab() as lab:
        e = ProxyRig(lab, index=203)
        try:
            yield e
        finally:
            e.close()
            fastpath.choose("splice")


@pytest.fixture(autouse=True)
def fresh(eg):
    eg.link.usage = Usage()
    eg.link.policy = None
    yield
    assert eg.lab.trap_hits() == {}, "a never-reach address accepted a connection"


def _conn(eg):
    """The proxy's Connection of the one open connection (waits for the relay to take it)."""
    deadline = time.time() + 30          # a wait, ended as soon as it holds (load makes it long)
    while time.time() < deadline:
        conns = eg.call(lambda: list(eg.link.conns))
        if conns and (conns[0].fast is not None or fastpath.STATS["splice"]):
            return conns[0]
        time.sleep(0.01)
    raise AssertionError("no relayed connection")


def _counts(eg, out: int, into: int) -> None:
    deadline = time.time() + 30          # a wait, ended as soon as it holds (load makes it long)
    while time.time() < deadline and (eg.link.usage.bytes_out, eg.link.usage.bytes_in) != (out, into):
        time.sleep(0.02)
    assert (eg.link.usage.bytes_out, eg.link.usage.bytes_in) == (out, into)


def _echo_through(s: socket.socket, data: bytes) -> bytes:
    """Send `data` and half-close while reading the echo to its end (the server closes on EOF)."""
    got = bytearray()

    def send():
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    t = threading.Thread(target=send)
    t.start()
    while chunk := s.recv(1 << 20):
        got.extend(chunk)
    t.join()
    return bytes(got)


def test_large_transfer_exact_counted_and_by_the_kernel(eg):
    eg.policy(["11.1.1.10/32:7"])
    before = dict(fastpath.STATS)
    data = os.urandom(48 << 20)
    with eg.connect(eg.lab.allowed, 7, timeout=20) as s:
        s.sendall(b"x")
        assert s.recv(1) == b"x"
        c = _conn(eg)
        assert c.fast is not None                              # relayed by the kernel
        assert _echo_through(s, data) == data                  # byte-exact, in order, both ways
    assert fastpath.STATS["kernel"] == before["kernel"] + 1
    _counts(eg, len(data) + 1, len(data) + 1)
    assert not eg.call(lambda: list(eg.link.conns))           # ended and gone


def test_https_after_its_sni_is_relayed_by_the_kernel(eg):
    """The ClientHello the proxy read goes up first; the handshake and the rest by the kernel."""
    eg.policy(["allowed.test"])
    before = dict(fastpath.STATS)
    status, body = eg.https(eg.lab.allowed, "allowed.test", "/bytes/3000000")
    assert status == 200 and len(body) == 3000000
    assert fastpath.STATS["kernel"] == before["kernel"] + 1
    deadline = time.time() + 30          # a wait, ended as soon as it holds (load makes it long)
    while eg.link.usage.bytes_in < 3000000 and time.time() < deadline:
        time.sleep(0.02)
    assert 3000000 < eg.link.usage.bytes_in < 3100000           # the body, TLS records and the handshake


def test_half_close_passes_after_the_bytes_before_it(eg):
    """The sandbox's FIN reaches the server only after its last bytes; the server's answer after
    it still comes back, then the server's own end."""
    eg.policy(["11.1.1.10/32:7"])
    with eg.connect(eg.lab.allowed, 7) as s:
        s.sendall(b"1")
        assert s.recv(1) == b"1"
        assert _conn(eg).fast is not None
        s.sendall(b"tail" * 1000)
        s.shutdown(socket.SHUT_WR)                             # the echo server closes on EOF
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        assert got == b"tail" * 1000
    _counts(eg, 4001, 4001)


def test_server_speaks_first_is_relayed(eg):
    """A banner that arrived before the pairing waits in its socket's queue and goes out then."""
    eg.policy(["11.1.1.10/32:2222"])
    with eg.connect(eg.lab.allowed, 2222) as s:
        got = b""
        while chunk := s.recv(100):
            got += chunk
        assert got.startswith(b"BANNER ")


def test_policy_change_cuts_a_kernel_relayed_connection(eg):
    eg.policy(["11.1.1.10/32:7"])
    s = eg.connect(eg.lab.allowed, 7)
    try:
        s.sendall(b"abc")
        assert s.recv(3) == b"abc"
        c = _conn(eg)
        assert c.fast is not None
        s.sendall(b"de")
        assert s.recv(2) == b"de"
        eg.call(c.sync)                                        # what the daemon's usage answer does
        assert (eg.link.usage.bytes_out, eg.link.usage.bytes_in) == (5, 5)
        eg.policy(["11.1.1.10/32:2222"])
        assert eg.call(recheck, eg.link) == 1
        s.settimeout(3)
        try:
            s.sendall(b"f")
            assert s.recv(10) == b""                           # the end, nothing more echoed
        except ConnectionError:
            pass
        assert not eg.call(lambda: c.fast.paired)             # out of the kernel's map
    finally:
        s.close()
    deadline = time.time() + 30          # a wait, ended as soon as it holds (load makes it long)
    while eg.call(lambda: list(eg.link.conns)) and time.time() < deadline:
        time.sleep(0.02)
    assert not eg.call(lambda: list(eg.link.conns))


def test_kernel_relay_off_falls_back_to_splice(eg, capfd):
    eg.policy(["11.1.1.10/32:7"])
    before = fastpath.STATS["splice"]
    try:
        eg.call(fastpath.disable, "off for a test")
        assert "kernel relay off (off for a test)" in capfd.readouterr().err
        assert fastpath.reason() == "off for a test"
        data = os.urandom(12 << 20)
        with eg.connect(eg.lab.allowed, 7, timeout=20) as s:
            assert _echo_through(s, data) == data
    finally:
        eg.call(fastpath.choose, "kernel")
    assert fastpath.STATS["splice"] == before + 1
    _counts(eg, len(data), len(data))


def _loopback_pair():
    """c -> p1 (the proxy's accepted socket), p2 -> s1 (the proxy's upstream socket), on loopback."""
    a_l, b_l = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(a_l.getsockname())
    p1, _ = a_l.accept()
    p2 = socket.create_connection(b_l.getsockname())
    s1, _ = b_l.accept()
    for s in (c, s1):
        s.settimeout(5)
    for s in (p1, p2):
        s.setblocking(False)
    a_l.close()
    b_l.close()
    return c, p1, p2, s1


def test_a_connection_ended_before_its_pairing_goes_by_splice(eg):
    """The map takes only established sockets: a client that sent its bytes and its FIN before
    the pairing is left (unread, uncounted) to the splice relay, which carries bytes and ends."""
    from sandtree.network import splice
    c, p1, p2, s1 = _loopback_pair()
    try:
        c.sendall(b"early")
        c.shutdown(socket.SHUT_WR)
        time.sleep(0.05)                                       # p1 is in CLOSE_WAIT now
        usage = Usage()
        before = dict(fastpath.STATS)

        async def go():
            if await fastpath.relay(usage, p1, p2):
                return "kernel"
            await splice.relay(usage, p1, p2)
            return "splice"
        result = []
        t = threading.Thread(target=lambda: result.append(__import__("asyncio").run(go())))
        t.start()
        got = b""
        while chunk := s1.recv(100):
            got += chunk
        s1.sendall(b"back")
        s1.close()
        back = b""
        while chunk := c.recv(100):
            back += chunk
        t.join(5)
        assert result == ["splice"] and got == b"early" and back == b"back"
        assert fastpath.STATS["splice"] == before["splice"] + 1
        assert (usage.bytes_out, usage.bytes_in) == (5, 4)
    finally:
        for s in (c, p1, p2, s1):
            s.close()


def test_program_key_matches_the_socket():
    """key_of() builds what the program reads from an skb: a pair of plain loopback connections
    relayed by a map of their own moves bytes both ways (a wrong key would leave them)."""
    h = sockmap.Sockhash()
    socks = []
    try:
        a_l, b_l = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
        c = socket.create_connection(a_l.getsockname())
        p1, _ = a_l.accept()
        p2 = socket.create_connection(b_l.getsockname())
        s1, _ = b_l.accept()
        socks = [a_l, b_l, c, p1, p2, s1]
        for s in (c, s1):
            s.settimeout(3)
        h.pair(p1, p2)
        with pytest.raises(OSError):
            h.pair(p2, p1)                                     # a key in already is never replaced
        c.sendall(b"ping")
        assert s1.recv(4) == b"ping"
        s1.sendall(b"pong")
        assert c.recv(4) == b"pong"
        h.unpair(p1, p2)
        c.sendall(b"left")                                     # unpaired: stays with p1
        assert p1.recv(4) == b"left"
    finally:
        for s in socks:
            s.close()
        h.close()


def test_a_websocket_after_101_is_relayed_by_the_kernel(eg):
    """Past an accepted upgrade on port 80 the connection is opaque: the kernel relays it, exact
    and counted (the head and the 101 by the HTTP relay, the rest by the program)."""
    eg.policy(["allowed.test:80"])
    before = dict(fastpath.STATS)
    with eg.connect(eg.lab.allowed, 80, timeout=20) as s:
        s.sendall(b"GET /upgrade HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        assert head.startswith(b"HTTP/1.1 101")
        data = os.urandom(8 << 20)
        assert _echo_through(s, data) == data
    assert fastpath.STATS["kernel"] == before["kernel"] + 1
    deadline = time.time() + 30         # both directions' counts arrive when the relay ends (load: later)
    while min(eg.link.usage.bytes_out, eg.link.usage.bytes_in) <= len(data) and time.time() < deadline:
        time.sleep(0.02)
    assert eg.link.usage.bytes_out > len(data) and eg.link.usage.bytes_in > len(data)
    assert eg.link.usage.bytes_out - len(data) < 200 and eg.link.usage.bytes_in - len(data) < 400   # the heads


def test_the_splice_relay_unless_the_kernel_one_is_chosen(eg):
    """The daemon's default (SANDTREE_EGRESS_RELAY unset): splice; config, client and daemon pass
    the choice on."""
    import subprocess
    import sys
    from sandtree import config
    eg.policy(["11.1.1.10/32:7"])
    before = dict(fastpath.STATS)
    try:
        eg.call(fastpath.choose, "splice")
        assert fastpath.reason() == fastpath.NOT_CHOSEN
        with eg.connect(eg.lab.allowed, 7) as s:
            assert _echo_through(s, b"plain") == b"plain"
    finally:
        eg.call(fastpath.choose, "kernel")
    assert fastpath.STATS["splice"] == before["splice"] + 1 and fastpath.STATS["kernel"] == before["kernel"]
    code = "from sandtree import config; print(config.egress_relay())"
    env = {k: v for k, v in os.environ.items() if k != "SANDTREE_EGRESS_RELAY"}
    for value, want in ((None, "splice"), ("kernel", "kernel"), ("KERNEL ", "kernel"), ("bpf", "splice")):
        e = env | ({"SANDTREE_EGRESS_RELAY": value} if value else {})
        out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want
    assert config.egress_relay() in ("splice", "kernel")


def test_the_daemon_takes_the_choice_from_the_environment(tmp_path, monkeypatch):
    """The client starts the store's daemon with --relay from SANDTREE_EGRESS_RELAY; its ping
    says which relay is on (and why the kernel one is off)."""
    from sandtree.network.client import Egress
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
    monkeypatch.setenv("PYTHONPATH", src)
    for value, off in (("kernel", ""), ("", fastpath.NOT_CHOSEN)):
        monkeypatch.setenv("SANDTREE_EGRESS_RELAY", value)
        e = Egress(str(tmp_path / (value or "default")))
        try:
            assert e.ping()["relay"]["kernel_off"] == off
        finally:
            e.stop_daemon()


def test_a_cut_ends_the_wait_for_a_reader_that_never_reads():
    """The sandbox sent its last bytes and its FIN, the server reads nothing: the relay waits for
    those bytes to go out before it passes the FIN on; a cut (Connection.close) ends that wait."""
    import asyncio
    from sandtree.network.proxy import Connection
    fastpath.choose("kernel")
    c, p1, p2, s1 = _loopback_pair()
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        conn = Connection(None, [], None, 7, False, ())
        conn.sockets += [p1, p2]
        usage = Usage()
        job = asyncio.run_coroutine_threadsafe(fastpath.relay(usage, p1, p2, conn), loop)
        deadline = time.time() + 30          # a wait, ended as soon as it holds (load makes it long)
        while conn.fast is None and time.time() < deadline:
            time.sleep(0.01)
        assert conn.fast is not None
        c.settimeout(10)
        c.sendall(os.urandom(50 << 20))                       # more than p2 can hold: s1 reads nothing
        c.shutdown(socket.SHUT_WR)
        time.sleep(1.0)
        import select
        poll = select.poll()
        poll.register(p1.fileno(), select.POLLRDHUP)
        assert poll.poll(0), "the FIN reached the proxy"        # so the relay is past the event ...
        assert not job.done()                                  # ... waiting for the bytes before it
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(3)
        loop.call_soon_threadsafe(conn.close)
        assert job.result(3) is True                           # the cut ended it
        assert 0 < usage.bytes_out <= 50 << 20
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(3)
        for s in (c, p1, p2, s1):
            s.close()
        fastpath.choose("splice")
