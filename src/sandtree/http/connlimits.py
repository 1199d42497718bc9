"""The connections of `sandtree serve`: what one connection, one client and all of them may hold.

uvicorn (on httptools) takes a header of any size and any number of headers, never times out a
request whose headers are still coming, and keeps every connection it accepted: a 16 MiB header
and 20,000 headers were read, 300 half-sent requests were held for a minute, and 1,000 idle
connections took the server to 1,022 open files (its limit: then nobody can connect, and the
engine cannot open a file). LimitedHttp is uvicorn's httptools protocol with those bounds
(ConnLimits, from defaults.py; `sandtree serve` options change them):

- a request's line and headers: at most `header_bytes` and `header_count` (else 431
  headers_too_large, and the connection is closed); counted as the bytes come, so no more than
  one read past the cap is ever buffered;
- they must all have come `header_timeout` seconds after the connection was made, or after the
  request's first byte (else 408 request_timeout, closed; a connection that sent nothing is just
  closed); an idle connection between requests is closed after `keep_alive` (uvicorn's own);
- one client address holds at most `per_client` connections, all clients at most `total`
  (bounded by the open-file limit less a reserve): one more is answered 429 limit_exceeded and
  closed at once, so it holds no file past its accept. (A WebSocket, once upgraded, is its own
  protocol's and no longer counted.)

`sandtree mcp --http` runs with the same protocol (server.connection_options, which the CLI hands
it). Every refusal is JSON in the one error shape (errors.py). What a deployment should put in front
(a reverse proxy that buffers requests and bounds clients) is in docs/deploy.md.
"""

from __future__ import annotations

import json
import resource
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from .. import defaults as D
from ..errors import HeadersTooLarge, InvalidInput, LimitExceeded, RequestTimeout, SandtreeError

FILES_RESERVE = 256          # open files kept for the engine (stores, sandboxes' pipes, pidfds) under the limit


@dataclass(frozen=True)
class ConnLimits:
    header_bytes: int = D.HEADER_BYTES
    header_count: int = D.HEADER_COUNT
    header_timeout: float = D.HEADER_TIMEOUT
    keep_alive: float = D.KEEP_ALIVE
    per_client: int = D.CLIENT_CONNECTIONS          # 0: no cap per client (behind a proxy: it is one client)
    total: int = D.SERVER_CONNECTIONS

    def __post_init__(self):
        for name in ("header_bytes", "header_count", "total"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidInput(f"{name} must be a positive integer")
        if not isinstance(self.per_client, int) or self.per_client < 0:
            raise InvalidInput("per_client must be an integer from 0 (no cap)")
        for name in ("header_timeout", "keep_alive"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 < v <= D.DURATION_MAX:
                raise InvalidInput(f"{name} must be seconds more than 0")

    def connections(self) -> int:
        """`total`, at most what the open-file limit leaves past FILES_RESERVE (at least 16)."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return self.total
        return max(16, min(self.total, soft - FILES_RESERVE))


class _Refused(Exception):
    """Raised from a parser callback (httptools hands it back as a parse error)."""


def limited_protocol(limits: ConnLimits) -> type:
    """A protocol class for uvicorn.Config(http=...), with its own count of connections per client."""
    return type("LimitedHttp", (LimitedHttp,), {"limits": limits, "total": limits.connections(), "per_peer": {}})


class LimitedHttp(HttpToolsProtocol):
    limits: ConnLimits
    total: int
    per_peer: dict                  # client address -> its open connections (this server's)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._peer = self.client[0] if self.client else None
        self._counted = False
        self._header_timer = None
        self._refusal: SandtreeError | None = None
        self._in_headers, self._header_bytes, self._header_count = True, 0, 0
        n = self.per_peer.get(self._peer, 0)
        if len(self.connections) > self.total:
            return self._refuse(LimitExceeded(f"the server holds {self.total} connections, its most: try again later",
                                              limit=self.total))
        if self.limits.per_client and n >= self.limits.per_client:
            return self._refuse(LimitExceeded(f"this client holds {n} connections, the most one client may "
                                              f"(close some, or reuse them)", limit=self.limits.per_client))
        self.per_peer[self._peer] = n + 1
        self._counted = True
        self._arm()

    def connection_lost(self, exc) -> None:
        self._release()
        super().connection_lost(exc)

    def _release(self) -> None:
        self._disarm()
        if self._counted:
            self._counted = False
            n = self.per_peer.get(self._peer, 1) - 1
            if n > 0:
                self.per_peer[self._peer] = n
            else:
                self.per_peer.pop(self._peer, None)

    # ---- the header timeout ------------------------------------------------------------------
    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.limits.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._header_bytes:          # a request started and never finished its headers
            self._refuse(RequestTimeout(f"the request's headers did not come within {self.limits.header_timeout} s"))
        else:                           # nothing sent: closed as an idle connection is
            self.transport.close()

    # ---- counting headers as they come -------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        was = self._in_headers
        super().data_received(data)
        if self._in_headers and was and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > self.limits.header_bytes:
                self._refuse(HeadersTooLarge(f"a request's line and headers are over {self.limits.header_bytes} bytes",
                                             limit=self.limits.header_bytes))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers, self._header_bytes, self._header_count = True, 0, 0
        if self._header_timer is None:
            self._arm()

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        self._check()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        self._header_count += 1
        self._check()
        super().on_header(name, value)

    def _check(self) -> None:
        if self._header_count > self.limits.header_count:
            self._refusal = HeadersTooLarge(f"a request may have {self.limits.header_count} headers at most",
                                            limit=self.limits.header_count)
        elif self._header_bytes > self.limits.header_bytes:
            self._refusal = HeadersTooLarge(f"a request's line and headers are over {self.limits.header_bytes} bytes",
                                            limit=self.limits.header_bytes)
        if self._refusal is not None:
            raise _Refused()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        super().on_headers_complete()

    def handle_websocket_upgrade(self) -> None:
        self._release()              # the WebSocket's protocol has the connection from here
        super().handle_websocket_upgrade()

    # ---- answers ------------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what its parser refused: ours (a header cap) or a malformed request."""
        exc, self._refusal = self._refusal, None
        self._refuse(exc or InvalidInput("invalid HTTP request"))

    def _refuse(self, exc: SandtreeError) -> None:
        """Answer `exc` in the one error shape and close the connection."""
        self._disarm()
        if self.transport.is_closing():
            return
        body = json.dumps(exc.to_dict()).encode()
        head = [STATUS_LINE[exc.http_status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
                 b"\r\nconnection: close\r\n\r\n", body]
        self.transport.write(b"".join(head))
        self.transport.close()
