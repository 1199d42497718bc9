"""Tenants and tokens against a real `sandtree serve` on loopback: isolation (another tenant's
things answer exactly as nonexistent ones), sharing, scopes, limits, revocation, hashed tokens,
the audit log and the JSON request log."""

from __future__ import annotations

import glob
import io
import json
import subprocess
import sys
import tarfile
import time
from typing import Annotated, Any

import httpx
import pytest
from conftest import free_port, wait_for_port
from fastapi import Depends

import sandtree
from sandtree.http.server import engine_for

NOWHERE = "f" * 64                       # an image ID no store holds
NO_OP = "0" * 32
Caller = Annotated[Any, Depends(engine_for)]          # how another router asks for the caller's engine


DATABASES: dict[str, str] = {}       # a store's home -> its PostgreSQL URL (test_backends_tenants.py)


def db_args(home) -> list[str]:
    url = DATABASES.get(str(home))
    return ["--database", url] if url else []


@pytest.fixture(scope="module")
def server_database():
    """The metadata database of the `srv` server's store: None = SQLite (tests/backends.py overrides it)."""
    return None


def cli(home, *args) -> str:
    p = subprocess.run([sys.executable, "-m", "sandtree", "--home", str(home), *db_args(home), *args], capture_output=True,
                       text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    return p.stdout


def token(home, tenant, *extra) -> dict:
    return json.loads(cli(home, "token", "create", "--tenant", tenant, "--json", *extra))


@pytest.fixture(scope="module")
def srv(tmp_path_factory, rootfs, server_database):
    home = tmp_path_factory.mktemp("tenants-home")
    if server_database:
        DATABASES[str(home)] = server_database
    toks = {"alice": token(home, "alice"), "bob": token(home, "bob"),
            "carol": token(home, "carol", "--scopes", "list"),
            "dave": token(home, "dave", "--max-runs", "1", "--max-timeout", "2", "--max-output", "1000"),
            "root": token(home, "ops", "--scopes", "admin")}
    port = free_port()
    log = home / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", str(home), *db_args(home), "serve",
                                 "--port", str(port), "--ports-port", "0"], stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    clients = {}
    try:
        wait_for_port(port, 30)
        for name, t in toks.items():
            clients[name] = httpx.Client(base_url=url + "/api/v1", timeout=60,
                                         headers={"Authorization": f"Bearer {t['token']}"})
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            t.add(rootfs, arcname=".")
        yield {"home": home, "url": url, "tokens": toks, "c": clients, "log": log, "tar": buf.getvalue()}
    finally:
        for c in clients.values():
            c.close()
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def alice_world(srv):
    """Alice's things: an imported base (tag base), a child made by a run, a branch, an upload."""
    a = srv["c"]["alice"]
    r = a.post("/images/import", params={"tag": "base"}, content=srv["tar"])
    assert r.status_code == 201, r.text
    base = r.json()["image"]
    run = a.post("/runs", json={"image": "base", "command": "echo alice-secret > /note",
                                "env": {"API_TOKEN": "hunter2hunter2"}}).json()
    assert run["status"] == "done", run
    child = run["result"]
    assert a.put("/tags/mine", json={"image": child}).status_code == 200
    assert a.post("/branches", json={"name": "web", "image": child}).status_code == 201
    sha = a.post("/files", content=b"alice's upload").json()["sha256"]
    return {"base": base, "child": child, "op": run["id"], "sha": sha}


