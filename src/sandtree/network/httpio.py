"""Byte streams and HTTP/1.x framing for the interceptor (intercept.py): a stream over an asyncio
(reader, writer) pair, TLS through memory BIOs when asked (so the bytes the proxy already read, the
ClientHello, are fed in first and nothing depends on asyncio's internals); bounded reads of heads,
lines and bodies; head parsing that refuses ambiguous framing; chunked bodies relayed chunk by chunk;
and the Masker that keeps secret values out of what goes back to the sandbox."""

from __future__ import annotations

import asyncio
import ssl

__all__ = ["Closed", "Refuse", "Stream", "Reader", "Masker", "prefix_hold", "parse_head", "request_line", "get", "tokens", "build",
           "framing", "authority", "relay_chunks", "field_line", "chunk_size", "MAX_HEAD", "MAX_HEADERS", "MAX_LINE", "READ",
           "LINGER_BYTES"]

MAX_HEAD = 64 * 1024           # request or response head
MAX_HEADERS = 128
MAX_LINE = 4096                # a chunk-size line or a trailer line
READ = 256 * 1024               # bytes read (and decrypted) at a time
LINGER_BYTES = 1 << 20         # read and dropped at most, after a refusal


class Closed(Exception):
    """The peer went away or broke the protocol; the connection ends."""


