"""The links' transparent TCP proxy: the router's ruleset (nft.py) redirects every TCP connection
a sandbox opens here, IPv4 or IPv6 (a listener for each); the original destination comes from
conntrack (SO_ORIGINAL_DST), the link from the accepted socket's local address (the link's
gateway: the sandbox can not choose it). ::ffff:a.b.c.d is decided and dialled as a.b.c.d.

On port 443 the proxy reads the TLS ClientHello's SNI (bounded bytes, 2 s); on port 80 the first
request head (plainhttp.first_request), and every later request of the connection is decided again
by plainhttp.relay. A name the policy resolves is dialled BY THAT NAME: resolved through the
upstream and refused when what it resolves to is not public (unless a network rule names it) --
an `/etc/hosts` entry or a rebinding DNS answer can not steer the connection. Other ports (and 443
without a name) are decided by the destination address: network rules, or name rules through the
names the link's resolver answered with that address; port 80 without a name (not HTTP, no Host)
by network rules alone. A refusal closes the connection (HTTP on port 80 gets a 403 naming the
host and the rule) and is counted with its reason in link.usage. Opaque connections are relayed
by splice (splice.py), or by the kernel when chosen (fastpath.py: a BPF sockmap).

A connection goes to the interceptor (intercept.py: a secret's placeholder becomes its value) only
when it is TLS on 443 whose SNI a secret is for AND the proxy dialled that name itself (the name is
allowed by a name rule or `*`): the value then goes to what the daemon's DNS says the name is, over
TLS verified for it. A name that an address rule alone allows keeps the sandbox's destination, so
it is relayed as it is (the placeholder goes out unchanged), as is plain HTTP."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct

from . import fastpath, intercept, netns, plainhttp, policy, splice, tape
from .httpio import Closed, Refuse
from .nft import PROXY_PORT
from .policy import Verdict
from .sniff import SNIFF_BYTES, sni
from .state import LinkState

__all__ = ["serve_proxy", "recheck", "synced", "Connection", "ProxyServer", "CHUNK", "DIAL_SECONDS",
           "SNIFF_SECONDS", "SO_ORIGINAL_DST", "SOL_IPV6", "gateway_of", "MAX_LINK_CONNECTIONS"]

SO_ORIGINAL_DST = 80              # (IP6T_SO_ORIGINAL_DST is the same number at SOL_IPV6)
SOL_IPV6 = 41
SNIFF_SECONDS = 2.0
CHUNK = 1 << 18              # stream buffers of intercepted connections
DIAL_SECONDS = 10.0
# one link's connections in the proxy at once (two daemon fds each): every sandbox shares the
# daemon, and one holding thousands ran it out of fds for all the others
MAX_LINK_CONNECTIONS = 256
_OPEN: dict[str, int] = {}      # link key -> its connections in _handle now


async def _sniff(sock: socket.socket, port: int) -> tuple[bytes, str | None]:
    parse = sni
    data = b""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SNIFF_SECONDS
    while len(data) < SNIFF_BYTES:
        left = deadline - loop.time()
        if left <= 0:
            break
        try:
            more = await asyncio.wait_for(loop.sock_recv(sock, SNIFF_BYTES - len(data)), left)
        except asyncio.TimeoutError:
            break
        if not more:
            break
        data += more
        found = parse(data)
        if found is not False:
            return data, found
    return data, None


# ---- connections ----------------------------------------------------------------------------
class Connection:
    """One proxied connection: what it was decided on (recheck re-decides it) and how to cut it."""

    def __init__(self, link: LinkState, names: list[str], ip, port: int, by_name: bool, own):
        self.link, self.dest_names, self.ip, self.port, self.own = link, names, ip, port, own
        self.by_name = by_name           # dialled by a name the sandbox gave (SNI/Host)
        self.sockets: list[socket.socket] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.closed = False
        self.fast = None                 # fastpath.Fast while the kernel relays it

    def sync(self) -> None:
        """Bring the link's counters up to date (a kernel-relayed connection counts late)."""
        if self.fast is not None:
            self.fast.sync()

    def close(self) -> None:
        """Cut both ends; the relay notices (its reads end) and frees the sockets."""
        self.closed = True
        if self.fast is not None:
            self.fast.stop()             # counted, and out of the kernel's map before the cut
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for w in self.writers:
            w.transport.abort()


def gateway_of(sock: socket.socket) -> str:
    """The local address a link's connection (or datagram) was redirected to: its gateway, as the
    daemon keys links (ipaddress's spelling, for IPv6 too)."""
    return str(ipaddress.ip_address(sock.getsockname()[0].split("%")[0]))


