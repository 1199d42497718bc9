"""The /v1 gaps found by running Contree's clients (issue 16, item 3), on the wire against a real
`sandtree serve` on loopback: `~` and relative inspect paths, GET /files, image imports in the
operation list, preserve_cwd, networking on a server that gives none, a spawn that cannot start,
and a disposable run's end state (an ephemeral image: usable, unlisted)."""

from __future__ import annotations

import hashlib
import uuid

import httpx
import pytest
from conftest import serve_process

import sandtree


@pytest.fixture
def home(tmp_path, rootfs) -> str:
    h = str(tmp_path / "home")
    st = sandtree.Sandtree(h)
    st.import_image(rootfs, tag="ubuntu:latest")
    st.close()
    return h


@pytest.fixture
def server(home):
    with serve_process(home) as url:
        yield url


def run(url: str, **body) -> dict:
    r = httpx.post(f"{url}/v1/instances", json={"image": "tag:ubuntu:latest", **body})
    assert r.status_code == 201, r.text
    op = r.json()["uuid"]
    with httpx.stream("GET", f"{url}/v1/operations/{op}/events", params={"follow": "1"}, timeout=60) as s:
        for _ in s.iter_lines():
            pass
    return httpx.get(f"{url}/v1/operations/{op}").json()


def test_home_and_relative_paths(server):
    done = run(server, command="mkdir -p /root/notes /srv/app && echo hi > /root/notes/a && echo x > /srv/app/f",
               shell=True, disposable=False)
    image = done["result"]["image"]

    def ls(path):
        r = httpx.get(f"{server}/v1/inspect/{image}/list", params={"path": path})
        return r.status_code, sorted(f["path"] for f in r.json().get("files", []))
    assert ls("~") == (200, ["notes"])                        # uid 0's home in the image's /etc/passwd
    assert ls("~/notes") == (200, ["a"])
    assert ls("~user") == ls("/tmp")                           # another user's home (the test image: /tmp)
    assert ls("srv/app") == (200, ["f"])                       # relative: from the image's working directory
    assert ls("~nobody-here")[0] == 404
    dl = httpx.get(f"{server}/v1/inspect/{image}/download", params={"path": "~/notes/a"})
    assert dl.status_code == 200 and dl.content == b"hi\n"
    grep = httpx.get(f"{server}/v1/inspect/{image}/grep", params={"pattern": "hi", "path": "~"}).json()
    assert [m["path"] for m in grep["matches"]] == ["/root/notes/a"]
    assert httpx.head(f"{server}/v1/inspect/{image}/archive", params={"path": "~/notes"}).status_code == 200


def test_a_disposable_run_ends_in_an_ephemeral_image(server):
    listed = {i["uuid"] for i in httpx.get(f"{server}/v1/images").json()["images"]}
    done = run(server, command="echo state > /state", shell=True, disposable=True)
    image = done["result"]["image"]
    assert done["status"] == "SUCCESS" and image and image == done["result_image_uuid"]
    assert {i["uuid"] for i in httpx.get(f"{server}/v1/images").json()["images"]} == listed    # unlisted
    assert httpx.get(f"{server}/v1/inspect/{image}/download", params={"path": "/state"}).content == b"state\n"
    nxt = run(server, command="cat /state", shell=True, image=image)             # chains on it
    assert nxt["metadata"]["result"]["stdout"]["value"] == "state\n"
    assert httpx.patch(f"{server}/v1/images/{image}/tag", json={"tag": "kept"}).status_code == 200
    assert image in {i["uuid"] for i in httpx.get(f"{server}/v1/images").json()["images"]}  # a tag lists it


def test_spawn_failure_is_a_failed_operation(server):
    done = run(server, command="echo CHANGES > file.txt")          # shell=false: a path to an executable
    assert done["status"] == "FAILED" and done["result"] == {"image": None, "tag": None}
    assert done["error"] == "spawn failed: cannot execute 'echo CHANGES > file.txt': No such file or directory"
    listed = httpx.get(f"{server}/v1/operations", params={"status": "FAILED"}).json()
    assert listed[0]["error"] == done["error"]
    ok = run(server, command="sleep", args=["0"])                    # a relative name: found on PATH
    assert ok["status"] == "SUCCESS" and ok["metadata"]["result"]["state"]["exit_code"] == 0


