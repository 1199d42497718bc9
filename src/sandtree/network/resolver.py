"""The links' DNS: every DNS packet a sandbox sends (UDP or TCP port 53, to any address) is
redirected here by the router's ruleset (nft.py), over IPv4 or IPv6. A name the link's policy may
resolve is answered with its A records from the upstream, and its AAAA records when the upstream
routes IPv6 (else AAAA is answered empty: nothing could reach them); other types empty;
any other name gets NXDOMAIN and is counted as refused, as does a name that is not a plain host
name (policy.wire_name: a label holding a dot, NUL, backslash or other byte). Nothing is
forwarded, so a DNS tunnel (TXT or otherwise) gets no further than this process. The answers are recorded in `link.names`
(address -> names) so the proxy can decide a name rule for a connection to a bare address."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct

import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from . import netns
from .links import IPV6
from .nft import RESOLVER_PORT
from .policy import wire_name
from .state import MAX_HOSTS, LinkState
from .tape import TapeUpstream

__all__ = ["serve_resolver", "answer", "Resolver", "IP_PKTINFO", "IPV6_PKTINFO", "IPV6_RECVPKTINFO", "MAX_NAMES_PER_IP", "MAX_NAMED_ADDRESSES", "MAX_LINK_TCP", "TCP_IDLE", "TTL"]

TTL = 30                 # short: a policy change reaches the sandbox's caches soon
MAX_NAMES_PER_IP = 16
# addresses kept in link.names: a zone answering a fresh address per name grew it without end
MAX_NAMED_ADDRESSES = 4096
TCP_IDLE = 10.0
# one link's DNS-over-TCP connections at once: each is a daemon fd held up to TCP_IDLE per message,
# and every sandbox shares the daemon
MAX_LINK_TCP = 64
IP_PKTINFO = 8           # socket.IP_PKTINFO is missing on some builds
IPV6_RECVPKTINFO, IPV6_PKTINFO = 49, 50


def _record(link: LinkState, name: str, ips) -> None:
    for ip in ips:
        # re-inserted at the end: the oldest answer is the one dropped when the map is full
        names = link.names.pop(str(ip), None) or set()
        while len(link.names) >= MAX_NAMED_ADDRESSES:
            del link.names[next(iter(link.names))]
        link.names[str(ip)] = names
        if len(names) < MAX_NAMES_PER_IP:
            names.add(name)


def _refuse(link: LinkState, name: str, reason: str) -> None:
    link.usage.dns_refused += 1
    refused = link.usage.refused_hosts
    if len(refused) < MAX_HOSTS and not any(r["host"] == name and r["port"] == 53 for r in refused):
        refused.append({"host": name, "port": 53, "reason": f"DNS: {reason}"})


async def answer(link: LinkState | None, wire: bytes, upstream) -> bytes | None:
    """The reply to one DNS message from `link` (None: not a message worth answering)."""
    try:
        q = dns.message.from_wire(wire)
    except dns.exception.DNSException:
        return None
    if q.flags & dns.flags.QR:
        return None
    r = dns.message.make_response(q)
    r.flags |= dns.flags.RA
    if link is None or q.opcode() != dns.opcode.QUERY or len(q.question) != 1:
        r.set_rcode(dns.rcode.REFUSED)
        return r.to_wire()
    link.usage.dns_queries += 1
    if link.tape is not None:            # resolutions recorded, or answered from the tape
        upstream = TapeUpstream(upstream, link.tape)
    question = q.question[0]
    # from the labels, not the text: `x\.y` is one label holding a dot, which a text comparison
    # read as two (a `*.` rule passed it, and upstream got the label back)
    name = wire_name(question.name.labels)
    if name is None:
        _refuse(link, question.name.to_text(omit_final_dot=True)[:255], "not a host name")
        r.set_rcode(dns.rcode.NXDOMAIN)
        return r.to_wire()
    verdict = link.policy.resolves(name) if link.policy is not None else None
    if verdict is None or not verdict.allowed:
        _refuse(link, name, verdict.reason if verdict else "this sandbox has no network")
        r.set_rcode(dns.rcode.NXDOMAIN)
        return r.to_wire()
    if question.rdclass == dns.rdataclass.IN and question.rdtype in (dns.rdatatype.A, dns.rdatatype.ANY):
        ips = await upstream.resolve(name)
        if not ips:
            r.set_rcode(dns.rcode.NXDOMAIN)
            return r.to_wire()
        _record(link, name, ips)
        r.answer.append(dns.rrset.from_text_list(question.name, TTL, "IN", "A", [str(i) for i in ips]))
    elif question.rdclass == dns.rdataclass.IN and question.rdtype == dns.rdatatype.AAAA and upstream.has_ipv6():
        ips = await upstream.resolve(name, "AAAA")
        if ips:                              # (none: NOERROR, empty; the name may have A records)
            _record(link, name, ips)
            r.answer.append(dns.rrset.from_text_list(question.name, TTL, "IN", "AAAA", [str(i) for i in ips]))
    return r.to_wire()                       # other types: an empty NOERROR answer


class Resolver:
    """The UDP sockets and TCP servers (IPv4, IPv6); close() stops them all."""

    def __init__(self, udp: list[socket.socket], tcp: list[asyncio.AbstractServer], loop):
        self.udp, self.tcp, self.loop = udp, tcp, loop
        self.tasks: set[asyncio.Task] = set()

    def close(self) -> None:
        for u in self.udp:
            self.loop.remove_reader(u.fileno())
            u.close()
        for t in self.tcp:
            t.close()
        for t in list(self.tasks):
            t.cancel()


def _sockets(router_fd: int, family: int, port: int) -> tuple[socket.socket, socket.socket]:
    """(UDP, TCP listening) sockets on `port` of the router namespace for `family`."""
    with netns.entered(router_fd):
        udp = socket.socket(family, socket.SOCK_DGRAM)
        tsock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            for s in (udp, tsock):
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            udp.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVPKTINFO, 1)
        else:
            udp.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        any_ = "::" if family == socket.AF_INET6 else "0.0.0.0"
        udp.bind((any_, port))
        udp.setblocking(False)
        tsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tsock.bind((any_, port))
        tsock.listen(128)
        tsock.setblocking(False)
    except BaseException:
        udp.close()
        tsock.close()
        raise
    return udp, tsock


def _pktinfo(udp: socket.socket, anc) -> tuple[str, list] | None:
    """(the local address a datagram was sent to, the ancillary data that sends a reply from
    it), or None when the kernel said nothing of it."""
    if udp.family == socket.AF_INET6:
        info = next((d for lvl, typ, d in anc if lvl == socket.IPPROTO_IPV6 and typ == IPV6_PKTINFO), None)
        if info is None or len(info) < 20:
            return None
        local = socket.inet_ntop(socket.AF_INET6, info[:16])   # in6_pktinfo.ipi6_addr
        return local, [(socket.IPPROTO_IPV6, IPV6_PKTINFO, info[:16] + b"\0\0\0\0")]
    info = next((d for lvl, typ, d in anc if lvl == socket.IPPROTO_IP and typ == IP_PKTINFO), None)
    if info is None or len(info) < 12:
        return None
    local = socket.inet_ntoa(info[8:12])       # in_pktinfo.ipi_addr: the header's destination
    # reply with ipi_spec_dst = that address, ifindex 0: the route picks the link
    return local, [(socket.IPPROTO_IP, IP_PKTINFO, struct.pack("=i4s4s", 0, info[8:12], b"\0\0\0\0"))]


async def serve_resolver(router_fd: int, links, upstream, port: int = RESOLVER_PORT) -> Resolver:
    loop = asyncio.get_running_loop()
    v4 = _sockets(router_fd, socket.AF_INET, port)
    pairs = [v4]
    if IPV6:
        try:
            pairs.append(_sockets(router_fd, socket.AF_INET6, port))
        except BaseException:
            for s in v4:
                s.close()
            raise

    open_tcp: dict[str, int] = {}        # link gateway -> its TCP connections now

    async def on_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        local = str(ipaddress.ip_address(writer.get_extra_info("sockname")[0].split("%")[0]))
        link = links(local)
        if open_tcp.get(local, 0) >= MAX_LINK_TCP:
            writer.close()
            return
        open_tcp[local] = open_tcp.get(local, 0) + 1
        try:
            while True:
                n = struct.unpack("!H", await asyncio.wait_for(reader.readexactly(2), TCP_IDLE))[0]
                msg = await asyncio.wait_for(reader.readexactly(n), TCP_IDLE)
                out = await answer(link, msg, upstream)
                if out is None:
                    break
                writer.write(struct.pack("!H", len(out)) + out)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, OSError):
            pass
        finally:
            writer.close()
            open_tcp[local] -= 1
            if not open_tcp[local]:
                del open_tcp[local]

    tcp = [await asyncio.start_server(on_tcp, sock=t) for _, t in pairs]
    res = Resolver([u for u, _ in pairs], tcp, loop)

    async def one(udp: socket.socket, data: bytes, local: str, peer, reply_anc: list) -> None:
        out = await answer(links(str(ipaddress.ip_address(local))), data, upstream)
        if out is not None:
            try:                             # from the address the query was redirected to
                udp.sendmsg([out], reply_anc, 0, peer)
            except OSError:
                pass

    def readable(udp: socket.socket) -> None:
        for _ in range(64):
            try:
                data, anc, _flags, peer = udp.recvmsg(4096, socket.CMSG_SPACE(20))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            got = _pktinfo(udp, anc)
            if got is None:
                continue
            t = loop.create_task(one(udp, data, got[0], peer, got[1]))
            res.tasks.add(t)
            t.add_done_callback(res.tasks.discard)

    for udp in res.udp:
        loop.add_reader(udp.fileno(), readable, udp)
    return res
