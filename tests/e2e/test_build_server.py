"""Builds through a real `sandtree serve` on loopback (issue 15 item 7): POST /api/v1/builds with a
context tar streams the steps as Server-Sent Events and gives the in-process build's image ID; the
remote SDK, the CLI with --server and the MCP `build` tool reach the same build; malicious context
tars are refused with nothing built; tenants and the operator get only the cache hits they may (each
only its own results: rows are per principal), their network grant bounds RUN steps (403), and
builds are audited."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import tarfile

import httpx
import pytest
from conftest import listening

import sandtree

DOCKERFILE = """\
FROM base
WORKDIR /app
COPY hello.txt .
COPY sub/ /app/sub/
RUN cat hello.txt sub/inner.txt > out.txt && echo built >> out.txt
ENV GREETING=hi
"""


def cli(home, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sandtree", "--home", str(home), *args], capture_output=True,
                          text=True, timeout=120, env=env)


def token(home, tenant, *extra) -> str:
    p = cli(home, "token", "create", "--tenant", tenant, "--json", *extra)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["token"]


def tar_of(members) -> bytes:
    """A tar from (TarInfo fields, data) pairs, written as given (nothing cleaned)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for fields, data in members:
            info = tarfile.TarInfo(fields.pop("name"))
            for k, v in fields.items():
                setattr(info, k, v)
            info.size = len(data or b"")
            t.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def dir_tar(path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        t.add(path, arcname=".")
    return buf.getvalue()


def sse(r: httpx.Response) -> list[tuple[str, dict]]:
    out, event = [], None
    for line in r.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            out.append((event, json.loads(line[6:])))
    return out


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    d = tmp_path_factory.mktemp("ctx")
    (d / "hello.txt").write_text("hello\n")
    (d / "sub").mkdir()
    (d / "sub" / "inner.txt").write_text("inner\n")
    (d / "Dockerfile").write_text(DOCKERFILE)
    return d


@pytest.fixture(scope="module")
def srv(tmp_path_factory, rootfs):
    home = tmp_path_factory.mktemp("build-server")
    toks = {"alice": token(home, "alice"), "bob": token(home, "bob"), "ops": token(home, "ops", "--scopes", "admin")}
    base_tar = dir_tar(rootfs)
    with listening(home, "serve") as url:
        clients = {n: httpx.Client(base_url=url + "/api/v1", timeout=120, headers={"Authorization": f"Bearer {t}"})
                   for n, t in toks.items()}
        try:
            for n in ("alice", "bob"):
                r = clients[n].post("/images/import", params={"tag": "base"}, content=base_tar)
                assert r.status_code == 201, r.text
            yield {"home": home, "url": url, "tokens": toks, "c": clients, "base": r.json()["image"],
                   "base_tar": base_tar}
        finally:
            for c in clients.values():
                c.close()


def post_build(client, body: bytes, **params) -> tuple[int, object]:
    """(status, SSE events) of a build, or (status, the error JSON) when refused before any step."""
    with client.stream("POST", "/builds", params=params, content=body) as r:
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            return r.status_code, sse(r)
        r.read()
        return r.status_code, r.json()


def test_a_rest_build_streams_its_steps_in_order_and_gives_the_in_process_id(srv, ctx, tmp_path):
    a = srv["c"]["alice"]
    status, events = post_build(a, dir_tar(ctx), tag="app")
    assert status == 200, events
    kinds = [k for k, _ in events]
    assert kinds[-1] == "result" and set(kinds[:-1]) == {"progress"}, kinds
    progress = [e for k, e in events if k == "progress"]
    ends = [e for e in progress if e["status"] in ("done", "cached")]
    assert [e["step"] for e in ends] == list(range(1, 7))                    # every step ends, in order
    steps = [e["step"] for e in progress]
    assert steps == sorted(steps)                                            # never out of order
    run_step = [e for e in progress if e["step"] == 5]
    assert run_step[0]["status"] == "running" and run_step[-1]["status"] == "done"
    result = events[-1][1]
    assert [s["cached"] for s in result["steps"]][1:] == [False] * 5
    # the same Dockerfile and files built in process on another store: the same image
    tarpath = tmp_path / "base.tar"
    tarpath.write_bytes(srv["base_tar"])
    st = sandtree.Sandtree(str(tmp_path / "home"), warm=0)
    try:
        assert st.engine.import_path(str(tarpath), tag="base") == srv["base"]
        local = st.engine.build_context(str(ctx), tag="app")
        assert local.image == result["image"]
    finally:
        st.close()
    assert a.get("/images/app/read", params={"path": "/app/out.txt"}).content == b"hello\ninner\nbuilt\n"
    cfg = a.get("/images/app/config").json()["config"]
    assert "GREETING=hi" in cfg["Env"] and cfg["WorkingDir"] == "/app"
    # a rebuild is all cache hits, the same ID
    status, again = post_build(a, dir_tar(ctx))
    assert [s["cached"] for s in again[-1][1]["steps"]] == [True] * 6 and again[-1][1]["image"] == result["image"]
    # configure over REST: a new image with another config, the tenant's own
    r = a.post("/images/app/configure", json={"config": {**cfg, "WorkingDir": "/srv"}, "tag": "app-srv"})
    assert r.status_code == 201, r.text
    assert a.get("/images/app-srv/config").json()["config"]["WorkingDir"] == "/srv"
    audit = a.get("/audit").json()
    built = [x for x in audit if x["action"] == "build" and x.get("result") == result["image"]]
    assert built and built[-1]["tag"] == "app" and built[-1]["steps"] == 6


def test_malicious_context_tars_are_refused_and_nothing_is_built(srv):
    a = srv["c"]["alice"]
    before = len(a.get("/images").json())
    ops_before = len(a.get("/operations", params={"limit": 1000}).json())
    df = "FROM base\nCOPY . /ctx/\nRUN touch /ran\n"
    f = {"mode": 0o644}
    cases = {
        "absolute": (tar_of([({"name": "/etc/evil", **f}, b"x")]), "absolute"),
        "dotdot": (tar_of([({"name": "a/../../evil", **f}, b"x")]), ".."),
        "through a link": (tar_of([({"name": "l", "type": tarfile.SYMTYPE, "linkname": "/tmp"}, None),
                                   ({"name": "l/evil", **f}, b"x")]), "symlink"),
        "device": (tar_of([({"name": "disk", "type": tarfile.BLKTYPE, "devmajor": 8, "devminor": 0}, None)]),
                   "device node"),
        "fifo": (tar_of([({"name": "p", "type": tarfile.FIFOTYPE}, None)]), "FIFO"),
        "hard link out": (tar_of([({"name": "h", "type": tarfile.LNKTYPE, "linkname": "/etc/passwd"}, None)]),
                          "absolute"),
        "too deep": (tar_of([({"name": "/".join(["d"] * 130) + "/f", **f}, b"x")]), "deeper than 128"),
    }
    for name, (body, says) in cases.items():
        status, err = post_build(a, body, text=df, tag=f"evil-{name.replace(' ', '-')}")
        assert 400 <= status < 500, (name, status, err)
        assert says in err["message"], (name, err)
        print(name, status, err["message"])
    # a symlink out of the context, then COPY through it: refused naming the line
    link = tar_of([({"name": "out", "type": tarfile.SYMTYPE, "linkname": "/etc"}, None)])
    status, err = post_build(a, link, text="FROM base\nCOPY out/passwd /stolen\n", tag="evil-copy")
    assert status == 400 and "line 2" in err["message"] and "symlink" in err["message"], err
    status, err = post_build(a, link, text="FROM base\nCOPY out /stolen\n", tag="evil-copy")
    assert status == 400 and "outside the build context" in err["message"], err
    # a huge member count (the same directory member 200,001 times: cheap to make, counted all the same)
    hdr = tarfile.TarInfo("d")
    hdr.type, hdr.mode = tarfile.DIRTYPE, 0o755
    huge = hdr.tobuf(tarfile.USTAR_FORMAT) * 200_001 + b"\0" * 1024
    status, err = post_build(a, huge, text=df, tag="evil-huge")
    assert status == 413 and "more than 200000 entries" in err["message"], err
    # nothing was built, nothing tagged, no operation ran, no staging left
    assert len(a.get("/images").json()) == before
    assert len(a.get("/operations", params={"limit": 1000}).json()) == ops_before
    assert not [t for t in a.get("/tags").json() if t.startswith("evil")]
    assert not [n for n in os.listdir(os.path.join(srv["home"], "tmp")) if n.startswith("context-")]


def test_the_remote_sdk_builds_dockerfiles_and_recipes(srv, ctx, tmp_path):
    st = sandtree.connect(srv["url"], token=srv["tokens"]["alice"])
    local = sandtree.Sandtree(str(tmp_path / "home"), warm=0)
    try:
        events = []
        res = st.build_context(str(ctx), tag="sdk-app", progress=events.append)
        assert res.image == st.image("app").id and all(s.cached for s in res.steps)
        assert events and events[-1]["status"] == "cached"
        # the Python builder: its steps travel as the Dockerfile they are, with the files they list
        recipe = st.recipe("base", context=str(ctx)).workdir("/app").copy("hello.txt", "/app/") \
            .copy("sub", "/app/sub").run("cat hello.txt sub/inner.txt > out.txt").env(GREETING="hi")
        out = []
        img = recipe.build(tag="from-recipe", progress=out.append)
        assert img.read("/app/out.txt") == b"hello\ninner\n"
        assert any(e["status"] == "running" for e in out)
        tarpath = tmp_path / "base.tar"
        tarpath.write_bytes(srv["base_tar"])
        local.engine.import_path(str(tarpath), tag="base")
        same = local.recipe("base", context=str(ctx)).workdir("/app").copy("hello.txt", "/app/") \
            .copy("sub", "/app/sub").run("cat hello.txt sub/inner.txt > out.txt").env(GREETING="hi").build()
        assert same.id == img.id
        assert img.config()["WorkingDir"] == "/app"                # over HTTP: the OCI config object
    finally:
        st.close()
        local.close()


def test_the_cli_builds_against_a_server(srv, ctx, tmp_path):
    env = {**os.environ, "SANDTREE_TOKEN": srv["tokens"]["bob"]}
    p = cli(tmp_path / "unused", "build", str(ctx), "--server", srv["url"], "--tag", "cli-app", "--progress",
            "plain", env=env)
    assert p.returncode == 0, p.stderr
    image = p.stdout.strip()
    assert "#5 DONE" in p.stderr or "#5 CACHED" in p.stderr, p.stderr
    b = srv["c"]["bob"]
    assert b.get("/resolve", params={"ref": "cli-app"}).json()["image"] == image
    assert b.get("/images/cli-app/read", params={"path": "/app/out.txt"}).content == b"hello\ninner\nbuilt\n"
    # -f from outside the context: sent as the Dockerfile's text
    other = tmp_path / "Other.dockerfile"
    other.write_text("FROM base\nCOPY hello.txt /h\n")
    p = cli(tmp_path / "unused", "build", str(ctx), "-f", str(other), "--server", srv["url"], "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["steps"][1]["text"] == "COPY hello.txt /h"
    assert not (tmp_path / "unused").exists()             # nothing local: the server built it


def test_the_mcp_build_tool(srv):
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters
    params = StdioServerParameters(command=sys.executable, args=["-m", "sandtree", "mcp", "--tools", "all", "--url", srv["url"]],
                                   env={**os.environ, "SANDTREE_TOKEN": srv["tokens"]["bob"]})

    def data(result):
        assert not result.is_error, result.content
        if result.structured_content is not None and "result" in result.structured_content:
            return result.structured_content["result"]
        return json.loads(result.content[0].text)

    async def main():
        async with Client(params) as c:
            sha = data(await c.call_tool("upload", {"content": "from mcp\n"}))["sha256"]
            df = "FROM base\nCOPY note.txt /note.txt\nRUN cat /note.txt > /copy.txt\nENV MODE=mcp\n"
            res = data(await c.call_tool("build", {"dockerfile": df, "files": {"note.txt": sha}, "tag": "mcp-app"}))
            assert [s["cached"] for s in res["steps"]] == [True, False, False, False]
            assert res["steps"][2]["text"] == "RUN cat /note.txt > /copy.txt"
            again = data(await c.call_tool("build", {"dockerfile": df, "files": {"note.txt": sha}}))
            assert again["image"] == res["image"] and all(s["cached"] for s in again["steps"])
            cfg = data(await c.call_tool("image_config", {"image": "mcp-app"}))
            assert "MODE=mcp" in cfg["config"]["Env"]
            r = await c.call_tool("build", {"dockerfile": "FROM base\nCOPY nothing /x\n"})
            assert r.is_error and "line 2" in r.content[0].text
        return res["image"]
    image = asyncio.run(main())
    assert srv["c"]["bob"].get("/images/mcp-app/read", params={"path": "/copy.txt"}).content == b"from mcp\n"
    assert srv["c"]["bob"].get("/resolve", params={"ref": "mcp-app"}).json()["image"] == image


def test_tenants_share_only_the_cache_hits_they_may(srv, ctx):
    a, b = srv["c"]["alice"], srv["c"]["bob"]
    df = "FROM base\nCOPY hello.txt /h.txt\nRUN head -c 16 /dev/urandom | od -x > /key\n"
    body = tar_of([({"name": "hello.txt", "mode": 0o644}, b"hello\n")])
    _, ev = post_build(a, body, text=df, tag="keyed")
    alice = ev[-1][1]
    assert [s["cached"] for s in alice["steps"]] == [True, False, False]
    alice_key = a.get("/images/keyed/read", params={"path": "/key"}).content
    # Bob, the same inputs: none of Alice's private results is his hit (a COPY hit would tell him she
    # copied exactly these bytes there; her RUN's result holds the key her run made). His steps run:
    # the COPY converges on the same image (now his too), the RUN makes his own key
    _, ev = post_build(b, body, text=df, tag="keyed")
    bob = ev[-1][1]
    assert [s["cached"] for s in bob["steps"]] == [True, False, False]
    assert bob["steps"][1]["image"] == alice["steps"][1]["image"]
    _, ev = post_build(b, body, text=df)
    assert [s["cached"] for s in ev[-1][1]["steps"]] == [True, True, True]   # his own results: his hits
    assert bob["image"] != alice["image"]
    assert b.get("/images/keyed/read", params={"path": "/key"}).content != alice_key
    assert b.get(f"/images/{alice['image']}").status_code == 404          # hers stays hers
    # a result Alice shared is visible to Bob, yet not his hit: who built a step decided what its RUN
    # wrote (cache rows are per principal); he names her image to start from it
    df2 = "FROM base\nRUN head -c 16 /dev/urandom | od -x > /shared-key\n"
    _, ev = post_build(a, b"", text=df2)
    shared = ev[-1][1]["image"]
    assert a.post(f"/images/{shared}/share", json={"public": True}).status_code == 200
    _, ev = post_build(b, b"", text=df2)
    assert ev[-1][1]["image"] != shared and not ev[-1][1]["steps"][1]["cached"]
    _, ev = post_build(b, b"", text=f"FROM {shared}\n")
    assert ev[-1][1]["image"] == shared


def test_a_networked_step_beyond_the_grant_is_refused_with_403(srv, ctx):
    b = srv["c"]["bob"]                                      # no network grant (the default: off)
    ops = len(b.get("/operations", params={"limit": 1000}).json())
    body = tar_of([({"name": "hello.txt", "mode": 0o644}, b"hello\n")])
    status, err = post_build(b, body, text="FROM base\nRUN --network=none true\nRUN --network=pypi.org pip download x\n",
                             network="all")
    assert status == 403 and err["error"] == "forbidden" and "line 3" in err["message"] and "pypi.org" in \
        err["message"], err
    # a step's own --network only narrows the build's: with none given it is refused (line named)
    status, err = post_build(b, body, text="FROM base\nRUN true\nRUN --network=pypi.org pip download x\n")
    assert status == 400 and "line 3" in err["message"] and "build's network" in err["message"], err
    status, err = post_build(b, body, text="FROM base\nRUN echo hi\n", network="all")
    assert status == 403 and "line 2" in err["message"], err
    assert len(b.get("/operations", params={"limit": 1000}).json()) == ops     # nothing ran
    assert [x for x in b.get("/audit").json() if x["action"] == "build" and x.get("error") == "forbidden"]


def test_a_context_over_the_tenants_upload_cap_is_refused(srv):
    """The context tar is an upload: the tenant's max_upload bounds it while it streams (413)."""
    t = token(srv["home"], "small", "--max-upload", "4K")
    with httpx.Client(base_url=srv["url"] + "/api/v1", timeout=60, headers={"Authorization": f"Bearer {t}"}) as c:
        big = tar_of([({"name": "big.bin", "mode": 0o644}, b"x" * 64 * 1024)])
        status, err = post_build(c, big, text="FROM scratch\nCOPY big.bin /\n")
        assert status == 413 and err["error"] == "too_large", err

        def chunks():                            # no Content-Length: refused while streaming
            yield big[:2048]
            yield big[2048:]
        with c.stream("POST", "/builds", params={"text": "FROM scratch\nCOPY big.bin /\n"}, content=chunks()) as r:
            r.read()
            assert r.status_code == 413, r.text
        assert not [n for n in os.listdir(os.path.join(srv["home"], "tmp")) if n.startswith("upload-")]


def test_the_embedded_mcp_build_tool_takes_a_file_set(tmp_path, rootfs, ctx):
    """`sandtree mcp` on its own store (stdio): rsync makes a file set of the context, `build` takes
    it as directory_state_id; the image (and every step) is the in-process build's of the directory."""
    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters
    params = StdioServerParameters(command=sys.executable, args=["-m", "sandtree", "--home", str(tmp_path / "h"),
                                                                 "mcp", "--tools", "all"], env=dict(os.environ))

    def data(result):
        assert not result.is_error, result.content
        if result.structured_content is not None and "result" in result.structured_content:
            return result.structured_content["result"]
        return json.loads(result.content[0].text)

    async def main():
        async with Client(params) as c:
            data(await c.call_tool("import_image", {"source": rootfs, "tag": "base"}))
            fs = data(await c.call_tool("rsync", {"source": str(ctx), "destination": "/"}))
            res = data(await c.call_tool("build", {"dockerfile": DOCKERFILE,
                                                   "directory_state_id": fs["directory_state_id"]}))
            assert [s["cached"] for s in res["steps"]][1:] == [False] * 5
            return res["image"]
    image = asyncio.run(main())
    local = sandtree.Sandtree(str(tmp_path / "h"), warm=0)
    try:
        assert local.image(image).read("/app/out.txt") == b"hello\ninner\nbuilt\n"
        same = local.build_context(str(ctx))                  # the context directory itself, in process
        assert same.image == image and all(s.cached for s in same.steps)
    finally:
        local.close()


def test_an_admin_build_is_audited(srv):
    ops = srv["c"]["ops"]
    status, events = post_build(ops, b"", text=f"FROM {srv['base']}\nRUN echo admin > /who\n", tag="admin-built")
    assert status == 200 and events[-1][0] == "result", events
    image = events[-1][1]["image"]
    rec = [x for x in ops.get("/audit").json() if x["action"] == "build" and x["tenant"] == "ops"]
    assert rec and rec[0]["result"] == image and rec[0]["tag"] == "admin-built" and rec[0]["steps"] == 2


def test_a_tenants_run_steps_get_its_limits(srv):
    """A build's RUN steps are the tenant's runs: its max_timeout ends one (BuildFailed, as an SSE
    error naming the line), and nothing is tagged."""
    t = token(srv["home"], "slow", "--max-timeout", "1")
    with httpx.Client(base_url=srv["url"] + "/api/v1", timeout=60, headers={"Authorization": f"Bearer {t}"}) as c:
        assert c.post("/images/import", params={"tag": "base"}, content=srv["base_tar"]).status_code == 201
        status, events = post_build(c, b"", text="FROM base\nRUN sleep 5\n", tag="never")
        assert status == 200 and events[-1][0] == "error", events
        err = events[-1][1]
        assert err["error"] == "build_failed" and "line 2" in err["message"] and "timed out" in err["message"], err
        assert c.get("/resolve", params={"ref": "never"}).status_code == 404


def test_a_tenants_build_never_becomes_the_operators_cache_hit(srv):
    """Cache rows are per principal. The operator (an admin token) builds a step whose RUN writes a
    random token; Alice, who cannot see that image, builds the same step and runs it again: her row
    must not replace the operator's, whose next build is still its own image and token (a recipe
    pool would roll onto hers; a key generated at build time would be hers to know). And the
    other way: the operator, who sees every image, does not take a tenant's result as its hit."""
    ops, a, b = srv["c"]["ops"], srv["c"]["alice"], srv["c"]["bob"]
    df = f"FROM {srv['base']}\nRUN head -c 16 /dev/urandom | od -x > /build-key\n"

    def build(client, text):
        status, ev = post_build(client, b"", text=text)
        assert status == 200 and ev[-1][0] == "result", ev
        return ev[-1][1]

    def key(client, image):
        r = client.get(f"/images/{image}/read", params={"path": "/build-key"})
        assert r.status_code == 200, r.text
        return r.content

    mine = build(ops, df)
    assert [s["cached"] for s in mine["steps"]] == [True, False]
    op_key = key(ops, mine["image"])
    alice = build(a, df)
    assert [s["cached"] for s in alice["steps"]] == [True, False] and alice["image"] != mine["image"]
    again = build(ops, df)
    assert [s["cached"] for s in again["steps"]] == [True, True]
    assert again["image"] == mine["image"] and key(ops, again["image"]) == op_key
    assert build(a, df)["image"] == alice["image"]            # her own row is still her hit
    bob = build(b, df)                                        # and one tenant's never another's
    assert not bob["steps"][1]["cached"] and bob["image"] not in (alice["image"], mine["image"])
    assert build(a, df)["image"] == alice["image"] and build(ops, df)["image"] == mine["image"]
    # a tenant first: the operator sees its image, yet runs the step itself
    df2 = f"FROM {srv['base']}\nRUN head -c 16 /dev/urandom | od -x > /build-key-2\n"
    first = build(a, df2)
    ours = build(ops, df2)
    assert not ours["steps"][1]["cached"] and ours["image"] != first["image"]
    assert build(a, df2)["image"] == first["image"] and build(ops, df2)["image"] == ours["image"]
