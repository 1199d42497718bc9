"""Builds of a Dockerfile with a build context that is a directory or a tar: the work of the engine's
ContextBuildOps (contexts.py), which loads this module on a build's first use (engine/parts.py).

A context tar is untrusted (a tenant sent it): it is unpacked by the store's import extractor
(store/importers.extract_tar: no absolute names, no `..`, nothing written through a symlink, no
hard link leaving the archive, names by the one name rule) under CONTEXT_LIMITS (members, bytes,
ratio to the tar, depth; device nodes and FIFOs refused) into a private staging dir of the store,
which goes when the build ends, whatever happens. Then it is an ordinary context directory
(recipe/context.py: symlinks in it are kept as symlinks and never followed, a COPY through or of
one that leaves the context is refused), parsed (engine/builds/dockerfiles.py) and built (builds.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import stat

from ...errors import BadArchive, InvalidInput, TooLarge
from ...recipe.context import MAX_BYTES, MAX_DEPTH, MAX_ENTRIES, BuildContext
from ...recipe.lexer import MAX_TEXT_BYTES
from ...store import importers
from ...store.layers import remove_tree
from .dockerfiles import dockerfile_recipe

__all__ = ["CONTEXT_LIMITS", "unpacked_context", "build_context_as"]

# What a context tar may expand to: as many entries and bytes as one COPY may select, as deep as
# a context may be walked, 100x its size past 256 MiB, and no device node or FIFO at all.
CONTEXT_LIMITS = importers.ImportLimits(max_bytes=MAX_BYTES, max_entries=MAX_ENTRIES, max_depth=MAX_DEPTH,
                                        special=False)


@contextlib.contextmanager
def unpacked_context(store, context: str | None, limits: importers.ImportLimits = CONTEXT_LIMITS):
    """The context directory: `context` itself when it is one (or None), else the tar at `context`
    unpacked into a private staging dir, removed at the end (never crossing a mount: remove_tree)."""
    if context is None:
        yield None
        return
    try:
        st = os.stat(context)
    except OSError as e:
        raise InvalidInput(f"build context {context!r}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        yield context
        return
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(f"build context {context!r} is neither a directory nor a tar file")
    stage = store.layers.stage("context")
    try:
        os.chmod(stage, 0o700)                     # private: only the engine reads what a tenant sent
        root = os.path.join(stage, "context")
        os.mkdir(root, 0o755)
        budget = importers.ImportBudget(limits)
        budget.source(st.st_size)
        with open(context, "rb") as raw, importers.open_tar_stream(io.BufferedReader(raw), budget) as t:
            try:
                importers.extract_tar(t, root, chown=False, budget=budget)
            except (BadArchive, InvalidInput, TooLarge) as exc:
                raise type(exc)(f"build context: {exc.message}", **exc.details) from None
        yield root
    finally:
        remove_tree(stage)


def build_context_as(engine, view, context: str | None, *, dockerfile: str = "Dockerfile",
                     text: str | None = None, tag: str | None = None, build_args: dict | None = None,
                     target: str | None = None, network=None, no_cache: bool = False, no_cache_filter=(),
                     progress=None):
    """The engine's build_context_as (contexts.py)."""
    if text is not None and (not isinstance(text, str) or len(text.encode()) > MAX_TEXT_BYTES):
        raise InvalidInput(f"the Dockerfile text must be a string of at most {MAX_TEXT_BYTES} bytes")
    with unpacked_context(engine.store, context) as root:
        if text is None:
            if root is None:
                raise InvalidInput("give a Dockerfile's text or a build context holding one")
            text = BuildContext(root).read_file(dockerfile or "Dockerfile", MAX_TEXT_BYTES)
        recipe = dockerfile_recipe(view if view is not None else engine, root, text=text, build_args=build_args,
                                   target=target, network=network)
        # (the parser put the build-wide network into each RUN without its own: not again here,
        # where it would turn on a `RUN --network=none`)
        return engine.build_as(recipe, view, tag=tag, no_cache=no_cache, no_cache_filter=no_cache_filter,
                               progress=progress)
