"""sandtree's errors as envd's Connect-RPC services answer them: a Connect error code, from each
class's http_status (errors.py), so a new error class needs nothing here; and strict codecs, so a
malformed message is the client's error. (envd's HTTP routes answer E2B's {"code", "message"}:
files.py.) Needs the `e2b` extra (connectrpc)."""

from __future__ import annotations

import asyncio
import functools

from connectrpc.code import Code
from connectrpc.codec import proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError

from ....errors import SandtreeError

# http_status -> Connect code (what E2B's SDK maps back: NOT_FOUND -> FileNotFoundException,
# INVALID_ARGUMENT -> InvalidArgumentException, ALREADY_EXISTS -> make_dir's False, ...)
CODES = {400: Code.INVALID_ARGUMENT, 401: Code.UNAUTHENTICATED, 403: Code.PERMISSION_DENIED,
         404: Code.NOT_FOUND, 405: Code.INVALID_ARGUMENT, 408: Code.DEADLINE_EXCEEDED, 409: Code.ALREADY_EXISTS,
         410: Code.NOT_FOUND, 413: Code.RESOURCE_EXHAUSTED, 422: Code.INVALID_ARGUMENT,
         425: Code.UNAVAILABLE, 429: Code.RESOURCE_EXHAUSTED, 431: Code.RESOURCE_EXHAUSTED,
         502: Code.UNAVAILABLE, 503: Code.UNAVAILABLE, 507: Code.RESOURCE_EXHAUSTED}


def connect_error(exc: SandtreeError) -> ConnectError:
    return ConnectError(CODES.get(exc.http_status, Code.INTERNAL), exc.message)


def rpc(fn):
    """A Connect method whose sandtree errors reach the client as their Connect codes."""
    @functools.wraps(fn)
    async def method(*a, **k):
        try:
            return await fn(*a, **k)
        except SandtreeError as exc:
            raise connect_error(exc) from None
    return method


class _Strict:
    """A codec whose malformed input is the client's error (INVALID_ARGUMENT, as connect-go's envd
    answers it), not connectrpc's UNKNOWN (HTTP 500) nor a decoder's panic (a pyo3 PanicException is
    a BaseException: it dropped the connection)."""

    def __init__(self, inner):
        self.inner = inner

    def name(self) -> str:
        return self.inner.name()

    def encode(self, message) -> bytes:
        return self.inner.encode(message)

    def decode(self, data, message_class):
        try:
            return self.inner.decode(data, message_class)
        except (KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError):
            raise
        except BaseException as exc:                     # noqa: BLE001 - see the class doc
            raise ConnectError(Code.INVALID_ARGUMENT, f"malformed {self.inner.name()} message: {exc}"[:500]) from None


def strict_codecs() -> list:
    """connectrpc's default codecs (proto binary and JSON), strict as _Strict says."""
    return [_Strict(proto_binary_codec()), _Strict(proto_json_codec())]
