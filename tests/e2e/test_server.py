"""The REST API against a real `sandtree serve` process on loopback, through httpx."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time

import httpx
import pytest

from conftest import free_port, serve_process, wait_for_port


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("server-home")
    with serve_process(home, "--max-runs", "2") as url, httpx.Client(base_url=url + "/api/v1", timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def image(server, rootfs):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.add(rootfs, arcname=".")
    r = server.post("/images/import", params={"tag": "bb"}, content=buf.getvalue())
    assert r.status_code == 201, r.text
    return r.json()["image"]


def test_health_and_openapi(server):
    assert server.get("/health").json()["ok"] is True
    spec = \
        httpx.get(str(server.base_url.copy_with(path="/openapi.json"))).json()
    assert "/api/v1/runs" in spec["paths"] and "/api/v1/operations/{op}/events" in spec["paths"]


def test_images_runs_and_inspection(server, image):
    assert any(i["id"] == image and "bb" in i["tags"] for i in server.get("/images").json())
    r = server.post("/runs", json={"image": "bb", "command": "echo hi > /x; cat /x; exit 3"}).json()
    assert r["status"] == "done" and r["outcome"]["exit_code"] == 3 and r["stdout"] == "hi\n"
    child = r["result"]
    assert server.get(f"/images/{child}/read", params={"path": "/x"}).content == b"hi\n"
    assert "x" in [e["name"] for e in server.get(f"/images/{child}/ls", params={"path": "/"}).json()]
    assert server.get(f"/images/{child}/grep", params={"pattern": "hi", "path": "/x"}).json()[0]["line"] == 1
    assert server.get(f"/images/{child}").json()["parents"] == [image]
    assert server.put("/tags/srv/x", json={"image": child}).json()["image"] == child
    assert server.get("/images/srv/x/read", params={"path": "/x"}).content == b"hi\n"
    up = server.post("/files", content=b"uploaded").json()["sha256"]
    r = server.post("/runs", json={"image": "bb", "command": "cat /u", "files": [{"path": "/u", "sha256": up}]})
    assert r.json()["stdout"] == "uploaded"
    d = server.get("/diff", params={"a": image, "b": child, "patch": True}).json()
    assert [c["path"] for c in d["changes"]] == ["/x"] and "+hi" in d["patch"]
    with tarfile.open(fileobj=io.BytesIO(server.get(f"/images/{child}/export", params={"path": "/x"}).content)) as t:
        assert t.getnames() == ["x"]


def test_errors_map_to_statuses(server, image):
    assert server.get("/images/nope").status_code == 404
    assert server.get(f"/images/{image}/read", params={"path": "/nope"}).status_code == 404
    r = server.get(f"/images/{image}/read", params={"path": "/../etc/shadow"})
    assert r.status_code == 400 and r.json()["error"] == "path_escape"
    assert server.post("/runs", json={"image": "bb", "command": "true", "timeout": -1}).status_code == 400
    assert server.post("/runs", json={"image": "bb"}).status_code == 422            # malformed body
    assert server.post("/runs", content=b"{not json").status_code == 422
    # every error in the one shape; a misspelt field is refused by name, not ignored
    r = server.post("/runs", json={"image": "bb", "command": "true", "timout": 5})
    assert r.status_code == 422 and r.json()["error"] == "invalid_input", r.text
    assert "timout" in r.json()["message"] and r.json()["fields"][0]["field"] == "timout"
    r = server.post("/runs", json={"image": "bb"})
    assert r.json()["error"] == "invalid_input" and "command" in r.json()["message"]
    assert server.get("/operations/nope").status_code == 404
    assert server.post("/images/import", content=b"junk").status_code == 400
    assert server.post("/branches", json={"name": "bad name!", "image": "bb"}).status_code == 400


def test_operations_queue_stream_and_cancel(server, image):
    a = server.post("/runs", json={"image": "bb", "command": "for i in 1 2 3; do echo line$i; sleep 0.2; done",
                                   "wait": False}).json()
    assert a["status"] in ("queued", "running")
    seen = []
    with server.stream("GET", f"/operations/{a['id']}/events") as s:
        for line in s.iter_lines():
            seen.append(line)
            if line.startswith("event: end"):
                break
    text = "\n".join(seen)
    assert "data: line1" in text and "data: line3" in text and "event: end" in text
    ids = [int(line[4:]) for line in seen if line.startswith("id: ")]
    # resume: with Last-Event-ID only what came after
    with server.stream("GET", f"/operations/{a['id']}/events", headers={"Last-Event-ID": str(ids[1])}) as s:
        rest = [line for line in s.iter_lines() if line.startswith("id: ")]
    assert [int(line[4:]) for line in rest] == ids[2:]
    done = server.post(f"/operations/{a['id']}/wait", params={"timeout": 30}).json()
    assert done["status"] == "done" and done["outcome"]["exit_code"] == 0
    # more runs than max_runs=2: the third waits in the queue, and a queued one can be cancelled
    long = [server.post("/runs", json={"image": "bb", "command": "sleep 5", "wait": False}).json()["id"]
            for _ in range(3)]
    time.sleep(0.5)
    states = [server.get(f"/operations/{o}").json()["status"] for o in long]
    assert states.count("running") == 2 and states.count("queued") == 1
    for o in long:
        assert server.post(f"/operations/{o}/cancel").json()["id"] == o
    for o in long:
        assert server.post(f"/operations/{o}/wait", params={"timeout": 30}).json()["status"] == "cancelled"
    assert server.post(f"/operations/{long[0]}/cancel").status_code == 400          # already over
    assert any(o["id"] == a["id"] for o in server.get("/operations", params={"limit": 20}).json())


def test_branches_merge_over_http(server, image):
    assert server.post("/branches", json={"name": "web", "image": "bb"}).status_code == 201
    one = server.post("/runs", json={"image": "branch:web", "command": "echo 1 > /one"}).json()["result"]
    assert server.get("/branches").json()["web"] == one
    other = server.post("/runs", json={"image": "bb", "command": "echo 2 > /two"}).json()["result"]
    m = server.post("/merge", json={"ours": one, "theirs": other}).json()
    assert m["image"] and m["conflicts"] == []
    assert server.post("/branches/web/rollback", json={"steps": 1}).json()["image"] == image
    assert server.delete("/branches/web").status_code == 200


def test_killed_server_loses_nothing_and_marks_runs_failed(tmp_path, rootfs):
    home = str(tmp_path / "home")
    port = free_port()
    cmd = [sys.executable, "-m", "sandtree", "--home", home, "serve", "--ports-port", "0", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 30)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=60) as c:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as t:
                t.add(rootfs, arcname=".")
            img = c.post("/images/import", content=buf.getvalue()).json()["image"]
            kept = c.post("/runs", json={"image": img, "command": "echo kept > /k"}).json()["result"]
            op = c.post("/runs", json={"image": img, "command": "sleep 60", "wait": False}).json()["id"]
            time.sleep(0.5)
    finally:
        proc.kill()                                        # kill -9 mid-run (the server alone)
        proc.wait()
    for _ in range(50):                                    # the sandbox dies with it (PDEATHSIG chain)
        if not _running_sandboxes(home):
            break
        time.sleep(0.1)
    assert not _running_sandboxes(home)
    port = free_port()
    proc = subprocess.Popen(cmd[:-1] + [str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 30)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=60) as c:
            c.get("/operations", params={"limit": 1})      # the engine's operations start (and recover)
            rec = c.get(f"/operations/{op}").json()
            assert rec["status"] == "failed" and rec["outcome"]["error"] == "interrupted"
            assert c.get(f"/images/{kept}/read", params={"path": "/k"}).content == b"kept\n"
            assert c.post("/admin/fsck").json()["ok"]
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _running_sandboxes(home: str) -> list[str]:
    """Sandboxes of the store at `home` (their helper runs from home/bin; the init is its child)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,stat=,args="], capture_output=True, text=True).stdout
    rows = [l.split(None, 3) for l in out.splitlines() if len(l.split(None, 3)) == 4]
    helpers = {r[0] for r in rows if home in r[3]}
    return [" ".join(r) for r in rows if "sandtree-init" in r[3] and r[1] in helpers and r[2][0] != "Z"]


