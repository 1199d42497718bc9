"""contree-mcp 0.5.0, its own MCP server process (a stdio subprocess from the pinned venv) pointed at
a real `sandtree serve` on loopback by its documented CONTREE_URL/CONTREE_TOKEN, driven by the
official MCP client: every one of its tools. The tools that never reach Contree's API (get_guide,
registry_token_obtain, registry_auth: the MCP server's own host) are called too, and checked for
not reaching it; no request leaves loopback.
"""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest
from conftest import serve_process

import sandtree
from test_contree import contree_mcp  # noqa: F401 - the venv fixture

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root")

TOOLS = {"list_images", "registry_token_obtain", "registry_auth", "import_image", "get_image", "set_tag", "run",
         "rsync", "upload", "download", "get_operation", "list_operations", "wait_operations", "cancel_operation",
         "whoami", "list_files", "read_file", "grep", "get_guide"}


@pytest.fixture
def server(tmp_path, rootfs):
    home = str(tmp_path / "home")
    st = sandtree.Sandtree(home)
    st.import_image(rootfs, tag="busybox")
    st.close()
    with serve_process(home) as url:
        yield url


def test_every_contree_mcp_tool(server, contree_mcp, tmp_path):  # noqa: F811 - the fixture
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTREE_", "NEBIUS_"))}
    env.update(CONTREE_HOME=str(tmp_path / "contree"), CONTREE_NO_UPDATE_CHECK="1", HOME=str(tmp_path),
               CONTREE_URL=server, CONTREE_TOKEN="fake-token", BROWSER="/bin/false")
    params = StdioServerParameters(command=contree_mcp, args=["--auth-type", "jwt"], env=env)
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "main.py").write_text("print('synced')\n")
    (project / "skip.pyc").write_bytes(b"\0")
    called: set[str] = set()

    async def tool(c, name: str, args: dict, ok: bool = True):
        called.add(name)
        r = await c.call_tool(name, args)
        assert r.is_error != ok, (name, r.content)
        text = r.content[0].text if r.content else ""
        try:
            return json.loads(text)
        except ValueError:
            return text

    async def main():
        async with Client(params) as c:
            assert {t.name for t in (await c.list_tools()).tools} == TOOLS
            assert "contree" in json.dumps(await tool(c, "get_guide", {"section": "workflow"})).lower()
            images = await tool(c, "list_images", {"tagged": True})
            assert "busybox" in json.dumps(images)
            img = await tool(c, "get_image", {"image": "tag:busybox"})
            # files: rsync a local directory, then a run sees it where it was put
            state = await tool(c, "rsync", {"source": str(project), "destination": "/app", "exclude": ["*.pyc"]})
            sid = state if isinstance(state, int) else int(json.loads(json.dumps(state)))
            ran = await tool(c, "run", {"command": "cat /app/pkg/main.py; ls /app; echo made > /made",
                                        "image": img["uuid"], "directory_state_id": sid, "disposable": False})
            assert ran["exit_code"] == 0 and ran["stdout"] == "print('synced')\npkg\n", ran
            made = ran["result"]["image"]
            up = await tool(c, "upload", {"content": "payload\n"})
            queued = await tool(c, "run", {"command": "cat /in", "image": made, "wait": False,
                                           "files": {"/in": up["uuid"]}})
            waited = await tool(c, "wait_operations", {"operation_ids": [queued["operation_id"]]})
            assert "payload" in json.dumps(waited)
            got = await tool(c, "get_operation", {"operation_id": queued["operation_id"]})
            assert got["status"] == "SUCCESS" and got["stdout"] == "payload\n"
            assert queued["operation_id"] in json.dumps(await tool(c, "list_operations", {}))
            slow = await tool(c, "run", {"command": "sleep 60", "image": made, "wait": False})
            await tool(c, "cancel_operation", {"operation_id": slow["operation_id"]})
            done = await tool(c, "wait_operations", {"operation_ids": [slow["operation_id"]]})
            assert "CANCELLED" in json.dumps(done), done
            # the image: its files, a download to this host, grep, a tag
            ls = await tool(c, "list_files", {"image": made, "path": "/"})
            assert "made" in {f["name"] for f in ls["files"]}
            assert (await tool(c, "read_file", {"image": made, "path": "/made"}))["content"] == "made\n"
            dest = tmp_path / "out" / "made.txt"
            await tool(c, "download", {"image": made, "path": "/made", "destination": str(dest)})
            assert dest.read_bytes() == b"made\n"
            assert "/made" in json.dumps(await tool(c, "grep", {"image": made, "pattern": "ma.e", "path": "/made"}))
            assert (await tool(c, "set_tag", {"image_uuid": made, "tag": "mcp/made"}))["tag"] == "mcp/made"
            assert await tool(c, "whoami", {})
            # a registry import the server cannot reach fails as an operation, saying so
            imp = await tool(c, "import_image", {"registry_url": "docker://127.0.0.1:9/none/such:1", "tag": "x/y",
                                                 "i_accept_that_anonymous_access_might_be_rate_limited": True})
            assert imp["status"] == "FAILED" and imp["error"], imp
            # tools of the MCP server's own host: registries' pages and credentials (not our API)
            tok = await tool(c, "registry_token_obtain", {"registry_url": "127.0.0.1:9"})
            assert tok["status"] in ("success", "error") and tok.get("message"), tok    # (BROWSER: /bin/false)
            await tool(c, "registry_auth", {"registry_url": "127.0.0.1:9", "username": "u", "token": "t"}, ok=False)
            return made

    before = httpx.get(f"{server}/v1/operations", params={"limit": 1000}).json()
    made = asyncio.run(main())
    assert called == TOOLS
    assert httpx.get(f"{server}/v1/inspect/{made}/").json()["tag"] == "mcp/made"
    after = httpx.get(f"{server}/v1/operations", params={"limit": 1000}).json()
    kinds = [o["kind"] for o in after[:len(after) - len(before)]]
    assert sorted(kinds) == ["image_import"] + ["instance"] * 3, kinds    # the runs and the import
