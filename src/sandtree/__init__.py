"""sandtree: a self-hosted sandbox for AI agents with git-like, content-addressed images.

    import sandtree
    st = sandtree.Sandtree()
    img = st.image("debian:bookworm")
    r = img.run("python3 -V")
"""

import importlib

from .defaults import Limits
from .errors import (BadArchive, BuildFailed, CommandNotFound, Conflict, DiskFull, Forbidden, ImageNotFound, InvalidInput,
                     LimitExceeded, MergeConflict, TapeMiss, Ended, NotFound, NotReady, NotRegularFile, PathEscape, PathNotFound,
                     RegistryError, RuntimeUnavailable, SandboxError, SandtreeError, StoreCorrupt, TooLarge,
                     Unauthorized)

# The API's classes load on first use (PEP 562), so that a process using one part (the remote
# client, the CLI parsing its arguments) does not import the others.
_LAZY = {name: "client.sdk" for name in ("Sandtree", "connect")}
_LAZY.update({name: "client.objects" for name in ("Image", "RunResult", "Branch", "MergeResult", "Sandbox", "SandboxProcess",
                                                    "best_of")})
_LAZY.update({"ImageConfig": "store.imageconfig", "RecipeBuilder": "recipe.builder", "Recipe": "recipe.steps"})
_LAZY.update({name: "client.aio" for name in ("AsyncSandtree", "AsyncImage", "AsyncRunResult", "AsyncBranch",
                                              "AsyncSandbox")})

__all__ = [
    "Sandtree", "Image", "RunResult", "Branch", "MergeResult", "Sandbox", "SandboxProcess", "best_of", "connect",
    "AsyncSandtree", "AsyncImage", "AsyncRunResult", "AsyncBranch", "AsyncSandbox", "Limits",
    "SandtreeError", "NotFound", "ImageNotFound", "PathNotFound", "InvalidInput", "PathEscape",
    "BadArchive", "CommandNotFound", "Conflict", "RuntimeUnavailable", "SandboxError", "StoreCorrupt",
    "Unauthorized", "Forbidden", "LimitExceeded", "NotRegularFile", "MergeConflict", "TapeMiss", "TooLarge",
    "RegistryError", "DiskFull", "BuildFailed", "NotReady", "Ended", "ImageConfig", "RecipeBuilder", "Recipe",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'sandtree' has no attribute {name!r}")
    # a lazy export: `import sandtree` stays light; the engine loads when first named
    value = getattr(importlib.import_module(f".{where}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
