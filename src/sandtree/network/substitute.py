"""Where a secret's placeholder becomes its value in a request (intercept.py relays; this says
what is replaced, and how it is encoded where it lands):

  * the request target: percent-encoded;
  * a header (or trailer) value: as it is, and inside `Authorization: Basic` base64 decoded,
    replaced, encoded again;
  * a body: JSON-escaped for a JSON body, form-encoded for a form body, raw otherwise -- whole
    (`body`) or as a stream (`Stream`: a placeholder split between two reads or two chunks is
    still found; memory is one read plus the longest placeholder).

What the relay masks in responses (`masks`) is every form a value was sent in, not only the value
itself: a host that echoes the request (its URL, its headers, its form) hands back the proxy's own
encoding, and percent-, form- or JSON-encoding or base64 is undone by the sandbox in one line (an attack
review found it: `GET /echo?q=PLACEHOLDER` gave back the value percent-encoded)."""

from __future__ import annotations

import base64
import json
import urllib.parse

from .httpio import READ, prefix_hold
from .state import Secret

__all__ = ["target", "value", "body", "body_values", "masks", "grown", "Stream"]


def target(text: bytes, secrets: list[Secret]) -> bytes:
    for s in secrets:
        ph = s.placeholder.encode()
        if ph in text:
            text = text.replace(ph, urllib.parse.quote(s.value, safe="").encode())
    return text


def masks(secrets: list[Secret]) -> list[bytes]:
    """Each value in every encoding the substitution writes it (value, target, form and JSON
    bodies), longest first; `value` adds a Basic credential it writes (the encoding holds more)."""
    out = set()
    for s in secrets:
        v = s.value
        out.update((v.encode(), urllib.parse.quote(v, safe="").encode(), urllib.parse.quote_plus(v).encode(),
                    json.dumps(v)[1:-1].encode()))
    return sorted((m for m in out if m), key=lambda m: (-len(m), m))


def value(text: bytes, secrets: list[Secret], sent: list[bytes] | None = None) -> bytes:
    """A header value with the placeholders replaced; `sent` (the connection's masks) gets a
    Basic credential this wrote, as it goes on the wire."""
    for s in secrets:
        text = text.replace(s.placeholder.encode(), s.value.encode())
    scheme, _, cred = text.partition(b" ")
    if scheme.lower() == b"basic" and cred:
        try:
            plain = base64.b64decode(cred.strip(), validate=True)
        except ValueError:
            return text
        new = plain
        for s in secrets:
            new = new.replace(s.placeholder.encode(), s.value.encode())
        if new != plain:
            cred = base64.b64encode(new)
            text = scheme + b" " + cred
            if sent is not None and cred not in sent:
                sent.append(cred)
    return text


def body_values(secrets: list[Secret], ctype: bytes) -> list[tuple[bytes, bytes]]:
    """(placeholder, value as the body of type `ctype` writes it) for each secret."""
    ctype = ctype.split(b";")[0].strip().lower()
    out = []
    for s in secrets:
        if ctype == b"application/json" or ctype.endswith(b"+json"):
            v = json.dumps(s.value)[1:-1].encode()
        elif ctype == b"application/x-www-form-urlencoded":
            v = urllib.parse.quote_plus(s.value).encode()
        else:
            v = s.value.encode()
        out.append((s.placeholder.encode(), v))
    return out


def body(data: bytes, secrets: list[Secret], ctype: bytes) -> bytes:
    for ph, v in body_values(secrets, ctype):
        if ph in data:
            data = data.replace(ph, v)
    return data


def grown(data: bytes, pairs: list[tuple[bytes, bytes]]) -> int:
    """The length of `data` once substituted (placeholders never overlap: each holds 128 random bits)."""
    return len(data) + sum(data.count(p) * (len(v) - len(p)) for p, v in pairs if p)


class Stream:
    """Replaces placeholders in a body that comes in pieces. `feed` returns what is certain; it
    holds back only a tail that may be the start of a placeholder (never a byte of a value:
    replaced text is not searched again). `found`: how many were replaced.

    Callers feed at most MAX_FEED bytes at a time: a body of nothing but placeholders grows by
    up to len(value)/len(placeholder) (16 KiB values: over 300 times), so what one feed returns,
    and the daemon holds, stays a few MiB (an attack review found it: a 1 MiB body was 327 MiB)."""

    MAX_FEED = 16 << 10

    def pieces(self, data: bytes, size: int = READ):
        """feed(data) in MAX_FEED slices, given out in pieces of about `size` bytes (so a
        relay's writes stay as few as one a read when nothing grows)."""
        if grown(data, self.pairs) - len(data) <= size:     # little growth (the usual body): one feed
            yield self.feed(data)
            return
        out: list[bytes] = []
        n = 0
        for i in range(0, len(data), self.MAX_FEED):
            piece = self.feed(data[i:i + self.MAX_FEED])
            out.append(piece)
            n += len(piece)
            if n >= size:
                yield b"".join(out)
                out, n = [], 0
        if n:
            yield b"".join(out)

    def __init__(self, pairs: list[tuple[bytes, bytes]]):
        self.pairs = [(p, v) for p, v in pairs if p]
        self.tail = b""
        self.found = 0

    def feed(self, data: bytes) -> bytes:
        buf = self.tail + data
        out = []
        i = 0
        while True:
            hits = [(j, p, v) for p, v in self.pairs if (j := buf.find(p, i)) >= 0]
            if not hits:
                break
            j, p, v = min(hits, key=lambda h: h[0])
            out += (buf[i:j], v)
            i = j + len(p)
            self.found += 1
        hold = prefix_hold(buf, i, [p for p, _ in self.pairs])
        self.tail = buf[len(buf) - hold:] if hold else b""
        out.append(buf[i:len(buf) - hold])
        return b"".join(out)

    def end(self) -> bytes:
        out, self.tail = self.tail, b""
        return out
