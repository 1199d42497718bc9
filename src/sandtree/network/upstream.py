"""Where the egress daemon's own connections and name lookups go: sockets made in the upstream
namespace (the host's, or one a test made), DNS asked of the upstream server. The sandbox never
talks to either: the proxy dials for it, the resolver asks for it."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import struct
import threading
import time

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rdatatype
from pyroute2 import IPRoute

from . import netns
from .policy import host_name

__all__ = ["Upstream", "CACHE_MAX", "MAX_TTL", "MIN_TTL", "OWN_TTL"]

CACHE_MAX = 4096
MIN_TTL, MAX_TTL = 5, 300       # bounds on how long an answer is reused
OWN_TTL = 30.0


def _nameserver() -> tuple[str, int]:
    try:
        with open("/etc/resolv.conf") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    return parts[1], 53
    except OSError:
        pass
    return "127.0.0.1", 53


class Upstream:
    def __init__(self, netns_fd: int | None = None, dns: tuple[str, int] | None = None,
                 ca_file: str | None = None):
        self.netns_fd = netns_fd
        self.dns = tuple(dns) if dns else _nameserver()
        self.ca_file = ca_file
        self._cache: dict[str, tuple[float, list]] = {}
        self._own: tuple[float, frozenset] | None = None
        self._v6: tuple[float, bool] | None = None
        self._tls: ssl.SSLContext | None = None

    # ---- sockets in the upstream namespace -------------------------------------------------------
    def socket(self, family=socket.AF_INET, type=socket.SOCK_STREAM) -> socket.socket:
        if self.netns_fd is None:
            s = socket.socket(family, type)
        else:
            with netns.entered(self.netns_fd):
                s = socket.socket(family, type)
        s.setblocking(False)
        return s

    async def connect(self, ip, port: int, *, timeout=10.0) -> socket.socket:
        """A non-blocking TCP socket connected to ip:port from the upstream namespace."""
        ip = ipaddress.ip_address(str(ip))
        s = self.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(s, (str(ip), port)), timeout)
            return s
        except BaseException:
            s.close()
            raise

    async def open_connection(self, ip, port: int, *, ssl=None, server_hostname=None, timeout=10.0,
                              limit: int = 1 << 18):
        s = await self.connect(ip, port, timeout=timeout)
        try:
            return await asyncio.wait_for(asyncio.open_connection(
                sock=s, ssl=ssl, server_hostname=server_hostname if ssl else None, limit=limit), timeout)
        except BaseException:
            s.close()
            raise

    def tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            ctx = ssl.create_default_context()           # CERT_REQUIRED, host names checked
            if self.ca_file:
                ctx.load_verify_locations(self.ca_file)
            self._tls = ctx
        return self._tls

    def own_addresses(self) -> frozenset:
        """The upstream namespace's own addresses (the egress host's): never a destination. Re-read
        every OWN_TTL seconds (a host's addresses change), in a thread of its own: pyroute2 runs an
        event loop of its own, which can not nest in the caller's."""
        now = time.monotonic()
        if self._own is None or self._own[0] < now:
            found: list = []
            t = threading.Thread(target=self._read_own, args=(found,))
            t.start()
            t.join()
            if found or self._own is None:
                self._own = (now + OWN_TTL, frozenset(found))
        return self._own[1]

    def _read_own(self, found: list) -> None:
        try:
            if self.netns_fd is None:
                ipr = IPRoute()
            else:
                with netns.entered(self.netns_fd):
                    ipr = IPRoute()
            try:
                found += [ipaddress.ip_address(a.get_attr("IFA_ADDRESS")) for a in ipr.get_addr()]
            finally:
                ipr.close()
        except OSError:
            pass

    def has_ipv6(self) -> bool:
        """Whether the upstream namespace routes IPv6 to the internet (a route to a global
        address: a UDP connect looks one up and sends nothing). Without it the resolver answers no
        AAAA (a sandbox would pick an address nothing can reach). Re-read every OWN_TTL seconds."""
        now = time.monotonic()
        if self._v6 is None or self._v6[0] < now:
            try:
                with self.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
                    s.connect(("2000::", 9))
                ok = True
            except OSError:
                ok = False
            self._v6 = (now + OWN_TTL, ok)
        return self._v6[1]

    # ---- names -----------------------------------------------------------------------------------
    async def resolve(self, name: str, rdtype: str = "A") -> list:
        """`name`'s addresses of type `rdtype` (A: IPv4Address, AAAA: IPv6Address; [] when none,
        NXDOMAIN or no answer, or not a plain host name: policy.host_name); answers reused for
        their TTL. The question is made from the name's labels, never parsed from text (where
        `\\.` would put a dot inside a label)."""
        name = host_name(name)
        if name is None:
            return []
        kind, cls = {"A": (dns.rdatatype.A, ipaddress.IPv4Address),
                     "AAAA": (dns.rdatatype.AAAA, ipaddress.IPv6Address)}[rdtype]
        hit = self._cache.get((name, rdtype))
        now = time.monotonic()
        if hit and hit[0] > now:
            return list(hit[1])
        try:
            qname = dns.name.Name([label.encode("ascii") for label in name.split(".")] + [b""])
            reply = await self._ask(dns.message.make_query(qname, kind))
        except (OSError, asyncio.TimeoutError, dns.exception.DNSException):
            return []
        ips, ttl = [], MAX_TTL
        for rrset in reply.answer:
            if rrset.rdtype == kind:
                ttl = min(ttl, rrset.ttl)
                ips += [cls(r.address) for r in rrset]
        if len(self._cache) >= CACHE_MAX:
            self._cache.clear()
        self._cache[(name, rdtype)] = (now + max(MIN_TTL, ttl), ips)
        return ips

    async def _ask(self, query: dns.message.Message, timeout: float = 3.0) -> dns.message.Message:
        loop = asyncio.get_running_loop()
        host, port = self.dns
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = self.socket(fam, socket.SOCK_DGRAM)
        try:
            await loop.sock_connect(s, (host, port))
            wire = query.to_wire()
            for _ in range(2):                          # one resend of a lost datagram
                await loop.sock_sendall(s, wire)
                try:
                    data = await asyncio.wait_for(loop.sock_recv(s, 65535), timeout / 2)
                except asyncio.TimeoutError:
                    continue
                reply = dns.message.from_wire(data)
                if reply.id != query.id:
                    continue
                if reply.flags & dns.flags.TC:
                    break
                return reply
            else:
                raise asyncio.TimeoutError()
        finally:
            s.close()
        return await self._ask_tcp(query, timeout)       # truncated: the same question over TCP

    async def _ask_tcp(self, query, timeout: float) -> dns.message.Message:
        r, w = await self.open_connection(self.dns[0], self.dns[1], timeout=timeout)
        try:
            wire = query.to_wire()
            w.write(struct.pack("!H", len(wire)) + wire)
            n = struct.unpack("!H", await asyncio.wait_for(r.readexactly(2), timeout))[0]
            return dns.message.from_wire(await asyncio.wait_for(r.readexactly(n), timeout))
        finally:
            w.close()
