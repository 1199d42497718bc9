"""Plain HTTP on port 80 (not intercepted): every request of a connection is decided by its own
Host, not only the first (sites share addresses: virtual hosting, CDNs).

The proxy (proxy.py) reads a connection's first bytes with `read_first`: an HTTP/1.x request line,
or not HTTP (then the connection is an opaque relay decided by its address alone). It decides the
first request's name (`parse_request`), dials it, and hands the connection to `relay`, which keeps
it strictly request/response: a request head is read (httpio's parser: bounded, no folding, no
bare CR/LF, names that are tokens), checked, sent on rebuilt, its body relayed by its framing
while the response is followed to its end; only then is the next request read (a pipelined one
waits in the socket). A later request whose name differs from the connection's is decided like
the first: refused with the same 403 and reason when the policy forbids it, and 421 (Misdirected
Request) when it allows it -- it is never sent to the upstream dialled for the other name (the
client opens a connection of its own for it, as HTTP/1.1 clients do anyway).

Framing is strict in both directions (request smuggling is the attack): Transfer-Encoding with
Content-Length, more than one Content-Length, a Transfer-Encoding other than `chunked`, a chunk
size that is not plain hex, a malformed trailer: refused (400/501) or the connection cut. Bodies
of known length move by splice (splice.py: exactly that many bytes, never one past them); the
response direction is read only as far as heads, chunk lines and trailers. After an Upgrade
request the connection becomes an opaque relay only if the upstream answered it 101; only
`websocket` is passed (an `h2c` offer is taken out of the request: HTTP/2 would carry requests
this relay can not read). CONNECT is refused. Requests without a name (no Host, HTTP/1.0) are
decided by the destination address alone (network rules, `all`), never by names the link's
resolver answered for it."""

from __future__ import annotations

import asyncio
import re
import socket
import urllib.parse

from .httpio import (MAX_HEAD, MAX_LINE, READ, Closed, Reader, Refuse, authority, build, chunk_size,
                     field_line, framing, get, parse_head, tokens)
from . import fastpath
from .splice import relay as opaque, splice

__all__ = ["Request", "read_first", "first_request", "parse_request", "relay", "answer", "FIRST_SECONDS",
           "HEAD_SECONDS", "SPLICE_MIN"]

FIRST_SECONDS = 2.0        # for a connection's first request line (else: not HTTP)
HEAD_SECONDS = 10.0        # for the rest of the first head
SPLICE_MIN = 64 * 1024     # a body part at least this long is spliced; shorter ones go through a read
_REQUEST_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ [!-~]+ HTTP/1\.[01]\r\n")
_HOST = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?(:[0-9]{1,5})?|\[[0-9a-f:.]+\](:[0-9]{1,5})?")
_PHRASES = {400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed", 408: "Request Timeout",
            421: "Misdirected Request", 431: "Request Header Fields Too Large", 501: "Not Implemented",
            502: "Bad Gateway"}


class _Sock:
    """httpio's stream interface over a non-blocking socket (Reader reads through it)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    async def read(self) -> bytes:
        try:
            return await asyncio.get_running_loop().sock_recv(self.sock, READ)
        except OSError:
            return b""


def _looks_http(buf: bytes) -> bool | None:
    """True: `buf` starts with an HTTP/1.x request line; False: it can not; None: more needed."""
    end = buf.find(b"\r\n")
    if end < 0:
        return None if len(buf) <= MAX_LINE and re.fullmatch(rb"[!-~]*( [!-~]*){0,2}", buf) else False
    return bool(_REQUEST_LINE.fullmatch(buf[:end + 2]))


async def read_first(sock: socket.socket) -> tuple[bytes, bool]:
    """A connection's first bytes and whether they start an HTTP/1.x request (its request line
    whole within FIRST_SECONDS); its head may still be incomplete."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FIRST_SECONDS
    buf = b""
    while True:
        left = deadline - loop.time()
        if left <= 0:
            return buf, False
        try:
            more = await asyncio.wait_for(loop.sock_recv(sock, MAX_HEAD), left)
        except asyncio.TimeoutError:
            return buf, False
        buf += more
        seen = _looks_http(buf)
        if seen is not None or not more:
            return buf, bool(seen)


async def first_request(sock: socket.socket) -> tuple[bytes, "Request | None"]:
    """The bytes read and the first request (None: not HTTP; then decide by the address alone).
    Refuse for a request not passed on; Closed for a connection cut inside its head."""
    buf, http = await read_first(sock)
    if not http:
        return buf, None
    r = Reader(_Sock(sock))
    r.buf += buf
    try:
        head = await asyncio.wait_for(r.head(), HEAD_SECONDS)
    except asyncio.TimeoutError:
        raise Refuse(408, f"request head not complete in {HEAD_SECONDS:.0f} s") from None
    req = parse_request(head)
    req.size = len(head)
    return head + bytes(r.buf), req