def test_requests_need_a_valid_token(srv):
    url = srv["url"] + "/api/v1"
    assert httpx.get(url + "/health").status_code == 200                # liveness stays open
    r = httpx.get(url + "/images")
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    for bad in ("nonsense", "stk_0123456789abcdef_" + "x" * 43,
                srv["tokens"]["alice"]["token"][:-2] + "zz"):
        r = httpx.get(url + "/images", headers={"Authorization": f"Bearer {bad}"})
        assert r.status_code == 401 and r.json() == {"error": "unauthorized", "message": "invalid or revoked token"}
    assert httpx.get(srv["url"] + "/metrics").status_code == 401
    # the counters are every tenant's: admin only (issue 12 review; a tenant read them before)
    assert srv["c"]["bob"].get(str(srv["url"]) + "/metrics").status_code == 403
    assert "sandtree_runs_started_total" in srv["c"]["root"].get(str(srv["url"]) + "/metrics").text
    who = srv["c"]["alice"].get("/whoami").json()
    assert who["tenant"] == "alice" and who["token"] == srv["tokens"]["alice"]["id"]
    assert set(who["scopes"]) == {"import", "run", "list", "cancel", "tag"}
    assert srv["c"]["dave"].get("/whoami").json()["limits"] == {
        **who["limits"], "timeout": 2.0, "output": 1000, "concurrent_runs": 1}


def test_other_tenants_images_do_not_exist(srv, alice_world):
    b = srv["c"]["bob"]
    child, base = alice_world["child"], alice_world["base"]
    assert b.get("/images").json() == [] and b.get("/tags").json() == {} and b.get("/branches").json() == {}
    # every read path: the same status and body as for an image that exists nowhere
    for path in ("/images/{}", "/images/{}/ls", "/images/{}/parents", "/images/{}/children", "/images/{}/log",
                 "/images/{}/lineage", "/images/{}/ancestors", "/images/{}/descendants", "/images/{}/produced-by",
                 "/images/{}/export"):
        mine, none = b.get(path.format(child)), b.get(path.format(NOWHERE))
        assert mine.status_code == none.status_code == 404, path
        assert mine.json() == {**none.json(), "message": none.json()["message"].replace(NOWHERE, child),
                               "image": child}, path
    r = b.get(f"/images/{child}/read", params={"path": "/note"})
    assert r.status_code == 404 and r.json()["error"] == "image_not_found"
    # names and prefixes: Alice's tag, branch and ID prefix are unknown to Bob
    for ref in ("base", "mine", "tag:mine", child[:10], base[:8]):
        r = b.get("/resolve", params={"ref": ref})
        assert r.status_code == 404 and r.json() == {"error": "image_not_found",
                                                     "message": f"no image or tag {ref!r}", "image": ref}
    r = b.get("/resolve", params={"ref": "branch:web"})
    assert r.status_code == 404 and r.json() == {"error": "not_found", "message": "no branch 'web'", "branch": "web"}
    assert b.get("/branches/web").status_code == 404
    # run, tag, branch, diff, merge, share on it: all "no such image"
    for method, path, body in (("POST", "/runs", {"image": child, "command": "cat /note"}),
                               ("POST", "/runs", {"image": "branch:web", "command": "true"}),
                               ("PUT", "/tags/stolen", {"image": child}),
                               ("POST", "/branches", {"name": "b", "image": child}),
                               ("POST", "/merge", {"ours": child, "theirs": child}),
                               ("POST", f"/images/{child}/share", {"public": True})):
        r = b.request(method, path, json=body)
        assert r.status_code == 404, (path, r.text)
    r = b.get("/diff", params={"a": child, "b": child})
    assert r.status_code == 404 and r.json()["error"] == "image_not_found"
    # operations and their events: as nonexistent as a made-up id
    op = alice_world["op"]
    for method, path in (("GET", "/operations/{}"), ("POST", "/operations/{}/wait"),
                         ("POST", "/operations/{}/cancel"), ("GET", "/operations/{}/events")):
        mine, none = b.request(method, path.format(op)), b.request(method, path.format(NO_OP))
        assert mine.status_code == none.status_code == 404, path
        assert mine.json() == {"error": "not_found", "message": f"no operation {op!r}"}
    assert op not in [o["id"] for o in b.get("/operations").json()]
    # uploads by sha256: neither downloadable nor injectable
    sha = alice_world["sha"]
    assert b.get(f"/files/{sha}").json() == {"error": "not_found", "message": f"no uploaded file {sha!r}"}
    assert b.post("/file-sets", json=[{"path": "/x", "sha256": sha}]).status_code == 404
    mine = b.post("/images/import", content=srv["tar"]).json()["image"]      # Bob's own (same content)
    r = b.post("/runs", json={"image": mine, "command": "cat /x", "files": [{"path": "/x", "sha256": sha}]})
    assert r.status_code == 404 and r.json() == {"error": "not_found", "message": f"no uploaded file {sha!r}"}
    fs = srv["c"]["alice"].post("/file-sets", json=[{"path": "/x", "sha256": sha}]).json()["id"]
    r = b.post("/runs", json={"image": mine, "command": "cat /x", "file_set": fs})
    assert r.status_code == 404 and r.json() == {"error": "not_found", "message": f"no file set {fs!r}"}
    # Alice's own view is intact, her events stream included
    a = srv["c"]["alice"]
    with a.stream("GET", f"/operations/{op}/events") as ev:
        assert "event: end" in list(ev.iter_lines())
    assert a.get(f"/operations/{op}").json()["status"] == "done"
    assert op in [o["id"] for o in a.get("/operations").json()]
    assert a.get("/resolve", params={"ref": "mine"}).json()["image"] == child
    assert a.get(f"/images/{child}/read", params={"path": "/note"}).content == b"alice-secret\n"