def _verdict(link: LinkState, names, ip, port, own) -> Verdict:
    if link.policy is None:
        return Verdict(False, "this sandbox has no network")
    return link.policy.connect(names, ip, port, own)


def synced(link: LinkState):
    """link.usage with its kernel-relayed connections counted up to now (they count every second)."""
    for c in list(link.conns):
        c.sync()
    return link.usage


def recheck(link: LinkState) -> int:
    """Close the open connections of `link` its (replaced) policy forbids; how many."""
    cut = 0
    for c in list(link.conns):
        if c.closed:
            continue
        if not _verdict(link, c.dest_names, c.ip, c.port, c.own).allowed:
            c.close()
            link.conns.discard(c)
            cut += 1
    return cut


async def _refuse(link: LinkState, sock: socket.socket, host: str, port: int, reason: str,
                  http: bool) -> None:
    link.usage.refuse(host, port, reason)
    if not http:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))    # a reset
        return
    link.usage.bytes_in += await plainhttp.answer(sock, 403, f"sandtree egress refused {host}:{port}: {reason}")


def _original_dst(sock: socket.socket):
    if sock.family == socket.AF_INET6:
        raw = sock.getsockopt(SOL_IPV6, SO_ORIGINAL_DST, 28)       # sockaddr_in6
        return policy.unmapped(ipaddress.IPv6Address(raw[8:24])), struct.unpack("!H", raw[2:4])[0]
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack("!H", raw[2:4])[0]
    return ipaddress.IPv4Address(raw[4:8]), port


async def _decide(link: LinkState, name: str | None, ip, port: int, upstream, own, dns_names=True):
    """(names, ip to dial, by_name, verdict); without a name, by the address: through the names the
    link's resolver answered with it when `dns_names`, else by network rules alone."""
    if not name:
        names = sorted(link.names.get(str(ip), ())) if dns_names else []
        return names, ip, False, _verdict(link, names, ip, port, own)
    names = [name]
    if link.policy.resolves(name).allowed:
        # dial THE NAME: what the sandbox connected to (its /etc/hosts, a rebinding answer) is ignored
        # (IPv4 first; the name's IPv6 addresses when none of those is allowed, or it has none)
        verdicts = []
        for family in ("A", "AAAA"):
            if family == "AAAA" and not upstream.has_ipv6():
                break
            ips = await upstream.resolve(name, family)
            verdicts += [(i, link.policy.connect(names, i, port, own)) for i in ips]
            for i, v in verdicts:
                if v.allowed:
                    return names, policy.unmapped(i), True, v
        return names, ip, True, verdicts[0][1] if verdicts else Verdict(False, f"{name} does not resolve")
    # a name outside the name rules: only a network rule naming the address may allow it
    verdict = link.policy.connect(names, ip, port, own)
    if verdict.allowed and not any(r.kind == "net" and r.port_ok(port) and r.addr_ok(ip)
                                   for r in link.policy.allow):
        verdict = link.policy.resolves(name)
    return names, ip, False, verdict


async def _handle(client: socket.socket, links, upstream, spool_dir=None) -> None:
    link = links(gateway_of(client))
    if link is None:
        return
    try:
        ip, port = _original_dst(client)
    except OSError:
        return
    if _OPEN.get(link.key, 0) >= MAX_LINK_CONNECTIONS:
        await _refuse(link, client, str(ip), port, f"over {MAX_LINK_CONNECTIONS} open connections", False)
        return
    _OPEN[link.key] = _OPEN.get(link.key, 0) + 1
    try:
        await _handle_counted(link, client, ip, port, upstream, spool_dir)
    finally:
        _OPEN[link.key] -= 1
        if not _OPEN[link.key]:
            del _OPEN[link.key]


