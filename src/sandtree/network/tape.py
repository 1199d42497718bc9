"""Egress tapes, the daemon's part: what a link fetched, kept so that a later run can be answered
from it with no upstream at all (design.md, "Egress tapes"; the engine's part is engine/tapes.py).

A link attached with a tape (`attach(tape={"record", "replay", "rules"})`) has `LinkState.tape`:
  * every name the daemon resolves for it (the resolver's answers and the proxy's own dials) is
    kept as (name, type) -> addresses; replaying, those are the answers and nothing is asked;
  * every connection it is allowed goes through `serve` instead of the splice/kernel relays (they
    never show Python a byte): HTTPS on 443 with a name is terminated with the link's CA (the
    sandbox trusts it as it does for secrets) and dialled with verified TLS; plain HTTP on 80 is
    read request by request; each request and its response become an exchange. Anything else
    (another port, TLS without a name) is an opaque stream: the bytes of each direction in the
    order they came, per connection;
  * bodies are written as files named by their sha256 into the tape's directory (the engine moves
    them into the store's blobs); the tape's JSON is written there at the release.
A connection to a host a secret is for, recorded, goes through the interceptor (intercept.py) as
without a tape, and the tape reads the sandbox's side of it (the placeholders it sent, the masked
answers it got: a value never reaches a tape). Placeholders are random per run: a tape keeps them
as `sandtree-secret-NAME` and a replay compares requests spelled the same way.

Replaying, a request is matched by method, URL (less the ignored query parameters), the selected
headers (defaults.TAPE_MATCH_HEADERS plus `match_headers`, less `ignore_headers`) and its body's
digest; the n-th same request gets the n-th answer recorded for it (the last again after that). A
request with no answer is a miss: answered 502 naming it and reported at the release (the engine
fails the run with TapeMiss), unless the tape also records (replay_or_record): then it goes out
and joins the new tape, which holds the old one's entries too."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import os
import socket
import ssl
import tempfile
import time
import urllib.parse

from .. import defaults as D
from ..errors import InvalidInput
from .httpio import READ, Closed, Reader, Refuse, Stream, authority, framing, get, parse_head, request_line, tokens

__all__ = ["Tape", "TapeUpstream", "serve", "tap", "exchanges", "parse_option", "TAPE_FORMAT", "TAPE_FILE"]

TAPE_FORMAT = "sandtree-tape/1"
TAPE_FILE = "tape.json"


class _Sink:
    """A body on its way to the tape's directory: hashed as it is written, named by its digest."""

    def __init__(self, directory: str):
        self.fd, self.tmp = tempfile.mkstemp(dir=directory, prefix=".body-")
        self.h, self.size, self.dir = hashlib.sha256(), 0, directory

    def write(self, data: bytes) -> None:
        if data:
            self.h.update(data)
            self.size += len(data)
            os.write(self.fd, data)

    def done(self) -> str | None:
        os.close(self.fd)
        if not self.size:
            os.unlink(self.tmp)
            return None
        digest = self.h.hexdigest()
        os.rename(self.tmp, os.path.join(self.dir, digest))
        return digest

    def drop(self) -> None:
        os.close(self.fd)
        os.unlink(self.tmp)


