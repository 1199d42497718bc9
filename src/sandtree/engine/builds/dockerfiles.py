"""A Dockerfile on the host as a Recipe, for the surfaces that build from one (the CLI's `sandtree
build`; build_context: REST, the remote client, MCP): the file read with its size bounded, the build
context opened (recipe/context.py), and the parser (recipe/dockerfile.py) given this engine's view of a base image's
environment, so `ENV PATH=/opt/bin:$PATH` expands as Docker would. The build itself is Engine.build.
"""

from __future__ import annotations

import os

from ...errors import InvalidInput, NotFound
from ...recipe.context import BuildContext, read_text
from ...recipe.dockerfile import parse
from ...recipe.lexer import MAX_TEXT_BYTES
from ...recipe.steps import Recipe
from ...values import DEFAULT_ENV

__all__ = ["read_dockerfile", "dockerfile_recipe"]


def read_dockerfile(path: str) -> str:
    """The text of the Dockerfile at `path` (a regular file, at most MAX_TEXT_BYTES, UTF-8)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InvalidInput(f"no Dockerfile at {path!r} (give one with -f)", path=path) from None
    except OSError as e:
        raise InvalidInput(f"cannot read {path!r}: {e.strerror}", path=path) from None
    return read_text(fd, path, MAX_TEXT_BYTES)


def dockerfile_recipe(engine, context: str | None, *, dockerfile: str | None = None, text: str | None = None,
                      build_args: dict | None = None, target: str | None = None, network=None) -> Recipe:
    """The Recipe of a Dockerfile: `text`, or the file `dockerfile` (default CONTEXT/Dockerfile),
    with `context` the build context directory (None: no COPY from a context)."""
    if text is None:
        if dockerfile is None:
            if context is None:
                raise InvalidInput("give a Dockerfile or a build context")
            dockerfile = os.path.join(context, "Dockerfile")
        text = read_dockerfile(dockerfile)
    ctx = BuildContext(context) if context is not None else None

    def image_env(ref: str) -> dict:
        # A base image's env for expansion. A docker:// base not pulled yet is pulled now (the
        # build's FROM finds it then); BuildKit's default PATH when the image sets none.
        try:
            image = engine.resolve(ref)
        except (NotFound, InvalidInput):
            if not ref.startswith("docker://"):
                raise InvalidInput(f"FROM {ref}: no such image") from None
            image = engine.pull(ref)
        return {"PATH": DEFAULT_ENV["PATH"], **dict(engine.image_config(image).env)}

    return parse(text, context=ctx, build_args=build_args, target=target, network=network, image_env=image_env)