class Request:
    """A request head, parsed and checked (parse_request); `size`: its length as read."""

    def __init__(self, method, target, version, fields, name, kind, length, keep, upgrade):
        self.method, self.target, self.version, self.fields = method, target, version, fields
        self.name, self.kind, self.length, self.keep, self.upgrade = name, kind, length, keep, upgrade
        self.size = 0

    def head(self) -> bytes:
        return build(b" ".join((self.method, self.target, self.version)), self.fields)


def parse_request(head: bytes) -> Request:
    """Refuse (with the status to answer) for anything not passed on; the name is what Host (and an
    absolute-form target) say, lower case, without port or final dot, None when neither is there."""
    first, fields = parse_head(head)
    parts = first.split(b" ")
    if not _REQUEST_LINE.fullmatch(first + b"\r\n") or len(parts) != 3:
        raise Refuse(400, "malformed request line")
    method, target, version = parts
    if method == b"CONNECT":
        raise Refuse(405, "CONNECT is not relayed on port 80")
    hosts = [h.decode("latin-1") for h in get(fields, b"host")]
    if len(hosts) > 1:
        raise Refuse(400, "more than one Host")
    if not target.startswith(b"/") and target != b"*":          # the absolute form names a host too
        parsed = urllib.parse.urlsplit(target.decode("latin-1"))
        if parsed.scheme.lower() != "http" or not parsed.netloc:
            raise Refuse(400, "malformed request target")
        hosts.append(parsed.netloc)
    for h in hosts:
        if not _HOST.fullmatch(h.strip().lower()):
            raise Refuse(400, f"malformed host {h[:80]!r}")
    names = {authority(h) for h in hosts}
    if len(names) > 1:
        raise Refuse(400, "Host and the request target name different hosts")
    kind, length = framing(fields, request=True)
    if kind == "chunked" and version == b"HTTP/1.0":
        # an HTTP/1.0 server may ignore Transfer-Encoding and read the chunks as the next request
        raise Refuse(400, "Transfer-Encoding in an HTTP/1.0 request")
    conn = tokens(fields, b"connection")
    keep = b"close" not in conn and (version == b"HTTP/1.1" or b"keep-alive" in conn)
    upgrade = bool(get(fields, b"upgrade")) and b"upgrade" in conn
    if upgrade and tokens(fields, b"upgrade") != {b"websocket"}:
        # h2c and the like: answered in HTTP/1.1 instead (the relay could not read what follows)
        conn = conn - {b"upgrade", b"http2-settings"}
        fields = [(k, v) for k, v in fields if k.lower() not in (b"upgrade", b"http2-settings", b"connection")]
        if conn:
            fields.append((b"Connection", b", ".join(sorted(conn))))
        upgrade = False
    return Request(method, target, version, fields, names.pop() if names else None, kind, length, keep, upgrade)


