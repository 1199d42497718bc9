"""Builds of a Dockerfile with a build context that is a directory or a tar (a mixin of
engine.Engine): what `POST /api/v1/builds`, the remote client, the CLI against a server and the MCP
`build` tool reach. The work (unpacking an untrusted context tar, parsing its Dockerfile) is
contexttar.py, loaded on a build's first use (engine/parts.py)."""

from __future__ import annotations

from .. import parts             # contexttar: loaded on a build's first use (start-up time: parts.py)

__all__ = ["ContextBuildOps"]


class ContextBuildOps:
    """Mixed into engine.Engine (store, build_as)."""

    def build_context(self, context: str | None, *, dockerfile: str = "Dockerfile", text: str | None = None,
                      tag: str | None = None, build_args: dict | None = None, target: str | None = None,
                      network=None, no_cache: bool = False, no_cache_filter=(), progress=None):
        return self.build_context_as(None, context, dockerfile=dockerfile, text=text, tag=tag,
                                     build_args=build_args, target=target, network=network, no_cache=no_cache,
                                     no_cache_filter=no_cache_filter, progress=progress)

    def build_context_as(self, view, context: str | None, *, dockerfile: str = "Dockerfile",
                         text: str | None = None, tag: str | None = None, build_args: dict | None = None,
                         target: str | None = None, network=None, no_cache: bool = False, no_cache_filter=(),
                         progress=None):
        """build_context as `view` (a tenant's view: it resolves, pulls and guards the build; None:
        the operator). Not an operation of the table: the tenant view's way in."""
        return parts.contexttar.build_context_as(self, view, context, dockerfile=dockerfile, text=text, tag=tag,
                                                 build_args=build_args, target=target, network=network,
                                                 no_cache=no_cache, no_cache_filter=no_cache_filter,
                                                 progress=progress)
