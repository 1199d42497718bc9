"""A Recipe (the Python builder's) built by a server: what `st.build(recipe)` does through
`sandtree.connect`. Each step's text is its Dockerfile instruction (recipe/texts.py: the builder and the
parser give the same steps), so the recipe travels as the Dockerfile it is, with a tar of exactly the
context entries its COPY steps listed (modes and symlinks as listed, never followed); the server
parses that Dockerfile against that context and gets the same steps, keys and image IDs.

Reads only values of the recipe (no import of recipe/ or the engine: a connect()ed client loads none).
"""

from __future__ import annotations

import os
import tarfile
import tempfile

from ..errors import InvalidInput

__all__ = ["build_remote", "recipe_dockerfile"]


def build_remote(engine, recipe, *, tag=None, no_cache=False, no_cache_filter=(), network=None, progress=None):
    """engine: a RemoteEngine. The BuildResult the server sent."""
    text, files = recipe_dockerfile(recipe)
    with tempfile.TemporaryDirectory() as d:
        tar = os.path.join(d, "context.tar")
        with tarfile.open(tar, mode="w", format=tarfile.PAX_FORMAT) as t:
            for f in files:
                _add_listed(t, recipe.context, f)
        return engine.build_context(tar, text=text, tag=tag, network=network, no_cache=no_cache,
                                    no_cache_filter=no_cache_filter, progress=progress)


def _add_listed(t: tarfile.TarFile, context: str, f) -> None:
    """One listed context entry (recipe.steps.ContextFile) into the tar, as listed."""
    info = tarfile.TarInfo(f.path)
    info.mode = f.mode
    if f.kind == "dir":
        info.type = tarfile.DIRTYPE
        t.addfile(info)
    elif f.kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, f.target
        t.addfile(info)
    else:
        fd = os.open(os.path.join(context, f.path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as src:
            info.size = os.fstat(fd).st_size
            t.addfile(info, src)


def _network_flag(value) -> str:
    """A RUN step's policy as its --network flag (a Dockerfile has no deny-list form)."""
    value = value.to_json() if hasattr(value, "to_json") else value
    if isinstance(value, dict):
        if value.get("deny_out"):
            raise InvalidInput("a recipe step with a deny-list network cannot be built over HTTP")
        value = value.get("allow_out") or []
    if value is True:
        return "all"
    if value is False:
        return "none"
    return ",".join(value) if isinstance(value, (list, tuple)) else str(value)


def recipe_dockerfile(recipe) -> tuple[str, list]:
    """(the Dockerfile a Recipe's steps are, the context entries its COPY steps list, once each)."""
    lines, files, seen = [], [], set()
    for stage in recipe.stages:
        for step in stage.steps:
            kind, text = type(step).__name__, step.text
            if "\n" in text:
                raise InvalidInput(f"step {text[:40]!r}... holds a newline: over HTTP a recipe travels as a "
                                   "Dockerfile, one line a step")
            if kind == "Run" and step.network is not None:
                text = f"RUN --network={_network_flag(step.network)} {text[4:]}"
            if kind == "Copy" and step.from_stage is None:
                for f in step.sources:
                    if f.path != "." and f.path not in seen:
                        seen.add(f.path)
                        files.append(f)
            lines.append(text)
    return "\n".join(lines) + "\n", files