def test_preserve_cwd(server):
    done = run(server, command="pwd", shell=True, cwd="/tmp", preserve_cwd=True, disposable=False)
    image = done["result"]["image"]
    after = run(server, command="pwd; cd /; echo moved", shell=True, image=image, disposable=False)
    assert after["metadata"]["result"]["stdout"]["value"] == "/tmp\nmoved\n"    # the saved default
    again = run(server, command="pwd", shell=True, image=after["result"]["image"])
    assert again["metadata"]["result"]["stdout"]["value"] == "/tmp\n"        # a command's cd saves nothing
    plain = run(server, command="pwd", shell=True, cwd="/var", disposable=False)
    assert run(server, command="pwd", shell=True, image=plain["result"]["image"])["metadata"]["result"]["stdout"][
        "value"] == "/\n"                                                   # without preserve_cwd: not saved
    same = run(server, command="true", shell=True, preserve_cwd=True, disposable=False)   # "/" already: no write
    assert same["result"]["image"] == same["image_uuid"]


def test_files_list_and_imports_listed(server):
    digests = []
    for body in (b"one\n", b"two\n"):
        r = httpx.post(f"{server}/v1/files", content=body, headers={"Content-Type": "application/octet-stream"})
        digests.append(r.json()["sha256"])
    files = httpx.get(f"{server}/v1/files").json()["files"]
    assert {f["sha256"] for f in files} >= set(digests)
    f = {f["sha256"]: f for f in files}[hashlib.sha256(b"one\n").hexdigest()]
    assert f["size"] == 4 and f["uuid"] == str(uuid.UUID(f["sha256"][:32])) and f["created_at"] and f["updated_at"]
    assert len(httpx.get(f"{server}/v1/files", params={"limit": 1}).json()["files"]) == 1
    assert httpx.get(f"{server}/v1/files", params={"since": "2999-01-01T00:00:00"}).json() == {"files": []}
    assert httpx.get(f"{server}/v1/files", params={"limit": 0}).status_code == 400
    run(server, command="true", shell=True)
    both = httpx.get(f"{server}/v1/operations").json()
    assert [o["kind"] for o in both] == ["instance", "image_import"]           # the fixture's import too
    assert [o["kind"] for o in httpx.get(f"{server}/v1/operations", params={"kind": "image_import"}).json()] \
        == ["image_import"]


def test_uploads_per_tenant(home):
    st = sandtree.Sandtree(home)
    try:
        a = st._engine.tenancy.create_token("alpha", None)["token"]
        b = st._engine.tenancy.create_token("beta", None)["token"]
        base = st._engine.resolve("ubuntu:latest")
        st._engine.tenancy.share(base)
        shared = str(uuid.UUID(base[:32]))
    finally:
        st.close()
    with serve_process(home) as url:
        def files(token):
            return {f["sha256"] for f in httpx.get(f"{url}/v1/files", headers={"Authorization": f"Bearer {token}"})
                    .json()["files"]}
        up = httpx.post(f"{url}/v1/files", content=b"alpha's", headers={"Authorization": f"Bearer {a}"}).json()
        assert files(a) == {up["sha256"]} and files(b) == set()
        assert httpx.get(f"{url}/api/v1/files", headers={"Authorization": f"Bearer {b}"}).json() == []
        # a tenant's disposable run: its end state usable by UUID (by it only), listed for nobody
        ha, hb = ({"Authorization": f"Bearer {t}"} for t in (a, b))
        before = httpx.get(f"{url}/v1/images", headers=ha).json()["images"]
        r = httpx.post(f"{url}/v1/instances", headers=ha, json={"command": "echo t > /t", "shell": True,
                                                                 "image": shared, "disposable": True})
        assert r.status_code == 201, r.text
        with httpx.stream("GET", f"{url}/v1/operations/{r.json()['uuid']}/events", params={"follow": "1"},
                          headers=ha, timeout=60) as s:
            for _ in s.iter_lines():
                pass
        image = httpx.get(f"{url}/v1/operations/{r.json()['uuid']}", headers=ha).json()["result"]["image"]
        assert image and image != shared
        assert httpx.get(f"{url}/v1/images", headers=ha).json()["images"] == before
        assert httpx.get(f"{url}/v1/inspect/{image}/download", params={"path": "/t"}, headers=ha).content == b"t\n"
        assert httpx.get(f"{url}/v1/inspect/{image}/", headers=hb).status_code == 404


def test_networking_on_a_server_without_network(home, monkeypatch):
    monkeypatch.setenv("SANDTREE_NETWORK_DEFAULT", "off")
    with serve_process(home) as url:
        r = httpx.post(f"{url}/v1/instances", json={"command": "true", "image": "tag:ubuntu:latest",
                                                    "networking": {"enabled": True}})
        assert r.status_code == 400 and "no network" in r.json()["error"]
        assert httpx.get(f"{url}/v1/operations", params={"kind": "instance"}).json() == []   # nothing ran
        ok = httpx.post(f"{url}/v1/instances", json={"command": "true", "image": "tag:ubuntu:latest",
                                                     "networking": {"enabled": False}})
        assert ok.status_code == 201
