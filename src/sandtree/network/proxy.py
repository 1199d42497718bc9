"""The links' transparent TCP proxy: the router's ruleset (nft.py) redirects every TCP connection
a sandbox opens here; the original destination comes from conntrack (SO_ORIGINAL_DST), the link
from the accepted socket's local address (the link's gateway: the sandbox can not choose it).

On ports 80 and 443 the proxy reads the HTTP Host header or the TLS ClientHello's SNI (bounded
bytes, 2 s). A name the policy resolves is dialled BY THAT NAME: resolved through the upstream and
refused when what it resolves to is not public (unless a network rule names it) -- an `/etc/hosts`
entry or a rebinding DNS answer can not steer the connection. Other ports (and 80/443 without a
name) are decided by the destination address: network rules, or name rules through the names the
link's resolver answered with that address. A refusal closes the connection (HTTP on port 80 gets a
403 naming the host and the rule) and is counted with its reason in link.usage."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct

from . import intercept, netns
from .nft import PROXY_PORT
from .policy import Verdict
from .state import LinkState

__all__ = ["serve_proxy", "recheck", "Connection", "sni", "http_host", "CHUNK", "DIAL_SECONDS", "SNIFF_BYTES",
           "SNIFF_SECONDS", "SO_ORIGINAL_DST"]

SO_ORIGINAL_DST = 80
SNIFF_BYTES = 16384          # what a ClientHello or an HTTP head may take
SNIFF_SECONDS = 2.0
CHUNK = 1 << 18              # relay reads: large, the copy is what a download costs
DIAL_SECONDS = 10.0


# ---- what the first bytes say --------------------------------------------------------------
def sni(data: bytes) -> str | None | bool:
    """The server name of a TLS ClientHello in `data`; False: more bytes needed; None: none."""
    if len(data) < 5:
        return False
    if data[0] != 22:                                        # not a handshake record
        return None
    body = bytearray()
    pos = 0
    while len(body) < 4 or len(body) < 4 + int.from_bytes(body[1:4], "big"):
        if len(data) < pos + 5:
            return False
        if data[pos] != 22:
            return None
        n = int.from_bytes(data[pos + 3:pos + 5], "big")
        if len(data) < pos + 5 + n:
            return False
        body += data[pos + 5:pos + 5 + n]
        pos += 5 + n
    if body[0] != 1:                                          # not a ClientHello
        return None
    try:
        p = 4 + 2 + 32                                        # header, version, random
        p += 1 + body[p]                                      # session id
        p += 2 + int.from_bytes(body[p:p + 2], "big")         # cipher suites
        p += 1 + body[p]                                      # compression methods
        end = p + 2 + int.from_bytes(body[p:p + 2], "big")
        p += 2
        while p + 4 <= end:
            kind, n = int.from_bytes(body[p:p + 2], "big"), int.from_bytes(body[p + 2:p + 4], "big")
            p += 4
            if kind == 0:                                     # server_name: list of (type, name)
                q = p + 2
                while q + 3 <= p + n:
                    t, m = body[q], int.from_bytes(body[q + 1:q + 3], "big")
                    if t == 0:
                        return bytes(body[q + 3:q + 3 + m]).decode("ascii").lower().rstrip(".")
                    q += 3 + m
                return None
            p += n
    except (IndexError, UnicodeDecodeError):
        return None
    return None


def http_host(data: bytes) -> str | None | bool:
    """The Host of an HTTP/1.x request head in `data`; False: more bytes needed; None: none."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False if len(data) < SNIFF_BYTES else None
    lines = data[:end].split(b"\r\n")
    if len(lines[0].split(b" ")) != 3 or not lines[0].split(b" ")[2].startswith(b"HTTP/1."):
        return None
    for line in lines[1:]:
        k, sep, v = line.partition(b":")
        if sep and k.strip().lower() == b"host":
            host = v.strip().decode("latin-1").lower()
            if host.startswith("["):
                return host[1:host.find("]")] if "]" in host else None
            return host.rsplit(":", 1)[0].rstrip(".") if host.count(":") == 1 else host.rstrip(".")
    return None


async def _sniff(reader: asyncio.StreamReader, port: int) -> tuple[bytes, str | None]:
    parse = sni if port == 443 else http_host
    data = b""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SNIFF_SECONDS
    while len(data) < SNIFF_BYTES:
        left = deadline - loop.time()
        if left <= 0:
            break
        try:
            more = await asyncio.wait_for(reader.read(SNIFF_BYTES - len(data)), left)
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
    """One proxied connection: what it was decided on (recheck re-decides it) and its sockets."""

    def __init__(self, link: LinkState, names: list[str], ip, port: int, by_name: bool, writers, own):
        self.link, self.dest_names, self.ip, self.port, self.own = link, names, ip, port, own
        self.by_name = by_name           # dialled by a name the sandbox gave (SNI/Host)
        self.writers = writers
        self.closed = False

    def close(self) -> None:
        self.closed = True
        for w in self.writers:
            try:
                w.transport.abort()
            except Exception:
                pass


