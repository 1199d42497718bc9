"""Plain HTTP on port 80 through the egress proxy (network/plainhttp.py): every request of a
kept-alive connection is decided by its own Host, and framing is strict (request smuggling is the
attack: a request the proxy reads as one and the server as two, the second for another host).

The real ruleset, proxy and resolver (tests/netlab.ProxyRig) against netlab's HTTP server, which
records each request it parsed (lab.requests). Where sites share an address -- allowed.test,
www.allowed.test and (here, as a CDN would) a forbidden host asked by Host on the same address --
the test checks what the server saw, not only what the client got back. Every packet stays in
namespaces netlab made."""

from __future__ import annotations

import json
import socket

import pytest

from sandtree.network import httpio, plainhttp
from sandtree.network.state import Usage

from netlab import ALLOWED, proxy_rig, read_all


@pytest.fixture(scope="module")
def rig():
    with proxy_rig(202) as r:
        yield r


@pytest.fixture(autouse=True)
def fresh(rig):
    rig.link.usage = Usage()
    rig.link.names.clear()
    rig.policy(["allowed.test", "www.allowed.test"])
    rig.lab.requests.clear()
    yield
    assert rig.lab.trap_hits() == {}


def exchange(rig, raw: bytes, ip=ALLOWED) -> bytes:
    s = rig.connect(ip, 80)
    with s:
        s.sendall(raw)
        return read_all(s)


