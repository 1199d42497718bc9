"""Annotations and trace export through the other surfaces: MCP (a real `sandtree mcp` over stdio), REST and
the remote SDK (a real `sandtree serve` on loopback): valid calls answer as in process, bad input is a typed
error that changes nothing."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from mcp.client.client import Client

import sandtree
from sandtree.errors import InvalidInput

from conftest import serve_process
from test_mcp import data, stdio


def test_mcp_annotate(tmp_path):
    d = tmp_path / "tree"
    d.mkdir()
    (d / "f").write_text("f")

    async def main():
        async with Client(stdio(str(tmp_path / "home"))) as c:
            img = data(await c.call_tool("import_image", {"source": str(d), "tag": "t"}))["image"]
            got = data(await c.call_tool("annotate", {"image": "t", "score": 0.25, "meta": {"k": "v", "n": 2}}))
            assert got == {"image": img, "score": 0.25, "meta": {"k": "v", "n": 2}}
            for bad in ({"image": "t", "meta": {"bad key": 1}}, {"image": "t", "meta": {"k": [1]}},
                        {"image": "nope", "score": 1}):
                r = await c.call_tool("annotate", bad)
                assert r.is_error
            return img, data(await c.call_tool("annotate", {"image": img}))    # unchanged by the refused calls
    img, after = asyncio.run(main())
    assert after == {"image": img, "score": 0.25, "meta": {"k": "v", "n": 2}}


def test_rest_and_remote_sdk(tmp_path, rootfs):
    home = tmp_path / "home"
    with serve_process(home) as url:
        st = sandtree.connect(url)
        try:
            root = st.import_image(rootfs).run("echo r > /r").image
            a, b = root.fork(["echo a > /a; echo out-a", "echo b > /b; exit 2"])
            assert a.image.annotate(score=0.5, note="x") == {"score": 0.5, "meta": {"note": "x"}}
            r = httpx.post(f"{url}/api/v1/images/{b.image.id}/annotations", json={"score": 0.1, "meta": {"ok": False}})
            assert r.status_code == 200 and r.json() == {"score": 0.1, "meta": {"ok": False}}
            for body in ({"meta": {"../k": 1}}, {"meta": {"k": {"x": 1}}}, {"score": "high"}, {"extra": 1}):
                r = httpx.post(f"{url}/api/v1/images/{b.image.id}/annotations", json=body)
                assert r.status_code in (400, 422), (body, r.status_code)
            with pytest.raises(InvalidInput):
                st.annotate(b.image, None, **{"k": "x" * 5000})
            assert st.annotations(b.image) == {"score": 0.1, "meta": {"ok": False}}
            out = tmp_path / "remote.jsonl"
            assert st.trace_export(root, "jsonl", str(out))["rows"] == 3
            rows = {r["image"]: r for r in map(json.loads, out.read_text().splitlines())}
            assert rows[a.image.id]["stdout"] == "out-a\n" and rows[a.image.id]["score"] == 0.5
            assert rows[b.image.id]["exit_code"] == 2 and json.loads(rows[b.image.id]["meta"]) == {"ok": False}
            assert rows[b.image.id]["parent"] == root.id
        finally:
            st.close()
