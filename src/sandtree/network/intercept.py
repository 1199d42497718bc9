"""Secret injection: the egress proxy hands over a TLS connection on port 443 whose SNI is a host
some secret of the link is for and which the proxy dialled by that name itself (`wants`: never
plain HTTP, never an address the sandbox chose); `handle` terminates the sandbox's TLS with the
link's CA (ca.py), completes the dial with TLS verified for the name, and relays HTTP/1.x both
ways, putting each secret's real value in place of its placeholder in the requests -- only for
secrets whose hosts match the connection's name. So a value goes only to a server that proved
(a certificate the daemon trusts) that it is the secret's host, at an address the daemon's DNS
gave for that name.

Requests (each request of a kept-alive connection alike; substitute.py says how each part is
encoded):
  * request line, header values and trailers: the placeholder becomes the value;
  * bodies (JSON-escaped for a JSON body, form-encoded for a form body, raw otherwise): with
    Content-Length up to MAX_BODY in memory, up to MAX_SPOOL through an unlinked spool file (the
    daemon's directory; the body as sent, substituted again when read back: values never reach
    the disk; SPOOL_TOTAL at once, else 503), the length set anew either way; chunked
    bodies as they stream, chunked anew (a placeholder split between reads or chunks is found;
    memory: one read and a placeholder's length). Larger Content-Length bodies stream as they are;
  * a Host that names another host than the connection's name is refused (421) before anything is
    sent: a virtual host behind the same address must not receive this name's secrets; CONNECT
    (a tunnel through the host to elsewhere) is refused (405);
  * heads are bounded (MAX_HEAD bytes, MAX_HEADERS lines); ambiguous framing (Content-Length with
    Transfer-Encoding, differing lengths, folded or bare-LF lines) is refused (400).
The upstream connection is the sandbox connection's own (no pool); when the host closed it while
it was idle, an idempotent request whose body was read whole is sent again on a new dial, other
requests see the connection end. A kept-alive connection idle for IDLE seconds is closed.
Responses are relayed as they come (chunk by chunk), but every value that may have been sent on
this connection is masked ('*' times its length: the framing keeps its length) in heads, bodies
and trailers, so a host that echoes the request back (httpbin's /headers, an error page quoting
the Authorization header) does not hand the value to the sandbox. Requests that got a value ask
for `Accept-Encoding: identity`, so that an echo is readable to the mask. Not masked: an echo the
host encodes (base64, JSON `\\/` escapes, a compressed body it sends anyway).
"""

from __future__ import annotations

import asyncio
import io
import ssl
import tempfile
import urllib.parse
from typing import Awaitable, Callable

from ..tasks import until_first
from .httpio import (READ, Closed, Masker, Reader, Refuse, Stream, authority, build, framing,
                     get, parse_head, relay_chunks, request_line, tokens)
from . import substitute
from .policy import Rule, host_name
from .state import LinkState, Secret

__all__ = ["wants", "handle", "matches", "MAX_BODY", "MAX_SPOOL", "SPOOL_TOTAL", "IDLE", "LINGER"]

MAX_BODY = 1 << 20             # Content-Length bodies up to this are substituted in memory
MAX_SPOOL = 256 << 20          # larger ones up to this through a spool file (the length changes)
SPOOL_TOTAL = 4 << 30          # all spool files of the daemon at once
_SPOOLED = [0]
LINGER = 2.0                   # seconds a refused client may go on sending before the close
IDLE = 300.0                   # seconds a kept-alive connection may wait for its next request
_IDEMPOTENT = {b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"TRACE"}


def matches(hosts, name: str) -> bool:
    """Whether host rules `hosts` ("api.example.org", "*.example.org") name host `name` (a plain
    host name, compared label by label: policy.Rule.name_ok)."""
    name = host_name(name)
    return name is not None and any(Rule.parse(h).name_ok(name) for h in hosts)


