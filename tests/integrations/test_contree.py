"""The Contree-compatible /v1 against Nebius Contree's own published clients, unmodified, and a
real `sandtree serve` on loopback: contree-sdk's README quick start (sync and async, the README's
own code), contree-mcp as a real stdio subprocess driven by the official `mcp` client, and the
wire itself (shapes, statuses, the event stream, errors).

The clients are pointed at the server through their documented configuration only
($CONTREE_HOME/auth.ini for the SDK, CONTREE_URL/CONTREE_TOKEN for contree-mcp), so no request
can reach the Contree cloud; each test also checks that the server saw its work.
"""

from __future__ import annotations

import asyncio
import fcntl
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from conftest import serve_process

import sandtree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MCP_VENV = os.path.join(ROOT, ".venv", "contree-mcp")
MCP_REQUIREMENTS = os.path.join(ROOT, "tests", "contree-mcp-requirements.txt")


@pytest.fixture
def home(tmp_path, rootfs) -> str:
    """A store holding the busybox image tagged the way the README's quick start names it."""
    h = str(tmp_path / "home")
    st = sandtree.Sandtree(h)
    st.import_image(rootfs, tag="ubuntu:latest")
    st.close()
    return h


@pytest.fixture
def server(home):
    with serve_process(home) as url:
        yield url


@pytest.fixture
def sdk_env(tmp_path, server, monkeypatch):
    """contree-sdk's own configuration: a profile in $CONTREE_HOME/auth.ini naming our server."""
    cfg = tmp_path / "contree"
    cfg.mkdir()
    (cfg / "auth.ini").write_text(f"[profile:default]\nurl = {server}\n")
    monkeypatch.setenv("CONTREE_HOME", str(cfg))
    for var in ("CONTREE_PROFILE", "CONTREE_BASE_URL", "CONTREE_TOKEN", "NEBIUS_API_KEY", "NEBIUS_PROJECT_ID"):
        monkeypatch.delenv(var, raising=False)
    return server


def readme_example(name: str) -> str:
    """A code block of contree-sdk's README (its PyPI description), verbatim."""
    readme = importlib.metadata.metadata("contree-sdk").get_payload()
    m = re.search(r"```python[^\n]*fixture:name:" + re.escape(name) + r"\n(.*?)```", readme, re.DOTALL)
    assert m, f"no {name} example in contree-sdk's README"
    return m.group(1)


def operations(url: str) -> list[dict]:
    return httpx.get(f"{url}/v1/operations").json()


@pytest.mark.parametrize("example", ["test_quick_start_async_simple", "test_quick_start_sync_simple"])
def test_readme_quick_start(sdk_env, example):
    code = readme_example(example)
    assert 'Contree' in code and 'token="fake-token"' in code and "ubuntu:latest" in code
    before = len(operations(sdk_env))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ}, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "Hello from Contree!\n\n"
    ops = operations(sdk_env)
    assert len(ops) == before + 1 and ops[0]["status"] == "SUCCESS" and ops[0]["kind"] == "instance"
    # the SDK runs disposable by default: the state it ended in (here unchanged: the image itself)
    assert ops[0]["result_image_uuid"] == ops[0]["image_uuid"]


def test_sdk_images_files_tags_and_stable_uuids(sdk_env, home):
    from contree_sdk import Contree, ContreeSync
    from contree_sdk.sdk.exceptions import NotFoundError

    async def main():
        c = Contree(token="fake-token")
        base = await c.images.use("ubuntu:latest", strict=True)
        assert base.tag == "ubuntu:latest" and base.uuid is not None
        child = await base.run(shell="mkdir -p /work && echo built > /work/out && cat /data/in.txt",
                               files={"/data/in.txt": b"uploaded bytes\n"}, disposable=False)
        assert child.stdout == "uploaded bytes\n" and child.exit_code == 0
        assert child.uuid is not None and child.uuid != base.uuid
        names = {f.name for f in await child.ls("/work")}
        assert names == {"out"}
        assert await child.read("/work/out") == b"built\n"
        tagged = await child.tag_as("built:v1")
        assert (await c.images.use("built:v1", strict=True)).uuid == child.uuid
        await tagged.untag()
        with pytest.raises(NotFoundError):
            await c.images.use("built:v1", strict=True)
        failing = await base.run(shell="echo oops >&2; exit 3")
        assert failing.exit_code == 3 and failing.stderr == "oops\n"
        with pytest.raises(NotFoundError):
            await c.images.use(str(uuid.UUID(int=1)), strict=True)
        listed = {str(i.uuid) for i in await c.images()}
        assert {str(base.uuid), str(child.uuid)} <= listed
        return base.uuid, child.uuid

    base_uuid, child_uuid = asyncio.run(main())
    # the UUID is the image ID's first 128 bits: the same image has the same UUID everywhere
    st = sandtree.Sandtree(home)
    try:
        image_id = st._engine.resolve("ubuntu:latest")
    finally:
        st.close()
    assert base_uuid.hex == image_id[:32]
    sync = ContreeSync(token="fake-token")
    assert sync.images.use("ubuntu:latest", strict=True).uuid == base_uuid
    assert sync.images.use(str(child_uuid), strict=True).uuid == child_uuid


