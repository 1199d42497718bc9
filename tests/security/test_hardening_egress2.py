"""Attack review of issue 14/15's network additions, from inside a sandbox (an HTTP client of the
proxy) and from a run that leaves processes behind.

Finding F3 (fixed): the interceptor masked a secret's value in responses only as it is, while it
sends the value percent-encoded (request target), form-encoded (form bodies), JSON-escaped (JSON
bodies) and base64-encoded (inside `Authorization: Basic`): a host that echoes the request handed
the sandbox the value in the proxy's own encoding, undone in one line. Real TLS upstream and
interceptor on loopback (the helpers of tests/unit/test_egress_secrets.py)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import urllib.parse

import pytest

from sandtree.network import substitute
from sandtree.network.httpio import Masker
from sandtree.network.state import LinkState
from sandtree.network.trust import bundle, link_ca, parse_secrets
from test_egress_secrets import Conn, Loop, Proxy, Upstream, _server_ctx, _test_ca
from test_egress_warm import eng, img, lab, wait_linked  # noqa: F401 (fixtures: the real daemon on a netlab)

API = "api.example.org"
# a value as real tokens are (base64 alphabets, punctuation): its encodings differ from it
VALUE = 'AKIA/s3cr+et=va l&ue"q\\z~é'


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("echo")
    up_ca, leaf, key = _test_ca([API])
    loop = Loop()
    up = loop.run(Upstream(_server_ctx(tmp, leaf, key)).start())
    secrets = parse_secrets({"TOKEN": {"value": VALUE, "hosts": [API]}})
    link = LinkState(key="echo", index=1, address="100.64.1.2", gateway="100.64.1.1", policy=None,
                     secrets=secrets, ca=link_ca("echo", secrets))
    import ssl
    proxy = Proxy(link, up.port, ssl.create_default_context(cadata=up_ca.decode()))
    port = loop.run(proxy.listen(API))
    ctx = ssl.create_default_context(cadata=bundle(link.ca.pem(), up_ca).decode())
    yield type("Env", (), dict(loop=loop, up=up, port=port, ctx=ctx, ph=secrets[0].placeholder))
    loop.close_all([*proxy.listeners.values(), up.server])


def _raw(env, request: bytes) -> bytes:
    c = Conn(API, env.port, env.ctx)
    c.connect()
    c.sock.sendall(request)
    got = b""
    while chunk := c.sock.recv(65536):
        got += chunk
    c.sock.close()
    return got


def _encodings() -> dict[str, bytes]:
    return {"raw": VALUE.encode(), "percent": urllib.parse.quote(VALUE, safe="").encode(),
            "form": urllib.parse.quote_plus(VALUE).encode(), "json": json.dumps(VALUE)[1:-1].encode(),
            "basic": base64.b64encode(b"user:" + VALUE.encode())}


def _leaks(got: bytes) -> list[str]:
    return [k for k, v in _encodings().items() if v in got]


def test_an_echoed_request_target_does_not_give_the_value_back_percent_encoded(env):
    got = _raw(env, f"GET /echo?q={env.ph} HTTP/1.1\r\nHost: {API}\r\nConnection: close\r\n\r\n".encode())
    sent = env.up.requests[-1]["target"]
    assert sent == "/echo?q=" + urllib.parse.quote(VALUE, safe="")     # the host did get the value
    assert got.startswith(b"HTTP/1.1 200") and _leaks(got) == []


def test_an_echoed_form_body_does_not_give_the_value_back_form_encoded(env):
    body = f"k={env.ph}".encode()
    got = _raw(env, f"POST /echo HTTP/1.1\r\nHost: {API}\r\nContent-Type: application/x-www-form-urlencoded"
                    f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    assert env.up.requests[-1]["body"] == b"k=" + urllib.parse.quote_plus(VALUE).encode()
    assert got.startswith(b"HTTP/1.1 200") and _leaks(got) == []


def test_an_echoed_basic_credential_does_not_give_the_value_back_base64_encoded(env):
    cred = base64.b64encode(f"user:{env.ph}".encode()).decode()
    got = _raw(env, f"GET /echo-header HTTP/1.1\r\nHost: {API}\r\nAuthorization: Basic {cred}\r\n"
                    f"Connection: close\r\n\r\n".encode())
    assert (b"Basic " + _encodings()["basic"]).decode() in dict(env.up.requests[-1]["headers"]).values()
    assert got.startswith(b"HTTP/1.1 200") and _leaks(got) == []


def test_masks_cover_every_encoding_the_substitution_writes():
    secrets = parse_secrets({"T": {"value": VALUE, "hosts": [API]}})
    ph = secrets[0].placeholder
    sent: list = substitute.masks(secrets)
    written = [substitute.target(f"/x?{ph}".encode(), secrets)[3:],
               substitute.body(ph.encode(), secrets, b"application/json"),
               substitute.body(ph.encode(), secrets, b"application/x-www-form-urlencoded"),
               substitute.value(b"Basic " + base64.b64encode(f"u:{ph}".encode()), secrets, sent)[6:]]
    for w in written:
        m = Masker(sent)
        out = m.feed(b"<" + w + b">") + m.end()
        assert out == b"<" + b"*" * len(w) + b">", w


# ---- a run's processes and its link ---------------------------------------------------------------

pytestmark_net = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nft")




def _in_netns(inode: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == inode:
                out.append(int(pid))
        except OSError:
            pass
    return out


@pytestmark_net
def test_a_runs_background_processes_do_not_outlive_it_in_its_link(eng, img):
    """A networked run (warm, linked) leaves daemons behind (setsid, nohup, double fork): none is
    in its link once the run returns, and the next run's link is another namespace."""
    policy = {"allow_out": ["11.1.1.0/24:80"]}
    eng.run(img, "true", network=policy, disposable=True)          # the linked pool starts
    wait_linked(eng)
    cmd = ("readlink /proc/self/ns/net; (setsid sleep 300 &) ; nohup sleep 300 >/dev/null 2>&1 & "
           "sh -c 'sleep 300 & exit 0'; exit 0")
    first = eng.run(img, cmd, network=policy, disposable=True)
    inode = first.stdout.decode().split()[0]
    assert inode.startswith("net:[")
    end = time.monotonic() + 3                 # (the helper, in the link too, may still be exiting)
    while (left := _in_netns(inode)) and time.monotonic() < end:
        time.sleep(0.05)
    assert left == [], [open(f"/proc/{p}/cmdline", "rb").read()[:80] for p in left]
    second = eng.run(img, "readlink /proc/self/ns/net", network=policy, disposable=True)
    assert second.stdout.decode().split()[0] != inode


