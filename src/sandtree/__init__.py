"""sandtree: a self-hosted sandbox for AI agents with git-like, content-addressed images.

    import sandtree
    st = sandtree.Sandtree()
    img = st.image("debian:bookworm")
    r = img.run("python3 -V")
"""

from .client.aio import AsyncBranch, AsyncImage, AsyncRunResult, AsyncSandbox, AsyncSandtree
from .client.sdk import Branch, Image, MergeResult, RunResult, Sandbox, Sandtree, best_of, connect
from .errors import (BadArchive, CommandNotFound, Conflict, DiskFull, Forbidden, ImageNotFound, InvalidInput,
                     LimitExceeded, MergeConflict, NotFound, NotRegularFile, PathEscape, PathNotFound,
                     RegistryError, RuntimeUnavailable, SandboxError, SandtreeError, StoreCorrupt, TooLarge,
                     Unauthorized)
from .runtime.base import Limits

__all__ = [
    "Sandtree", "Image", "RunResult", "Branch", "MergeResult", "Sandbox", "best_of", "connect",
    "AsyncSandtree", "AsyncImage", "AsyncRunResult", "AsyncBranch", "AsyncSandbox", "Limits",
    "SandtreeError", "NotFound", "ImageNotFound", "PathNotFound", "InvalidInput", "PathEscape",
    "BadArchive", "CommandNotFound", "Conflict", "RuntimeUnavailable", "SandboxError", "StoreCorrupt",
    "Unauthorized", "Forbidden", "LimitExceeded", "NotRegularFile", "MergeConflict", "TooLarge",
    "RegistryError", "DiskFull",
]
__version__ = "0.1.0"