def test_uuids_survive_a_restart(home, tmp_path):
    with serve_process(home) as url:
        first = httpx.get(f"{url}/v1/inspect/", params={"tag": "ubuntu:latest"}, follow_redirects=True).json()
        op = httpx.post(f"{url}/v1/instances", json={"command": "echo x > /f", "shell": True,
                                                     "image": "tag:ubuntu:latest"}).json()["uuid"]
        done = wait_op(url, op)
        made = done["result"]["image"]
    with serve_process(home) as url:
        again = httpx.get(f"{url}/v1/inspect/", params={"tag": "ubuntu:latest"}, follow_redirects=True).json()
        assert again == first
        assert httpx.get(f"{url}/v1/inspect/{made}/").json()["uuid"] == made
        after = httpx.get(f"{url}/v1/operations/{op}").json()
        assert after["status"] == "SUCCESS" and after["result"]["image"] == made
        assert after["metadata"]["command"] == "echo x > /f" and after["metadata"]["shell"] is True
        # a finished operation's event log after a restart: its completion, so followers end
        text = httpx.get(f"{url}/v1/operations/{op}/events").text
        assert [json.loads(d)["type"] for d in re.findall(r"^data: (.*)$", text, re.MULTILINE)] == ["completion"]


def wait_op(url: str, op: str, timeout: float = 60) -> dict:
    """Follow the event stream to its end, then read the operation (what contree-client does)."""
    with httpx.stream("GET", f"{url}/v1/operations/{op}/events", params={"follow": "1"}, timeout=timeout) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for _ in r.iter_lines():
            pass
    return httpx.get(f"{url}/v1/operations/{op}").json()


def sse(text: str) -> list[dict]:
    frames = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":"))
        if fields:
            frames.append(fields)
    return frames


def test_instances_operations_and_events_on_the_wire(server):
    r = httpx.post(f"{server}/v1/instances",
                   json={"command": "/bin/sh", "args": ["-c", "echo out; echo err >&2; cat; exit 4"],
                         "image": "tag:ubuntu:latest", "stdin": {"value": "aW5wdXQ=", "encoding": "base64"},
                         "env": {"A": "1"}, "disposable": True, "future_field": {"ignored": True}})
    assert r.status_code == 201, r.text
    op = r.json()["uuid"]
    assert r.headers["location"] == f"/v1/operations/{op}" and r.json()["image"] == str(uuid.UUID(
        httpx.get(f"{server}/v1/inspect/", params={"tag": "ubuntu:latest"}, follow_redirects=True).json()["uuid"]))
    done = wait_op(server, op)
    assert done["status"] == "SUCCESS" and done["kind"] == "instance" and done["error"] is None
    res = done["metadata"]["result"]
    assert res["state"]["exit_code"] == 4 and res["stdout"] == {"value": "out\ninput", "encoding": "ascii",
                                                                  "truncated": False}
    # disposable: the end state all the same (nothing written: the source image), kept ephemeral
    assert res["stderr"]["value"] == "err\n" and done["result"] == {"image": r.json()["image"], "tag": None}
    assert done["metadata"]["command"] == "/bin/sh" and done["metadata"]["args"][1].startswith("echo out")
    frames = sse(httpx.get(f"{server}/v1/operations/{op}/events").text)
    events = [json.loads(f["data"]) for f in frames]
    assert [f["event"] for f in frames] == [e["type"] for e in events]
    types = [e["type"] for e in events]
    assert types[:2] == ["init", "spawn"] and types[-3:] == ["exit", "shutdown", "completion"], types
    assert b"".join(e["data"]["value"].encode() for e in events if e["type"] == "stdout") == b"out\ninput"
    assert events[-3]["data"]["code"] == 4 and events[-1]["data"]["status"] == "SUCCESS"
    # the stdin it was given is an event of process 1 (Contree's `stdin`)
    assert [(e["spid"], e["data"]["value"]) for e in events if e["type"] == "stdin"] == [(1, "input")]
    ids = [e["id"] for e in events]
    assert ids == sorted(set(ids))
    # resuming with Last-Event-Id sends only what came after it
    tail = sse(httpx.get(f"{server}/v1/operations/{op}/events", headers={"Last-Event-Id": str(ids[-3])}).text)
    assert [int(f["id"]) for f in tail] == ids[-2:]
    listed = httpx.get(f"{server}/v1/operations", params={"status": "SUCCESS", "kind": "instance"}).json()
    assert op in [o["uuid"] for o in listed]
    assert httpx.get(f"{server}/v1/operations", params={"status": "FAILED"}).json() == []


