"""The one exception tree of sandtree. Every adapter (CLI, SDK, server) maps these, and only these.

    SandtreeError                 base; `code` is a stable machine-readable name
    ├── NotFound                  unknown image, tag, path or operation
    │   ├── ImageNotFound
    │   └── PathNotFound
    ├── InvalidInput              the request itself is wrong; nothing was changed
    │   ├── PathEscape            a path that leaves the image (`..`, symlinks, absolute tar members)
    │   ├── BadArchive            an import source that cannot be read safely
    │   ├── CommandNotFound       the command cannot be executed (details: command, errno: ENOENT, EACCES...)
    │   ├── NotRegularFile        a host-side file call met a device, FIFO or socket
    │   ├── MethodNotAllowed      an HTTP method the path does not take (the server's router: 405)
    │   └── RequestTimeout        a request's headers did not come in time (the server's connections: 408)
    ├── Conflict                  a ref moved under us (compare-and-swap lost)
    │   ├── NotReady              what the call needs is still starting (425: retry)
    │   ├── Ended                 what the call needs has ended (a finished live run: 410)
    │   ├── MergeConflict         a merge left conflicts (`details["conflicts"]` lists them)
    │   └── TapeMiss              a replayed run asked what its tape does not hold (`details["missed"]`)
    ├── Unauthorized              no valid token (a server with tokens configured)
    ├── Forbidden                 the token lacks the scope this call needs
    ├── LimitExceeded             a tenant's limit (concurrent runs, timeout, output) refuses it
    │   └── TooLarge              a body, upload, archive or expansion over its size cap
    │       └── HeadersTooLarge   a request's headers over their size or count cap (431)
    ├── RegistryError             an OCI registry refused or could not be reached
    ├── DiskFull                  the store's disk has no room; nothing was committed
    ├── StoreUnavailable          the store's metadata database cannot be reached; nothing was written
    ├── BuildFailed               a build's step failed (`details`: step, line, text, exit_code, stderr tail)
    ├── RuntimeUnavailable        this host cannot run the requested isolation tier
    ├── SandboxError              the sandbox could not be set up (not the command's failure)
    ├── StoreCorrupt              fsck-level damage found while reading
    └── NodeLost                  a cluster node died (or became unreachable) during the call

Each class carries its HTTP status: the one error table (server, Contree router and remote client
all read `ERRORS` / `http_status`, so a new class needs no edit elsewhere).
"""

from __future__ import annotations


class SandtreeError(Exception):
    code = "error"
    http_status = 500

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict:
        return {"error": self.code, "message": self.message, **self.details}


class NotFound(SandtreeError):
    code = "not_found"
    http_status = 404


class ImageNotFound(NotFound):
    code = "image_not_found"


class PathNotFound(NotFound):
    code = "path_not_found"


class InvalidInput(SandtreeError):
    code = "invalid_input"
    http_status = 400


class PathEscape(InvalidInput):
    code = "path_escape"


class BadArchive(InvalidInput):
    code = "bad_archive"


class CommandNotFound(InvalidInput):
    code = "command_not_found"


class Conflict(SandtreeError):
    code = "conflict"
    http_status = 409


class NotReady(Conflict):
    """Asked too early: what the call needs is still starting (HTTP 425 Too Early, as Contree; retry)."""
    code = "not_ready"
    http_status = 425


class Ended(Conflict):
    """What the call needs has ended (a live run that finished: no live process to reach), HTTP 410."""
    code = "ended"
    http_status = 410


class Unauthorized(SandtreeError):
    code = "unauthorized"
    http_status = 401


class Forbidden(SandtreeError):
    code = "forbidden"
    http_status = 403


class LimitExceeded(SandtreeError):
    code = "limit_exceeded"
    http_status = 429


class RuntimeUnavailable(SandtreeError):
    code = "runtime_unavailable"
    http_status = 503


class SandboxError(SandtreeError):
    code = "sandbox_error"
    http_status = 500


class StoreCorrupt(SandtreeError):
    code = "store_corrupt"
    http_status = 500


class NotRegularFile(InvalidInput):
    code = "not_a_regular_file"


class MethodNotAllowed(InvalidInput):
    code = "method_not_allowed"
    http_status = 405


class RequestTimeout(InvalidInput):
    code = "request_timeout"
    http_status = 408


class MergeConflict(Conflict):
    code = "merge_conflict"


class TapeMiss(Conflict):
    """A run replayed from an egress tape (replay=) asked for something the tape does not hold: the
    message names each request (method and URL, a DNS question, a TCP connection; `details`: missed,
    tape, op); the sandbox got a 502 naming it, nothing went out. record=True with replay= sends such
    requests out and extends the tape instead."""
    code = "tape_miss"


class TooLarge(LimitExceeded):
    code = "too_large"
    http_status = 413


class HeadersTooLarge(TooLarge):
    code = "headers_too_large"
    http_status = 431


class RegistryError(SandtreeError):
    code = "registry_error"
    http_status = 502


class DiskFull(SandtreeError):
    code = "disk_full"
    http_status = 507


class StoreUnavailable(SandtreeError):
    """The store's metadata database (a PostgreSQL server) cannot be reached or refused us;
    nothing of the call was written."""
    code = "store_unavailable"
    http_status = 503


class BuildFailed(SandtreeError):
    """A RUN of a build exited non-zero (or was killed): nothing was tagged. The message names the
    step, its Dockerfile line and instruction, then the tails of the command's stdout and stderr (`details`:
    stdout, stderr), and a hint when a step with no network failed to reach one (`details`: hint)."""
    code = "build_failed"
    http_status = 422


class NodeLost(SandtreeError):
    """A cluster node (cluster/) died or became unreachable while it ran the call: the run's
    sandbox went with it and nothing of it was committed; `details`: node, operation, reason.
    Except a run that finished and committed on the node just before it went: its `details` also
    name the `image` it made (its row is done; it is not retried, even with retries=)."""
    code = "node_lost"
    http_status = 503


def _tree(cls) -> list:
    return [cls] + [d for c in cls.__subclasses__() for d in _tree(c)]


# the code of an answer to a bug (an exception that is no SandtreeError): HTTP 500, logged
INTERNAL = "internal"

# code -> class, for every class of the tree (the remote client rebuilds errors from it)
ERRORS = {cls.code: cls for cls in _tree(SandtreeError)}


def code_of_status(status: int) -> str:
    """The error code of an HTTP status the server's framework answers by itself (an unknown path
    404, a body it cannot parse 400): the most general class of the table with that status."""
    if status == 500:
        return INTERNAL
    for cls in _tree(SandtreeError)[1:]:
        if cls.http_status == status:
            return cls.code
    return INTERNAL if status >= 500 else InvalidInput.code


def http_status(code: str, default: int = 400) -> int:
    """The HTTP status of an error code (of any class in the tree)."""
    cls = ERRORS.get(code)
    return cls.http_status if cls is not None else default