def test_same_content_shared_storage_separate_lineage(srv, alice_world):
    """Bob imports the same rootfs: same ID (stored once), but Alice's runs on it stay hers."""
    b = srv["c"]["bob"]
    base = b.post("/images/import", params={"tag": "base"}, content=srv["tar"]).json()["image"]
    assert base == alice_world["base"]
    assert b.get(f"/images/{base}/children").json() == []
    assert b.get(f"/images/{base}/descendants").json() == {base: 0}
    assert b.get(f"/images/{base}/lineage").json()["tree"]["children"] == []
    assert b.get(f"/images/{base}").json()["tags"] == ["base"]
    mine = b.post("/runs", json={"image": "base", "command": "echo bob > /note"}).json()
    assert b.get(f"/images/{mine['result']}/log").json()[0]["command"] == "echo bob > /note"
    assert [c["child"] for c in b.get(f"/images/{base}/children").json()] == [mine["result"]]
    # tags are per tenant: both have a "base"; Bob's tag moves his only
    assert b.put("/tags/base", json={"image": mine["result"]}).status_code == 200
    assert srv["c"]["alice"].get("/resolve", params={"ref": "base"}).json()["image"] == base
    kids = [c["child"] for c in srv["c"]["alice"].get(f"/images/{base}/children").json()]
    assert alice_world["child"] in kids and mine["result"] not in kids
    # through the SDK: the same typed error as for a missing image
    st = sandtree.connect(srv["url"], token=srv["tokens"]["bob"]["token"])
    try:
        with pytest.raises(sandtree.ImageNotFound):
            st.image(alice_world["child"])
        with pytest.raises(sandtree.ImageNotFound):
            st.image(alice_world["child"][:12])
        assert st.whoami()["tenant"] == "bob"
    finally:
        st.close()


def test_public_sharing(srv, alice_world):
    a, b = srv["c"]["alice"], srv["c"]["bob"]
    child = alice_world["child"]
    assert a.post(f"/images/{child}/share", json={"public": True}).json() == {"image": child, "public": True}
    assert b.get(f"/images/{child}/read", params={"path": "/note"}).content == b"alice-secret\n"
    info = b.get(f"/images/{child}").json()
    assert info["tags"] == [] and info["parents"] == []        # Alice's names and the parent stay hers
    assert b.get(f"/images/{child}/log").json()[0]["command"] is None
    run = b.post("/runs", json={"image": child, "command": "echo more >> /note"}).json()
    assert run["status"] == "done"
    r = b.post(f"/images/{child}/share", json={"public": False})
    assert r.status_code == 403 and r.json()["error"] == "forbidden"       # only an owner unshares
    # a no-op run "produces" the shared image itself; that does not make Bob the one who shared it
    assert b.post("/runs", json={"image": child, "command": "true"}).json()["result"] == child
    r = b.post(f"/images/{child}/share", json={"public": False})
    assert r.status_code == 403 and r.json()["error"] == "forbidden"
    assert b.get(f"/images/{child}").status_code == 200
    assert a.post(f"/images/{child}/share", json={"public": False}).json()["public"] is False
    assert b.get(f"/images/{child}").status_code == 404
    assert b.get(f"/images/{run['result']}/read", params={"path": "/note"}).content == b"alice-secret\nmore\n"