def test_disposable_keeps_no_image_and_cancel(server):
    count = len(httpx.get(f"{server}/v1/images").json()["images"])
    for disposable in (True, False):
        op = httpx.post(f"{server}/v1/instances", json={"command": "touch /new", "shell": True,
                                                        "image": "tag:ubuntu:latest",
                                                        "disposable": disposable}).json()["uuid"]
        assert wait_op(server, op)["status"] == "SUCCESS"
    assert len(httpx.get(f"{server}/v1/images").json()["images"]) == count + 1
    op = httpx.post(f"{server}/v1/instances", json={"command": "echo started; sleep 60", "shell": True,
                                                    "image": "tag:ubuntu:latest"}).json()["uuid"]
    for _ in range(100):                       # ?inflight: the output so far of a running instance
        live = httpx.get(f"{server}/v1/operations/{op}", params={"inflight": ""}).json()
        if live["status"] == "EXECUTING" and (live["metadata"]["result"] or {}).get("stdout", {}).get("value"):
            break
        time.sleep(0.1)
    assert live["metadata"]["result"]["stdout"]["value"] == "started\n"
    assert httpx.get(f"{server}/v1/operations/{op}").json()["metadata"]["result"] is None
    assert httpx.delete(f"{server}/v1/operations/{op}").status_code == 202
    assert wait_op(server, op)["status"] == "CANCELLED"
    again = httpx.delete(f"{server}/v1/operations/{op}")
    assert again.status_code == 409 and "CANCELLED" in again.json()["error"]


