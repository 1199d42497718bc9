"""Async twins of the public API, generated from the sync classes (one implementation).

Every public method of Sandtree and Image becomes a coroutine of the same name that runs the sync
method in a worker thread (sandboxes are processes; the engine's waits are blocking syscalls) and
wraps what comes back into the async twin types.

    async with AsyncSandtree() as st:
        img = await st.image("debian:bookworm")
        r = await img.run("python3 -V")
        await r.image.ls("/")
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect

from . import objects
from . import sdk as api


def _wrap(value):
    if isinstance(value, objects.Image):
        return AsyncImage(value)
    if isinstance(value, objects.RunResult):
        return AsyncRunResult(**{**{f.name: getattr(value, f.name) for f in dataclasses.fields(value)},
                                 "image": _wrap(value.image), "source": _wrap(value.source)})
    if isinstance(value, objects.MergeResult):
        return objects.MergeResult(_wrap(value.image), _wrap(value.base), value.conflicts, value.ignored)
    if isinstance(value, objects.Branch):
        return AsyncBranch(value)
    if isinstance(value, objects.Sandbox):
        return AsyncSandbox(value)
    if isinstance(value, objects.SandboxProcess):
        return AsyncSandboxProcess(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    if isinstance(value, dict) and any(isinstance(v, objects.Branch) for v in value.values()):
        return {k: _wrap(v) for k, v in value.items()}
    return value


def _unwrap(value):
    return value._sync if isinstance(value, (AsyncImage, AsyncSandtree, AsyncBranch, AsyncSandbox)) else value


def _twin(sync_cls):
    """Class decorator: add an async method for each public sync method of sync_cls."""
    def decorate(cls):
        for name, fn in inspect.getmembers(sync_cls, inspect.isfunction):
            if name.startswith("_") or name in cls.__dict__:
                continue

            def make(name=name, fn=fn):
                @functools.wraps(fn)
                async def method(self, *args, **kwargs):
                    args = [_unwrap(a) for a in args]
                    kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
                    bound = getattr(self._sync, name)
                    return _wrap(await asyncio.to_thread(bound, *args, **kwargs))
                return method
            setattr(cls, name, make())
        for name, _prop in inspect.getmembers(sync_cls, lambda m: isinstance(m, property)):
            if name not in cls.__dict__:
                setattr(cls, name, property(lambda self, name=name: _wrap(getattr(self._sync, name))))
        return cls
    return decorate


@_twin(api.Sandtree)
class AsyncSandtree:
    def __init__(self, home: str | None = None, **kwargs):
        self._sync = api.Sandtree(home, **kwargs)

    @classmethod
    def connect(cls, url: str, *, token: str | None = None) -> "AsyncSandtree":
        """The async API over a `sandtree serve` at `url`. Connecting does no I/O, so the result
        is used at once or awaited: `AsyncSandtree.connect(url)` and `await AsyncSandtree.connect(url)`
        are the same (what a user of an async API expects to write either way)."""
        self = cls.__new__(cls)
        self._sync = api.connect(url, token=token)
        return self

    def __await__(self):
        """`await AsyncSandtree.connect(...)`: the connected object itself."""
        if False:                                        # a generator that returns at once
            yield
        return self

    async def __aenter__(self) -> "AsyncSandtree":
        return self

    async def __aexit__(self, *exc):
        self._sync.close()

    async def recipe(self, base="scratch", context: str | None = "."):
        """Sandtree.recipe, whose `.build(...)` is a coroutine too (the build runs in a worker
        thread): `r = await st.recipe(img); image = await r.run("make").build()`."""
        async def abuild(recipe, **kw):
            res = await asyncio.to_thread(self._sync.build, recipe, **kw)
            return _wrap(objects.Image(self._sync, res.image))
        return self._sync.recipe(_unwrap(base), context).bound(abuild)


@_twin(objects.Image)
class AsyncImage:
    def __init__(self, sync: objects.Image):
        self._sync = sync
        self.id = sync.id

    def __repr__(self) -> str:
        return f"<AsyncImage {self.id[:12]}>"

    def __eq__(self, other) -> bool:
        return isinstance(other, AsyncImage) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


@_twin(objects.Branch)
class AsyncBranch:
    def __init__(self, sync: objects.Branch):
        self._sync = sync
        self.name = sync.name

    def __repr__(self) -> str:
        return f"<AsyncBranch {self.name}>"


@_twin(objects.Sandbox)
class AsyncSandbox:
    def __init__(self, sync: objects.Sandbox):
        self._sync = sync
        self.id = sync.id

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id[:12]}>"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc):
        await asyncio.to_thread(self._sync.stop)


@dataclasses.dataclass
class AsyncRunResult(objects.RunResult):
    image: "AsyncImage | None" = None
    source: "AsyncImage | None" = None


@_twin(objects.SandboxProcess)
class AsyncSandboxProcess:
    def __init__(self, sync: objects.SandboxProcess):
        self._sync = sync
        self.sandbox_id, self.pid = sync.sandbox_id, sync.pid

    def __repr__(self) -> str:
        return f"<AsyncSandboxProcess {self.pid} of {self.sandbox_id[:12]}>"