class Refuse(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


# ---- byte streams: plain TCP or TLS over it through memory BIOs -------------------------------

class Stream:
    """A byte stream over an asyncio (reader, writer), TLS through memory BIOs when `ctx` is given
    (so the bytes the proxy already read -- the ClientHello -- are simply fed in first)."""

    def __init__(self, reader, writer, ctx: ssl.SSLContext | None = None, *, server_side=False,
                 server_hostname=None, initial: bytes = b""):
        self.r, self.w, self.eof = reader, writer, False
        self.pending = initial
        self.tls = None
        if ctx is not None:
            self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
            self.tls = ctx.wrap_bio(self.inc, self.out, server_side=server_side, server_hostname=server_hostname)
            if initial:
                self.inc.write(initial)
                self.pending = b""

    async def _raw(self) -> bytes:
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        try:
            return await self.r.read(READ)
        except (ConnectionError, OSError):
            return b""

    async def _flush(self) -> None:
        data = self.out.read()
        if data:
            self.w.write(data)
            await self.w.drain()

    async def _fill(self) -> None:
        if self.eof:
            raise Closed("eof")
        data = await self._raw()
        if data:
            self.inc.write(data)
        else:
            self.eof = True
            self.inc.write_eof()

    async def handshake(self) -> None:
        if self.tls is None:
            return
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
        await self._flush()

    async def read(self) -> bytes:
        """Some bytes; b"" at the end."""
        if self.tls is None:
            return await self._raw()
        while True:
            try:
                data = self.tls.read(READ)
                # what is already decrypted or buffered goes in one piece (a record is 16 KiB)
                while len(data) < READ and (self.tls.pending() or self.inc.pending):
                    try:
                        data += self.tls.read(READ - len(data))
                    except ssl.SSLError:
                        break
                return data
            except ssl.SSLWantReadError:
                await self._flush()
                try:
                    await self._fill()
                except Closed:
                    return b""
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    async def write(self, data: bytes) -> None:
        try:
            if self.tls is None:
                self.w.write(data)
                await self.w.drain()
            else:
                self.tls.write(data)
                await self._flush()
        except (ConnectionError, OSError, ssl.SSLError) as e:
            raise Closed(str(e)) from None

    async def close(self, linger: float = 0.0) -> None:
        """close_notify and close. `linger`: first half-close and read (discarding) for up to that
        many seconds, so that a refusal sent while the peer is still sending is not lost to the
        reset that closing over unread bytes causes (nginx's lingering close)."""
        try:
            if self.tls is not None and not self.eof:
                try:
                    self.tls.unwrap()
                except ssl.SSLError:
                    pass
                await self._flush()
            if linger and self.w.can_write_eof():
                self.w.write_eof()
                await asyncio.wait_for(self._discard(), linger)
        except (ConnectionError, OSError, ssl.SSLError, asyncio.TimeoutError):
            pass
        finally:
            self.w.close()

    async def _discard(self) -> None:
        left = LINGER_BYTES
        while left > 0:
            data = await self._raw()
            if not data:
                return
            left -= len(data)


class Reader:
    """Buffered reading of HTTP framing from a stream."""

    def __init__(self, stream: Stream):
        self.s, self.buf = stream, bytearray()

    async def more(self) -> bool:
        data = await self.s.read()
        self.buf += data
        return bool(data)

    async def head(self, limit: int = MAX_HEAD) -> bytes | None:
        """Bytes up to and including the blank line; None at a clean end before any byte."""
        start = 0
        while True:
            i = self.buf.find(b"\r\n\r\n", start)
            if i + 4 > limit:
                raise Refuse(431, f"head over {limit} bytes")
            if i >= 0:
                out = bytes(self.buf[:i + 4])
                del self.buf[:i + 4]
                return out
            if len(self.buf) > limit:
                raise Refuse(431, f"head over {limit} bytes")
            start = max(0, len(self.buf) - 3)
            if not await self.more():
                if self.buf.strip():
                    raise Closed("cut inside a head")
                return None

    async def line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                out = bytes(self.buf[:i + 2])
                del self.buf[:i + 2]
                return out
            if len(self.buf) > MAX_LINE:
                raise Closed("line too long")
            if not await self.more():
                raise Closed("cut inside a body")

    async def some(self, n: int) -> bytes:
        """Up to n bytes (at least one), as they come."""
        if not self.buf:                    # the common case of a body: no copy through the buffer
            data = await self.s.read()
            if not data:
                raise Closed("cut inside a body")
            if len(data) > n:
                self.buf += data[n:]
            return data[:n] if len(data) > n else data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not await self.more():
                raise Closed("cut inside a body")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


# ---- heads ---------------------------------------------------------------------------------

_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_CTL = frozenset(range(0x20)) - {0x09} | {0x7f}          # not allowed in a field value


_LINE_BREAKS = frozenset(b"\r\n\0")


def field_line(line: bytes, request: bool = True) -> tuple[bytes, bytes]:
    """(name, value) of one header or trailer line (without its CRLF); Refuse(400) for anything a
    server could read otherwise: no colon, a name that is not a token (a space before the colon),
    folding (a leading space), bare CR or LF, NUL, and in a request other control bytes (a
    response's values may hold them: only its client reads it)."""
    name, sep, value = line.partition(b":")
    if (not sep or not name or not _TCHAR.issuperset(name) or line[:1] in (b" ", b"\t")
            or not (_CTL if request else _LINE_BREAKS).isdisjoint(value)):
        raise Refuse(400, "malformed header line")
    return name, value.strip(b" \t")


def parse_head(head: bytes, request: bool = True) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    lines = head[:-4].split(b"\r\n")
    if len(lines) - 1 > MAX_HEADERS:
        raise Refuse(431, f"more than {MAX_HEADERS} header lines")
    fields = [field_line(line, request) for line in lines[1:]]
    if not _CTL.isdisjoint(lines[0]):
        raise Refuse(400, "malformed first line")
    return lines[0], fields



def request_line(head: bytes) -> tuple[bytes, bytes, bytes, list[tuple[bytes, bytes]]]:
    """(method, target, version, fields) of an HTTP/1.x request's head; Refuse 400 when its first line is not
    `METHOD TARGET HTTP/1.x` (the interceptor's and the tape's requests alike)."""
    first, fields = parse_head(head)
    parts = first.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise Refuse(400, "malformed request line")
    return parts[0], parts[1], parts[2], fields

def chunk_size(line: bytes) -> int:
    """The size of a chunk-size line (with its CRLF): hex digits only (no sign, no 0x, no spaces or
    underscores, at most 16), then optional extensions free of control bytes; Closed otherwise (a
    size two parsers read differently is how a request is smuggled)."""
    text, _, ext = line[:-2].partition(b";")
    if (not line.endswith(b"\r\n") or not text or len(text) > 16 or not _HEX.issuperset(text)
            or not _CTL.isdisjoint(ext)):
        raise Closed("bad chunk size")
    return int(text, 16)


_HEX = frozenset(b"0123456789abcdefABCDEF")


def get(fields, name: bytes) -> list[bytes]:
    return [v for k, v in fields if k.lower() == name]


def tokens(fields, name: bytes) -> set[bytes]:
    return {t.strip().lower() for v in get(fields, name) for t in v.split(b",")}


def build(first: bytes, fields) -> bytes:
    return first + b"\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in fields) + b"\r\n"


def framing(fields, request: bool) -> tuple[str, int]:
    """("chunked", 0) | ("length", n) | ("none", 0) for a request without body | ("close", 0)."""
    te, cl = get(fields, b"transfer-encoding"), get(fields, b"content-length")
    if te:
        if cl:
            raise Refuse(400, "both Transfer-Encoding and Content-Length")
        codings = [t for t in b",".join(te).lower().replace(b" ", b"").split(b",") if t]
        if codings[-1:] != [b"chunked"] or (request and codings != [b"chunked"]):
            raise Refuse(501 if request else 502, "unsupported Transfer-Encoding")
        return "chunked", 0
    if cl:
        values = {v.strip() for v in b",".join(cl).split(b",")}
        if (len(values) != 1 or not next(iter(values)).isdigit() or len(next(iter(values))) > 18
                or (request and (len(cl) > 1 or b"," in cl[0]))):
            raise Refuse(400 if request else 502, "bad Content-Length")
        return "length", int(next(iter(values)))
    return ("none", 0) if request else ("close", 0)


def authority(text: str) -> str:
    host = text.strip().lower()
    if host.startswith("["):
        return host.split("]")[0] + "]"
    return host.rsplit(":", 1)[0].rstrip(".") if ":" in host else host.rstrip(".")



def prefix_hold(buf: bytes, start: int, needles) -> int:
    """How many bytes at the end of buf[start:] may begin one of `needles` (held back until the
    next piece says whether it is one): the longest such tail."""
    hold = 0
    for v in needles:
        i = buf.find(v[:1], max(start, len(buf) - len(v) + 1))
        while i >= 0:
            if v.startswith(buf[i:]):
                hold = max(hold, len(buf) - i)
                break
            i = buf.find(v[:1], i + 1)
    return hold


class Masker:
    """Replaces `values` by '*' of their length in a stream of chunks, holding back only a tail
    that could be the start of a value (so a streamed response is not delayed otherwise)."""

    def __init__(self, values: list[bytes]):
        self.values = [v for v in values if v]
        self.tail = b""

    def feed(self, data: bytes) -> bytes:
        if not self.values:
            return data
        buf = self.tail + data
        for v in self.values:
            if v in buf:
                buf = buf.replace(v, b"*" * len(v))
        hold = prefix_hold(buf, 0, self.values)
        self.tail = buf[len(buf) - hold:] if hold else b""
        return buf[:len(buf) - hold]

    def end(self) -> bytes:
        out, self.tail = self.tail, b""
        return out


async def relay_chunks(src: Reader, send, mask=None, trailer=None) -> None:
    """Relay a chunked body chunk by chunk; with `mask` (feed/end: a Masker, a substitution
    stream), its payload passed through it and chunked anew (a value may straddle two chunks), and
    its trailers through `trailer(line)` when given, else through `mask` too."""
    while True:
        line = await src.line()
        size = chunk_size(line)
        if size == 0:
            trailers, count = [], 0
            while True:
                t = await src.line()
                if t != b"\r\n":
                    try:
                        field_line(t[:-2])
                    except Refuse:
                        raise Closed("malformed trailer") from None
                trailers.append(t)
                count += 1
                if t == b"\r\n":
                    break
                if count > MAX_HEADERS:
                    raise Closed("too many trailers")
            if mask is None:
                await send(line + b"".join(trailers))
            else:
                rest = mask.end()
                tail = (b"".join(map(trailer, trailers)) if trailer is not None
                        else mask.feed(b"".join(trailers)) + mask.end())
                await send((b"%x\r\n%s\r\n" % (len(rest), rest) if rest else b"") + b"0\r\n" + tail)
            return
        left = size
        if mask is None:
            await send(line)
        while left:
            data = await src.some(min(left, READ))
            left -= len(data)
            if mask is None:
                await send(data)
                continue
            # (a substitution grows: it gives its output out in pieces; a masker does not)
            for out in mask.pieces(data) if hasattr(mask, "pieces") else (mask.feed(data),):
                if out:
                    await send(b"%x\r\n%s\r\n" % (len(out), out))
        if await src.exactly(2) != b"\r\n":
            raise Closed("chunk not followed by CRLF")
        if mask is None:
            await send(b"\r\n")