def test_files_whoami_and_inspect(server):
    up = httpx.post(f"{server}/v1/files", content=b"\x00binary\xff", headers={"Content-Type": "application/octet-stream"})
    assert up.status_code == 201
    f = up.json()
    assert f["size"] == 8 and uuid.UUID(f["uuid"]).hex == f["sha256"][:32]
    info = httpx.get(f"{server}/v1/files/{f['sha256']}").json()
    assert info["uuid"] == f["uuid"] and info["created_at"] and info["updated_at"]
    assert httpx.head(f"{server}/v1/files/{f['sha256']}").status_code == 200
    assert httpx.head(f"{server}/v1/files/{'0' * 64}").status_code == 404
    op = httpx.post(f"{server}/v1/instances", json={
        "command": "od -An -tx1 /in.bin; stat -c %a /in.bin", "shell": True, "image": "tag:ubuntu:latest",
        "files": {"/in.bin": {"uuid": f["uuid"], "mode": "0600"}}}).json()["uuid"]
    out = wait_op(server, op)["metadata"]["result"]["stdout"]["value"]
    assert out.split() == ["00", "62", "69", "6e", "61", "72", "79", "ff", "600"]
    # whoami, with and without a token: both answered (tokens are checked by the tenants work)
    for headers in ({"Authorization": "Bearer whatever", "Project": "p"}, {}):
        me = httpx.get(f"{server}/v1/whoami", headers=headers).json()
        assert me["operations_stat"] == {"SUCCESS": 1}
        assert me["permissions"]["spawn"] is True and me["limits"]["instance_max_timeout"] > 0
        assert set(me) >= {"token_uuid", "token_expiration", "permissions", "limits", "operations_stat"}
    img = httpx.get(f"{server}/v1/inspect/", params={"tag": "ubuntu:latest"}, follow_redirects=False)
    assert img.status_code == 302 and img.headers["location"].endswith("/")
    uid = img.headers["location"].rstrip("/").rsplit("/", 1)[-1]
    r = httpx.get(f"{server}/v1/inspect/{uid}", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == f"/v1/inspect/{uid}/"
    r = httpx.get(f"{server}/v1/inspect", params={"tag": "ubuntu:latest"}, follow_redirects=True)
    assert r.json()["uuid"] == uid
    ls = httpx.get(f"{server}/v1/inspect/{uid}/list", params={"path": "/etc"}).json()
    entry = {e["path"]: e for e in ls["files"]}["greeting"]
    assert ls["path"] == "/etc" and entry["is_regular"] and entry["mode"] == 0o100644 and entry["size"] == 21
    bin_ = {e["path"]: e for e in httpx.get(f"{server}/v1/inspect/{uid}/list", params={"path": "/bin"}).json()["files"]}
    assert bin_["sh"]["is_symlink"] and bin_["sh"]["symlink_to"] == "busybox"
    assert httpx.get(f"{server}/v1/inspect/{uid}/download", params={"path": "/etc/greeting"}).content == \
        b"hello from the image\n"
    assert httpx.get(f"{server}/v1/inspect/{uid}/download", params={"path": "/etc"}).status_code == 422
    assert httpx.head(f"{server}/v1/inspect/{uid}/download", params={"path": "/nope"}).status_code == 404
    g = httpx.get(f"{server}/v1/inspect/{uid}/grep", params={"pattern": "HELLO", "case": "insensitive",
                                                            "path": "/etc"}).json()
    assert [(m["path"], m["line_number"]) for m in g["matches"]] == [("/etc/greeting", 1)]
    assert g["matches"][0]["submatches"][0]["text"] == "hello" and g["truncated"] is False
    tar = httpx.get(f"{server}/v1/inspect/{uid}/archive", params={"path": "/etc"})
    assert tar.status_code == 200 and b"greeting" in tar.content


def test_errors_are_typed_and_change_nothing(server):
    def err(r, status):
        assert r.status_code == status, (r.status_code, r.text)
        body = r.json()
        assert body["status"] == status and isinstance(body["error"], str) and body["error"]
        return body["error"]

    nobody = str(uuid.UUID(int=7))
    images = httpx.get(f"{server}/v1/images").json()
    err(httpx.get(f"{server}/v1/operations/{nobody}"), 404)
    err(httpx.get(f"{server}/v1/operations/{nobody}/events"), 404)
    err(httpx.delete(f"{server}/v1/operations/{nobody}"), 404)
    err(httpx.get(f"{server}/v1/operations/not-a-uuid"), 400)
    err(httpx.get(f"{server}/v1/inspect/{nobody}/"), 404)
    err(httpx.get(f"{server}/v1/inspect/", params={"tag": "no-such-tag"}), 404)
    err(httpx.get(f"{server}/v1/files/{'a' * 64}"), 404)
    err(httpx.get(f"{server}/v1/files/xyz"), 400)
    err(httpx.post(f"{server}/v1/instances", json={"command": "true", "image": f"{nobody}"}), 404)
    err(httpx.post(f"{server}/v1/instances", json={"command": "true", "image": "tag:no-such-tag"}), 404)
    err(httpx.post(f"{server}/v1/instances", json={"command": "true", "image": "ubuntu"}), 400)
    assert "command" in err(httpx.post(f"{server}/v1/instances", json={"image": "tag:ubuntu:latest"}), 400)
    err(httpx.post(f"{server}/v1/instances", content=b"{not json", headers={"Content-Type": "application/json"}), 400)
    err(httpx.post(f"{server}/v1/instances", json={"command": "true", "image": "tag:ubuntu:latest",
                                                    "files": {"/x": {"uuid": nobody}}}), 404)
    err(httpx.post(f"{server}/v1/instances", json={"command": "true", "image": "tag:ubuntu:latest",
                                                    "cwd": "relative"}), 400)
    err(httpx.get(f"{server}/v1/images", params={"since": "yesterday"}), 400)
    err(httpx.get(f"{server}/v1/images", params={"limit": 0}), 400)
    uid = images["images"][0]["uuid"]
    err(httpx.patch(f"{server}/v1/images/{uid}/tag", json={"tag": ""}), 400)
    err(httpx.patch(f"{server}/v1/images/{uid}/tag", json={"tag": "bad tag!"}), 400)
    err(httpx.delete(f"{server}/v1/images/{uid}/tag", params={"tag": "not-its-tag"}), 404)
    err(httpx.get(f"{server}/v1/inspect/{uid}/download", params={"path": "/missing"}), 404)
    assert httpx.get(f"{server}/v1/images").json() == images
    assert httpx.get(f"{server}/v1/operations", params={"kind": "instance"}).json() == []   # nothing started


# ---- contree-mcp: its own venv (it needs mcp 1.x; sandtree pins mcp 2.x) --------------------------
@pytest.fixture(scope="session")
def contree_mcp() -> str:
    """contree-mcp's command, installed once into .venv/contree-mcp from the pinned requirements."""
    exe = os.path.join(MCP_VENV, "bin", "contree-mcp")
    stamp = os.path.join(MCP_VENV, ".requirements")
    with open(MCP_REQUIREMENTS) as f:
        wanted = f.read()

    def installed() -> bool:
        if not os.path.exists(exe) or not os.path.exists(stamp):
            return False
        with open(stamp) as f:
            return f.read() == wanted
    os.makedirs(os.path.dirname(MCP_VENV), exist_ok=True)
    with open(MCP_VENV + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)             # two test sessions of one checkout build it once
        if not installed():
            subprocess.run([sys.executable, "-m", "venv", "--clear", MCP_VENV], check=True)
            subprocess.run([os.path.join(MCP_VENV, "bin", "pip"), "install", "-q", "-r", MCP_REQUIREMENTS],
                           check=True)
            with open(stamp, "w") as f:
                f.write(wanted)
    return exe


def test_contree_mcp_run_list_read_round_trip(server, contree_mcp, tmp_path):
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTREE_", "NEBIUS_"))}
    env.update(CONTREE_HOME=str(tmp_path / "contree"), CONTREE_NO_UPDATE_CHECK="1",
               CONTREE_URL=server, CONTREE_TOKEN="fake-token")
    params = StdioServerParameters(command=contree_mcp, args=["--auth-type", "jwt"], env=env)

    def value(result) -> dict:
        assert not result.is_error, result.content
        return json.loads(result.content[0].text)

    async def main():
        async with Client(params) as c:
            assert {"run", "list_files", "read_file"} <= {t.name for t in (await c.list_tools()).tools}
            r = value(await c.call_tool("run", {"command": "mkdir -p /work && printf 'hi\\n' > /work/x && cat /work/x",
                                                "image": "tag:ubuntu:latest", "disposable": False}))
            assert r["status"] == "SUCCESS" and r["exit_code"] == 0 and r["stdout"] == "hi\n"
            image = r["result"]["image"]
            assert image and image == r["result_image_uuid"]
            ls = value(await c.call_tool("list_files", {"image": image, "path": "/work"}))
            assert [(f["name"], f["type"], f["size"]) for f in ls["files"]] == [("x", "file", 3)]
            got = value(await c.call_tool("read_file", {"image": image, "path": "/work/x"}))
            assert got["content"] == "hi\n" and got["encoding"] == "utf-8"
            missing = await c.call_tool("read_file", {"image": image, "path": "/work/nope"})
            assert missing.is_error
            # the rest of its tools over the same wire: upload + files, async runs, tags, grep, whoami
            up = value(await c.call_tool("upload", {"content": "payload\n"}))
            queued = value(await c.call_tool("run", {"command": "cat /in", "image": image, "wait": False,
                                                    "files": {"/in": up["uuid"]}}))
            waited = value(await c.call_tool("wait_operations", {"operation_ids": [queued["operation_id"]]}))
            assert "payload" in json.dumps(waited)
            got = value(await c.call_tool("get_operation", {"operation_id": queued["operation_id"]}))
            assert got["status"] == "SUCCESS" and got["stdout"] == "payload\n"
            ops = value(await c.call_tool("list_operations", {}))
            assert queued["operation_id"] in json.dumps(ops)
            assert value(await c.call_tool("set_tag", {"image_uuid": image, "tag": "mcp/work"}))["tag"] == "mcp/work"
            assert value(await c.call_tool("get_image", {"image": "tag:mcp/work"}))["uuid"] == image
            assert "mcp/work" in json.dumps(value(await c.call_tool("list_images", {"tagged": True})))
            hits = value(await c.call_tool("grep", {"image": image, "pattern": "hi", "path": "/work"}))
            assert "/work/x" in json.dumps(hits)
            assert value(await c.call_tool("whoami", {}))
            return image

    image = asyncio.run(main())
    # the work happened here: the image it made is in our store, named by its UUID
    assert httpx.get(f"{server}/v1/inspect/{image}/").json()["uuid"] == image


# ---- imports from a registry on loopback ----------------------------------------------------------
registry = pytest.importorskip("test_registry").registry      # Debian's docker-registry, with an image


def test_sdk_imports_from_a_registry(sdk_env, registry):
    from contree_sdk import Contree
    from contree_sdk.sdk.exceptions import FailedOperationError

    ref = f"{registry['host']}/team/app:1"

    async def main():
        c = Contree(token="fake-token")
        image = await c.images.oci(ref)               # not there yet: imported, tagged as the reference
        assert image.tag == ref and image.uuid is not None
        assert await image.read("/etc/b") == b"b"
        again = await c.images.oci(ref)               # there now: found by its tag, no second import
        assert again.uuid == image.uuid
        with pytest.raises(FailedOperationError):
            await c.images.import_from(f"{registry['host']}/team/app:nope")
        return image

    image = asyncio.run(main())
    # imports are listed with kind=image_import (and without a kind), each readable by its UUID
    imports = httpx.get(f"{sdk_env}/v1/operations", params={"kind": "image_import"}).json()
    assert [o["status"] for o in imports] == ["FAILED", "SUCCESS", "SUCCESS"]       # newest first
    assert {o["kind"] for o in imports} == {"image_import"} and "not found" in imports[0]["error"]
    assert imports[1]["result_image_uuid"] == str(image.uuid)
    assert {o["uuid"] for o in imports} <= {o["uuid"] for o in httpx.get(f"{sdk_env}/v1/operations").json()}
    r = httpx.post(f"{sdk_env}/v1/images/import", json={
        "registry": {"url": f"docker://{ref}", "credentials": {"username": "u", "password": "p"}}, "tag": "again"})
    assert r.status_code == 201
    done = httpx.get(f"{sdk_env}/v1/operations/{r.json()['uuid']}").json()
    for _ in range(100):
        if done["status"] in ("SUCCESS", "FAILED"):
            break
        time.sleep(0.1)
        done = httpx.get(f"{sdk_env}/v1/operations/{r.json()['uuid']}").json()
    assert done["kind"] == "image_import" and done["status"] == "SUCCESS"
    assert done["result"] == {"image": str(image.uuid), "tag": "again"}
    assert done["metadata"]["registry"]["url"] == f"docker://{ref}"
    assert httpx.post(f"{sdk_env}/v1/images/import", json={"registry": {}}).status_code == 400
    assert httpx.post(f"{sdk_env}/v1/images/import", json={"registry": {"url": ref}, "tag": "bad tag"}).status_code == 400
    assert httpx.post(f"{sdk_env}/v1/images/import", json={"registry": {"url": "ftp://x/y"}}).status_code == 400


def test_engine_finds_uploads_by_uuid_prefix(st):
    """The engine methods behind Contree's upload UUIDs (a sha256's first 128 bits)."""
    e = st._engine
    digest = e.upload(b"content")
    assert e.find_upload(digest[:32]) == digest == e.find_upload(digest)
    assert e.upload_info(digest)["size"] == 7
    with pytest.raises(sandtree.NotFound):
        e.find_upload("0" * 32)
    with pytest.raises(sandtree.NotFound):
        e.upload_info("0" * 64)
    for bad in ("abc", digest[:31], "g" * 32, None):
        with pytest.raises(sandtree.InvalidInput):
            e.find_upload(bad)