def test_scopes(srv, alice_world):
    c = srv["c"]["carol"]                                     # list only
    assert c.get("/images").status_code == 200
    before = len(srv["c"]["root"].get("/audit", params={"limit": 10000}).json())
    for method, path, kw in (("POST", "/runs", {"json": {"image": NOWHERE, "command": "true"}}),
                             ("POST", "/images/import", {"content": srv["tar"]}),
                             ("DELETE", "/tags/x", {}),
                             ("POST", "/files", {"content": b"x"})):
        r = c.request(method, path, **kw)
        assert r.status_code == 403, path
        assert r.json()["error"] == "forbidden" and "scope" in r.json()["message"]
    assert c.get("/images").json() == []                       # nothing was made
    assert len(srv["c"]["root"].get("/audit", params={"limit": 10000}).json()) == before
    st = sandtree.connect(srv["url"], token=srv["tokens"]["carol"]["token"])
    try:
        with pytest.raises(sandtree.Forbidden, match="no 'run' scope"):
            st._engine.run(NOWHERE, "true")
    finally:
        st.close()
    # operator-only calls are refused to a tenant, answered for an admin token
    assert srv["c"]["alice"].post("/admin/fsck").status_code == 403
    assert srv["c"]["root"].post("/admin/fsck", params={"verify_content": False}).json()["ok"] is True


def test_limits(srv, alice_world):
    d = srv["c"]["dave"]                       # max-runs 1, max-timeout 2 s, max-output 1000 bytes
    assert d.post("/images/import", params={"tag": "base"}, content=srv["tar"]).status_code == 201
    first = d.post("/runs", json={"image": "base", "command": "sleep 1.5", "wait": False}).json()
    r = d.post("/runs", json={"image": "base", "command": "true", "wait": False})
    assert r.status_code == 429 and r.json()["error"] == "limit_exceeded" and r.json()["limit"] == "max_runs"
    assert d.post(f"/operations/{first['id']}/wait", params={"timeout": 30}).json()["status"] == "done"
    # the slot is free again; another tenant was never limited by dave's
    assert d.post("/runs", json={"image": "base", "command": "true"}).json()["status"] == "done"
    r = d.post("/runs", json={"image": "base", "command": "true", "timeout": 60})
    assert r.status_code == 429 and r.json()["limit"] == "max_timeout"
    t0 = time.monotonic()
    r = d.post("/runs", json={"image": "base", "command": "sleep 30"}).json()
    assert r["outcome"]["timed_out"] is True and time.monotonic() - t0 < 15      # capped at 2 s
    r = d.post("/runs", json={"image": "base", "command": "head -c 5000 /dev/zero", "disposable": True}).json()
    assert r["outcome"]["stdout_truncated"] is True and len(r["stdout_base64"]) <= 1400
    r = d.post("/runs", json={"image": "base", "command": "true", "output": "1M"})
    assert r.status_code == 429 and r.json()["limit"] == "max_output"
    # submitted at once: exactly one takes the slot; meanwhile another tenant runs unhindered
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda _: d.post("/runs", json={"image": "base", "command": "sleep 1",
                                                              "wait": False}), range(4)))
    assert sorted(r.status_code for r in codes) == [201, 429, 429, 429]
    assert srv["c"]["alice"].post("/runs", json={"image": "base", "command": "true"}).json()["status"] == "done"
    ok = next(r for r in codes if r.status_code == 201).json()["id"]
    assert d.post(f"/operations/{ok}/wait", params={"timeout": 30}).json()["status"] == "done"
    st = sandtree.connect(srv["url"], token=srv["tokens"]["dave"]["token"])
    try:
        with pytest.raises(sandtree.LimitExceeded):
            st.image("base").run("true", timeout=100)
    finally:
        st.close()