# ---- plain HTTP on port 80: a request's name and framing, as the proxy reads them ---------------

@pytest.mark.parametrize("head,status", [
    (b"GET http://a.com@evil.com/ HTTP/1.1\r\nHost: a.com\r\n\r\n", 400),          # userinfo in the target
    (b"GET http://evil.com/ HTTP/1.1\r\nHost: a.com\r\n\r\n", 400),                 # target and Host differ
    (b"GET / HTTP/1.1\r\nHost: a.com\r\nHost: evil.com\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a.com, evil.com\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a.com%2fevil.com\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a.com\r\n Host: evil.com\r\n\r\n", 400),            # obs-fold
    (b"GET / HTTP/1.1\r\nhost : evil.com\r\n\r\n", 400),                            # blank before ':'
    (b"GET / HTTP/1.1\r\nHost: a.com\r\nTransfer-Encoding : chunked\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a.com\r\nTransfer-Encoding: \x0bchunked\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a.com\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a.com\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\nHost: a.com\r\nTransfer-Encoding: identity, chunked\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: +5\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: 5, 5\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400),
    (b"POST / HTTP/1.0\r\nHost: a.com\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"CONNECT evil.com:443 HTTP/1.1\r\nHost: evil.com:443\r\n\r\n", 405),
])
def test_smuggling_heads_are_refused_not_normalised(head, status):
    from sandtree.network.httpio import Refuse
    from sandtree.network.plainhttp import parse_request
    with pytest.raises(Refuse) as e:
        parse_request(head)
    assert e.value.status == status


def test_names_that_are_one_host_decide_as_one_and_h2c_is_taken_out():
    from sandtree.network.plainhttp import parse_request
    assert parse_request(b"GET HTTP://A.COM./ HTTP/1.1\r\nHost: a.com:80\r\n\r\n").name == "a.com"
    r = parse_request(b"GET / HTTP/1.1\r\nHost: a.com\r\nUpgrade: websocket, h2c\r\nConnection: upgrade\r\n\r\n")
    assert not r.upgrade and b"h2c" not in r.head() and b"Upgrade" not in r.head()


# ---- F6: a body of placeholders grows in the daemon's memory ----------------------------------------

class _Discard:
    """An HTTPS upstream (`ctx`) that reads each request's body (Content-Length or chunked) without
    keeping it and answers with the number of body bytes it read."""

    def __init__(self, ctx):
        self.ctx = ctx

    async def start(self):
        import asyncio
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ctx)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, r, w):
        import asyncio
        try:
            while True:
                head = (await r.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                n = 0
                if "transfer-encoding: chunked" in head:
                    while size := int((await r.readuntil(b"\r\n")).split(b";")[0], 16):
                        n += len(await r.readexactly(size))
                        await r.readexactly(2)
                    await r.readuntil(b"\r\n")
                else:
                    left = int(head.split("content-length: ")[1].split("\r\n")[0])
                    while left:
                        left -= len(await r.read(min(left, 1 << 20)))
                        n = int(head.split("content-length: ")[1].split("\r\n")[0]) - left
                body = str(n).encode()
                w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_of_placeholders_is_not_multiplied_in_the_daemons_memory(chunked, tmp_path):
    """A sandbox's 1 MiB body made of a secret's placeholder (50 bytes) becomes 327 MiB with a 16 KiB
    value: it was built in memory whole (and each 256 KiB read of a chunked or spooled body became
    84 MiB); 256 such requests a link were the daemon's memory, every tenant's egress. It is still
    sent whole, streamed in slices."""
    import asyncio
    import http.client
    import tracemalloc
    value = "v" * (16 << 10)
    secrets = parse_secrets({"K": {"value": value, "hosts": [API]}})
    link = LinkState(key="grow", index=2, address="100.64.2.2", gateway="100.64.2.1", policy=None,
                     secrets=secrets, ca=link_ca("grow", secrets))
    import ssl
    up_ca, leaf, key = _test_ca([API])
    loop = Loop()
    up = loop.run(_Discard(_server_ctx(tmp_path, leaf, key)).start())
    proxy = Proxy(link, up.port, ssl.create_default_context(cadata=up_ca.decode()))
    port = loop.run(proxy.listen(API))
    ctx = ssl.create_default_context(cadata=link.ca.pem().decode())
    ph = secrets[0].placeholder.encode()
    body = ph * ((1 << 20) // len(ph))
    expect = len(body) // len(ph) * len(value)
    try:
        tracemalloc.start()
        c = Conn(API, port, ctx, timeout=60)
        if chunked:
            c.request("POST", "/", body=(body[i:i + 65536] for i in range(0, len(body), 65536)),
                      headers={"Host": API, "Content-Type": "text/plain"})
        else:
            c.request("POST", "/", body=body, headers={"Host": API, "Content-Type": "text/plain"})
        got = c.getresponse().read()
        c.close()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert int(got) == expect                                   # the host got every value
        assert peak < 48 << 20, f"{peak >> 20} MiB held for a {len(body) >> 10} KiB body"
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        loop.close_all([*proxy.listeners.values(), up.server])