async def answer(sock: socket.socket, status: int, text: str, linger: float = 2.0) -> int:
    """Send a short text answer and end the connection (reading, discarding, for up to `linger`
    seconds first, so that the answer is not lost to a reset over unread bytes); bytes sent."""
    loop = asyncio.get_running_loop()
    body = (text + "\n").encode()
    head = (f"HTTP/1.1 {status} {_PHRASES.get(status, 'Error')}\r\nContent-Type: text/plain\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    try:
        await asyncio.wait_for(loop.sock_sendall(sock, head + body), 2)
        sock.shutdown(socket.SHUT_WR)

        async def drain():
            left = 1 << 20
            while left > 0 and (data := await loop.sock_recv(sock, 65536)):
                left -= len(data)
        await asyncio.wait_for(drain(), linger)
    except (OSError, asyncio.TimeoutError):
        pass
    return len(head) + len(body)


# ---- the relay -------------------------------------------------------------------------------

class _Side:
    """One direction: what is read from `src` (buffered in `r`) goes to `dst`, counted."""

    def __init__(self, src: socket.socket, dst: socket.socket, count, buffered: bytes = b""):
        self.src, self.dst, self.count = src, dst, count
        self.r = Reader(_Sock(src))
        self.r.buf += buffered

    async def send(self, data) -> None:
        if data:
            await asyncio.get_running_loop().sock_sendall(self.dst, data)
            self.count(len(data))

    async def body(self, n: int) -> None:
        """Exactly n bytes: what is buffered, then by splice (or a read, for a short rest)."""
        take = min(n, len(self.r.buf))
        if take:
            await self.send(bytes(self.r.buf[:take]))
            del self.r.buf[:take]
            n -= take
        while n >= SPLICE_MIN:
            n -= await splice(self.src, self.dst, self.count, n)
        while n:
            data = await self.r.some(n)
            n -= len(data)
            await self.send(data)

    async def chunks(self) -> None:
        """A chunked body: sizes strictly read (httpio.chunk_size), the data by `body`."""
        while True:
            line = await self.r.line()
            size = chunk_size(line)
            await self.send(line)
            if size == 0:
                break
            await self.body(size)
            if await self.r.exactly(2) != b"\r\n":
                raise Closed("chunk not followed by CRLF")
            await self.send(b"\r\n")
        for _ in range(64):
            line = await self.r.line()
            if line != b"\r\n":
                try:
                    field_line(line[:-2])
                except Refuse:
                    raise Closed("malformed trailer") from None
            await self.send(line)
            if line == b"\r\n":
                return
        raise Closed("too many trailers")

    async def framed(self, kind: str, length: int) -> None:
        if kind == "length":
            await self.body(length)
        elif kind == "chunked":
            await self.chunks()
        elif kind == "close":
            await self.send(bytes(self.r.buf))
            self.r.buf.clear()
            await splice(self.src, self.dst, self.count)


async def _either(a: socket.socket, b: socket.socket) -> socket.socket:
    """Whichever of two sockets is readable first."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    for s in (a, b):
        loop.add_reader(s.fileno(), lambda s=s: fut.done() or fut.set_result(s))
    try:
        return await fut
    finally:
        for s in (a, b):
            loop.remove_reader(s.fileno())


async def _response(down: _Side, req: Request) -> tuple[int, bool]:
    """Relay the responses to `req` (1xx, then the final one, or a 101 to an upgrade): (status, keep)."""
    while True:
        try:
            head = await down.r.head()
        except Refuse as e:
            raise Refuse(502, f"upstream response: {e.reason}") from None
        if head is None:
            raise Closed("upstream closed")
        try:
            first, fields = parse_head(head, request=False)
        except Refuse as e:
            raise Refuse(502, f"upstream response: {e.reason}") from None
        parts = first.split(b" ", 2)
        if (len(parts) < 2 or parts[0] not in (b"HTTP/1.0", b"HTTP/1.1")
                or not re.fullmatch(rb"[1-5][0-9][0-9]", parts[1])):
            raise Refuse(502, "upstream response: malformed status line")
        status = int(parts[1])
        if status == 101 and not req.upgrade:
            raise Closed("101 to a request that asked no upgrade")
        bodiless = status < 200 or status in (204, 304) or req.method == b"HEAD"
        try:
            kind, length = ("none", 0) if bodiless else framing(fields, request=False)
        except Refuse as e:                   # before a byte of it goes down: a 502 can still replace it
            raise Refuse(502, f"upstream response: {e.reason}") from None
        await down.send(head)
        if status == 101:
            return status, True
        if status < 200:
            continue
        await down.framed(kind, length)
        keep = kind != "close" and b"close" not in tokens(fields, b"connection") and parts[0] == b"HTTP/1.1"
        return status, keep


async def relay(link, client: socket.socket, up: socket.socket, first: bytes, req: Request, port: int,
                decide, conn=None) -> None:
    """Serve a connection whose first request `req` (`first`: the bytes read, its head and what
    followed it; first_request) was decided and dialled to `up`. `decide(name)` -> Verdict for a
    later request naming another host. Returns when the connection is over (the caller closes both
    sockets). `conn` (proxy.Connection): a connection past a 101 is relayed by the kernel where it
    can (fastpath.py), and conn.close() then counts and unpairs it."""
    usage = link.usage

    def out(n):
        usage.bytes_out += n

    def into(n):
        usage.bytes_in += n
    upward, down = _Side(client, up, out, first[req.size:]), _Side(up, client, into)
    key, opening = req.name, True
    try:
        while True:
            if not opening:
                if down.r.buf:
                    return                                   # the upstream said more than it was asked
                if not upward.r.buf and await _either(client, up) is up:
                    return                                   # the upstream closed (or spoke) while idle
                head = await upward.r.head()
                if head is None:
                    return
                req = parse_request(head)
                if req.name != key:
                    host = req.name or "(no Host)"
                    verdict = await decide(req.name) if req.name else None
                    if verdict is not None and not verdict.allowed:
                        usage.refuse(host, port, verdict.reason)
                        usage.bytes_in += await answer(client, 403, f"sandtree egress refused {host}:{port}: "
                                                                    f"{verdict.reason}")
                        return
                    usage.bytes_in += await answer(client, 421, f"sandtree egress: this connection is for "
                                                                f"{key or 'its address'}; a request for {host} "
                                                                "needs a connection of its own")
                    return
            opening = False
            await upward.send(req.head())
            # the request's body and the response move at once (a server may answer before it has
            # read the whole body); a failure of either ends the connection
            body = asyncio.ensure_future(upward.framed(req.kind, req.length))
            response = asyncio.ensure_future(_response(down, req))
            try:
                await asyncio.wait((body, response), return_when=asyncio.FIRST_COMPLETED)
                if body.done():
                    body.result()
                status, keep = await response
                if not keep and not body.done():
                    return
                await body
            finally:
                for t in (body, response):
                    t.cancel()
                await asyncio.gather(body, response, return_exceptions=True)
            if status == 101:
                await upward.send(bytes(upward.r.buf))
                await down.send(bytes(down.r.buf))
                upward.r.buf.clear()
                down.r.buf.clear()
                if not await fastpath.relay(usage, client, up, conn):
                    await opaque(usage, client, up)
                return
            if not (keep and req.keep):
                return
    except Refuse as e:
        usage.bytes_in += await answer(client, e.status, f"sandtree egress: {e.reason}")
    except (Closed, OSError, asyncio.IncompleteReadError):
        pass