def responses(data: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each response in `data` (Content-Length framed, as the proxy's and
    netlab's answers are)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
        n = int(fields.get(b"content-length", b"0"))
        out.append((status, rest[:n]))
        data = rest[n:]
    return out


def seen_hosts(rig) -> list[str]:
    return [r["headers"].get("host") for r in rig.lab.requests]


def test_kept_alive_requests_with_bodies_are_each_relayed(rig):
    raw = b""
    for i in range(10):
        raw += b"GET /g%d HTTP/1.1\r\nHost: allowed.test\r\n\r\n" % i
        raw += b"POST /p%d HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\nhello" % i
        raw += (b"POST /c%d HTTP/1.1\r\nHost: Allowed.Test:80\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3;ext=1\r\nabc\r\n0A\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n" % i)
    raw += b"GET /last HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
    raw += b"HEAD /h HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET /after HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"
    data = exchange(rig, raw)
    head_at = data.index(b"HTTP/1.1 200 OK", data.index(b'"/last"'))
    got = responses(data[:head_at])
    assert [s for s, _ in got] == [200] * 31
    assert json.loads(got[-1][1])["path"] == "/last"
    head, _, after = data[head_at:].partition(b"\r\n\r\n")     # HEAD: the head only, the next one follows
    assert b"Content-Length" in head and json.loads(responses(after)[0][1])["path"] == "/after"
    bodies = {r["path"]: r["body"] for r in rig.lab.requests}
    assert bodies["/p3"] == "hello" and bodies["/c7"] == "abc0123456789"
    assert len(rig.lab.requests) == 33 and rig.link.usage.connections == 1


def test_a_later_request_for_a_forbidden_host_is_refused_with_the_reason(rig):
    data = exchange(rig, b"GET /a HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
                         b"GET /b HTTP/1.1\r\nHost: other.test\r\n\r\n"
                         b"GET /c HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
    (s1, _), (s2, b2) = responses(data)
    assert (s1, s2) == (200, 403)
    assert b"other.test:80" in b2 and b"not in the allow-list" in b2
    assert seen_hosts(rig) == ["allowed.test"]             # /b and what followed it never went out
    assert [(r["host"], r["port"]) for r in rig.link.usage.refused_hosts] == [("other.test", 80)]


def test_a_later_request_for_another_allowed_host_on_the_address_is_misdirected(rig):
    # www.allowed.test is allowed and lives on the same address: still not sent on a connection
    # dialled for allowed.test (421: the client opens its own connection for it)
    data = exchange(rig, b"GET /a HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
                         b"GET /b HTTP/1.1\r\nHost: www.allowed.test\r\n\r\n")
    (s1, _), (s2, b2) = responses(data)
    assert (s1, s2) == (200, 421) and b"needs a connection of its own" in b2
    assert seen_hosts(rig) == ["allowed.test"] and rig.link.usage.refused_hosts == []
    assert responses(exchange(rig, b"GET /b HTTP/1.1\r\nHost: www.allowed.test\r\nConnection: close\r\n\r\n"))[0][0] == 200


@pytest.mark.parametrize("second", [
    b"GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",     # absolute form names another
    b"GET / HTTP/1.1\r\n\r\n",                                           # no Host: not this name's
    b"GET / HTTP/1.0\r\n\r\n",
])
def test_a_later_request_naming_another_host_otherwise_never_goes_out(rig, second):
    data = exchange(rig, b"GET /a HTTP/1.1\r\nHost: allowed.test\r\n\r\n" + second)
    statuses = [s for s, _ in responses(data)]
    assert statuses[0] == 200 and statuses[1] in (400, 421) and len(statuses) == 2
    assert seen_hosts(rig) == ["allowed.test"]


@pytest.mark.parametrize("smuggle", [
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4, 4\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: +4\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding : chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding:\x0bchunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nX: a\r\n Transfer-Encoding: chunked\r\n\r\n",   # obs-fold
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nX: a\nTransfer-Encoding: chunked\r\n\r\n",    # bare LF
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nX: a\rTransfer-Encoding: chunked\r\n\r\n",    # bare CR
    b"POST / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test other.test\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: allowed.test\x00.other.test\r\n\r\n",
    b"CONNECT other.test:80 HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
    b"POST / HTTP/1.0\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n",
])
def test_ambiguous_framing_is_refused_before_anything_goes_out(rig, smuggle):
    tail = b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"
    for first in (b"", b"GET /a HTTP/1.1\r\nHost: allowed.test\r\n\r\n"):  # as the first and a later request
        rig.lab.requests.clear()
        got = responses(exchange(rig, first + smuggle + b"0\r\n\r\n" + tail))
        assert [s for s, _ in got][:len(first) and 1] == [200] * (1 if first else 0)
        assert got[-1][0] in (400, 405, 501), got
        assert seen_hosts(rig) == (["allowed.test"] if first else [])


@pytest.mark.parametrize("size", [b"0x5", b"+5", b" 5", b"5 ", b"-0", b"1_0", b"5\n", b"G",
                                  b"1" + b"0" * 16, b"", b"5;a\x00"])
def test_bad_chunk_sizes_cut_the_connection(rig, size):
    raw = (b"POST /c HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n" + size +
           b"\r\nhello\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n")
    data = exchange(rig, raw)
    assert b"other.test" not in data and "other.test" not in seen_hosts(rig)
    assert "/smuggled" not in [r["path"] for r in rig.lab.requests]


def test_bad_chunk_framing_after_the_size_cuts_too(rig):
    for body in (b"5\r\nhelloXX0\r\n\r\n",                     # data not followed by CRLF
                 b"5\r\nhello\r\n0\r\nbad trailer\r\n\r\n",     # a trailer that is not a field
                 b"5\r\nhello\r\n0\r\nX: a\nHost: other.test\r\n\r\n"):
        rig.lab.requests.clear()
        exchange(rig, b"POST /c HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n" + body +
                 b"GET /smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n")
        assert "/smuggled" not in [r["path"] for r in rig.lab.requests]


def test_an_upgrade_the_server_refused_leaves_the_connection_http(rig):
    data = exchange(rig, b"GET /no HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                         b"GET /b HTTP/1.1\r\nHost: other.test\r\n\r\n")
    (s1, _), (s2, b2) = responses(data)
    assert (s1, s2) == (200, 403) and b"other.test" in b2
    assert seen_hosts(rig) == ["allowed.test"]


def test_an_upgrade_the_server_accepted_is_relayed_both_ways(rig):
    s = rig.connect(ALLOWED, 80)
    with s:
        s.sendall(b"GET /upgrade HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        assert head.startswith(b"HTTP/1.1 101")
        frame = b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"   # the new protocol's bytes, not HTTP
        s.sendall(frame)
        got = b""
        while len(got) < len(frame):
            got += s.recv(4096)
        assert got == frame
    assert seen_hosts(rig) == ["allowed.test"]


def test_an_h2c_upgrade_offer_is_taken_out(rig):
    data = exchange(rig, b"GET /h HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAA\r\n"
                         b"Connection: Upgrade, HTTP2-Settings, close\r\n\r\n")
    assert responses(data)[0][0] == 200
    headers = rig.lab.requests[-1]["headers"]
    assert "upgrade" not in headers and "http2-settings" not in headers and headers["connection"] == "close"


def test_a_huge_head_is_refused_first_or_later(rig):
    huge = b"GET / HTTP/1.1\r\nHost: allowed.test\r\nX-Big: " + b"a" * (httpio.MAX_HEAD + 10) + b"\r\n\r\n"
    assert responses(exchange(rig, huge))[0][0] == 431
    got = responses(exchange(rig, b"GET /a HTTP/1.1\r\nHost: allowed.test\r\n\r\n" + huge))
    assert [s for s, _ in got] == [200, 431]
    many = b"GET / HTTP/1.1\r\nHost: allowed.test\r\n" + b"X: y\r\n" * (httpio.MAX_HEADERS + 1) + b"\r\n"
    assert responses(exchange(rig, many))[0][0] == 431
    assert seen_hosts(rig) == ["allowed.test"]


def test_a_request_without_host_is_decided_by_its_address_alone(rig):
    rig.dns("allowed.test")                                  # the resolver answered the name for the address
    data = exchange(rig, b"GET / HTTP/1.0\r\n\r\n")
    assert responses(data)[0][0] == 403 and rig.lab.requests == []
    rig.policy(["allowed.test", f"{ALLOWED}/32:80"])           # a network rule naming the address: fine
    assert responses(exchange(rig, b"GET /n HTTP/1.0\r\n\r\n"))[0][0] == 200


def test_not_http_on_port_80_is_decided_by_its_address_alone(rig):
    rig.dns("allowed.test")
    hits = rig.lab.hits[(ALLOWED, 80)]
    s = rig.connect(ALLOWED, 80)
    with s:
        s.sendall(b"\x16\x03\x01junk\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass
    assert rig.lab.hits[(ALLOWED, 80)] == hits
    assert any("not in the allow-list" in r["reason"] for r in rig.link.usage.refused_hosts)


def test_a_large_upload_and_download_keep_their_framing(rig):
    n = 3 << 20                                              # spliced both ways (past SPLICE_MIN)
    body = bytes(range(256)) * (n // 256)
    s = rig.connect(ALLOWED, 80)
    with s:
        s.sendall(b"PUT /up HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: %d\r\n\r\n" % n + body +
                  b"GET /bytes/%d HTTP/1.1\r\nHost: allowed.test\r\n\r\n" % n +
                  b"GET /end HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
        data = read_all(s)
    got = responses(data)
    assert [st for st, _ in got] == [200, 200, 200] and len(got[1][1]) == n
    assert rig.lab.requests[0]["body"].encode("latin-1") == body
    assert rig.link.usage.bytes_out > n and rig.link.usage.bytes_in > n


def test_first_line_detection():
    assert plainhttp._looks_http(b"GET / HTTP/1.1\r\n") is True
    assert plainhttp._looks_http(b"GET /a") is None
    assert plainhttp._looks_http(b"\x16\x03\x01") is False
    assert plainhttp._looks_http(b"SSH-2.0-OpenSSH_9.2\r\n") is False
    assert plainhttp._looks_http(b"GET / HTTP/2\r\n") is False


def _curl(rig, *args) -> str:
    import os
    import shutil
    import subprocess
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    resolve = [a for n in ("allowed.test", "www.allowed.test", "other.test") for a in ("--resolve", f"{n}:80:{ALLOWED}")]
    out = subprocess.run(["nsenter", f"--net=/proc/{os.getpid()}/fd/{rig.sandbox_fd}", "curl", "-sS", "-v",
                          "--max-time", "10", *resolve, *args], pass_fds=(rig.sandbox_fd,),
                         capture_output=True, text=True, timeout=30)
    return out.stdout + out.stderr


def test_real_curl_reuses_a_connection_uploads_chunked_and_is_refused_readably(rig):
    text = _curl(rig, "http://allowed.test/a", "http://allowed.test/b",
                 "-H", "Transfer-Encoding: chunked", "--data-binary", "x=1")
    assert text.count("Re-using existing connection") >= 1 and rig.link.usage.connections == 1, text
    assert [r["path"] for r in rig.lab.requests] == ["/a", "/b"] and rig.lab.requests[1]["body"] == "x=1"
    text = _curl(rig, "http://allowed.test/c", "http://www.allowed.test/d", "http://other.test/e")
    assert '"path": "/c"' in text and '"path": "/d"' in text             # a connection per host: both served
    assert "403 Forbidden" in text and "other.test:80" in text and "not in the allow-list" in text


def test_field_lines_are_strict_in_requests_and_only_structural_in_responses():
    assert httpio.field_line(b"X-A: b\tc") == (b"X-A", b"b\tc")
    for bad in (b"X A: b", b"X-A : b", b" X-A: b", b"X-A b", b": b", b"X-A: b\rc", b"X-A: b\nc", b"X-A: b\0"):
        for request in (True, False):
            with pytest.raises(httpio.Refuse):
                httpio.field_line(bad, request)
    with pytest.raises(httpio.Refuse):
        httpio.field_line(b"X-A: b\x01c")
    assert httpio.field_line(b"X-A: b\x01c", request=False) == (b"X-A", b"b\x01c")
    assert httpio.chunk_size(b"1aF;name=v\r\n") == 0x1af
    for bad in (b"0x5\r\n", b"+5\r\n", b" 5\r\n", b"5 \r\n", b"1_0\r\n", b"\r\n", b"5\n", b"5;\x00\r\n"):
        with pytest.raises(httpio.Closed):
            httpio.chunk_size(bad)