class Tape:
    """One link's tape. `directory`: where bodies and, at the end, tape.json go (recording);
    `replay`: the engine's replay file (the old tape and where its bodies are); `rules`: matching."""

    def __init__(self, key: str, directory: str | None, record: bool, replay: str | None, rules: dict | None,
                 placeholders: dict[str, str]):
        self.key, self.dir, self.record = key, directory, bool(record)
        self.placeholders = {p.encode(): f"sandtree-secret-{n}".encode() for n, p in placeholders.items()}
        self.start = time.monotonic()
        self.dns: dict[tuple[str, str], list[str]] = {}
        self.http: list[dict] = []
        self.tcp: list[dict] = []
        self.misses: list[str] = []
        self.ipv6: bool | None = None
        self.parent: str | None = None
        self.paths: dict[str, str] = {}              # digest -> file (the old tape's bodies)
        rules = rules or {}
        self.ignore_headers = {h.lower() for h in rules.get("ignore_headers") or ()}
        self.ignore_query = set(rules.get("ignore_query") or ())
        self.headers = ({h.lower() for h in D.TAPE_MATCH_HEADERS} | {h.lower() for h in rules.get("match_headers") or ()}) \
            - self.ignore_headers
        self.replaying = replay is not None
        self.index: dict[tuple, list[dict]] = {}
        self.served: dict[tuple, int] = {}
        self.streams: dict[tuple, list[dict]] = {}
        self.streamed: dict[tuple, int] = {}
        if self.dir is not None:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
        if replay is not None:
            with open(replay) as f:
                given = json.load(f)
            old, self.paths = given["tape"], given["paths"]
            self.parent = given.get("id")
            self.ipv6 = old.get("ipv6")
            for d in old.get("dns", ()):
                self.dns[(d["name"], d["type"])] = list(d["answers"])
            for ex in old.get("http", ()):
                self.index.setdefault(self.key_of(ex), []).append(ex)
            for c in old.get("tcp", ()):
                self.streams.setdefault((c["host"], c["port"]), []).append(c)
            if self.record:                          # replay_or_record: the new tape holds the old one
                self.http, self.tcp = list(old.get("http", ())), list(old.get("tcp", ()))

    # ---- what the tape holds ------------------------------------------------------------------
    def now(self) -> float:
        return round(time.monotonic() - self.start, 3)

    def canon(self, data: bytes) -> bytes:
        for p, c in self.placeholders.items():
            if p in data:
                data = data.replace(p, c)
        return data

    def key_of(self, ex: dict) -> tuple:
        parts = urllib.parse.urlsplit(ex["url"])
        query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
                 if k not in self.ignore_query]
        url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, urllib.parse.urlencode(query), ""))
        headers = tuple(sorted((k.lower(), v) for k, v in ex["headers"] if k.lower() in self.headers))
        return ex["method"], url, headers, ex.get("body")

    def answer_for(self, ex: dict) -> dict | None:
        k = self.key_of(ex)
        found = self.index.get(k)
        if not found:
            return None
        n = self.served.get(k, 0)
        self.served[k] = n + 1
        return found[min(n, len(found) - 1)]

    def miss(self, what: str) -> None:
        if len(self.misses) < D.TAPE_MAX_MISSES and what not in self.misses:
            self.misses.append(what)

    def body(self, data: bytes) -> str | None:
        """A recorded body (a request's, a stream's part) into the directory; its digest."""
        if not data or self.dir is None:
            return None
        digest = hashlib.sha256(data).hexdigest()
        path = os.path.join(self.dir, digest)
        if not os.path.exists(path):
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".body-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.rename(tmp, path)
        return digest

    def path(self, digest: str) -> str:
        p = self.paths.get(digest)
        if p is None and self.dir is not None:
            p = os.path.join(self.dir, digest)
        if p is None:
            raise Closed(f"tape body {digest[:12]} missing")
        return p

    def to_json(self) -> dict:
        return {"format": TAPE_FORMAT, "parent": self.parent, "ipv6": self.ipv6,
                "dns": [{"name": n, "type": t, "answers": a} for (n, t), a in sorted(self.dns.items())],
                "http": self.http, "tcp": self.tcp}

    def finish(self) -> dict:
        """What the release answers: where the tape is (recording) and the replay's misses."""
        out: dict = {"misses": list(self.misses)}
        if self.record and self.dir is not None:
            with open(os.path.join(self.dir, TAPE_FILE), "w") as f:
                json.dump(self.to_json(), f, sort_keys=True, separators=(",", ":"))
            out["dir"] = self.dir
        return out


class TapeUpstream:
    """The daemon's upstream as a taped link sees it: resolutions recorded, or answered from the
    tape; with a replay-only tape nothing can be dialled (a request that reaches the network would
    be a bug: it is refused here, not sent)."""

    def __init__(self, upstream, tape: Tape):
        self.up, self.tape = upstream, tape

    def has_ipv6(self) -> bool:
        t = self.tape
        if t.replaying and (t.ipv6 is not None or not t.record):
            return bool(t.ipv6)
        if t.ipv6 is None:
            t.ipv6 = self.up.has_ipv6()
        return t.ipv6

    async def resolve(self, name: str, rdtype: str = "A") -> list:
        t = self.tape
        key = (name, rdtype)
        if key in t.dns:
            return [ipaddress.ip_address(a) for a in t.dns[key]]
        if not t.record:
            t.miss(f"DNS {rdtype} {name}")
            return []
        ips = await self.up.resolve(name, rdtype)
        t.dns[key] = [str(i) for i in ips]
        return ips

    def own_addresses(self):
        return self.up.own_addresses()

    def tls_context(self):
        return self.up.tls_context()

    def _out(self):
        if not self.tape.record:
            raise OSError("a replayed link has no upstream")

    async def connect(self, ip, port: int, **kw):
        self._out()
        return await self.up.connect(ip, port, **kw)

    async def open_connection(self, ip, port: int, **kw):
        self._out()
        return await self.up.open_connection(ip, port, **kw)


