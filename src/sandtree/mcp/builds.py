"""MCP tools for builds: `build` (a Dockerfile's text with a context of uploaded files or
a file set), `image_config` (what an image's runs default to).

The context is made here as a tar of the files the tool is given (uploads, read back by digest, as
the caller's own), and goes to the engine's build_context like any other context tar: the engine
unpacks it under the same limits and rules, embedded or through `sandtree mcp --url`.
"""

from __future__ import annotations

import io
import tarfile
import tempfile

from ..errors import InvalidInput
from .toolkit import Toolkit

MAX_CONTEXT_FILES = 10_000        # files one build tool call may name


def register(t: Toolkit) -> None:
    engine = t.engine

    def context_tar(out, files: dict[str, str] | None, directory_state_id: str | None) -> int:
        entries = [{"path": p, "sha256": h} for p, h in (files or {}).items()]
        if directory_state_id is not None:       # a file set's paths, relative to the context root
            entries += [dict(f) for f in engine.file_set(directory_state_id)]
        if len(entries) > MAX_CONTEXT_FILES:
            raise InvalidInput(f"a build context of more than {MAX_CONTEXT_FILES} files")
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for e in entries:
                data = engine.download(e["sha256"])
                info = tarfile.TarInfo(str(e["path"]).lstrip("/"))   # (the engine checks every name)
                info.size, info.mode = len(data), int(e.get("mode") or 0o644)
                tar.addfile(info, io.BytesIO(data))
        return len(entries)

    @t.handler
    def build(dockerfile: str, files: dict[str, str] | None = None, directory_state_id: str | None = None,
              tag: str | None = None, build_args: dict[str, str] | None = None, target: str | None = None,
              network: bool | str | list[str] | dict | None = None, no_cache: bool = False) -> dict:
        """Build an image from a Dockerfile, each step cached on the image DAG (an unchanged step is
        a lookup, not a run). Returns the image and each step: its instruction, cached or not, its
        image and seconds. FROM takes an image of this server (ID, tag), docker://REF or scratch.
        dockerfile: the Dockerfile's text
        files: the build context: {"path/in/context": "<sha256 from upload>"}
        directory_state_id: a file set (from rsync) whose files are the build context (paths relative to its root)
        build_args: values for the Dockerfile's ARGs
        target: the stage to build (default: the last)
        network: network of RUN steps without their own --network (default: none)
        no_cache: run every step again"""
        with tempfile.TemporaryFile() as f:
            n = context_tar(f, files, directory_state_id)
            f.flush()
            context = f"/proc/self/fd/{f.fileno()}" if n else None
            res = engine.build_context(context, text=dockerfile, tag=tag, build_args=build_args, target=target,
                                       network=network, no_cache=no_cache)
        d = res.to_dict()
        return {"image": d["image"], "tag": tag,
                "steps": [{k: s.get(k) for k in ("index", "stage", "text", "line", "cached", "image", "seconds")}
                          for s in d["steps"]]}

    @t.handler
    def image_config(image: str) -> dict:
        """An image's config as OCI writes it (Env, WorkingDir, User, Entrypoint, Cmd, ExposedPorts,
        Labels): the defaults of its runs. Empty for an image without one."""
        cfg = engine.image_config(image)
        return {"image": image, "config": cfg.to_oci() if hasattr(cfg, "to_oci") else dict(cfg)}