def wants(link: LinkState, name: str, port: int, dialled_by_name: bool) -> bool:
    """Whether a connection to `name`:`port` is one a value may go on: TLS on 443 (verified by
    `handle`), and dialled by the daemon by that name (`dialled_by_name`: the address is the one the
    daemon's DNS gave, not the sandbox's choice). Plain HTTP never: the value would cross every
    network on the way in clear, to whatever answers the address."""
    return (port == 443 and dialled_by_name and bool(name)
            and any(matches(s.hosts, name) for s in link.secrets))


# ---- the relay -----------------------------------------------------------------------------

async def handle(link: LinkState, name: str, port: int, client, first: bytes,
                 connect: Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]],
                 tls: ssl.SSLContext | None, spool_dir: str | None = None, tap=None) -> None:
    """Serve one intercepted connection to the end (see the module doc); never raises for what the
    peers do. `tls` must verify (CERT_REQUIRED and host names): the value goes only to the host
    proven to be `name`. `spool_dir`: where bodies over MAX_BODY are spooled (unlinked files;
    None: the system's temporary directory). `tap(stream)`: sees the sandbox's side (tape.py)."""
    name = host_name(name) or ""
    secrets = [s for s in link.secrets if matches(s.hosts, name)]
    if (port != 443 or not name or tls is None or tls.verify_mode != ssl.CERT_REQUIRED
            or not tls.check_hostname or link.ca is None):
        client[1].close()
        raise ValueError("intercept.handle: needs TLS on port 443 to a host name, the link's CA and an "
                         "upstream TLS context that verifies certificates and names")
    down = Stream(*client, link.ca.server_context(name), server_side=True, initial=first)
    if tap is not None:
        tap(down)                        # (a taped link's: placeholders and masked answers only)
    up, linger = None, 0.0
    try:
        async def dial():
            r, w = await connect()
            s = Stream(r, w, tls, server_hostname=name)
            await s.handshake()
            return s
        # the sandbox's handshake and the upstream's dial overlap: a new connection costs one round trip less
        dialing = asyncio.ensure_future(dial())
        try:
            await down.handshake()
        except (ssl.SSLError, Closed, ConnectionError, OSError):
            dialing.cancel()
            await asyncio.gather(dialing, return_exceptions=True)
            return
        try:
            up = await dialing
        except (ssl.SSLError, OSError, ConnectionError, Closed, asyncio.TimeoutError) as e:
            reason = "upstream certificate not verified" if isinstance(e, ssl.SSLCertVerificationError) \
                else f"upstream unreachable: {type(e).__name__}"
            await _answer(down, link, 502, f"{name}: {reason}")
            return
        ups = [up]
        try:
            await _relay(link, name, secrets, down, ups, dial, spool_dir)
        finally:
            up = ups[0]
    except Refuse as e:
        await _answer(down, link, e.status, f"{name}: {e.reason}")
        linger = LINGER
    except (Closed, ConnectionError, OSError, ssl.SSLError, asyncio.TimeoutError):
        pass
    finally:
        if up is not None:
            await up.close()
        await down.close(linger)


