"""Secret injection (issue 14, item 6): the per-link CA (network/ca.py), the interceptor
(network/intercept.py, network/httpio.py) and what the sandbox is given to trust it
(network/trust.py).

Everything on loopback: a real upstream HTTPS (and HTTP: it never gets a value) server with its own
test CA that records what it received; a stand-in for the egress proxy that, like proxy.py, hands a connection to
`intercept.handle` when `intercept.wants` says so and splices it otherwise; and a "sandbox" client
(blocking ssl + http.client) that trusts only what trust.bundle gives it."""

from __future__ import annotations

import asyncio
import base64
import datetime
import http.client
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import threading
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sandtree.errors import InvalidInput
from sandtree.network import intercept
from sandtree.network.ca import CA, placeholder
from sandtree.network.httpio import Masker
from sandtree.network.state import LinkState
from sandtree.network.trust import CA_VARIABLES, bundle, link_ca, parse_secrets, placeholders, sandbox_env

API = "api.example.org"
OTHER = "other.example.net"
PLAIN = "unlisted.example.com"
NAMES = [API, OTHER, PLAIN, "deep.svc.example.org"]
TOKEN = "tok-REAL-value-4f9a1c77e2b0d3a5"
OTHER_TOKEN = "other-REAL-9be21c0d77aa"


# ---- a test CA and the upstream servers that record what they receive -------------------------

