"""Where a secret's placeholder becomes its value in a request (intercept.py relays; this says
what is replaced, and how it is encoded where it lands):

  * the request target: percent-encoded;
  * a header (or trailer) value: as it is, and inside `Authorization: Basic` base64 decoded,
    replaced, encoded again;
  * a body: JSON-escaped for a JSON body, form-encoded for a form body, raw otherwise -- whole
    (`body`) or as a stream (`Stream`: a placeholder split between two reads or two chunks is
    still found; memory is one read plus the longest placeholder)."""

from __future__ import annotations

import base64
import json
import urllib.parse

from .state import Secret

__all__ = ["target", "value", "body", "body_values", "Stream"]


def target(text: bytes, secrets: list[Secret]) -> bytes:
    for s in secrets:
        ph = s.placeholder.encode()
        if ph in text:
            text = text.replace(ph, urllib.parse.quote(s.value, safe="").encode())
    return text


def value(text: bytes, secrets: list[Secret]) -> bytes:
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
            text = scheme + b" " + base64.b64encode(new)
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


class Stream:
    """Replaces placeholders in a body that comes in pieces. `feed` returns what is certain; it
    holds back only a tail that may be the start of a placeholder (never a byte of a value:
    replaced text is not searched again). `found`: how many were replaced."""

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
        hold = 0
        for p, _ in self.pairs:
            k = buf.find(p[:1], max(i, len(buf) - len(p) + 1))
            while k >= 0:
                if p.startswith(buf[k:]):
                    hold = max(hold, len(buf) - k)
                    break
                k = buf.find(p[:1], k + 1)
        self.tail = buf[len(buf) - hold:] if hold else b""
        out.append(buf[i:len(buf) - hold])
        return b"".join(out)

    def end(self) -> bytes:
        out, self.tail = self.tail, b""
        return out