async def _answer(down: Stream, link: LinkState, status: int, reason: str) -> None:
    body = (f"sandtree egress: {reason}\n").encode()
    phrase = {400: "Bad Request", 405: "Method Not Allowed", 421: "Misdirected Request",
              431: "Request Header Fields Too Large", 501: "Not Implemented", 502: "Bad Gateway"}.get(status, "Error")
    head = (f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    try:
        await down.write(head + body)
        link.usage.bytes_in += len(head) + len(body)
    except Closed:
        pass


async def _relay(link: LinkState, name: str, secrets: list[Secret], down: Stream, ups: list[Stream],
                 dial, spool_dir) -> None:
    """Request by request; `ups[0]` the upstream stream (replaced when it is dialled again)."""
    cin, uin = Reader(down), Reader(ups[0])
    masker_values = substitute.masks(secrets)      # (grows by the Basic credentials a request carries)
    served = 0

    async def send_up(data: bytes) -> None:
        await ups[0].write(data)
        link.usage.bytes_out += len(data)

    async def send_down(data: bytes) -> None:
        if data:
            await down.write(data)
            link.usage.bytes_in += len(data)

    while True:
        try:
            head = await asyncio.wait_for(cin.head(), IDLE)
        except asyncio.TimeoutError:
            return
        if head is None:
            return
        method, keep, upgrade, replay = await _request(cin, head, name, secrets, send_up, down, spool_dir,
                                                       masker_values)
        answered = False
        while True:                                  # interim (1xx) responses, then the final one
            try:
                rhead = await uin.head()
            except Refuse as e:
                raise Refuse(502, f"upstream response: {e.reason}") from None
            if rhead is None and served and not answered and replay is not None:
                # the host closed the kept-alive connection while it was idle and the request crossed
                # its close: an idempotent request may be sent again (RFC 9112 9.3.1), on a new dial
                await ups[0].close()
                ups[0] = await dial()
                uin = Reader(ups[0])
                await send_up(replay)
                replay = None
                continue
            if rhead is None:
                raise Closed("upstream closed")
            answered = True
            status, rkeep = await _response(uin, rhead, method, masker_values, send_down)
            if status == 101 and upgrade:
                await _tunnel(cin, uin, masker_values, send_up, send_down)
                return
            if status >= 200 or status == 101:
                break
        if not (keep and rkeep):
            return
        served += 1


async def _request(cin: Reader, head: bytes, name: str, secrets, send_up, down: Stream, spool_dir, sent: list):
    method, target, version, fields = request_line(head)
    if method == b"CONNECT":
        # a tunnel through the secret's host to somewhere else: not a request to that host
        raise Refuse(405, "CONNECT is not relayed to a host a secret is for")
    hosts = get(fields, b"host")
    if len(hosts) > 1:
        raise Refuse(400, "more than one Host")
    named = [h.decode("latin-1") for h in hosts]
    if not target.startswith(b"/") and target != b"*":            # absolute form names a host too
        parsed = urllib.parse.urlsplit(target.decode("latin-1"))
        if parsed.hostname:
            named.append(parsed.hostname)
    for h in named:
        if authority(h) != name:
            raise Refuse(421, f"this connection is for {name}, the request names {authority(h)}")
    kind, length = framing(fields, request=True)
    conn = tokens(fields, b"connection")
    keep = b"close" not in conn and (version != b"HTTP/1.0" or b"keep-alive" in conn)
    upgrade = bool(get(fields, b"upgrade")) and b"upgrade" in conn
    whole = kind == "length" and length <= MAX_BODY
    spooled = kind == "length" and MAX_BODY < length <= MAX_SPOOL
    expect = (whole or spooled) and b"100-continue" in tokens(fields, b"expect")
    if expect:
        # the body is read before the host sees the head: answer the client's wait ourselves
        await down.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    ctype = (get(fields, b"content-type") or [b""])[0]
    body = await cin.exactly(length) if whole else b""
    pairs = substitute.body_values(secrets, ctype)
    spool = await _spool(cin, length, pairs, spool_dir) if spooled else None
    if whole and body and (size := substitute.grown(body, pairs)) > MAX_BODY:
        # placeholders grow (a 1 MiB body of them, 16 KiB values: 327 MiB): streamed out, as a spool's
        spool, body = (io.BytesIO(body), size, True), b""
    try:
        new_target = substitute.target(target, secrets)
        new_fields = [(k, v if k.lower() == b"host" else substitute.value(v, secrets, sent)) for k, v in fields]
        new_body = substitute.body(body, secrets, ctype) if body else body
        if (new_target != target or new_fields != fields or new_body != body or kind == "chunked"
                or (spool is not None and spool[2])):
            # a value is (or, chunked, may be) on its way: ask for a body the response masks can read
            new_fields = [(k, v) for k, v in new_fields if k.lower() != b"accept-encoding"]
            new_fields.append((b"Accept-Encoding", b"identity"))
        if new_body != body or spool is not None:
            body = new_body
            size = spool[1] if spool is not None else len(body)
            new_fields = [(k, str(size).encode() if k.lower() == b"content-length" else v)
                          for k, v in new_fields]
        if expect:
            new_fields = [(k, v) for k, v in new_fields if k.lower() != b"expect"]
        whole_request = build(b" ".join((method, new_target, version)), new_fields) + body
        await send_up(whole_request)
        if spool is not None:             # substituted again as it is read back (the same output)
            spool[0].seek(0)
            stream = substitute.Stream(pairs)
            while data := spool[0].read(READ):
                for out in stream.pieces(data):
                    await send_up(out)
            await send_up(stream.end())
    finally:
        if spool is not None:
            spool[0].close()
            if spooled:
                _SPOOLED[0] -= length
    streamed = kind == "chunked" or (kind == "length" and not whole) or spool is not None
    replay = None if streamed or method not in _IDEMPOTENT else whole_request
    if kind == "length" and not (whole or spooled):
        left = length                 # over MAX_SPOOL: as it is
        while left:
            data = await cin.some(min(left, READ))
            left -= len(data)
            await send_up(data)
    elif kind == "chunked":
        # chunked anew as the substitution gives it out; a placeholder split between chunks is found
        stream = substitute.Stream(pairs)
        await relay_chunks(cin, send_up, stream, trailer=lambda line: _sub_trailer(line, secrets))
    return method, keep, upgrade, replay


def _sub_trailer(line: bytes, secrets) -> bytes:
    k, sep, v = line.partition(b":")
    return k + sep + substitute.value(v, secrets) if sep else line


async def _spool(cin: Reader, length: int, pairs, spool_dir):
    """(file, the body's length substituted, whether it holds a placeholder): the body as the sandbox
    sent it (placeholders, never values: a value stays in memory) in an unlinked file, counted
    against SPOOL_TOTAL until the caller closes it."""
    if _SPOOLED[0] + length > SPOOL_TOTAL:
        raise Refuse(503, "the egress spool for large bodies is full; try again later")
    _SPOOLED[0] += length
    try:
        f = tempfile.TemporaryFile(dir=spool_dir)
    except OSError:
        _SPOOLED[0] -= length
        raise
    try:
        left, size, stream = length, 0, substitute.Stream(pairs)
        while left:
            data = await cin.some(min(left, READ))
            left -= len(data)
            f.write(data)
            size += sum(len(out) for out in stream.pieces(data))
        size += len(stream.end())
    except BaseException:
        f.close()
        _SPOOLED[0] -= length
        raise
    return f, size, stream.found > 0


async def _response(uin: Reader, head: bytes, method: bytes, values, send_down) -> tuple[int, bool]:
    first, fields = parse_head(head, request=False)
    parts = first.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise Closed("malformed response from upstream")
    status = int(parts[1])
    bodiless = 100 <= status < 200 or status in (204, 304) or method == b"HEAD"
    try:
        kind, length = ("none", 0) if bodiless else framing(fields, request=False)
    except Refuse as e:                   # checked before a byte of it goes down: a 502 can still replace it
        raise Refuse(502, f"upstream response: {e.reason}") from None
    mask = Masker(values)
    await send_down(mask.feed(head) + mask.end())
    if bodiless:
        return status, True
    keep = b"close" not in tokens(fields, b"connection") and parts[0] != b"HTTP/1.0"
    if kind == "length":
        left = length
        while left:
            data = await uin.some(min(left, READ))
            left -= len(data)
            await send_down(mask.feed(data))
        await send_down(mask.end())
    elif kind == "chunked":
        await relay_chunks(uin, send_down, mask)
    else:
        while True:
            data = await uin.s.read() if not uin.buf else await uin.some(READ)
            if not data:
                break
            await send_down(mask.feed(data))
        await send_down(mask.end())
        keep = False
    return status, keep


async def _tunnel(cin: Reader, uin: Reader, values, send_up, send_down) -> None:
    """After a 101 (WebSocket): bytes both ways as they are, the host's masked."""
    mask = Masker(values)

    async def pump(src: Reader, send, m) -> None:
        if src.buf:
            data, src.buf = bytes(src.buf), bytearray()
            await send(m.feed(data) if m else data)
        while True:
            data = await src.s.read()
            if not data:
                break
            await send(m.feed(data) if m else data)
        if m:
            await send(m.end())

    await until_first(pump(cin, send_up, None), pump(uin, send_down, mask))
