"""A live fork (sb.fork(n), issue 38) through every surface, against the real thing: REST and the
remote and async SDKs on a real `sandtree serve` on loopback (with tenants: another tenant's
sandbox answers as a missing one, and max_sandboxes counts the children), MCP through the real
`mcp` client over stdio, and the CLI (`sandtree sandbox fork SID -n N`, `sandtree fork --live SID
-n N`). Each child is checked to continue the source's shell session (its cwd and exported
variable), and bad input to start nothing. The engine's own checks (memory, sockets, isolation,
both tiers) are tests/kernel/test_live_fork.py's."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest
from mcp.client.client import Client

import sandtree
from sandtree.client.aio import AsyncSandtree

from conftest import serve_process
from test_mcp import data, stdio

LIFETIME = 300          # (every sandbox is stopped by the test; this bounds one a failure leaves)


@pytest.fixture(autouse=True)
def criu_or_skip(tmp_path):
    st = sandtree.Sandtree(str(tmp_path / "probe"), warm=0)
    try:
        ok, why = st._engine.sandboxes.live.hibernate_available("namespaces")
    finally:
        st.close()
    if not ok:
        pytest.skip(f"a live fork checkpoints the sandbox: {why}")


def cli(home, *args, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "sandtree", "--home", str(home), *args], capture_output=True,
                       text=True, timeout=120, check=False)
    assert not check or p.returncode == 0, p.stderr
    return p


def _session(sb) -> None:
    """A shell session with state only it holds: its cwd and an exported variable."""
    assert sb.exec("mkdir -p /tmp/w; cd /tmp/w; export FORKED=yes-41").ok


def _continues(sb) -> bool:
    return sb.exec("echo $(pwd) $FORKED").stdout == b"/tmp/w yes-41\n"


def _stop_all(st) -> None:
    for s in st.sandboxes():
        s.stop()


def test_rest_remote_and_async_sdk_with_tenants(tmp_path, rootfs):
    home = tmp_path / "home"
    alice = json.loads(cli(home, "token", "create", "--tenant", "alice", "--max-sandboxes", "4", "--json").stdout)
    bob = json.loads(cli(home, "token", "create", "--tenant", "bob", "--json").stdout)
    with serve_process(home) as url:
        st = sandtree.connect(url, token=alice["token"])
        other = sandtree.connect(url, token=bob["token"])
        rest = httpx.Client(base_url=url + "/api/v1", timeout=120,
                            headers={"Authorization": f"Bearer {alice['token']}"})
        try:
            img = st.import_image(rootfs)
            sb = img.start(lifetime=LIFETIME)
            _session(sb)

            # REST: 201 and the children, each continuing the session
            r = rest.post(f"/sandboxes/{sb.id}/fork", json={"n": 1, "labels": {"via": "rest"}})
            assert r.status_code == 201, r.text
            [kid] = r.json()
            assert kid["state"] == "running" and kid["forked_from"]["sandbox"] == sb.id
            assert kid["labels"] == {"via": "rest"} and kid["id"] != sb.id
            assert _continues(st.sandbox(kid["id"]))
            assert rest.get(f"/sandboxes/{kid['id']}").json()["forked_from"] == kid["forked_from"]

            # bad input: the project's 4xx shape, nothing started
            before = {s.id for s in st.sandboxes()}
            for body in ({"n": 0}, {"n": -1}, {"n": 10_000}, {"n": "two"}, {"n": 1, "env": {"A": "1"}},
                         {"n": 1, "idle_action": "pause"}):
                r = rest.post(f"/sandboxes/{sb.id}/fork", json=body)
                assert r.status_code in (400, 422), (body, r.status_code, r.text)
            missing = rest.post(f"/sandboxes/{'f' * 32}/fork", json={"n": 1})
            assert missing.status_code == 404 and missing.json()["error"].endswith("not_found"), missing.text

            # another tenant's sandbox answers as a missing one, and nothing starts
            r = httpx.post(f"{url}/api/v1/sandboxes/{sb.id}/fork", json={"n": 1}, timeout=60,
                           headers={"Authorization": f"Bearer {bob['token']}"})
            assert r.status_code == 404 and r.json()["error"] == missing.json()["error"], r.text
            with pytest.raises(sandtree.NotFound):
                other._engine.sandbox_fork(sb.id, 1)
            assert other.sandboxes() == [] and {s.id for s in st.sandboxes()} == before

            # max_sandboxes (4) counts the children: 2 running, a fork of 3 would make 5
            r = rest.post(f"/sandboxes/{sb.id}/fork", json={"n": 3})
            assert r.status_code == 429, r.text
            assert r.json()["error"] == "limit_exceeded" and r.json()["limit"] == "max_sandboxes", r.text
            with pytest.raises(sandtree.LimitExceeded, match="max_sandboxes"):
                sb.fork(3)
            assert {s.id for s in st.sandboxes()} == before

            # the remote SDK: Sandbox objects that exec, commit and stop like any
            kids = sb.fork(2)
            assert all(isinstance(k, sandtree.Sandbox) for k in kids) and len({k.id for k in kids}) == 2
            assert all(_continues(k) for k in kids)
            assert kids[0].exec("echo mine > /tmp/w/f").ok
            assert kids[0].commit().read("/tmp/w/f") == b"mine\n"
            assert not kids[1].exec("cat /tmp/w/f").ok and not sb.exec("cat /tmp/w/f").ok
            for k in kids + [st.sandbox(kid["id"])]:
                k.stop()

            # the async SDK over the same server
            async def main():
                ast = AsyncSandtree.connect(url, token=alice["token"])
                asb = await ast.sandbox(sb.id)
                [achild] = await asb.fork(1, lifetime=60)
                got = await achild.exec("echo $FORKED")
                info = await achild.info()
                await achild.stop()
                return got.stdout, info
            out, info = asyncio.run(main())
            assert out == b"yes-41\n" and info["forked_from"]["sandbox"] == sb.id
            assert [s.id for s in st.sandboxes()] == [sb.id]
        finally:
            _stop_all(st)
            rest.close()
            st.close()
            other.close()


def test_mcp_sandbox_fork(tmp_path, rootfs):
    home = str(tmp_path / "home")

    async def main():
        async with Client(stdio(home)) as c:
            img = data(await c.call_tool("import_image", {"source": rootfs}))["image"]
            sb = data(await c.call_tool("sandbox_start", {"image": img, "lifetime": LIFETIME}))["id"]
            ran = data(await c.call_tool("sandbox_exec", {"sandbox_id": sb,
                                                          "command": "mkdir -p /tmp/w; cd /tmp/w; export FORKED=yes-41"}))
            assert ran["exit_code"] == 0
            kids = data(await c.call_tool("sandbox_fork", {"sandbox_id": sb, "n": 2}))
            assert len(kids) == 2 and all(k["forked_from"]["sandbox"] == sb for k in kids)
            for k in kids:
                got = data(await c.call_tool("sandbox_exec", {"sandbox_id": k["id"], "command": "echo $(pwd) $FORKED"}))
                assert got["stdout"] == "/tmp/w yes-41\n", got
            for bad in ({"sandbox_id": sb, "n": 0}, {"sandbox_id": sb, "n": 10_000}, {"sandbox_id": "f" * 32, "n": 1}):
                assert (await c.call_tool("sandbox_fork", bad)).is_error, bad
            listed = data(await c.call_tool("sandbox_list", {}))
            assert {s["id"] for s in listed} == {sb} | {k["id"] for k in kids}     # (nothing more started)
    try:
        asyncio.run(main())
    finally:
        st = sandtree.Sandtree(home, warm=0)
        _stop_all(st)
        st.close()


def test_cli_sandbox_fork_and_fork_live(tmp_path, rootfs):
    home = tmp_path / "home"
    st = sandtree.Sandtree(str(home), warm=0)
    try:
        img = st.import_image(rootfs)
        sb = img.start(lifetime=LIFETIME)
        _session(sb)
        # the table's verb
        kids = json.loads(cli(home, "sandbox", "fork", sb.id, "-n", "2", "--json").stdout)
        assert len(kids) == 2 and all(k["forked_from"]["sandbox"] == sb.id for k in kids)
        assert all(_continues(st.sandbox(k["id"])) for k in kids)
        # `sandtree fork --live SID -n N`: the same operation; its human output as the verb's
        p = cli(home, "fork", "--live", sb.id, "-n", "2")
        ids = [line.split()[0] for line in p.stdout.splitlines()]
        assert len(ids) == 2 and all(line.split()[1] == "running" for line in p.stdout.splitlines())
        for i in ids:
            assert st._engine.sandbox_info(i)["forked_from"]["sandbox"] == sb.id and _continues(st.sandbox(i))
        # bad input starts nothing, with an error that says why
        running = {s.id for s in st.sandboxes()}
        for args, why in ((("fork", "--live", sb.id, "-n", "0"), "n"),
                          (("fork", "--live", sb.id, "--cmd", "true"), "--cmd"),
                          (("fork", img.id, "-n", "2"), "--live"),
                          (("fork", "--live", "f" * 32), "f" * 12),
                          (("sandbox", "fork", sb.id, "-n", "0"), "n")):
            p = cli(home, *args, check=False)
            assert p.returncode != 0 and why in p.stderr, (args, p.stderr)
        assert {s.id for s in st.sandboxes()} == running
        # `sandtree fork IMAGE --cmd ...` (runs from an image) is as it was
        rows = json.loads(cli(home, "fork", img.id, "--cmd", "echo a > /a", "--cmd", "echo b", "--json").stdout)
        assert [r["exit_code"] for r in rows] == [0, 0] and st.image(rows[0]["image"]).read("/a") == b"a\n"
    finally:
        _stop_all(st)
        st.close()
