"""A test-made internet: network namespaces that exist only for the test, holding public-looking
addresses (11.1.1.0/24, and IPv6: 2600:1f18::10 and ::11 public-looking, fd00:5::10 a unique local
address a rule may name) and the addresses the egress path must never reach (169.254.169.254,
10.1.2.3, 127.0.0.1, fd00:ec2::254), with servers on them that record every connection.

    internet  -- the servers' namespace: every address on its `lo`, a veth to `edge`
    edge      -- the "upstream" namespace the egress daemon dials from (the host, in production):
                 11.1.0.2/30 and fd00:1::2/64 on the veth, default routes into `internet`

Servers (one asyncio loop on a thread, sockets bound to every address of `internet`):
    80    HTTP: echoes method, path, headers, body (Content-Length or chunked) and the address it
          was reached at as JSON; GET /bytes/N answers N bytes (throughput); /redirect a 302 to
          https://www.allowed.test/final, /chunked a chunked body, /gzip a gzip-encoded one; /upgrade with
          `Upgrade: websocket` answers 101 and then echoes bytes
    443   HTTPS, the same, with a certificate from the lab's CA (ca_file) for the zone's names
    7     TCP echo        2222  a banner ("BANNER <address>\\n") on a non-HTTP port
    53    DNS (UDP and TCP) on 11.1.1.53 answering ZONE (and TXT records)
`hits[(address, port)]` counts the connections each address:port accepted. Nothing links these
namespaces to anything but what a test attaches; closing the fds frees everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gzip
import ipaddress
import json
import os
import socket
import ssl
import struct
import tempfile
import threading
from collections import Counter

import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import dns.rrset
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pyroute2 import IPRoute

from portnet import LinkPair

from sandtree.network import netns, nft
from sandtree.network.policy import Policy
from sandtree.network.proxy import serve_proxy
from sandtree.network.resolver import serve_resolver
from sandtree.network.upstream import Upstream

ALLOWED, OTHER = "11.1.1.10", "11.1.1.11"
SIX, SIX_OTHER, ULA = "2600:1f18::10", "2600:1f18::11", "fd00:5::10"
DNS_IP = "11.1.1.53"
EDGE_IP = "11.1.0.2"
ZONE = {
    "allowed.test": {"A": ["11.1.1.10"]},
    "www.allowed.test": {"A": ["11.1.1.10"]},
    "other.test": {"A": ["11.1.1.11"]},
    "rebind.test": {"A": ["169.254.169.254"]},
    "private.test": {"A": ["10.1.2.3"]},
    "loop.test": {"A": ["127.0.0.1"]},
    "cgnat.test": {"A": ["100.64.0.1"]},
    "tunnel.test": {"TXT": ["secret-channel"]},
    "six.test": {"AAAA": ["2600:1f18::10"]},                        # IPv6 only
    "dual.test": {"A": ["11.1.1.10"], "AAAA": ["2600:1f18::10"]},
    "ula.test": {"AAAA": ["fd00:5::10"]},
    "mapped.test": {"AAAA": ["::ffff:169.254.169.254"]},           # IPv6 spellings of the metadata address
    "nat64.test": {"AAAA": ["64:ff9b::a9fe:a9fe"]},
    "allowed.test.txt": {"TXT": ["x"]},
}
INTERNET_V4 = ["11.1.1.10", "11.1.1.11", DNS_IP, "169.254.169.254", "10.1.2.3"]
INTERNET_V6 = ["fd00:ec2::254", "2600:1f18::10", "2600:1f18::11", "fd00:5::10"]
TRAPS = ["169.254.169.254", "10.1.2.3", "127.0.0.1", "fd00:ec2::254"]
PORTS = (80, 443, 7, 2222)
IFA_F_NODAD = 0x02


def _ipr(fd: int) -> IPRoute:
    with netns.entered(fd):
        return IPRoute()


def _norm(addr: str) -> str:
    return addr[7:] if addr.startswith("::ffff:") else addr


def _make_ca(names: list[str]):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    subj = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "netlab test CA")])
    ca = (x509.CertificateBuilder().subject_name(subj).issuer_name(subj).public_key(key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .sign(key, hashes.SHA256()))
    lkey = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(ALLOWED)),
                                               x509.IPAddress(ipaddress.ip_address(SIX))]
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(subj).public_key(lkey.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = lambda c: c.public_bytes(serialization.Encoding.PEM)   # noqa: E731
    kpem = lkey.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    return pem(ca), pem(leaf), kpem


class NetLab:
    """See the module doc. Attributes: internet_fd, edge_fd (the upstream namespace), dns (ip, port),
    ca_file, addresses, hits, trap_hits()."""

    def __init__(self, serve=PORTS):
        self.serve = tuple(serve)               # the ports served (bench/ serves 80 itself)
        self.internet_fd = netns.new()
        self.edge_fd = netns.new()
        self.dns = (DNS_IP, 53)
        self.allowed, self.other, self.edge_ip = ALLOWED, OTHER, EDGE_IP
        self.hits: Counter = Counter()
        self.requests: list[dict] = []
        self._dir = tempfile.mkdtemp(prefix="netlab-")
        self.ca_file = os.path.join(self._dir, "ca.pem")
        ca, leaf, key = _make_ca(sorted(ZONE) + ["*.allowed.test"])
        with open(self.ca_file, "wb") as f:
            f.write(ca)
        cert_file, key_file = os.path.join(self._dir, "leaf.pem"), os.path.join(self._dir, "leaf.key")
        with open(cert_file, "wb") as f:
            f.write(leaf + ca)
        with open(key_file, "wb") as f:
            f.write(key)
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(cert_file, key_file)
        self._wire()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._servers = asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(10)

    @property
    def path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.edge_fd}"

    # ---- the wires ------------------------------------------------------------------------------
    def _wire(self) -> None:
        i = _ipr(self.internet_fd)
        try:
            i.link("add", ifname="inet0", kind="veth", peer="edge0")
            i.link("set", index=i.link_lookup(ifname="edge0")[0], net_ns_fd=self.edge_fd)
            lo = i.link_lookup(ifname="lo")[0]
            i.link("set", index=lo, state="up")
            for a in INTERNET_V4:
                i.addr("add", index=lo, address=a, prefixlen=32)
            for a in INTERNET_V6:
                i.addr("add", index=lo, address=a, prefixlen=128, flags=IFA_F_NODAD)
            v = i.link_lookup(ifname="inet0")[0]
            i.addr("add", index=v, address="11.1.0.1", prefixlen=30)
            i.addr("add", index=v, address="fd00:1::1", prefixlen=64, flags=IFA_F_NODAD)
            i.link("set", index=v, state="up")
        finally:
            i.close()
        e = _ipr(self.edge_fd)
        try:
            e.link("set", index=e.link_lookup(ifname="lo")[0], state="up")
            v = e.link_lookup(ifname="edge0")[0]
            e.addr("add", index=v, address=EDGE_IP, prefixlen=30)
            e.addr("add", index=v, address="fd00:1::2", prefixlen=64, flags=IFA_F_NODAD)
            e.link("set", index=v, state="up")
            e.route("add", dst="0.0.0.0/0", gateway="11.1.0.1")
            e.route("add", dst="::/0", gateway="fd00:1::1", family=socket.AF_INET6)
        finally:
            e.close()

    # ---- servers --------------------------------------------------------------------------------
    def _sock(self, kind=socket.SOCK_STREAM, family=socket.AF_INET6, addr="::", port=0):
        with netns.entered(self.internet_fd):
            s = socket.socket(family, kind)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        if kind == socket.SOCK_STREAM:
            s.listen(256)
        s.setblocking(False)
        return s

    async def _serve(self):
        servers = []
        handlers = {80: self._http, 443: self._http, 7: self._echo, 2222: self._banner}
        for port in self.serve:
            servers.append(await asyncio.start_server(
                self._counted(handlers[port], port), sock=self._sock(port=port),
                ssl=self.tls if port == 443 else None, limit=1 << 18))
        servers.append(await asyncio.start_server(self._dns_tcp, sock=self._sock(
            family=socket.AF_INET, addr=DNS_IP, port=53)))
        udp = self._sock(socket.SOCK_DGRAM, socket.AF_INET, DNS_IP, 53)
        self._udp = udp
        self.loop.add_reader(udp.fileno(), self._dns_udp)
        return servers

    def _counted(self, handler, port):
        async def run(reader, writer):
            local = _norm(writer.get_extra_info("sockname")[0])
            self.hits[(local, port)] += 1
            # as real servers do: no Nagle (a TLS server's session tickets, written apart, waited
            # on the client's delayed ACK: 40 ms on some new connections)
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                await handler(reader, writer, local)
            except (ConnectionError, OSError, asyncio.IncompleteReadError, ssl.SSLError):
                pass
            finally:
                writer.close()
        return run

    async def _echo(self, reader, writer, local):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()

    async def _banner(self, reader, writer, local):
        writer.write(f"BANNER {local}\n".encode())
        await writer.drain()

    async def _http(self, reader, writer, local):
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body = b""
                while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                    body += await reader.readexactly(size)
                    assert await reader.readexactly(2) == b"\r\n"
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass                                          # trailers
            else:
                body = await reader.readexactly(int(headers.get("content-length", 0)))
            req = {"method": method, "path": path, "headers": headers, "body": body.decode("latin-1"),
                   "address": local}
            self.requests.append(req)
            if path == "/upgrade" and headers.get("upgrade", "").lower() == "websocket":
                writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
                await self._echo(reader, writer, local)
                return
            if path == "/redirect":                     # (a client follows it to another host)
                writer.write(b"HTTP/1.1 302 Found\r\nLocation: https://www.allowed.test/final\r\n"
                             b"Content-Length: 0\r\n\r\n")
                await writer.drain()
            elif path == "/chunked":
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"6\r\nchunk-\r\n3\r\none\r\n0\r\n\r\n")
                await writer.drain()
            elif path == "/gzip":
                out = gzip.compress(b"a gzip body " * 100, mtime=0)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
                             % len(out) + out)
                await writer.drain()
            elif path.startswith("/bytes/"):
                n = int(path[7:])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n)
                chunk = b"\0" * (1 << 20)
                while n > 0:
                    writer.write(chunk[:min(n, len(chunk))])
                    n -= min(n, len(chunk))
                    await writer.drain()
            else:
                out = json.dumps(req).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(out) + (out if method != "HEAD" else b""))
                await writer.drain()
            if headers.get("connection", "").lower() == "close":
                return

    # ---- DNS ------------------------------------------------------------------------------------
    def answer(self, wire: bytes) -> bytes | None:
        try:
            q = dns.message.from_wire(wire)
        except Exception:
            return None
        r = dns.message.make_response(q)
        r.flags |= dns.flags.AA
        if not q.question:
            return r.to_wire()
        qn = q.question[0]
        name = qn.name.to_text(omit_final_dot=True).lower()
        self.hits[("dns", name)] += 1
        if name not in ZONE:
            r.set_rcode(dns.rcode.NXDOMAIN)
            return r.to_wire()
        kind = dns.rdatatype.to_text(qn.rdtype)
        values = ZONE[name].get(kind, [])
        if values:
            if kind == "TXT":
                values = [f'"{v}"' for v in values]
            r.answer.append(dns.rrset.from_text_list(qn.name, 60, "IN", kind, values))
        return r.to_wire()

    def _dns_udp(self) -> None:
        try:
            data, peer = self._udp.recvfrom(4096)
        except (BlockingIOError, OSError):
            return
        out = self.answer(data)
        if out:
            self._udp.sendto(out, peer)

    async def _dns_tcp(self, reader, writer):
        try:
            while True:
                n = struct.unpack("!H", await reader.readexactly(2))[0]
                out = self.answer(await reader.readexactly(n))
                if out is None:
                    break
                writer.write(struct.pack("!H", len(out)) + out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    # ---- views ----------------------------------------------------------------------------------
    def trap_hits(self) -> dict:
        """Connections the never-reach addresses accepted (must stay empty)."""
        return {k: v for k, v in self.hits.items() if k[0] in TRAPS or k[0].startswith("127.")}

    def socket_in_edge(self, family=socket.AF_INET) -> socket.socket:
        with netns.entered(self.edge_fd):
            return socket.socket(family, socket.SOCK_STREAM)

    def close(self) -> None:
        async def stop():
            self.loop.remove_reader(self._udp.fileno())
            self._udp.close()
            for s in self._servers:
                s.close()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()
        os.close(self.internet_fd)                # the veth pair and addresses go with the namespaces
        os.close(self.edge_fd)
        for f in os.listdir(self._dir):
            os.unlink(os.path.join(self._dir, f))
        os.rmdir(self._dir)


class ProxyRig:
    """The egress path without the daemon, for tests and bench/: a router namespace with nft.py's
    ruleset and the proxy and resolver on an event loop of their own (a thread), a "sandbox"
    namespace on a veth to it (default route to the router), the upstream in `lab`'s edge
    namespace. .link is the LinkState whose policy the caller sets; .sandbox_fd the sandbox's
    namespace."""

    def __init__(self, lab, index=201):
        self.lab = lab
        self.pair = LinkPair(index)
        self.link = self.pair.link
        self.sandbox_fd = self.pair.sandbox_fd
        with netns.entered(self.sandbox_fd):
            ipr = IPRoute()
        try:
            ipr.route("add", dst="0.0.0.0/0", gateway=self.link.gateway)
            ipr.route("add", dst="::/0", gateway=self.link.gateway6, family=socket.AF_INET6)
        finally:
            ipr.close()
        nft.install(self.pair.router_fd)
        self.upstream = Upstream(lab.edge_fd, lab.dns, lab.ca_file)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        links = {self.link.gateway: self.link, self.link.gateway6: self.link}.get
        self.proxy = self.run(serve_proxy(self.pair.router_fd, links, self.upstream))
        self.resolver = self.run(serve_resolver(self.pair.router_fd, links, self.upstream))

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(15)

    def call(self, fn, *a):
        async def c():
            return fn(*a)
        return self.run(c())

    def policy(self, value) -> None:
        self.link.policy = Policy.from_value(value)

    # ---- the sandbox's side --------------------------------------------------------------------
    def sock(self, kind=socket.SOCK_STREAM, family=socket.AF_INET) -> socket.socket:
        with netns.entered(self.sandbox_fd):
            s = socket.socket(family, kind)
        s.settimeout(5)
        return s

    def connect(self, ip, port, timeout=5, source=None) -> socket.socket:
        s = self.sock(family=socket.AF_INET6 if ":" in ip else socket.AF_INET)
        s.settimeout(timeout)
        if source:
            s.bind((source, 0))
        s.connect((ip, port))
        return s

    def dns(self, name, kind="A", tcp=False, server=None):
        q = dns.message.make_query(name, kind)
        server = server or self.link.gateway
        family = socket.AF_INET6 if ":" in server else socket.AF_INET
        if tcp:
            s = self.sock(family=family)
            s.connect((server, 53))
            return dns.query.tcp(q, server, timeout=5, sock=s)
        return dns.query.udp(q, server, timeout=5, sock=self.sock(socket.SOCK_DGRAM, family))

    def http(self, ip, host, path="/", port=80) -> tuple[int, bytes]:
        s = self.connect(ip, port)
        with s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            data = read_all(s)
        if not data:
            return 0, b""
        return int(data.split(b" ", 2)[1]), data.split(b"\r\n\r\n", 1)[1]

    def https(self, ip, name, path="/") -> tuple[int, bytes]:
        ctx = ssl.create_default_context(cafile=self.lab.ca_file)
        s = self.connect(ip, 443)
        with ctx.wrap_socket(s, server_hostname=name) as t:
            t.sendall(f"GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
            data = read_all(t)
        return int(data.split(b" ", 2)[1]), data.split(b"\r\n\r\n", 1)[1]

    def close(self) -> None:
        async def stop():
            self.proxy.close()
            self.resolver.close()
            await self.proxy.wait_closed()
        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
        self.pair.close()


def read_all(s) -> bytes:
    out = b""
    while True:
        try:
            d = s.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            break
        if not d:
            break
        out += d
    return out


@contextlib.contextmanager
def proxy_rig(index: int):
    """A lab (netlab()) and a ProxyRig on it with link `index`, both closed afterwards."""
    with netlab() as lab:
        rig = ProxyRig(lab, index=index)
        try:
            yield rig
        finally:
            rig.close()


@contextlib.contextmanager
def netlab(serve=PORTS):
    """The lab for bench/ and scripts: `with netlab() as lab: ...`."""
    lab = NetLab(serve)
    try:
        yield lab
    finally:
        lab.close()


try:
    import pytest

    @pytest.fixture
    def lab():
        with netlab() as lab:
            yield lab
except ImportError:                                 # bench/ without pytest
    pass