# ---- HTTP exchanges --------------------------------------------------------------------------

async def _request(cin: Reader, name: str | None):
    """(raw head, method, target, fields, body bytes as framed, body decoded, keep) or None at the end."""
    head = await cin.head()
    if head is None:
        return None
    method, target, version, fields = request_line(head)
    if method == b"CONNECT":
        raise Refuse(405, "CONNECT is not taped")
    named = [h.decode("latin-1") for h in get(fields, b"host")]
    if not target.startswith(b"/") and target != b"*":
        parsed = urllib.parse.urlsplit(target.decode("latin-1"))
        if parsed.hostname:
            named.append(parsed.hostname)
    for h in named:
        if name and authority(h) != name:
            raise Refuse(421, f"this connection is for {name}, the request names {authority(h)}")
    kind, length = framing(fields, request=True)
    raw, decoded = b"", b""
    if kind == "length":
        if length > D.TAPE_MAX_REQUEST_BODY:
            raise Refuse(413, f"a taped request body is at most {D.TAPE_MAX_REQUEST_BODY} bytes")
        raw = decoded = await cin.exactly(length)
    elif kind == "chunked":
        parts_ = []
        while True:
            line = await cin.line()
            size = int(line[:-2].split(b";")[0], 16)
            parts_.append(line)
            if size == 0:
                while (t := await cin.line()) != b"\r\n":
                    parts_.append(t)
                parts_.append(b"\r\n")
                break
            data = await cin.exactly(size + 2)
            parts_.append(data)
            decoded += data[:-2]
            if len(decoded) > D.TAPE_MAX_REQUEST_BODY:
                raise Refuse(413, f"a taped request body is at most {D.TAPE_MAX_REQUEST_BODY} bytes")
        raw = b"".join(parts_)
    conn = tokens(fields, b"connection")
    keep = b"close" not in conn and (version != b"HTTP/1.0" or b"keep-alive" in conn)
    return head, method, target, fields, raw, decoded, keep


async def _response(uin: Reader, method: bytes, send, sink: _Sink | None) -> tuple[int, bytes, bool]:
    """Relay one response (interim ones included) with `send`, its body also into `sink`;
    (status, the final head, whether the connection may go on)."""
    while True:
        head = await uin.head()
        if head is None:
            raise Closed("upstream closed")
        first, fields = parse_head(head, request=False)
        parts = first.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise Closed("malformed response")
        status = int(parts[1])
        await send(head)
        if 100 <= status < 200 and status != 101:
            continue
        break
    if status == 101:
        raise Closed("protocol upgrades are not taped")
    keep = b"close" not in tokens(fields, b"connection") and parts[0] != b"HTTP/1.0"
    bodiless = status in (204, 304) or method == b"HEAD"
    kind, length = ("none", 0) if bodiless else framing(fields, request=False)

    async def out(data: bytes) -> None:
        if sink is not None:
            sink.write(data)
        await send(data)

    async def copy(left: int) -> None:
        while left:
            data = await uin.some(min(left, READ))
            left -= len(data)
            await out(data)
    if kind == "length":
        await copy(length)
    elif kind == "chunked":
        while True:
            line = await uin.line()
            size = int(line[:-2].split(b";")[0], 16)
            await out(line)
            if size == 0:
                while (t := await uin.line()) != b"\r\n":
                    await out(t)
                await out(b"\r\n")
                break
            await copy(size + 2)
    elif kind == "close":
        while True:
            data = bytes(uin.buf) if uin.buf else await uin.s.read()
            uin.buf = bytearray()
            if not data:
                break
            await out(data)
        keep = False
    return status, head, keep


def _exchange(tape: Tape, scheme: str, name: str, port: int, req, t: float) -> dict:
    head, method, target, fields, _raw, decoded, _keep = req
    netloc = name if port == {"http": 80, "https": 443}[scheme] else f"{name}:{port}"
    path = target.decode("latin-1")
    if not path.startswith("/"):
        parts = urllib.parse.urlsplit(path)
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    canon = tape.canon(decoded)
    return {"scheme": scheme, "host": name, "port": port, "method": method.decode("latin-1"),
            "url": tape.canon(f"{scheme}://{netloc}{path}".encode("latin-1")).decode("latin-1"),
            "headers": [[k.decode("latin-1"), tape.canon(v).decode("latin-1")] for k, v in fields],
            "body": hashlib.sha256(canon).hexdigest() if canon else None, "body_size": len(canon), "t": t}


