"""The async twin: same names and results as the sync API, from the same implementation."""

from __future__ import annotations

import asyncio
import inspect

import sandtree
from sandtree import AsyncImage, AsyncSandtree, Image, Sandtree


def test_async_api_mirrors_sync():
    for sync_cls, async_cls in ((Sandtree, AsyncSandtree), (Image, AsyncImage)):
        public = {n for n, f in inspect.getmembers(sync_cls, inspect.isfunction) if not n.startswith("_")}
        for name in public:
            assert inspect.iscoroutinefunction(getattr(async_cls, name)), name


def test_async_runs_concurrently(tmp_path, rootfs):
    async def main():
        async with AsyncSandtree(str(tmp_path / "home")) as st:
            img = await st.import_image(rootfs, tag="bb")
            assert isinstance(img, AsyncImage) and img.id == (await st.image("bb")).id
            results = await asyncio.gather(*(img.run(f"echo {i} > /n; cat /n") for i in range(4)))
            assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(4)]
            child = results[0].image
            assert isinstance(child, AsyncImage)
            assert await child.read("/n") == b"0\n"
            assert [p.id for p in await child.parents()] == [img.id]
            with_error = None
            try:
                await st.image("missing")
            except sandtree.ImageNotFound as exc:
                with_error = exc
            assert with_error is not None
    asyncio.run(main())


def test_public_names():
    assert set(sandtree.__all__) >= {"Sandtree", "Image", "RunResult", "AsyncSandtree", "SandtreeError"}