def _verdict(link: LinkState, names, ip, port, own):
    if link.policy is None:
        return Verdict(False, "this sandbox has no network")
    return link.policy.connect(names, ip, port, own)


def recheck(link: LinkState) -> int:
    """Close the open connections of `link` its (replaced) policy forbids; how many."""
    cut = 0
    for c in list(link.conns):
        if c.closed:
            continue
        v = _verdict(link, c.dest_names, c.ip, c.port, c.own)
        if not v.allowed:
            c.close()
            link.conns.discard(c)
            cut += 1
    return cut


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: LinkState,
                out: bool) -> None:
    usage = link.usage
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            if out:
                usage.bytes_out += len(data)
            else:
                usage.bytes_in += len(data)
            writer.write(data)
            if writer.transport.get_write_buffer_size() > CHUNK:
                await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError, asyncio.CancelledError, RuntimeError):
        writer.transport.abort()


async def _refuse(link: LinkState, writer, host: str, port: int, reason: str, http: bool) -> None:
    link.usage.refuse(host, port, reason)
    try:
        if http:
            body = f"sandtree egress refused {host}:{port}: {reason}\n".encode()
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            await asyncio.wait_for(writer.drain(), 2)
    except (ConnectionError, OSError, asyncio.TimeoutError):
        pass
    writer.transport.abort() if not http else writer.close()


def _original_dst(sock: socket.socket):
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack("!H", raw[2:4])[0]
    return ipaddress.IPv4Address(raw[4:8]), port


async def _handle(reader, writer, links, upstream) -> None:
    sock = writer.get_extra_info("socket")
    link = links(writer.get_extra_info("sockname")[0])
    if link is None:
        writer.transport.abort()
        return
    try:
        ip, port = _original_dst(sock)
    except OSError:
        writer.transport.abort()
        return
    own = upstream.own_addresses()
    first, name = b"", None
    if port in (80, 443) and link.policy is not None:
        first, name = await _sniff(reader, port)
    http = port == 80 and name is not None
    by_name = False
    if name:
        names = [name]
        if link.policy.resolves(name).allowed:
            by_name = True
            ips = await upstream.resolve(name)
            verdicts = [(i, link.policy.connect(names, i, port, own)) for i in ips]
            ok = [(i, v) for i, v in verdicts if v.allowed]
            if ok:
                ip, verdict = ok[0]
            elif verdicts:
                verdict = verdicts[0][1]
            else:
                verdict = Verdict(False, f"{name} does not resolve")
        else:                    # a name outside the name rules: only a network rule may allow it
            verdict = link.policy.connect(names, ip, port, own)
            if verdict.allowed and not any(r.kind == "net" and r.port_ok(port) and r.addr_ok(ip)
                                           for r in link.policy.allow):
                verdict = link.policy.resolves(name)
    else:
        names = sorted(link.names.get(str(ip), ()))
        verdict = _verdict(link, names, ip, port, own)
    host = names[0] if names else str(ip)
    if not verdict.allowed:
        await _refuse(link, writer, host, port, verdict.reason, http)
        return
    link.usage.allow(host)

    async def dial():
        return await upstream.open_connection(ip, port, timeout=DIAL_SECONDS)

    conn = Connection(link, names, ip, port, by_name, [writer], own)
    link.conns.add(conn)
    try:
        if name and port in (80, 443) and intercept.wants(link, name, port):
            await intercept.handle(link, name, port, (reader, writer), first, dial,
                                   upstream.tls_context() if port == 443 else None)
            return
        try:
            ur, uw = await dial()
        except (OSError, asyncio.TimeoutError):
            writer.transport.abort()
            return
        conn.writers.append(uw)
        if first:
            uw.write(first)
            link.usage.bytes_out += len(first)
        await asyncio.gather(_pump(reader, uw, link, True), _pump(ur, writer, link, False))
        uw.close()
    finally:
        link.conns.discard(conn)
        writer.close()


async def serve_proxy(router_fd: int, links, upstream, port: int = PROXY_PORT) -> asyncio.AbstractServer:
    """The proxy listening on `port` in the router namespace; links(local_ip) -> LinkState|None."""
    with netns.entered(router_fd):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(1024)
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    async def _guarded(reader, writer):
        try:
            await _handle(reader, writer, links, upstream)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            writer.transport.abort()

    return await asyncio.start_server(_guarded, sock=s, limit=CHUNK)