async def _refused(down: Stream, status: int, reason: str) -> None:
    body = f"sandtree egress tape: {reason}\n".encode()
    try:
        await down.write(b"HTTP/1.1 %d Error\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (status, len(body), body))
    except Closed:
        pass


async def exchanges(link, tape: Tape, scheme: str, name: str, port: int, down: Stream, dial) -> None:
    """Request by request on a taped HTTP connection (`down`: the sandbox's side, TLS ended);
    `dial()` -> the upstream Stream, made at the first request the tape does not answer."""
    cin = Reader(down)
    up = uin = None
    try:
        while True:
            req = await _request(cin, name)
            if req is None:
                return
            t = tape.now()
            ex = _exchange(tape, scheme, name, port, req, t)
            keep = req[6]
            hit = tape.answer_for(ex) if tape.replaying else None
            if hit is not None:
                data = hit["response_head"].encode("latin-1")
                await down.write(data)
                link.usage.bytes_in += len(data)
                if hit.get("response_body"):
                    with open(tape.path(hit["response_body"]), "rb") as f:
                        while chunk := f.read(READ):
                            await down.write(chunk)
                            link.usage.bytes_in += len(chunk)
                if not (keep and hit.get("keep", True)):
                    return
                continue
            what = f"{ex['method']} {ex['url']}"
            if not tape.record:
                tape.miss(what)
                await _refused(down, 502, f"no recorded answer for {what}")
                return
            if up is None:
                up = await dial()
                uin = Reader(up)
            raw = req[0] + req[4]
            await up.write(raw)
            link.usage.bytes_out += len(raw)
            if req[5]:
                tape.body(tape.canon(req[5]))

            async def send(data: bytes) -> None:
                await down.write(data)
                link.usage.bytes_in += len(data)
            rkeep = await _taped_response(tape, ex, uin, req[1], send)
            if not (keep and rkeep):
                return
    except Refuse as e:
        await _refused(down, e.status, e.reason)
    finally:
        if up is not None:
            await up.close()


async def _taped_response(tape: Tape, ex: dict, uin: Reader, method: bytes, send) -> bool:
    """The response to exchange `ex` read from `uin`, each part handed to `send`, its body into the tape's
    directory; `ex` completed and appended to the tape. Whether the connection stays open."""
    sink = _Sink(tape.dir)
    try:
        status, rhead, keep = await _response(uin, method, send, sink)
    except BaseException:
        sink.drop()
        raise
    size = sink.size
    ex.update(status=status, response_head=rhead.decode("latin-1"), response_body=sink.done(),
              response_size=size, keep=keep)
    tape.http.append(ex)
    return keep


async def _parse_tapped(tape: Tape, name: str, sent: bytes, got: bytes, t: float) -> None:
    """The exchanges of an intercepted connection from the sandbox's two byte streams."""
    class Mem:
        def __init__(self, data):
            self.data = data

        async def read(self):
            data, self.data = self.data, b""
            return data
    cin, uin = Reader(Mem(sent)), Reader(Mem(got))
    try:
        while (req := await _request(cin, name)) is not None:
            ex = _exchange(tape, "https", name, 443, req, t)
            if req[5]:
                tape.body(tape.canon(req[5]))

            async def send(data: bytes) -> None:
                pass
            await _taped_response(tape, ex, uin, req[1], send)
    except (Closed, Refuse, ValueError):
        pass                                 # (what was read whole is kept)


def tap(tape: Tape, name: str):
    """For intercept.handle: reads what the sandbox sends and gets on its (TLS-ended) stream;
    the connection's exchanges are taken from them when it ends (`.done()`)."""
    sent, got = bytearray(), bytearray()
    t = tape.now()

    def wrap(stream: Stream) -> None:
        read, write = stream.read, stream.write

        async def tread() -> bytes:
            data = await read()
            sent.extend(data)
            return data

        async def twrite(data: bytes) -> None:
            got.extend(data)
            await write(data)
        stream.read, stream.write = tread, twrite

    async def done() -> None:
        await _parse_tapped(tape, name, bytes(sent), bytes(got), t)
    wrap.done, wrap.sent, wrap.got = done, sent, got
    return wrap


# ---- opaque streams --------------------------------------------------------------------------

async def _opaque_record(link, tape: Tape, key, client: socket.socket, up: socket.socket, first: bytes) -> None:
    loop = asyncio.get_running_loop()
    segments: list[list] = []
    t = tape.now()

    def note(direction: str, data: bytes) -> None:
        if segments and segments[-1][0] == direction:
            segments[-1][1] += data
        else:
            segments.append([direction, bytearray(data)])

    async def pump(src, dst, direction: str) -> None:
        try:
            while True:
                data = await loop.sock_recv(src, READ)
                if not data:
                    break
                note(direction, data)
                await loop.sock_sendall(dst, data)
                if direction == "out":
                    link.usage.bytes_out += len(data)
                else:
                    link.usage.bytes_in += len(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
    if first:
        note("out", first)
        await loop.sock_sendall(up, first)
        link.usage.bytes_out += len(first)
    await asyncio.gather(pump(client, up, "out"), pump(up, client, "in"))
    tape.tcp.append({"host": key[0], "port": key[1], "t": t,
                     "segments": [[d, tape.body(bytes(b)), len(b)] for d, b in segments]})


async def _opaque_replay(link, tape: Tape, rec: dict, client: socket.socket, first: bytes) -> None:
    loop = asyncio.get_running_loop()
    pending = bytearray(first)
    for direction, digest, size in rec["segments"]:
        if direction == "out":
            while len(pending) < size:
                data = await loop.sock_recv(client, READ)
                if not data:
                    return
                pending += data
            del pending[:size]
            link.usage.bytes_out += size
        else:
            with open(tape.path(digest), "rb") as f:
                while chunk := f.read(READ):
                    await loop.sock_sendall(client, chunk)
                    link.usage.bytes_in += len(chunk)
    try:
        client.shutdown(socket.SHUT_WR)
        while await loop.sock_recv(client, READ):
            pass
    except OSError:
        pass


# ---- a taped connection ----------------------------------------------------------------------

async def serve(link, client: socket.socket, first: bytes, name: str | None, ip, port: int, http: bool,
                upstream: TapeUpstream, intercepted) -> None:
    """Serve one allowed connection of a taped link to its end. `http`: port 80 read as HTTP;
    `intercepted(tap)`: the interceptor's handling (a host a secret is for, recorded)."""
    tape: Tape = link.tape
    key = (name or str(ip), port)
    if port == 443 and name and link.ca is not None:
        if intercepted is not None and not tape.replaying:
            t = tap(tape, name)
            await intercepted(t)
            await t.done()
            return
        reader, writer = await asyncio.open_connection(sock=client.dup(), limit=1 << 18)
        down = Stream(reader, writer, link.ca.server_context(name), server_side=True, initial=first)
        try:
            try:
                await down.handshake()
            except (ssl.SSLError, Closed, ConnectionError, OSError):
                return

            async def dial() -> Stream:
                r, w = await upstream.open_connection(ip, port, timeout=10.0)
                s = Stream(r, w, upstream.tls_context(), server_hostname=name)
                await s.handshake()
                return s
            await exchanges(link, tape, "https", name, port, down, dial)
        except (Closed, ConnectionError, OSError, ssl.SSLError):
            pass
        finally:
            await down.close()
        return
    if http and name:
        reader, writer = await asyncio.open_connection(sock=client.dup(), limit=1 << 18)
        down = Stream(reader, writer, initial=first)
        try:
            async def dial() -> Stream:
                r, w = await upstream.open_connection(ip, port, timeout=10.0)
                return Stream(r, w)
            await exchanges(link, tape, "http", name, port, down, dial)
        except (Closed, ConnectionError, OSError):
            pass
        finally:
            await down.close()
        return
    # opaque: the n-th connection to this destination replays the n-th recorded one
    n = tape.streamed.get(key, 0)
    tape.streamed[key] = n + 1
    recorded = tape.streams.get(key, [])
    if n < len(recorded):
        await _opaque_replay(link, tape, recorded[n], client, first)
        return
    if not tape.record:
        tape.miss(f"TCP {key[0]}:{port} (connection {n + 1})")
        return
    try:
        up = await upstream.connect(ip, port, timeout=10.0)
    except (OSError, asyncio.TimeoutError):
        return
    try:
        await _opaque_record(link, tape, key, client, up, first)
    finally:
        up.close()


def parse_option(value, key: str, home: str, placeholders: dict[str, str]) -> Tape | None:
    """The attach request's `tape` ({"record": bool, "replay": path|None, "rules": {...}}) as a Tape
    (None: no tape); InvalidInput for another shape."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("record", False), bool):
        raise InvalidInput("tape is {'record': bool, 'replay': path, 'rules': {...}}")
    replay = value.get("replay")
    if replay is not None and (not isinstance(replay, str) or not os.path.isabs(replay)):
        raise InvalidInput("a tape's replay is the engine's replay file (an absolute path)")
    if not value.get("record") and replay is None:
        return None
    directory = os.path.join(home, "network", "tapes", hashlib.sha256(key.encode()).hexdigest()[:32]) \
        if value.get("record") else None
    return Tape(key, directory, value.get("record", False), replay, value.get("rules"), placeholders)