def test_revoke_takes_effect(srv):
    t = token(srv["home"], "erin")
    c = httpx.Client(base_url=srv["url"] + "/api/v1", headers={"Authorization": f"Bearer {t['token']}"})
    try:
        assert c.get("/whoami").json()["tenant"] == "erin"
        listed = json.loads(cli(srv["home"], "token", "list", "--json"))
        assert {"id": t["id"], "tenant": "erin", "revoked": None}.items() <= next(
            x for x in listed if x["id"] == t["id"]).items()
        assert all("token" not in x and "hash" not in x for x in listed)
        dave = next(x for x in listed if x["tenant"] == "dave")
        assert dave["limits"] == {"max_runs": 1, "max_timeout": 2.0, "max_output": 1000}
        assert "max_runs=1" in cli(srv["home"], "token", "list")
        cli(srv["home"], "token", "revoke", t["id"])
        r = c.get("/whoami")
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    finally:
        c.close()


def test_tokens_hashed_at_rest(srv):
    data = b""
    for p in glob.glob(str(srv["home"] / "sandtree.db*")):           # the database and its WAL
        with open(p, "rb") as f:
            data += f.read()
    url = DATABASES.get(str(srv["home"]))
    if url:                                                         # PostgreSQL: every table's rows
        import psycopg
        with psycopg.connect(url) as con:
            for (table,) in con.execute("SELECT tablename FROM pg_tables WHERE schemaname='public'").fetchall():
                data += repr(con.execute(f"SELECT * FROM {table}").fetchall()).encode()
    for t in srv["tokens"].values():
        secret = t["token"].split("_", 2)[2]
        assert secret.encode() not in data and t["token"].encode() not in data
        assert t["id"].encode() in data                    # the id is stored; the secret only hashed