def test_metrics(server, image):
    server.post("/runs", json={"image": "bb", "command": "true"})
    text = httpx.get(str(server.base_url.copy_with(path="/metrics"))).text
    lines = dict(l.rsplit(" ", 1) for l in text.splitlines() if l and not l.startswith("#"))
    assert int(lines["sandtree_runs_started_total"]) >= 1
    assert int(lines['sandtree_runs_finished_total{status="done"}']) >= 1
    assert int(lines['sandtree_run_seconds_bucket{le="+Inf"}']) >= 1
    assert int(lines["sandtree_images"]) >= 1 and "sandtree_queue_depth" in lines


def test_fuzzed_requests_never_5xx(server, image, tmp_path):
    """schemathesis, driven by our own OpenAPI document, against the running server: no 5xx,
    every status a documented one, every answer (errors included) in its documented schema.
    Path parameters and bodies name an image and a sandbox that exist most of the time, so the
    requests reach the routes' logic, not only their 404s."""
    import shutil
    exe = shutil.which("schemathesis") or os.path.join(os.path.dirname(sys.executable), "schemathesis")
    if not os.path.exists(exe):
        pytest.skip("schemathesis is not installed")
    sid = server.post("/sandboxes", json={"image": "bb", "lifetime": 1800}).json()["id"]
    (tmp_path / "schemathesis.toml").write_text(f"""
[dictionaries.images]
values = ["bb", "{image}"]
[dictionaries.sandboxes]
values = ["{sid}"]
[parameters]
"path.ref" = {{ dictionary = "images", probability = 0.8 }}
"path.image" = {{ dictionary = "images", probability = 0.8 }}
"path.sid" = {{ dictionary = "sandboxes", probability = 0.8 }}
"body.image" = {{ dictionary = "images", probability = 0.8 }}
""")
    spec = str(server.base_url.copy_with(path="/openapi.json"))
    try:
        p = subprocess.run([exe, "run", spec, "--checks",
                            "not_a_server_error,status_code_conformance,response_schema_conformance",
                            "--max-examples", "10",
                            # pull, push and login would reach registries the fuzzer names, off this machine
                            "--exclude-path-regex", "/events|/admin/gc|/images/pull|/push|/registries|^/v1/images/import",
                            "--request-timeout", "60", "--seed", "1"], capture_output=True, text=True, timeout=900,
                           cwd=tmp_path)                 # its config; its cache stays out of the checkout
    finally:
        # what the fuzzer started (sandboxes live past the server: their lifetimes end them)
        for sb in server.get("/sandboxes", params={"all": True}).json():
            if sb["state"] not in ("stopped", "expired", "gone"):
                server.post(f"/sandboxes/{sb['id']}/stop")
        for pool in server.get("/pools").json():
            server.delete(f"/pools/{pool['image']}")
    assert p.returncode == 0, p.stdout[-8000:]
    assert "Configuration:    " + str(tmp_path / "schemathesis.toml") in p.stdout      # the ids were used
