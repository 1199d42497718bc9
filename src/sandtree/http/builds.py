"""/api/v1 builds and image configs, the rows' hand-written routes (http/derived.py registers them by name): POST
/builds with a build context tar as the body, streaming the build's progress as Server-Sent Events and ending
with its result; an image's config (GET .../config) and a new image with another config (POST .../configure).

The context tar is spooled to the store's disk under the caller's upload cap (bodylimit.py, as an
image tar is), handed to the engine's build_context (which unpacks it safely into a private staging
dir and removes it), and removed here after. Everything decided before the first step (the tar,
the Dockerfile, the tenant's scope, limits and network grant) answers with its own status (400,
403, 413, ...); once a step has started, the answer is a 200 event stream: `progress` events (the
engine's progress dicts; a step's output as `output_base64`), then `result` (the BuildResult) or
`error` (the error object, as a status answer would hold it).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json

from fastapi import Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict

from ..engine import ImageConfig
from ..errors import InvalidInput, SandtreeError
from ..values import name_values
from .bodylimit import spool, unstage
from .derived import handler, resolved
from .plumbing import Plumbing


class ConfigureIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: dict                       # the OCI config object (Env, WorkingDir, User, Cmd, ...)
    tag: str | None = None


def _event(ev: dict) -> dict:
    out = dict(ev)
    if isinstance(out.get("output"), (bytes, bytearray)):
        out["output_base64"] = base64.b64encode(out.pop("output")).decode()
    return out


def _sse(kind: str, data) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, default=str)}\n\n"



def _network(value: str | None):
    """`network` as sent: JSON (a list or an object) or the CLI's words (off, all, a,b rules)."""
    if value is None or value[:1] not in ("[", "{"):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise InvalidInput("network is not valid JSON") from None


@handler("image_config")
def image_config(p: Plumbing):
    engine, call = p.engine, p.call

    async def image_config(ref: str) -> dict:
        i = await resolved(p, ref)
        return {"image": i, "config": (await call(engine.image_config, i)).to_oci()}
    return image_config


@handler("configure")
def configure(p: Plumbing):
    engine, call = p.engine, p.call

    async def configure(ref: str, body: ConfigureIn) -> dict:
        i = await resolved(p, ref)
        config = ImageConfig.from_oci(body.config)
        return {"image": await call(functools.partial(engine.configure, i, config, tag=body.tag)), "tag": body.tag}
    return configure


@handler("build")
def build(p: Plumbing):
    engine, call = p.engine, p.call

    async def build(request: Request, dockerfile: str = "Dockerfile", text: str | None = None,
                    tag: str | None = None, build_arg: list[str] = Query([], description="NAME=VALUE (repeatable)"),
                    target: str | None = None, network: str | None = None, no_cache: bool = False,
                    no_cache_filter: list[str] = Query([], description="a stage name or step number (repeatable)")):
        """The body is the build context as a tar (plain, gzip, xz, bzip2 or zstd); the Dockerfile
        is `text`, or the file `dockerfile` inside the context. Answers Server-Sent Events."""
        args = name_values(build_arg, "build_arg")
        net = _network(network)
        filters = tuple(int(f) if f.isdigit() else f for f in no_cache_filter)
        path, _, size = await spool(request, p.stage)
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        started = asyncio.Event()

        def progress(ev: dict) -> None:
            loop.call_soon_threadsafe(lambda: (queue.put_nowait(_event(ev)), started.set()))

        task = asyncio.ensure_future(call(functools.partial(
            engine.build_context, path if size else None, dockerfile=dockerfile, text=text, tag=tag,
            build_args=args, target=target, network=net, no_cache=no_cache, no_cache_filter=filters,
            progress=progress)))
        task.add_done_callback(lambda _: (unstage(path), queue.put_nowait(None), started.set()))
        await started.wait()
        if task.done() and queue.qsize() <= 1 and task.exception() is not None:
            raise task.exception()            # refused before any step: its own status

        async def events():
            while (item := await queue.get()) is not None:
                yield _sse("progress", item)
            exc = task.exception()
            if exc is None:
                yield _sse("result", task.result().to_dict())
            else:
                err = exc.to_dict() if isinstance(exc, SandtreeError) else {"error": "internal", "message": str(exc)}
                yield _sse("error", err)
        return StreamingResponse(events(), media_type="text/event-stream")
    return build