async def _handle_counted(link: LinkState, client: socket.socket, ip, port: int, upstream,
                          spool_dir) -> None:
    loop = asyncio.get_running_loop()
    if link.tape is not None:            # names resolved from (or into) the tape; replay: no dial
        upstream = tape.TapeUpstream(upstream, link.tape)
    own = upstream.own_addresses()
    first, name, req, dialled = b"", None, None, ip
    if port == 443 and link.policy is not None:
        first, name = await _sniff(client, port)
    elif port == 80 and link.policy is not None:
        try:
            first, req = await plainhttp.first_request(client)
        except Refuse as e:
            link.usage.refuse(str(ip), port, e.reason)
            link.usage.bytes_in += await plainhttp.answer(client, e.status, f"sandtree egress: {e.reason}")
            return
        except Closed:
            return
        name = req.name if req else None
    # on port 80 a connection without a name (not HTTP, no Host) is decided by its address alone:
    # a name the resolver answered for that address says nothing of which site it will ask for
    names, ip, by_name, verdict = await _decide(link, name, ip, port, upstream, own, port != 80)
    host = names[0] if names else str(ip)
    if not verdict.allowed:
        await _refuse(link, client, host, port, verdict.reason, port == 80 and req is not None)
        return
    link.usage.allow(host)
    conn = Connection(link, names, ip, port, by_name, own)
    conn.sockets.append(client)
    link.conns.add(conn)
    try:
        if link.tape is not None:
            # a taped link's bytes must pass through Python: never the splice or kernel relays
            wanted = name and intercept.wants(link, name, port, by_name)

            async def intercepted(tap):
                streams = await asyncio.open_connection(sock=client.dup(), limit=CHUNK)
                conn.writers.append(streams[1])
                await intercept.handle(link, name, port, streams, first,
                                       lambda: upstream.open_connection(ip, port, timeout=DIAL_SECONDS),
                                       upstream.tls_context(), spool_dir, tap=tap)
            await tape.serve(link, client, first, name, ip, port, port == 80 and req is not None, upstream,
                             intercepted if wanted else None)
            return
        if name and intercept.wants(link, name, port, by_name):
            streams = await asyncio.open_connection(sock=client.dup(), limit=CHUNK)
            conn.writers.append(streams[1])
            # `ip` is what the daemon resolved `name` to (by_name), never the sandbox's destination
            await intercept.handle(link, name, port, streams, first,
                                   lambda: upstream.open_connection(ip, port, timeout=DIAL_SECONDS),
                                   upstream.tls_context(), spool_dir)
            return
        try:
            up = await upstream.connect(ip, port, timeout=DIAL_SECONDS)
        except (OSError, asyncio.TimeoutError):
            return
        try:
            conn.sockets.append(up)
            if req is not None:
                async def later(other: str) -> Verdict:
                    return (await _decide(link, other, dialled, port, upstream, own, False))[3]
                if not conn.closed:
                    await plainhttp.relay(link, client, up, first, req, port, later, conn)
                return
            if first:
                await loop.sock_sendall(up, first)
                link.usage.bytes_out += len(first)
            # decided and opaque from here: the kernel relays it when it can (fastpath.py)
            if not conn.closed and not await fastpath.relay(link.usage, client, up, conn):
                await splice.relay(link.usage, client, up)
        finally:
            up.close()
    finally:
        link.conns.discard(conn)


class ProxyServer:
    """The listening proxy (what asyncio.start_server's server offers callers: close, wait_closed,
    sockets); closing it stops accepting and cuts the connections in flight."""

    def __init__(self, socks: list[socket.socket], links, upstream, spool_dir=None):
        self.sockets, self.spool_dir = list(socks), spool_dir
        self._accepting = [asyncio.ensure_future(self._accept(s, links, upstream)) for s in self.sockets]
        self._task = self._accepting[0]
        self._tasks: set[asyncio.Task] = set()

    async def _accept(self, sock, links, upstream) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, _ = await loop.sock_accept(sock)
            except OSError:
                if sock.fileno() < 0:
                    return
                await asyncio.sleep(0.1)        # out of fds, for one: keep serving once it passes
                continue
            client.setblocking(False)
            # no Nagle towards the sandbox: an intercepted request's answer is written in parts
            # (head, body), and Nagle held the second behind the client's delayed ACK (40 ms each)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = loop.create_task(self._one(client, links, upstream, self.spool_dir))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _one(client, links, upstream, spool_dir) -> None:
        try:
            await _handle(client, links, upstream, spool_dir)
        except (OSError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            client.close()

    def close(self) -> None:
        for t in self._accepting:
            t.cancel()
        for t in list(self._tasks):
            t.cancel()
        for s in self.sockets:
            s.close()

    def is_serving(self) -> bool:
        return not self._task.done()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, *self._tasks, return_exceptions=True)


async def serve_proxy(router_fd: int, links, upstream, port: int = PROXY_PORT,
                      spool_dir: str | None = None) -> ProxyServer:
    """The proxy listening on `port` in the router namespace, IPv4 and IPv6; links(local_ip) ->
    LinkState|None; `spool_dir`: where intercepted request bodies over intercept.MAX_BODY are spooled."""
    socks = []
    try:
        for family, any_ in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
            try:
                with netns.entered(router_fd):
                    s = socket.socket(family, socket.SOCK_STREAM)
            except OSError:
                if family == socket.AF_INET:
                    raise
                continue                          # (a kernel without IPv6: links.IPV6)
            socks.append(s)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((any_, port))
            s.listen(1024)
            s.setblocking(False)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return ProxyServer(socks, links, upstream, spool_dir)
