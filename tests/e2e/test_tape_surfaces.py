"""Egress tapes on the surfaces: the CLI (--record, `tape show`, --replay, a miss's exit and
message), the remote SDK and REST (record=, st.tape, GET /api/v1/tapes/{tape}, replay= in a run's
body) and MCP (run's record/replay, the tape_show tool), each against a real `sandtree` process
whose egress daemon's upstream is a netlab internet made here (tests/netlab.py); no packet
leaves namespaces made here. Daemons are stopped at teardown."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest

import sandtree
from netlab import NetLab
from sandtree.errors import TapeMiss
from sandtree.network.client import Egress
from test_network_surfaces import get, lab_env, server

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nft")

FETCH = get("allowed.test", "11.1.1.10")
MISS = "printf 'GET /elsewhere HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n' | nc -w 5 11.1.1.10 80"


@pytest.fixture(scope="module")
def lab():
    lab = NetLab()
    yield lab
    lab.close()


def test_cli_record_show_replay(tmp_path, lab, rootfs):
    home = str(tmp_path / "home")
    env = {**lab_env(lab), "SANDTREE_HOME": home}

    def cli(*args, check=True):
        p = subprocess.run([sys.executable, "-m", "sandtree", *args], env=env, capture_output=True, timeout=120)
        assert not check or p.returncode == 0, p.stderr.decode()
        return p
    try:
        img = json.loads(cli("image", "import", rootfs, "--json").stdout)["image"]
        p = cli("run", img, "--network", "allowed.test", "--record", "--", "sh", "-c", FETCH)
        tid = next(line.split()[1] for line in p.stderr.decode().splitlines() if line.startswith("tape: "))
        shown = json.loads(cli("tape", "show", tid, "--json").stdout)
        assert [(r["kind"], r["host"], r["path"], r["status"]) for r in shown["exchanges"] if r["kind"] == "http"] \
            == [("http", "allowed.test", "/hello", 200)]
        again = cli("run", img, "--network", "allowed.test", "--replay", tid, "--", "sh", "-c", FETCH)
        assert again.stdout.split(b"image: ")[0] == p.stdout.split(b"image: ")[0]
        miss = cli("run", img, "--network", "allowed.test", "--replay", tid, "--", "sh", "-c", MISS, check=False)
        assert miss.returncode != 0 and b"GET http://allowed.test/elsewhere" in miss.stderr, miss.stderr
    finally:
        Egress(home).stop_daemon()


def test_remote_sdk_and_rest(tmp_path, lab, rootfs):
    home = str(tmp_path / "home")
    with server(home, lab) as url:
        st = sandtree.connect(url)
        try:
            img = st.import_image(rootfs)
            r = img.run(FETCH, network="allowed.test", record=True)
            tid = r.usage["tape"]
            assert [x["path"] for x in st.tape(tid)["exchanges"] if x["kind"] == "http"] == ["/hello"]
            with pytest.raises(TapeMiss) as err:
                img.run(MISS, network="allowed.test", replay=tid)
            assert "GET http://allowed.test/elsewhere" in err.value.message
            with httpx.Client(base_url=url + "/api/v1", timeout=60) as h:
                got = h.get(f"/tapes/{tid}")
                assert got.status_code == 200 and got.json()["id"] == tid
                assert h.get("/tapes/" + "0" * 64).status_code == 404
                resp = h.post("/runs", json={"image": img.id, "command": FETCH, "network": ["allowed.test"],
                                             "replay": tid})
                assert resp.status_code == 201, resp.text
                assert resp.json()["spec"]["tape"] == tid
            again = img.run(FETCH, network="allowed.test", replay=tid)
            assert again.stdout == r.stdout
        finally:
            st.close()


def test_mcp_record_and_tape_show(tmp_path, lab, rootfs):
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters
    home = str(tmp_path / "home")
    params = StdioServerParameters(command=sys.executable, args=["-m", "sandtree", "--home", home, "mcp", "--tools", "all"],
                                   env=lab_env(lab))

    async def main():
        async with Client(params) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert {"record", "replay"} <= set(tools["run"].input_schema["properties"]) and "tape_show" in tools
            img = json.loads((await c.call_tool("import_image", {"source": rootfs})).content[0].text)["image"]
            r = json.loads((await c.call_tool("run", {"image": img, "command": FETCH, "network": ["allowed.test"],
                                                      "record": True})).content[0].text)
            tid = r["tape"]
            assert {"record", "replay"} <= set(tools["sandbox_start"].input_schema["properties"])
            shown = json.loads((await c.call_tool("tape_show", {"tape": tid})).content[0].text)
            assert any(x["path"] == "/hello" for x in shown["exchanges"])
    try:
        asyncio.run(main())
    finally:
        Egress(home).stop_daemon()
