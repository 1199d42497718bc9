"""What a connection's first bytes say about where it is going: the server name of a TLS
ClientHello (SNI) or the Host of an HTTP/1.x request head. Both parsers take what has arrived so
far and answer False while more is needed, so the proxy reads no more than it must (bounded by
SNIFF_BYTES)."""

from __future__ import annotations

__all__ = ["SNIFF_BYTES", "sni", "http_host"]

SNIFF_BYTES = 16384          # what a ClientHello or an HTTP head may take


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
