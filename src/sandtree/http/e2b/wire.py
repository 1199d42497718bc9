"""E2B's error shapes, from sandtree's errors (one table, every E2B module uses it): the control
plane's and envd's HTTP routes answer {"code": <status>, "message"} (http_error); envd's Connect
services raise ConnectError with the code E2B's SDK maps to its own exceptions (connect_error:
NOT_FOUND -> NotFoundException, INVALID_ARGUMENT -> InvalidArgumentException, ...)."""

from __future__ import annotations

from connectrpc.code import Code
from connectrpc.codec import proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError
from starlette.responses import JSONResponse

from ...errors import SandtreeError

__all__ = ["connect_error", "http_error", "CONNECT_CODES", "CODECS", "Checked"]

# sandtree's HTTP status (SandtreeError.http_status) -> the Connect code envd answers for it
CONNECT_CODES = {
    400: Code.INVALID_ARGUMENT, 405: Code.INVALID_ARGUMENT, 408: Code.DEADLINE_EXCEEDED,
    401: Code.UNAUTHENTICATED, 403: Code.PERMISSION_DENIED, 404: Code.NOT_FOUND,
    409: Code.FAILED_PRECONDITION, 410: Code.NOT_FOUND, 425: Code.UNAVAILABLE, 422: Code.FAILED_PRECONDITION,
    429: Code.RESOURCE_EXHAUSTED, 413: Code.RESOURCE_EXHAUSTED, 431: Code.RESOURCE_EXHAUSTED,
    507: Code.RESOURCE_EXHAUSTED, 502: Code.UNAVAILABLE, 503: Code.UNAVAILABLE,
}


def connect_error(exc: SandtreeError) -> ConnectError:
    return ConnectError(CONNECT_CODES.get(exc.http_status, Code.INTERNAL), exc.message)


def http_error(exc: SandtreeError) -> JSONResponse:
    return JSONResponse({"code": exc.http_status, "message": exc.message}, status_code=exc.http_status)


class Checked:
    """A Connect codec whose undecodable message is the client's error (INVALID_ARGUMENT), not the
    server's: connectrpc answers an exception of a codec as `unknown`, with a 500."""

    def __init__(self, codec):
        self.codec = codec

    def name(self) -> str:
        return self.codec.name()

    def encode(self, message) -> bytes:
        return self.codec.encode(message)

    def decode(self, data, message_class):
        try:
            return self.codec.decode(data, message_class)
        except ConnectError:
            raise
        except Exception as exc:              # noqa: BLE001 - whatever the parser raises for bad bytes
            raise ConnectError(Code.INVALID_ARGUMENT, f"not a valid {message_class.__name__} message: {exc}") from None


# what envd's Connect services take (binary and JSON, as connectrpc's defaults), checked
CODECS = [Checked(proto_binary_codec()), Checked(proto_json_codec())]
