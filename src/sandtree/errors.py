"""The one exception tree of sandtree. Every adapter (CLI, SDK, server) maps these, and only these.

    SandtreeError                 base; `code` is a stable machine-readable name
    ├── NotFound                  unknown image, tag, path or operation
    │   ├── ImageNotFound
    │   └── PathNotFound
    ├── InvalidInput              the request itself is wrong; nothing was changed
    │   ├── PathEscape            a path that leaves the image (`..`, symlinks, absolute tar members)
    │   ├── BadArchive            an import source that cannot be read safely
    │   └── CommandNotFound       the command to run does not exist in the image
    ├── Conflict                  a ref moved under us (compare-and-swap lost)
    ├── Unauthorized              no valid token (a server with tokens configured)
    ├── Forbidden                 the token lacks the scope this call needs
    ├── LimitExceeded             a tenant's limit (concurrent runs, timeout, output) refuses it
    ├── RuntimeUnavailable        this host cannot run the requested isolation tier
    ├── SandboxError              the sandbox could not be set up (not the command's failure)
    └── StoreCorrupt              fsck-level damage found while reading
"""

from __future__ import annotations


class SandtreeError(Exception):
    code = "error"

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict:
        return {"error": self.code, "message": self.message, **self.details}


class NotFound(SandtreeError):
    code = "not_found"


class ImageNotFound(NotFound):
    code = "image_not_found"


class PathNotFound(NotFound):
    code = "path_not_found"


class InvalidInput(SandtreeError):
    code = "invalid_input"


class PathEscape(InvalidInput):
    code = "path_escape"


class BadArchive(InvalidInput):
    code = "bad_archive"


class CommandNotFound(InvalidInput):
    code = "command_not_found"


class Conflict(SandtreeError):
    code = "conflict"


class Unauthorized(SandtreeError):
    code = "unauthorized"


class Forbidden(SandtreeError):
    code = "forbidden"


class LimitExceeded(SandtreeError):
    code = "limit_exceeded"


class RuntimeUnavailable(SandtreeError):
    code = "runtime_unavailable"


class SandboxError(SandtreeError):
    code = "sandbox_error"


class StoreCorrupt(SandtreeError):
    code = "store_corrupt"