def _test_ca(names):
    """(ca_pem, server_context) of an upstream with its own CA, certified for `names`."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test upstream CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    return ca_pem, leaf.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _server_ctx(tmp, leaf_pem, key_pem):
    path = tmp / f"leaf-{id(leaf_pem)}.pem"
    path.write_bytes(leaf_pem + key_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(path))
    path.unlink()
    return ctx


class Upstream:
    """An HTTP/1.1 server (TLS when given a context) that records every request:
    {"sni", "conn", "method", "target", "headers" (list of pairs), "body"} and answers by path:
      /echo          the request as JSON, Content-Length
      /echo-chunked  the same JSON, chunked in 7-byte chunks (a value straddles chunks)
      /echo-header   the Authorization header back in a response header, and "ok"
      /echo-close    the JSON, delimited by closing the connection
      anything else  "ok" """

    def __init__(self, ctx=None):
        self.ctx, self.requests, self.server, self.conns = ctx, [], None, 0

    async def start(self):
        if self.ctx is not None:
            self.ctx.sni_callback = lambda obj, name, ctx: setattr(obj, "sni", name)
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ctx)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, r, w):
        self.conns += 1
        conn = self.conns
        obj = w.get_extra_info("ssl_object")
        sni = getattr(obj, "sni", None) if obj is not None else None
        try:
            while True:
                try:
                    head = await r.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head[:-4].decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ")
                headers = [tuple(x.strip() for x in ln.split(":", 1)) for ln in lines[1:]]
                hd = {k.lower(): v for k, v in headers}
                trailers = []
                if hd.get("transfer-encoding") == "chunked":
                    body = b""
                    while True:
                        size = int((await r.readuntil(b"\r\n")).split(b";")[0], 16)
                        body += await r.readexactly(size + 2) if size else b""
                        if size:
                            body = body[:-2]
                        else:
                            while (t := await r.readuntil(b"\r\n")) != b"\r\n":
                                trailers.append(t[:-2].decode("latin-1"))
                            break
                else:
                    body = await r.readexactly(int(hd.get("content-length", 0)))
                rec = {"sni": sni, "conn": conn, "method": method, "target": target, "headers": headers,
                       "body": body, "trailers": trailers}
                self.requests.append(rec)
                echo = json.dumps({"target": target, "headers": headers, "body": body.decode("latin-1")}).encode()
                path = target.split("?")[0]
                if path == "/echo":
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(echo), echo))
                elif path == "/echo-chunked":
                    w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
                        b"%x\r\n%s\r\n" % (len(echo[i:i + 7]), echo[i:i + 7]) for i in range(0, len(echo), 7))
                        + b"0\r\n\r\n")
                elif path == "/echo-header":
                    w.write(b"HTTP/1.1 200 OK\r\nX-Echo: %s\r\nContent-Length: 2\r\n\r\nok"
                            % hd.get("authorization", "").encode())
                elif path == "/ws" and hd.get("upgrade") == "websocket":
                    w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                            b"X-Echo: %s\r\n\r\n" % hd.get("authorization", "").encode())
                    await w.drain()
                    while data := await r.read(65536):       # the frames, echoed as they are
                        self.requests.append({"sni": sni, "conn": conn, "ws": data, "headers": []})
                        w.write(data)
                        await w.drain()
                    return
                elif path == "/huge-head":
                    w.write(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\nContent-Length: 0\r\n\r\n")
                elif path == "/then-close":            # an idle timeout, right after answering
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await w.drain()
                    return
                elif path == "/bad-framing":
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
                elif path == "/big":
                    n = int(target.split("=")[1])
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n)
                    block = b"x" * 65536
                    while n > 0:
                        w.write(block[:n])
                        n -= 65536
                        await w.drain()
                elif path == "/echo-close":
                    w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + echo)
                    await w.drain()
                    w.close()
                    return
                else:
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n" + (b"" if method == "HEAD" else b"ok"))
                await w.drain()
        finally:
            w.close()


class Proxy:
    """Stands in for proxy.py: one listener per name (the real one reads SNI/Host); a connection
    whose name `intercept.wants` goes to `intercept.handle`, any other is spliced as it is."""

    def __init__(self, link, upstream_port, tls, port=443):
        self.link, self.up, self.tls, self.port, self.listeners = link, upstream_port, tls, port, {}

    async def listen(self, name):
        server = await asyncio.start_server(lambda r, w: self._serve(name, r, w), "127.0.0.1", 0)
        self.listeners[name] = server
        return server.sockets[0].getsockname()[1]

    async def _serve(self, name, r, w):
        first = await r.read(65536)

        async def connect():
            return await asyncio.open_connection("127.0.0.1", self.up)
        # the stand-in dials the name's upstream itself (as proxy.py does a name it resolved)
        if intercept.wants(self.link, name, self.port, True):
            await intercept.handle(self.link, name, self.port, (r, w), first, connect,
                                   self.tls if self.port == 443 else None)
            return
        ur, uw = await connect()
        uw.write(first)

        async def pump(a, b):
            try:
                while data := await a.read(65536):
                    b.write(data)
                    await b.drain()
            except ConnectionError:
                pass
            finally:
                b.close()
        await asyncio.gather(pump(r, uw), pump(ur, w))


class Loop:
    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close_all(self, servers):
        """Close `servers`, cancel every task left on the loop, stop it."""
        async def close():
            for server in servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self.run(close())
        self.stop()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class Conn(http.client.HTTPConnection):
    """The sandbox's client: connects to the proxy's port for `name`, SNI and Host `name`."""

    def __init__(self, name, port, ctx=None, timeout=10):
        super().__init__(name, port, timeout=timeout)
        self.ctx, self.sni = ctx, name

    def connect(self):
        sock = socket.create_connection(("127.0.0.1", self.port), self.timeout)
        self.sock = self.ctx.wrap_socket(sock, server_hostname=self.sni) if self.ctx else sock


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("secrets")
    up_ca, leaf, key = _test_ca(NAMES)
    loop = Loop()
    up = loop.run(Upstream(_server_ctx(tmp, leaf, key)).start())
    plain_up = loop.run(Upstream().start())
    secrets = parse_secrets({"API_TOKEN": {"value": TOKEN, "hosts": [API, "*.svc.example.org"]},
                             "OTHER_TOKEN": {"value": OTHER_TOKEN, "hosts": [OTHER]}})
    link = LinkState(key="t1", index=1, address="100.64.1.2", gateway="100.64.1.1", policy=None,
                     secrets=secrets, ca=link_ca("t1", secrets))
    upstream_tls = ssl.create_default_context(cadata=up_ca.decode())
    proxy = Proxy(link, up.port, upstream_tls)
    plain_proxy = Proxy(link, plain_up.port, None, port=80)
    ports = {n: loop.run(proxy.listen(n)) for n in NAMES}
    plain_ports = {n: loop.run(plain_proxy.listen(n)) for n in (API, PLAIN)}
    # the sandbox trusts what the run is given: the image's store (here: the test CA) + the link's CA
    sandbox_ctx = ssl.create_default_context(cadata=bundle(link.ca.pem(), up_ca).decode())
    only_link = ssl.create_default_context(cadata=link.ca.pem().decode())
    ph = {s.name: s.placeholder for s in secrets}
    e = type("Env", (), dict(loop=loop, up=up, plain_up=plain_up, link=link, ports=ports, plain_ports=plain_ports,
                             ctx=sandbox_ctx, only_link=only_link, ph=ph, up_ca=up_ca, tmp=tmp, proxy=proxy,
                             upstream_tls=upstream_tls))
    yield e
    loop.close_all([*proxy.listeners.values(), *plain_proxy.listeners.values(), up.server, plain_up.server])


def _req(e, name, method, target, headers=None, body=None, ctx="link", conn=None):
    c = conn or Conn(name, e.ports[name], e.only_link if ctx == "link" else e.ctx)
    c.request(method, target, body=body, headers=headers or {})
    resp = c.getresponse()
    data = resp.read()
    if conn is None:
        c.close()
    return resp, data


def _last(e, up=None):
    return (up or e.up).requests[-1]


def _hdr(rec, name):
    return [v for k, v in rec["headers"] if k.lower() == name.lower()]


# ---- the listed host gets the value; nobody else; the sandbox never sees it ------------------

def test_listed_host_receives_the_value_in_header_query_json_and_basic_auth(env):
    ph = env.ph["API_TOKEN"]
    body = json.dumps({"token": ph, "n": 1}).encode()
    basic = base64.b64encode(f"user:{ph}".encode()).decode()
    resp, data = _req(env, API, "POST", f"/echo?key={ph}&x=1",
                      {"Authorization": f"Bearer {ph}", "X-Basic": f"Basic {basic}",
                       "Content-Type": "application/json"}, body)
    assert resp.status == 200
    rec = _last(env)
    assert rec["sni"] == API
    assert rec["target"] == f"/echo?key={TOKEN}&x=1"
    assert _hdr(rec, "Authorization") == [f"Bearer {TOKEN}"]
    assert base64.b64decode(_hdr(rec, "X-Basic")[0].split()[1]) == f"user:{TOKEN}".encode()
    assert json.loads(rec["body"]) == {"token": TOKEN, "n": 1}      # and its new Content-Length framed it
    assert _hdr(rec, "Content-Length") == [str(len(rec["body"]))]
    assert ph not in json.dumps([rec["target"], rec["headers"]]) and ph.encode() not in rec["body"]
    # the host echoed all of it: the sandbox sees masks, never the value
    assert TOKEN.encode() not in data and b"*" * len(TOKEN) in data


def test_wildcard_host_and_form_body_get_the_value_encoded(env):
    ph = env.ph["API_TOKEN"]
    resp, _ = _req(env, "deep.svc.example.org", "POST", "/", {"Content-Type": "application/x-www-form-urlencoded"},
                   f"a=1&token={ph}".encode())
    assert resp.status == 200 and _last(env)["body"] == f"a=1&token={TOKEN}".encode()


def test_a_placeholder_goes_out_unchanged_to_a_host_its_secret_is_not_for(env):
    mine, theirs = env.ph["API_TOKEN"], env.ph["OTHER_TOKEN"]
    _req(env, OTHER, "GET", f"/?a={mine}", {"Authorization": f"Bearer {theirs}", "X-Other": mine})
    rec = _last(env)
    assert rec["sni"] == OTHER and rec["target"] == f"/?a={mine}"
    assert _hdr(rec, "Authorization") == [f"Bearer {OTHER_TOKEN}"] and _hdr(rec, "X-Other") == [mine]
    assert TOKEN not in json.dumps(rec["headers"]) + rec["target"]


def test_an_unlisted_host_is_not_intercepted_and_gets_only_the_placeholder(env):
    assert not intercept.wants(env.link, PLAIN, 443, True)
    assert not intercept.wants(env.link, API, 22, True) and intercept.wants(env.link, API.upper() + ".", 443, True)
    assert not intercept.wants(env.link, "svc.example.org", 443, True)    # *. is subdomains only
    # plain HTTP, and a connection the daemon did not dial by the name (an address rule): never
    assert not intercept.wants(env.link, API, 80, True) and not intercept.wants(env.link, API, 443, False)
    assert not intercept.wants(env.link, "x\\.svc.example.org", 443, True)  # a label with a dot in it
    ph = env.ph["API_TOKEN"]
    resp, _ = _req(env, PLAIN, "GET", f"/?k={ph}", {"Authorization": f"Bearer {ph}"}, ctx="bundle")
    assert resp.status == 200
    rec = _last(env)
    assert rec["sni"] == PLAIN and _hdr(rec, "Authorization") == [f"Bearer {ph}"] and rec["target"] == f"/?k={ph}"
    # spliced: the sandbox saw the host's own certificate (it trusts the image's store too)
    with pytest.raises(ssl.SSLCertVerificationError):
        _req(env, PLAIN, "GET", "/", ctx="link")


def test_a_host_header_other_than_the_sni_is_refused_before_anything_is_sent(env):
    before = len(env.up.requests)
    for host in (PLAIN, OTHER, "api.example.org.evil.com"):
        c = Conn(API, env.ports[API], env.only_link)
        c.putrequest("GET", "/echo", skip_host=True)
        c.putheader("Host", host)
        c.putheader("Authorization", "Bearer " + env.ph["API_TOKEN"])
        c.endheaders()
        resp = c.getresponse()
        text = resp.read()
        c.close()
        assert resp.status == 421 and host.encode() in text
    # the absolute form names a host too
    c = Conn(API, env.ports[API], env.only_link)
    c.putrequest("GET", f"https://{OTHER}/echo", skip_host=True)
    c.putheader("Host", API)
    c.endheaders()
    assert c.getresponse().status == 421
    c.close()
    assert len(env.up.requests) == before
    # the same name with a port and another case is the same host
    resp, _ = _req(env, API, "GET", "/", {"Host": "API.Example.org:443"})
    assert resp.status == 200 and len(env.up.requests) == before + 1


@pytest.mark.parametrize("path", ["/echo", "/echo-chunked", "/echo-header", "/echo-close"])
def test_the_client_never_sees_the_value_when_the_host_echoes_it(env, path):
    ph = env.ph["API_TOKEN"]
    c = Conn(API, env.ports[API], env.only_link)
    c.connect()
    raw = c.sock
    raw.sendall(f"GET {path}?q={ph} HTTP/1.1\r\nHost: {API}\r\nAuthorization: Bearer {ph}\r\n"
                f"Connection: close\r\n\r\n".encode())
    got = b""
    while chunk := raw.recv(65536):
        got += chunk
    raw.close()
    assert _hdr(_last(env), "Authorization") == [f"Bearer {TOKEN}"]
    assert got.startswith(b"HTTP/1.1 200") and TOKEN.encode() not in got
    assert b"*" * len(TOKEN) in got
    if path == "/echo-chunked":              # re-chunked but whole: the JSON parses
        body = got.split(b"\r\n\r\n", 1)[1]
        out, rest = b"", body
        while True:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        assert json.loads(out)["target"] == f"{path}?q={'*' * len(TOKEN)}"


def test_keep_alive_50_requests_each_get_the_value(env):
    ph = env.ph["API_TOKEN"]
    conns_before = env.up.conns
    c = Conn(API, env.ports[API], env.only_link)
    for i in range(50):
        body = f"n={i}&t={ph}".encode() if i % 2 else None
        resp, data = _req(env, API, "POST" if body else "GET", f"/echo?i={i}&t={ph}",
                          {"Authorization": f"Bearer {ph}"}, body, conn=c)
        assert resp.status == 200 and TOKEN.encode() not in data
        rec = _last(env)
        assert rec["target"] == f"/echo?i={i}&t={TOKEN}" and _hdr(rec, "Authorization") == [f"Bearer {TOKEN}"]
        if body:
            assert rec["body"] == f"n={i}&t={TOKEN}".encode()
    c.close()
    assert env.up.conns == conns_before + 1                    # one upstream connection for all 50
    assert len({r["conn"] for r in env.up.requests[-50:]}) == 1


def test_chunked_and_large_bodies_are_substituted_and_the_connection_goes_on(env):
    ph = env.ph["API_TOKEN"]
    half = len(ph) // 2
    c = Conn(API, env.ports[API], env.only_link)
    # chunked: the placeholder split between two chunks (http.client sends each item as a chunk)
    resp, _ = _req(env, API, "POST", "/", {"Content-Type": "application/x-www-form-urlencoded"},
                   iter([b"a=" + ph[:half].encode(), ph[half:].encode() + b"&b=2", b"&c=" + ph.encode()]), conn=c)
    assert resp.status == 200 and _last(env)["body"] == f"a={TOKEN}&b=2&c={TOKEN}".encode()
    assert _hdr(_last(env), "Transfer-Encoding") == ["chunked"] and _hdr(_last(env), "Accept-Encoding") == ["identity"]
    # over MAX_BODY: spooled, the length set anew
    big = b"x" * (intercept.MAX_BODY + 1) + ph.encode() + b"y" * 100 + ph.encode()
    resp, _ = _req(env, API, "POST", "/", {"Authorization": f"Bearer {ph}"}, big, conn=c)
    want = big.replace(ph.encode(), TOKEN.encode())
    assert resp.status == 200 and _last(env)["body"] == want
    assert _hdr(_last(env), "Content-Length") == [str(len(want))]
    assert _hdr(_last(env), "Authorization") == [f"Bearer {TOKEN}"]      # the head still gets it
    resp, _ = _req(env, API, "HEAD", "/", conn=c)
    resp, data = _req(env, API, "GET", "/", conn=c)
    assert (resp.status, data) == (200, b"ok")
    c.close()
    assert intercept._SPOOLED == [0]


def _raw_request(env, head: bytes, parts: list[bytes]) -> bytes:
    """Send a head and body parts as separate TCP writes (so the proxy reads them apart); the answer."""
    c = Conn(API, env.ports[API], env.only_link)
    c.connect()
    c.sock.sendall(head)
    for p in parts:
        time.sleep(0.05)
        c.sock.sendall(p)
    got = b""
    while chunk := c.sock.recv(65536):
        got += chunk
    c.close()
    return got


def test_a_placeholder_split_between_reads_of_a_large_body_is_substituted(env, monkeypatch):
    ph = env.ph["API_TOKEN"].encode()
    spooled = []
    real = intercept.tempfile.TemporaryFile

    def recording(*a, **kw):                      # what reaches the spool file (the disk)
        f = real(*a, **kw)
        write = f.write
        f.write = lambda data: (spooled.append(bytes(data)), write(data))[1]
        return f
    monkeypatch.setattr(intercept.tempfile, "TemporaryFile", recording)
    body = b'{"pad": "' + b"p" * (2 << 20) + b'", "t": "' + ph + b'", "u": "' + ph + b'"}'
    cut = body.index(ph) + 11
    got = _raw_request(env, b"PUT /big-json HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (API.encode(), len(body)),
                       [body[:cut], body[cut:cut + 20], body[cut + 20:]])
    assert got.startswith(b"HTTP/1.1 200")
    assert _last(env)["body"] == body.replace(ph, TOKEN.encode()) and TOKEN.encode() not in got
    on_disk = b"".join(spooled)
    assert on_disk == body and TOKEN.encode() not in on_disk       # the body as sent: never the value


def test_chunked_trailers_and_odd_chunk_splits_are_substituted(env):
    ph = env.ph["API_TOKEN"].encode()
    payload = b"[" + ph + b"]" + b"z" * 300000 + ph
    chunks = [payload[i:i + 5] for i in range(0, 40, 5)] + [payload[40:]]   # the placeholder in 5-byte chunks
    raw = b"".join(b"%x;ext=v\r\n%s\r\n" % (len(x), x) for x in chunks) + b"0\r\nX-Sig: " + ph + b"\r\n\r\n"
    got = _raw_request(env, b"POST /up HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sig\r\n"
                            b"Connection: close\r\n\r\n" % API.encode(), [raw[:17], raw[17:33], raw[33:]])
    assert got.startswith(b"HTTP/1.1 200")
    assert _last(env)["body"] == payload.replace(ph, TOKEN.encode())
    assert _last(env)["trailers"] == [f"X-Sig: {TOKEN}"]


def test_body_limits_over_the_spool_stream_as_they_are_and_a_full_spool_is_said(env, monkeypatch):
    ph = env.ph["API_TOKEN"].encode()
    body = b"q" * (intercept.MAX_BODY + 10) + ph
    head = b"POST / HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (API.encode(), len(body))
    monkeypatch.setattr(intercept, "SPOOL_TOTAL", intercept.MAX_BODY)
    got = _raw_request(env, head, [body])
    assert got.startswith(b"HTTP/1.1 503") and b"spool" in got
    monkeypatch.setattr(intercept, "MAX_SPOOL", intercept.MAX_BODY + 1)
    assert _raw_request(env, head, [body]).startswith(b"HTTP/1.1 200")
    assert _last(env)["body"] == body                  # over MAX_SPOOL: as it is (a documented limit)
    assert intercept._SPOOLED == [0]


def test_the_substitution_stream_holds_back_only_a_placeholder_prefix():
    from sandtree.network.substitute import Stream
    ph, value = b"sandtree-secret-A-0123456789abcdef", b"VALUE"
    data = b"x" + ph + b"sandtree-secret-A-nope" + ph + ph[:-1]
    for step in (1, 3, 7, len(data)):
        st = Stream([(ph, value)])
        out = b""
        for i in range(0, len(data), step):
            out += st.feed(data[i:i + step])
            assert len(st.tail) < len(ph)                # memory: one read plus a placeholder
        out += st.end()
        assert out == data.replace(ph, value) and st.found == 2


def test_expect_100_continue_is_answered_and_the_body_substituted(env):
    ph = env.ph["API_TOKEN"]
    c = Conn(API, env.ports[API], env.only_link)
    c.connect()
    body = f"t={ph}".encode()
    c.sock.sendall(f"PUT / HTTP/1.1\r\nHost: {API}\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n"
                   f"Connection: close\r\n\r\n".encode())
    assert c.sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    c.sock.sendall(body)
    got = b""
    while chunk := c.sock.recv(65536):
        got += chunk
    c.close()
    assert got.startswith(b"HTTP/1.1 200") and _last(env)["body"] == f"t={TOKEN}".encode()
    assert not _hdr(_last(env), "Expect")


def test_malformed_and_oversized_requests_are_refused(env):
    before = len(env.up.requests)
    cases = [b"GET / HTTP/1.1\r\nHost: %s\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
             b"GET / HTTP/1.1\r\nHost: %s\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
             b"GET / HTTP/1.1\r\nHost: %s\r\n folded: x\r\n\r\n",
             b"GET / HTTP/1.1\r\nHost: %s\r\nX: a\nY: b\r\n\r\n",
             b"GET / HTTP/1.1\r\nHost: %s\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
             b"GET / HTTP/1.1\r\nHost: %s\r\nX: " + b"a" * 70000 + b"\r\n\r\n"]
    for raw in cases:
        c = Conn(API, env.ports[API], env.only_link)
        c.connect()
        c.sock.sendall(raw.replace(b"%s", API.encode()) if b"%s" in raw[:60] else raw)
        got = b""
        while chunk := c.sock.recv(65536):
            got += chunk
        c.close()
        assert got[:12] in (b"HTTP/1.1 400", b"HTTP/1.1 431"), (raw[:80], got[:80])
    assert len(env.up.requests) == before


def test_plain_http_on_port_80_is_not_intercepted_and_gets_only_the_placeholder(env):
    """A value never goes in clear (it would cross every network on the way); intercept.handle
    refuses to serve anything but TLS on 443."""
    ph = env.ph["API_TOKEN"]
    c = Conn(API, env.plain_ports[API])
    resp, data = _req(env, API, "GET", f"/echo?t={ph}", {"Authorization": f"Bearer {ph}"}, conn=c)
    c.close()
    assert resp.status == 200 and TOKEN.encode() not in data
    assert _hdr(_last(env, env.plain_up), "Authorization") == [f"Bearer {ph}"]

    async def plain_handle():
        r, w = await asyncio.open_connection("127.0.0.1", env.plain_up.port)
        await intercept.handle(env.link, API, 80, (r, w), b"", None, env.upstream_tls)
    with pytest.raises(ValueError, match="port 443"):
        env.loop.run(plain_handle())


def test_usage_counts_the_relayed_bytes(env):
    u = env.link.usage
    out, inn = u.bytes_out, u.bytes_in
    _req(env, API, "POST", "/", {}, b"z" * 1000)
    deadline = time.monotonic() + 2           # the relay counts right after its write returns
    while u.bytes_in - inn < 40 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert u.bytes_out - out > 1000 and u.bytes_in - inn >= len(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


def test_upstream_tls_is_verified_or_nothing_is_sent(env):
    # an upstream context that does not trust the host's CA: 502, and the host never saw a request
    ph = env.ph["API_TOKEN"]
    before = len(env.up.requests)
    wrong_ca, _, _ = _test_ca(["elsewhere.test"])
    env.proxy.tls = ssl.create_default_context(cadata=wrong_ca.decode())
    try:
        resp, data = _req(env, API, "GET", "/", {"Authorization": f"Bearer {ph}"})
        assert resp.status == 502 and b"not verified" in data
        # a context that does not verify is refused outright (never an unverified upstream)
        env.proxy.tls = ssl._create_unverified_context()
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected, ssl.SSLError, OSError)):
            _req(env, API, "GET", "/")
    finally:
        env.proxy.tls = env.upstream_tls
    assert len(env.up.requests) == before
    # a host name the upstream's certificate does not carry: refused as well
    link = env.link
    lone = LinkState(key="t2", index=2, address="100.64.2.2", gateway="100.64.2.1", policy=None,
                     secrets=parse_secrets({"T": {"value": TOKEN, "hosts": ["nocert.example.org"]}}),
                     ca=CA.new("t2", hosts=["nocert.example.org"]))
    env.proxy.link = lone
    try:
        port = env.loop.run(env.proxy.listen("nocert.example.org"))
        c = Conn("nocert.example.org", port, ssl.create_default_context(cadata=lone.ca.pem().decode()))
        c.request("GET", "/")
        assert c.getresponse().status == 502
        c.close()
    finally:
        env.proxy.link = link
    assert len(env.up.requests) == before


# ---- the CA --------------------------------------------------------------------------------

def test_the_ca_is_constrained_to_the_secrets_hosts(env, tmp_path):
    ca = CA.new("c", hosts=[API, "*.svc.example.org"])
    cert = ca.certificate
    nc = cert.extensions.get_extension_for_class(x509.NameConstraints)
    assert nc.critical and {g.value for g in nc.value.permitted_subtrees} == {API, "svc.example.org"}
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert bc.ca and bc.path_length == 0
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert 1 <= days <= 31
    assert ca.server_context(API) is ca.server_context(API.upper())        # cached

    def verify(host):
        srv = ca.server_context(host)            # it signs any name asked: the constraints must refuse it
        cli = ssl.create_default_context(cadata=ca.pem().decode())
        a, b = socket.socketpair()
        s = srv.wrap_socket(a, server_side=True, do_handshake_on_connect=False)
        c = cli.wrap_socket(b, server_hostname=host, do_handshake_on_connect=False)
        t = threading.Thread(target=lambda: _quiet(s.do_handshake))
        t.start()
        try:
            c.do_handshake()
            return True
        except ssl.SSLCertVerificationError:
            return False
        finally:
            c.close()
            t.join(5)
            s.close()

    assert verify(API) and verify("a.svc.example.org")
    # a leaked key cannot impersonate anyone else to the sandbox: OpenSSL refuses the chain
    assert not verify("pypi.org") and not verify("example.org")
    with pytest.raises(InvalidInput):
        ca.server_context("not a name")
    with pytest.raises(InvalidInput):
        CA.new("x", days=90)


def _quiet(fn):
    try:
        fn()
    except (ssl.SSLError, OSError):
        pass


def test_placeholders_are_unguessable_and_recognisable():
    a, b = placeholder("API_TOKEN"), placeholder("API_TOKEN")
    assert a != b and a.startswith("sandtree-secret-API_TOKEN-") and len(a.rsplit("-", 1)[1]) == 32


# ---- the masker ------------------------------------------------------------------------------

def test_masker_catches_values_across_chunk_boundaries_and_holds_back_only_prefixes():
    v = b"SECRET-VALUE-123"
    for cut in range(1, len(v)):
        m = Masker([v])
        out = m.feed(b"xx" + v[:cut]) + m.feed(v[cut:] + b"yy") + m.end()
        assert out == b"xx" + b"*" * len(v) + b"yy"
    m = Masker([v])
    assert m.feed(b"nothing like it here S") == b"nothing like it here "    # "S" could begin it
    assert m.feed(b"ZZ") == b"SZZ" and m.end() == b""
    m = Masker([v])
    assert m.feed(b"data: event\n\n") == b"data: event\n\n"                # a stream is not delayed


# ---- trust.py --------------------------------------------------------------------------------

def test_parse_secrets_accepts_values_and_files_only_where_allowed(tmp_path):
    assert parse_secrets(None) == [] and parse_secrets({}) == []
    s = parse_secrets({"A_1": {"value": "abcd1234", "hosts": "API.example.org."}})
    assert s[0].name == "A_1" and s[0].hosts == ("api.example.org",) and s[0].placeholder != "abcd1234"
    f = tmp_path / "tok"
    f.write_text("from-a-file\n")
    s = parse_secrets({"F": {"file": str(f), "hosts": ["*.Example.org"]}}, host_files=True)
    assert s[0].value == "from-a-file" and s[0].hosts == ("*.example.org",)
    with pytest.raises(InvalidInput, match="not allowed here"):
        parse_secrets({"F": {"file": str(f), "hosts": ["a.org"]}})


@pytest.mark.parametrize("value, match", [
    ("x", "mapping"),
    ({"1BAD": {"value": "abcdefgh", "hosts": ["a.org"]}}, "environment variable"),
    ({"A-B": {"value": "abcdefgh", "hosts": ["a.org"]}}, "environment variable"),
    ({"SSL_CERT_FILE": {"value": "abcdefgh", "hosts": ["a.org"]}}, "trust-store"),
    ({"A": "abcdefgh"}, "expected"),
    ({"A": {"value": "abcdefgh"}}, "hosts"),
    ({"A": {"value": "abcdefgh", "hosts": []}}, "hosts"),
    ({"A": {"value": "abcdefgh", "hosts": ["10.0.0.1"]}}, "host name"),
    ({"A": {"value": "abcdefgh", "hosts": ["*"]}}, "host name"),
    ({"A": {"value": "abcdefgh", "hosts": ["a.org:443"]}}, "host name"),
    ({"A": {"value": "abcdefgh", "hosts": ["bad host"]}}, "host"),
    ({"A": {"value": "abcdefgh", "hosts": ["a.org"] * 33}}, "at most"),
    ({"A": {"value": 12345678, "hosts": ["a.org"]}}, "string"),
    ({"A": {"value": "ab", "hosts": ["a.org"]}}, "shorter"),
    ({"A": {"value": "x" * 20000, "hosts": ["a.org"]}}, "over"),
    ({"A": {"value": "abc\r\nX-Injected: 1", "hosts": ["a.org"]}}, "CR, LF"),
    ({"A": {"value": "abcdefgh", "file": "/x", "hosts": ["a.org"]}}, "exactly one"),
    ({"A": {"value": "abcdefgh", "hosts": ["a.org"], "extra": 1}}, "unknown"),
    ({f"S{i}": {"value": "abcdefgh", "hosts": ["a.org"]} for i in range(65)}, "at most"),
])
def test_bad_secrets_are_typed_errors(value, match):
    with pytest.raises(InvalidInput, match=match):
        parse_secrets(value)


def test_a_file_secret_that_cannot_be_read_is_a_typed_error(tmp_path):
    with pytest.raises(InvalidInput, match="cannot read"):
        parse_secrets({"A": {"file": str(tmp_path / "none"), "hosts": ["a.org"]}}, host_files=True)
    with pytest.raises(InvalidInput, match="absolute"):
        parse_secrets({"A": {"file": "rel", "hosts": ["a.org"]}}, host_files=True)


def test_sandbox_env_and_bundle():
    env = sandbox_env("/dev/sandtree/ca.pem")
    assert set(env) == set(CA_VARIABLES) >= {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT",
                                             "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"}
    assert set(env.values()) == {"/dev/sandtree/ca.pem"}
    ca = CA.new("b")
    with open("/etc/ssl/certs/ca-certificates.crt", "rb") as f:
        image = f.read()
    both = bundle(ca.pem(), image)
    assert both.startswith(image) and both.endswith(ca.pem())
    ctx = ssl.create_default_context(cadata=both.decode())
    assert len(ctx.get_ca_certs()) == image.count(b"-----BEGIN CERTIFICATE-----") + 1
    assert bundle(ca.pem(), None) == ca.pem()
    assert bundle(ca.pem(), b"junk-without-newline").startswith(b"junk-without-newline\n-----BEGIN")
    with pytest.raises(InvalidInput):
        bundle(b"not a cert", image)


# ---- the cost: added latency per HTTPS request --------------------------------------------

def _p50(fn, n):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def test_added_latency_per_https_request(env):
    ph = env.ph["API_TOKEN"]
    direct_ctx = ssl.create_default_context(cadata=env.up_ca.decode())
    hdr = {"Authorization": f"Bearer {ph}"}

    def keep(port, ctx):
        c = Conn(API, port, ctx)
        _req(env, API, "GET", "/", hdr, conn=c)
        p = _p50(lambda: _req(env, API, "GET", "/", hdr, conn=c), 500)
        c.close()
        return p

    def fresh(port, ctx):
        def one():
            c = Conn(API, port, ctx)
            _req(env, API, "GET", "/", hdr, conn=c)
            c.close()
        return _p50(one, 500)

    direct_keep, via_keep = keep(env.up.port, direct_ctx), keep(env.ports[API], env.only_link)
    direct_new, via_new = fresh(env.up.port, direct_ctx), fresh(env.ports[API], env.only_link)
    print(f"\nkept-alive p50: direct {direct_keep:.3f} ms, intercepted {via_keep:.3f} ms "
          f"(+{via_keep - direct_keep:.3f}); new connection p50: direct {direct_new:.3f} ms, "
          f"intercepted {via_new:.3f} ms (+{via_new - direct_new:.3f})")
    assert _hdr(_last(env), "Authorization") == [f"Bearer {TOKEN}"]
    # Not a performance target (make bench measures that): a guard against the delayed-ACK stall
    # (Nagle on a relayed socket: 40 ms on every kept-alive request), far from load's noise.
    assert via_keep - direct_keep < 30
    assert via_new - direct_new < 60


def test_masking_cost_and_download_throughput(env):
    """What masking responses costs: Masker alone, and a 32 MiB download through the interceptor
    against the same download straight from the host."""
    data = bytes(range(256)) * 256                                   # 64 KiB without the value
    m = Masker([TOKEN.encode(), OTHER_TOKEN.encode()])
    t = time.perf_counter()
    for _ in range(256):
        m.feed(data)
    masker_mb_s = 16 / (time.perf_counter() - t)
    size = 32 << 20

    def download(port, ctx):
        c = Conn(API, port, ctx)
        t = time.perf_counter()
        c.request("GET", f"/big?n={size}")
        resp = c.getresponse()
        got = 0
        while chunk := resp.read(1 << 20):
            got += len(chunk)
        dt = time.perf_counter() - t
        c.close()
        assert got == size
        return size / dt / (1 << 20)

    direct = download(env.up.port, ssl.create_default_context(cadata=env.up_ca.decode()))
    via = download(env.ports[API], env.only_link)
    print(f"\nMasker.feed: {masker_mb_s:.0f} MB/s; 32 MiB download: direct {direct:.0f} MB/s, "
          f"intercepted {via:.0f} MB/s ({via / direct:.2f}x)")
    # (rates are printed, not asserted: bench/ measures; both downloads arrived whole above)


def test_substitution_cost_and_upload_throughput(env):
    """What streaming substitution costs: substitute.Stream alone, and 32 MiB uploads through the
    interceptor (Content-Length: spooled; chunked: streamed) against the same upload direct."""
    from sandtree.network.substitute import Stream
    pairs = [(env.ph["API_TOKEN"].encode(), TOKEN.encode()), (env.ph["OTHER_TOKEN"].encode(), OTHER_TOKEN.encode())]
    data = bytes(range(256)) * 1024                                  # 256 KiB without a placeholder
    st = Stream(pairs)
    t = time.perf_counter()
    for _ in range(64):
        st.feed(data)
    stream_mb_s = 16 / (time.perf_counter() - t)
    size = 32 << 20
    block = b"u" * (1 << 20)

    def upload(port, ctx, chunked):
        c = Conn(API, port, ctx)
        t = time.perf_counter()
        body = (block for _ in range(size >> 20)) if chunked else block * (size >> 20)
        c.request("PUT", "/", body=body, headers={} if chunked else {"Content-Length": str(size)})
        assert c.getresponse().read() == b"ok"
        dt = time.perf_counter() - t
        c.close()
        assert len(_last(env)["body"]) == size
        return size / dt / (1 << 20)

    direct_ctx = ssl.create_default_context(cadata=env.up_ca.decode())
    rates = {(k, chunked): upload(port, ctx, chunked) for k, port, ctx in
             (("direct", env.up.port, direct_ctx), ("via", env.ports[API], env.only_link)) for chunked in (False, True)}
    print(f"\nsubstitute.Stream.feed: {stream_mb_s:.0f} MB/s; 32 MiB upload, Content-Length: direct "
          f"{rates['direct', False]:.0f} MB/s, intercepted {rates['via', False]:.0f} MB/s; chunked: direct "
          f"{rates['direct', True]:.0f} MB/s, intercepted {rates['via', True]:.0f} MB/s")
    # (rates are printed, not asserted: bench/ measures; each upload above arrived whole)
    assert stream_mb_s > 0 and all(r > 0 for r in rates.values())


def test_alpn_is_http1_and_a_bad_upstream_response_is_a_502(env):
    ctx = ssl.create_default_context(cadata=env.link.ca.pem().decode())
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    c = Conn(API, env.ports[API], ctx)
    c.connect()
    assert c.sock.selected_alpn_protocol() == "http/1.1"
    c.close()
    resp, data = _req(env, API, "GET", "/bad-framing")
    assert resp.status == 502 and b"upstream response" in data


def test_link_ca_and_placeholders_for_the_engine():
    assert link_ca("k", []) is None
    secrets = parse_secrets({"A": {"value": "abcdefgh", "hosts": ["a.example.org", "*.b.example.org"]}})
    ca = link_ca("k", secrets)
    nc = ca.certificate.extensions.get_extension_for_class(x509.NameConstraints).value
    assert {g.value for g in nc.permitted_subtrees} == {"a.example.org", "b.example.org"}
    env = placeholders(secrets)
    assert env == {"A": secrets[0].placeholder} and "abcdefgh" not in json.dumps(env)


def test_a_kept_alive_connection_the_host_closed_is_dialled_again_for_idempotent_requests(env):
    ph = env.ph["API_TOKEN"]
    c = Conn(API, env.ports[API], env.only_link)
    conns = env.up.conns
    assert _req(env, API, "GET", "/then-close", conn=c)[0].status == 200
    time.sleep(0.05)                                   # the host's close reaches the interceptor
    resp, data = _req(env, API, "GET", "/echo", {"Authorization": f"Bearer {ph}"}, conn=c)
    assert resp.status == 200 and TOKEN.encode() not in data
    assert env.up.conns == conns + 2 and _hdr(_last(env), "Authorization") == [f"Bearer {TOKEN}"]
    # a POST is not sent twice: the sandbox sees the connection end, as it would without us
    assert _req(env, API, "GET", "/then-close", conn=c)[0].status == 200
    time.sleep(0.05)
    before = len(env.up.requests)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        _req(env, API, "POST", "/", {}, b"once", conn=c)
    c.close()
    assert len(env.up.requests) == before


def test_an_upgraded_connection_is_relayed_both_ways_with_the_value_masked(env):
    ph = env.ph["API_TOKEN"]
    c = Conn(API, env.ports[API], env.only_link)
    c.connect()
    c.sock.sendall(f"GET /ws HTTP/1.1\r\nHost: {API}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Authorization: Bearer {ph}\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        got += c.sock.recv(65536)
    assert got.startswith(b"HTTP/1.1 101") and TOKEN.encode() not in got and b"*" * len(TOKEN) in got
    assert _hdr(_last(env), "Authorization") == [f"Bearer {TOKEN}"]
    frame = b"frame carrying " + ph.encode() + b" and the real " + TOKEN.encode()
    c.sock.sendall(frame)
    echo = b""
    while len(echo) < len(frame):
        echo += c.sock.recv(65536)
    c.close()
    # after the upgrade bytes go as they are (no substitution); what comes back is masked
    assert _last(env)["ws"] == frame
    assert echo == frame.replace(TOKEN.encode(), b"*" * len(TOKEN))


def test_an_upstream_head_over_the_limit_is_a_502(env):
    resp, data = _req(env, API, "GET", "/huge-head")
    assert resp.status == 502 and b"upstream response" in data


@pytest.mark.parametrize("tool", ["curl", "node"])
def test_real_clients_trust_the_bundle_through_the_sandbox_env(env, tool, tmp_path):
    """curl (OpenSSL, CURL_CA_BUNDLE) and Node (its own store + NODE_EXTRA_CA_CERTS) accept the link
    CA with its critical name constraints, from the variables sandbox_env sets."""
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed here")
    ph = env.ph["API_TOKEN"]
    pem = tmp_path / "ca.pem"
    pem.write_bytes(bundle(env.link.ca.pem(), open("/etc/ssl/certs/ca-certificates.crt", "rb").read()))
    port = env.ports[API]
    run_env = {"PATH": os.environ["PATH"], **sandbox_env(str(pem))}
    if tool == "curl":
        argv = ["curl", "-sS", "--resolve", f"{API}:{port}:127.0.0.1", "-H", f"Authorization: Bearer {ph}",
                f"https://{API}:{port}/echo"]
    else:
        script = ("require('https').get({host: '127.0.0.1', port: %d, servername: '%s', path: '/echo', "
                  "headers: {Host: '%s', Authorization: 'Bearer %s'}}, r => { let b = ''; "
                  "r.on('data', d => b += d); r.on('end', () => process.stdout.write(b)); })"
                  ".on('error', e => { console.error(String(e)); process.exit(3); })") % (port, API, API, ph)
        argv = ["node", "-e", script]
    before = len(env.up.requests)
    alone = subprocess.run(argv, env={"PATH": os.environ["PATH"]}, capture_output=True, timeout=30)
    assert alone.returncode != 0 and len(env.up.requests) == before     # without the variables: refused
    out = subprocess.run(argv, env=run_env, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert _hdr(_last(env), "Authorization") == [f"Bearer {TOKEN}"]
    assert TOKEN.encode() not in out.stdout and json.loads(out.stdout)["target"] == "/echo"
