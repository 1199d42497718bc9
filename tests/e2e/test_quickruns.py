"""POST /api/v1/runs answered before FastAPI's routing (http/quickruns.py) against a real `sandtree
serve` with tokens: the same answers, errors, audit entries and tenant checks as FastAPI's own route.

FastAPI's route is reached with the same body under another JSON content type
(application/merge-patch+json: FastAPI reads any `+json` type as JSON; quickruns takes only
application/json), so each case is answered both ways and compared."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile

import httpx
import pytest

from conftest import free_port, wait_for_port

QUICK, ROUTE = "application/json", "application/merge-patch+json"
VOLATILE = ("id", "started", "finished", "result")


def _token(home, tenant: str, *extra: str) -> str:
    p = subprocess.run([sys.executable, "-m", "sandtree", "--home", str(home), "token", "create", "--tenant", tenant,
                        "--json", *extra], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(p.stdout)["token"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory, rootfs):
    home = tmp_path_factory.mktemp("quickruns-home")
    toks = {"alice": _token(home, "alice"), "carol": _token(home, "carol", "--scopes", "list"),
            "dave": _token(home, "dave", "--max-timeout", "2"), "root": _token(home, "ops", "--scopes", "admin")}
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", str(home), "serve", "--port", str(port),
                             "--ports-port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    clients = {}
    try:
        wait_for_port(port, 30)
        url = f"http://127.0.0.1:{port}/api/v1"
        clients = {n: httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {t}"})
                   for n, t in toks.items()}
        clients["nobody"] = httpx.Client(base_url=url, timeout=60)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            t.add(rootfs, arcname=".")
        for who in ("alice", "dave", "carol"):
            if who != "carol":
                r = clients[who].post("/images/import", params={"tag": "base"}, content=buf.getvalue())
                assert r.status_code == 201, r.text
        yield clients
    finally:
        for c in clients.values():
            c.close()
        proc.terminate()
        proc.wait(timeout=15)


def both(c: httpx.Client, body) -> tuple[httpx.Response, httpx.Response]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return tuple(c.post("/runs", content=raw, headers={"content-type": t}) for t in (QUICK, ROUTE))


def same(a: httpx.Response, b: httpx.Response) -> None:
    assert a.status_code == b.status_code, (a.text, b.text)
    ja, jb = a.json(), b.json()
    if isinstance(ja, dict) and "id" in ja:
        ja, jb = ({k: v for k, v in j.items() if k not in VOLATILE} for j in (ja, jb))
        for j in (ja, jb):
            (j.get("outcome") or {}).pop("usage", None)
    assert ja == jb


def audit_len(srv) -> int:
    return len(srv["root"].get("/audit", params={"limit": 10000}).json())


def runs_of(c: httpx.Client) -> set[str]:
    return {o["id"] for o in c.get("/operations", params={"limit": 1000}).json()}


def test_a_run_is_answered_the_same_and_audited(srv):
    a = srv["alice"]
    before, ops = audit_len(srv), runs_of(a)
    quick, route = both(a, {"image": "base", "command": "echo hi; echo err >&2; exit 3", "env": {"K": "v"}})
    assert quick.status_code == 201 and quick.json()["status"] == "done"
    assert quick.json()["stdout"] == "hi\n" and quick.json()["stderr"] == "err\n"
    assert quick.json()["outcome"]["exit_code"] == 3
    same(quick, route)
    assert audit_len(srv) == before + 2                        # one audit entry each, as before
    assert runs_of(a) == ops | {quick.json()["id"], route.json()["id"]}
    queued, _ = both(a, {"image": "base", "command": "true", "wait": False})
    assert queued.status_code == 201 and queued.json()["status"] in ("queued", "running", "done")
    done = a.post(f"/operations/{queued.json()['id']}/wait").json()
    assert done["status"] == "done"


@pytest.mark.parametrize("body", [
    {"image": "base", "command": "true", "timeout": "soon"},            # a field of the wrong type
    {"command": "true"},                                                # a field missing
    {"image": "base", "command": "true", "wait": "maybe"},
    {"image": "base", "command": 7},
    ["base", "true"],                                                   # JSON, not an object
    b"{not json",
    b"",
    {"image": "nothing-of-that-name", "command": "true"},              # the engine's 404
    {"image": "base", "command": "true", "stdin": "a", "stdin_base64": "YQ=="},   # 400
    {"image": "base", "command": "true", "stdin_base64": "%%%"},
    {"image": "base", "command": "true", "disposable": "sometimes"},
    {"image": "base", "command": "true", "cwd": "/no/such/dir"},
    {"image": "base", "command": "true", "memory": "lots"},
], ids=lambda b: repr(b)[:40])
def test_bad_input_same_typed_error_and_nothing_changes(srv, body):
    a = srv["alice"]
    before, ops = audit_len(srv), runs_of(a)
    quick, route = both(a, body)
    assert 400 <= quick.status_code < 500 and "error" in quick.json()
    same(quick, route)
    assert audit_len(srv) == before and runs_of(a) == ops


def test_tenant_checks_and_limits_hold(srv):
    for who, body, status in (("nobody", {"image": "base", "command": "true"}, 401),      # no token
                              ("carol", {"image": "base", "command": "true"}, 403),       # no run scope
                              ("dave", {"image": "base", "command": "true", "timeout": 60}, 429)):  # over its limit
        before = audit_len(srv)
        quick, route = both(srv[who], body)
        assert quick.status_code == status, quick.text
        same(quick, route)
        assert audit_len(srv) == before
    # another tenant's image does not exist for alice, whichever way she asks
    daves = srv["dave"].post("/runs", json={"image": "base", "command": "echo dave > /d"}).json()["result"]
    quick, route = both(srv["alice"], {"image": daves, "command": "true"})
    assert quick.status_code == 404
    same(quick, route)


def test_a_body_over_the_cap_is_refused(srv):
    big = json.dumps({"image": "base", "command": "true", "env": {"X": "y" * (33 << 20)}}).encode()
    quick = srv["alice"].post("/runs", content=big, headers={"content-type": QUICK})
    assert quick.status_code == 413 and quick.json()["error"] == "too_large"
    def chunks():                                # no Content-Length: counted while it streams
        for i in range(0, len(big), 1 << 20):
            yield big[i:i + (1 << 20)]
    # (FastAPI's route answers this one 400 {"detail": ...}: it turns any error while reading a
    # body into that; the body cap's own 413 is what bodylimit.py documents)
    r = srv["alice"].post("/runs", content=chunks(), headers={"content-type": QUICK})
    assert r.status_code == 413 and r.json()["error"] == "too_large", r.text