def test_no_token_server_stays_on_loopback(tmp_path, rootfs):
    home = tmp_path / "home"
    p = subprocess.run([sys.executable, "-m", "sandtree", "--home", str(home), "serve", "--host", "0.0.0.0",
                        "--port", str(free_port())], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode != 0 and "loopback only" in p.stderr and "token create" in p.stderr
    # on loopback it serves, unscoped, and says so; a token sent anyway is ignored (Contree's
    # clients always send one)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", str(home), "serve", "--port", str(port), "--ports-port", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, 30)
        base = f"http://127.0.0.1:{port}/api/v1"
        assert httpx.get(base + "/whoami").json()["tenant"] == "local"
        assert httpx.get(base + "/whoami", headers={"Authorization": "Bearer stk_x"}).json()["tenant"] == "local"
        # still audited: who is the operator, "local"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            t.add(rootfs, arcname=".")
        img = httpx.post(base + "/images/import", content=buf.getvalue()).json()["image"]
        op = httpx.post(base + "/runs", json={"image": img, "command": "echo hi"}, timeout=60).json()["id"]
        rows = httpx.get(base + "/audit").json()
        assert rows[0]["op"] == op and rows[0]["tenant"] == "local" and rows[0]["command"] == "echo hi"
        assert rows[0]["image"] == img and rows[0]["outcome"] == "done"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert "no tokens configured, listening on loopback only" in err


def test_audit_records_who_ran_what(srv, alice_world):
    rows = srv["c"]["root"].get("/audit", params={"limit": 10000}).json()
    run = next(r for r in rows if r["op"] == alice_world["op"])
    assert run["tenant"] == "alice" and run["token"] == srv["tokens"]["alice"]["id"]
    assert run["action"] == "run" and run["image"] == alice_world["base"] and run["result"] == alice_world["child"]
    assert run["command"] == "echo alice-secret > /note" and run["outcome"] == "done" and run["exit_code"] == 0
    assert any(r["action"] == "import" and r["tenant"] == "alice" and r["result"] == alice_world["base"] for r in rows)
    # a secret passed in env is masked in the command recorded
    a = srv["c"]["alice"]
    a.post("/runs", json={"image": "base", "command": "echo hunter2hunter2", "env": {"API_TOKEN": "hunter2hunter2"},
                          "disposable": True})
    mine = a.get("/audit").json()
    assert mine[0]["command"] == "echo ***" and {r["tenant"] for r in mine} == {"alice"}
    assert "hunter2hunter2" not in json.dumps(srv["c"]["root"].get("/audit", params={"limit": 10000}).json())
    assert all(r["tenant"] == "bob" for r in srv["c"]["bob"].get("/audit").json())
    assert srv["c"]["bob"].get("/audit", params={"tenant": "alice"}).status_code == 403
    # bad input changes nothing, the audit log included; token management is the operator's ("local")
    assert a.post("/runs", json={"image": "base", "command": "true", "cwd": "/no/such"}).status_code == 400
    assert a.get("/audit").json()[0] == mine[0]
    made = [r for r in srv["c"]["root"].get("/audit", params={"limit": 10000}).json() if r["action"] == "token create"]
    assert {r["for"] for r in made} >= {"alice", "bob"} and {r["tenant"] for r in made} == {"local"}
    # the CLI reads the same table
    out = json.loads(cli(srv["home"], "audit", "--tenant", "alice", "--json", "--limit", "1000"))
    assert any(r["op"] == alice_world["op"] for r in out)


def test_structured_request_log(srv, alice_world):
    srv["c"]["alice"].get(f"/operations/{alice_world['op']}")
    time.sleep(0.2)
    with open(srv["log"]) as f:
        lines = [json.loads(line) for line in f if line.startswith("{")]
    assert lines[0]["event"] == "start" and lines[0]["auth"] == "tokens"
    reqs = [x for x in lines if x["event"] == "request"]
    runs = [x for x in reqs if x["path"] == "/api/v1/runs" and x["method"] == "POST" and x["status"] == 201]
    assert any(x["op"] == alice_world["op"] and x["tenant"] == "alice" for x in runs)
    assert all(isinstance(x["duration_ms"], float) for x in reqs)
    assert any(x["status"] == 401 and "tenant" not in x for x in reqs)
    assert any(x["path"] == f"/api/v1/operations/{alice_world['op']}" and x["op"] == alice_world["op"] for x in reqs)


def test_in_process_view_and_cli_tokens(tmp_path, rootfs):
    """engine.as_tenant in process: the same rules without HTTP (what MCP or Contree mount)."""
    from sandtree.engine import Engine
    from sandtree.tenancy import Tenant
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        a = eng.as_tenant(Tenant("a", limits={"max_runs": 1}))
        b = eng.as_tenant(Tenant("b"))
        img = a.import_path(rootfs, tag="x")
        rec = a.run("x", "echo 1 > /one")
        assert b.images() == [] and eng.resolve(rec.image) == rec.image         # the operator sees all
        with pytest.raises(sandtree.ImageNotFound):
            b.read(rec.image, "/one")
        with pytest.raises(sandtree.NotFound):
            b.operation(rec.op)
        with pytest.raises(sandtree.InvalidInput):
            a.run(img, "true", op_id=rec.op)              # an operation id is never the caller's to pick
        assert a.operation(rec.op)["result"] == rec.image
        assert a.whoami()["limits"]["concurrent_runs"] == 1 and eng.whoami()["tenant"] == "local"
    finally:
        eng.close()


def test_mcp_over_http_as_a_tenant(srv, alice_world):
    """`sandtree mcp --url` with $SANDTREE_TOKEN: the agent gets Bob's view, nothing of Alice's."""
    import asyncio
    import os

    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters
    params = StdioServerParameters(command=sys.executable, args=["-m", "sandtree", "mcp", "--tools", "all", "--url", srv["url"]],
                                   env={**os.environ, "SANDTREE_TOKEN": srv["tokens"]["bob"]["token"]})

    def data(result):
        assert not result.is_error, result.content
        if result.structured_content is not None and "result" in result.structured_content:
            return result.structured_content["result"]
        return json.loads(result.content[0].text)

    async def main():
        async with Client(params) as c:
            assert data(await c.call_tool("whoami", {}))["user"] == "bob"
            listed = data(await c.call_tool("list_images", {}))
            assert alice_world["child"] not in json.dumps(listed)
            r = await c.call_tool("read_file", {"image": alice_world["child"], "path": "/note"})
            assert r.is_error and "no image" in r.content[0].text and "alice-secret" not in r.content[0].text
    asyncio.run(main())


def test_engine_for_dependency_in_another_router(tmp_path):
    """A router mounted beside /api/v1 (the Contree API does this) gets the caller's view through
    Depends(engine_for): the token decides, nothing else."""
    from fastapi.testclient import TestClient

    from sandtree.engine import Engine
    from sandtree.http.server import build_app
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        app = build_app(eng)

        @app.get("/v1/me")
        def me(engine: Caller) -> dict:
            return {"tenant": engine.whoami()["tenant"], "images": len(engine.images())}
        # a loopback Host: without tokens the server answers no other (DNS rebinding; issue 12)
        with TestClient(app, base_url="http://127.0.0.1") as c:
            assert c.get("/v1/me").json() == {"tenant": "local", "images": 0}
            t = eng.tenancy.create_token("zed", "list")
            assert c.get("/v1/me").status_code == 401                        # tokens exist now
            r = c.get("/v1/me", headers={"Authorization": f"Bearer {t['token']}"})
            assert r.json() == {"tenant": "zed", "images": 0}
    finally:
        eng.close()


def test_admin_sandbox_actions_are_audited(srv, alice_world):
    root = srv["c"]["root"]
    base = root.post("/images/import", content=srv["tar"]).json()["image"]
    sid = root.post("/sandboxes", json={"image": base}).json()["id"]
    try:
        r = root.post(f"/sandboxes/{sid}/exec", json={"command": "echo x > /tmp/y"}).json()
        assert r["outcome"]["exit_code"] == 0
        img = root.post(f"/sandboxes/{sid}/commit", json={}).json()["image"]
    finally:
        root.post(f"/sandboxes/{sid}/stop")
    log = [r for r in reversed(root.get("/audit", params={"limit": 10000}).json()) if r.get("sandbox") == sid]
    assert [r["action"] for r in log] == ["sandbox start", "exec", "sandbox commit", "sandbox stop"]
    assert log[0]["image"] == base and log[1]["command"] == "echo x > /tmp/y"
    assert log[2]["result"] == img and {r["tenant"] for r in log} == {"ops"}


def test_pools_are_the_administrators(srv, alice_world):
    a, root = srv["c"]["alice"], srv["c"]["root"]
    child = alice_world["child"]
    r = a.put(f"/pools/{child}", json={"size": 1})
    assert r.status_code == 403 and r.json()["error"] == "forbidden"
    assert a.get("/pools").json() == []
    assert root.put(f"/pools/{child}", json={"size": 1, "wait": True}).json()["ready"] == 1
    assert a.get("/pools").json() == []                  # a tenant does not see the server's pools
    run = a.post("/runs", json={"image": child, "command": "true"}).json()   # but its runs use them
    assert run["outcome"]["usage"].get("pool") is True
    assert root.delete(f"/pools/{child}").status_code == 204 and root.get("/pools").json() == []


def test_a_tenant_forks_through_its_own_runs(srv, alice_world):
    """POST /fork as a tenant: the engine's fan-out, each run the tenant's own (audited, its
    operation visible to it only, counted against its limits); another tenant's image is absent."""
    a, b = srv["c"]["alice"], srv["c"]["bob"]
    r = a.post("/fork", json={"image": "mine", "commands": ["echo one > /f", "echo two > /f"], "parallel": 1})
    assert r.status_code == 200, r.text
    runs = r.json()
    assert [x["outcome"]["exit_code"] for x in runs] == [0, 0]
    assert len({x["result"] for x in runs}) == 2                     # one branch each
    for x in runs:
        assert a.get(f"/operations/{x['id']}").status_code == 200
        assert b.get(f"/operations/{x['id']}").status_code == 404    # not bob's
        assert a.get(f"/images/{x['result']}/read", params={"path": "/f"}).status_code == 200
    audit = a.get("/audit", params={"limit": 20}).json()
    assert {x["id"] for x in runs} <= {e["op"] for e in audit if e["action"] == "run"}
    r = b.post("/fork", json={"image": alice_world["child"], "commands": ["true"]})
    assert r.status_code == 404 and r.json()["error"] == "image_not_found"
    d = srv["c"]["dave"]                                             # --max-timeout 2: a fork's runs too
    assert d.post("/images/import", params={"tag": "forkbase"}, content=srv["tar"]).status_code == 201
    r = d.post("/fork", json={"image": "forkbase", "commands": ["true", "true"], "timeout": 60})
    assert r.status_code == 429 and r.json()["error"] == "limit_exceeded", r.text


def test_another_tenants_sandbox_files_and_watches_do_not_exist(srv, alice_world):
    """stat, rename and watches of a live sandbox are its owner's: to another tenant the sandbox, and a
    watch id of it, answer as nonexistent ones, and nothing changes."""
    a, b = srv["c"]["alice"], srv["c"]["bob"]
    sid = a.post("/sandboxes", json={"image": "base"}).json()["id"]
    try:
        a.post(f"/sandboxes/{sid}/exec", json={"command": "mkdir -p /w && echo a > /w/f"})
        wid = a.post(f"/sandboxes/{sid}/watches", json={"path": "/w"}).json()["watch"]
        assert b.get(f"/sandboxes/{sid}/stat", params={"path": "/w/f"}).status_code == 404
        assert b.post(f"/sandboxes/{sid}/rename", json={"source": "/w/f", "destination": "/w/g"}).status_code == 404
        assert b.post(f"/sandboxes/{sid}/watches", json={"path": "/w"}).status_code == 404
        assert b.get(f"/sandboxes/{sid}/watches/{wid}/events").status_code == 404
        assert b.get(f"/sandboxes/{sid}/watches/{wid}/events", params={"stream": "true"}).status_code == 404
        assert b.delete(f"/sandboxes/{sid}/watches/{wid}").status_code == 404
        assert b.post("/images/import", params={"tag": "bob-base"}, content=srv["tar"]).status_code == 201
        bob_sid = b.post("/sandboxes", json={"image": "bob-base"}).json()["id"]
        try:                                                  # bob's own sandbox does not reach alice's watch
            assert b.get(f"/sandboxes/{bob_sid}/watches/{wid}/events").status_code == 404
            assert b.delete(f"/sandboxes/{bob_sid}/watches/{wid}").status_code == 404
        finally:
            b.post(f"/sandboxes/{bob_sid}/stop")
        assert a.get(f"/sandboxes/{sid}/stat", params={"path": "/w/f"}).json()["size"] == 2
        a.post(f"/sandboxes/{sid}/exec", json={"command": "echo more >> /w/f"})
        got = a.get(f"/sandboxes/{sid}/watches/{wid}/events", params={"timeout": 5}).json()["events"]
        assert ("f", "write") in {(e["name"], e["type"]) for e in got}                # alice's watch went on
    finally:
        a.post(f"/sandboxes/{sid}/stop")
