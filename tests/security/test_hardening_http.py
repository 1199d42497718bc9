"""The HTTP layer's generic robustness (findings 9, 12, 13, 14 of the security review): every input
gets a typed 4xx in the one error shape, a bug a logged typed 500, every error status is in the
OpenAPI document, and connections are bounded (header sizes, a header timeout, connections per
client). Against real `sandtree serve` processes on loopback, with raw sockets where the client
must misbehave."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time

import httpx
import pytest

import sandtree
from sandtree.engine import Engine
from sandtree.errors import ERRORS, Conflict, InvalidInput, NotFound

from conftest import free_port, serve_process, wait_for_port

J = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, rootfs):
    home = tmp_path_factory.mktemp("http-home")
    with serve_process(home) as url, httpx.Client(base_url=url, timeout=60) as c:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            t.add(rootfs, arcname=".")
        r = c.post("/api/v1/images/import", params={"tag": "bb"}, content=buf.getvalue())
        assert r.status_code == 201, r.text
        yield c


def shaped(r, status: int | tuple = None, contree: bool = False) -> dict:
    """The answer is an error in the one shape (Contree's under /v1), with this status."""
    assert r.headers["content-type"].startswith("application/json"), (r.status_code, r.text[:300])
    body = r.json()
    if status is not None:
        assert r.status_code in (status if isinstance(status, tuple) else (status,)), (r.status_code, r.text[:300])
    if contree:
        assert set(body) == {"error", "status"} and body["status"] == r.status_code, body
    else:
        assert isinstance(body.get("error"), str) and isinstance(body.get("message"), str), body
        assert "detail" not in body, body
    return body


# ---- finding 12: every input gets a typed 4xx -------------------------------------------------------
DEEP = "[" * 1500 + "]" * 1500

BAD_BODIES = [
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","timeout":Infinity}'),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","timeout":NaN}'),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","timeout":1e308}'),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","timeout":-0.0}'),
    ("POST", "/api/v1/runs", ('{"image":"bb","command":"true","labels":%s}' % DEEP).encode()),
    ("POST", "/api/v1/runs", ('{"image":%s,"command":"true"}' % DEEP).encode()),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","pids":11885755610}'),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","memory":1e30}'),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","disk":' + b"1" + b"0" * 30 + b'}'),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","output":' + b"1" + b"0" * 30 + b'}'),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"echo \\ud800"}'),            # a lone surrogate
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","env":{"\\udcff":"x"}}'),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","pids":' + b"9" * 5000 + b'}'),
    ("POST", "/api/v1/runs", b'{"image":"\xff\xfe","command":"true"}'),             # not UTF-8
    ("POST", "/api/v1/runs", b'null'),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","memory":"1e400"}'),   # a size that is infinity
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","disk":"' + b"9" * 400 + b'"}'),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","files":[{"path":"/a","content":"x","mode":' + b"1" + b"0" * 30 + b'}]}'),
    ("POST", "/api/v1/runs", b'{"image":"bb","command":"true","files":[{"path":"/a","content":"x","uid":-1}]}'),
    ("POST", "/api/v1/sandboxes", b'{"image":"bb","pids":11885755610}'),
    ("POST", "/api/v1/sandboxes", b'{"image":"bb","cpus":1e16}'),
    ("POST", "/api/v1/sandboxes", b'{"image":"bb","idle_timeout":Infinity}'),
    ("POST", "/api/v1/sandboxes", b'{"image":"bb","lifetime":1e300}'),
    ("POST", "/api/v1/sandboxes", b'{"image":"bb","lifetime":NaN}'),
    ("POST", "/api/v1/sandboxes", ('{"image":"bb","labels":%s}' % DEEP).encode()),
    ("POST", "/api/v1/fork", b'{"image":"bb","commands":["true"],"cpus":1e16}'),
    ("POST", "/api/v1/fork", b'{"image":"bb","commands":["true"],"pids":11885755610}'),
    ("PUT", "/api/v1/pools/bb", b'{"size":1,"wait":true,"wait_timeout":Infinity}'),
    ("PUT", "/api/v1/pools/bb", b'{"size":1,"cpus":1e16}'),
]


@pytest.mark.parametrize("method,path,body", BAD_BODIES, ids=[f"{m} {p} {b[:50]!r}" for m, p, b in BAD_BODIES])
def test_bad_bodies_get_a_typed_4xx(server, method, path, body):
    """Finding 12: non-finite, out-of-range, too deep, not Unicode: each a typed 4xx in the one
    shape (was: text/plain 500, or 500 internal with the kernel's EINVAL/ERANGE)."""
    r = server.request(method, path, content=body, headers=J)
    err = shaped(r, (400, 422))
    assert err["error"] == "invalid_input", err


def test_a_sandboxs_paths_past_the_kernels_limits(server):
    """The same class on a live sandbox's file routes: a path past PATH_MAX or a name past
    NAME_MAX was ENAMETOOLONG, a 500."""
    sid = server.post("/api/v1/sandboxes", json={"image": "bb"}).json()["id"]
    try:
        shaped(server.post(f"/api/v1/sandboxes/{sid}/mkdir", params={"path": "/a" * 2100}), 400)
        shaped(server.put(f"/api/v1/sandboxes/{sid}/file", params={"path": "/" + "n" * 300}, content=b"x"), 400)
        shaped(server.get(f"/api/v1/sandboxes/{sid}/exists", params={"path": "/" + "n" * 300}), 400)
        assert server.post(f"/api/v1/sandboxes/{sid}/mkdir", params={"path": "/" + "n" * 255}).status_code == 200
    finally:
        server.post(f"/api/v1/sandboxes/{sid}/stop")


def test_nothing_bad_was_kept(server):
    """A refused body changed nothing: the operations and sandboxes lists still answer (a run
    whose command held a lone surrogate was kept once, and every list after it was a 500)."""
    r = server.get("/api/v1/operations", params={"limit": 1000})
    assert r.status_code == 200, r.text[:300]
    assert all("\\ud800" not in json.dumps(o) for o in r.json())
    assert server.get("/api/v1/sandboxes", params={"all": True}).status_code == 200


def test_limits_are_bounded_in_the_engine(st, rootfs):
    """Finding 12: the bounds are the engine's (every surface: SDK, MCP, CLI, REST), not the
    server's: each refused with InvalidInput before anything starts."""
    img = st.import_image(rootfs)
    for bad in ({"pids": 11885755610}, {"cpus": 1e16}, {"timeout": float("inf")}, {"timeout": float("nan")},
                {"memory": 10 ** 30}, {"disk": 10 ** 30}, {"output": 10 ** 30}, {"cpus": float("inf")}):
        with pytest.raises(InvalidInput):
            img.run("true", **bad)
        with pytest.raises(InvalidInput):
            img.start(**bad)
    for bad in ({"lifetime": float("inf")}, {"idle_timeout": float("inf")}, {"lifetime": float("nan")},
                {"lifetime": 1e300}):
        with pytest.raises(InvalidInput):
            img.start(**bad)
    assert st.sandboxes(all=True) == []
    assert img.run("true", pids=1 << 22, cpus=64, timeout=3600).exit_code == 0     # the bounds themselves


def test_a_sandbox_started_ahead_is_nobodys(tmp_path, rootfs):
    """Finding 12: GET or stop of a sandbox started ahead (its row has no caller's record) was a
    KeyError 'limits' (500); it is no sandbox of anybody's until a start claims it: 404, and
    the stop did not end it (the next start still claims it)."""
    with sandtree.Sandtree(str(tmp_path / "home"), warm=2) as st:
        img = st.import_image(rootfs)
        first = img.start()
        starts = st.engine.sandboxes.starts
        end = time.monotonic() + 30
        while time.monotonic() < end:
            with starts.cv:
                if starts.want and set(starts.want) <= set(starts.ready):
                    break
            time.sleep(0.01)
        (sid, _), = starts.ready.values()
        for call in (st.engine.sandbox_info, st.engine.sandbox_stop):
            for name in (sid, sid[:6]):
                with pytest.raises(NotFound):
                    call(name)
        second = img.start()
        assert second.id == sid and second.exec("echo ok").stdout == b"ok\n"
        first.stop()
        second.stop()


def _blocked_in_flock(tid: int) -> bool:
    try:
        with open(f"/proc/self/task/{tid}/wchan") as f:
            return "lock" in f.read()
    except OSError:
        return False


def test_a_list_racing_a_stop_is_not_an_error(tmp_path, rootfs):
    """Finding 12: a list (its reaper hibernating an idle sandbox) racing a stop froze a cgroup
    the stop had just removed: ENOENT, 500 internal. The race made certain: the list waits on
    the sandbox's commit lock (held here) while the sandbox's processes end and its row says
    stopped, as a stop leaves them; then the list goes on, and answers."""
    st = sandtree.Sandtree(str(tmp_path / "home"), warm=0)
    try:
        eng, sbs = st.engine, st.engine.sandboxes
        ok, why = sbs.live.hibernate_available(None)
        if not ok:
            pytest.skip(f"hibernate is unavailable here: {why}")
        img = st.import_image(rootfs)
        sid = eng.sandbox_start(img.id, idle_action="hibernate", idle_timeout=600)["id"]
        with eng.store.db.tx() as con:                               # idle past its idle timeout
            con.execute("UPDATE sandboxes SET last_used=? WHERE id=?", (time.time() - 10000, sid))
        got = {}
        with sbs._commit_lock(sid):
            def lister():
                got["tid"] = threading.get_native_id()
                try:
                    got["list"] = eng.sandbox_list(all=True)
                except Exception as exc:                        # noqa: BLE001 - what the test looks for
                    got["error"] = exc
            t = threading.Thread(target=lister)
            t.start()
            end = time.monotonic() + 30
            while not ("tid" in got and _blocked_in_flock(got["tid"])) and time.monotonic() < end:
                time.sleep(0.01)
            assert _blocked_in_flock(got["tid"]), "the list never reached the sandbox's commit lock"
            row = sbs._row(sid)
            sbs.live.stop(row["handle"])                         # what a stop does, under the lock
            sbs._set_state(sid, "stopped")
        t.join(60)
        assert "error" not in got, repr(got.get("error"))
        assert [s["state"] for s in got["list"] if s["id"] == sid] == ["stopped"]
    finally:
        st.close()


def test_a_commit_racing_a_stop_is_a_conflict(tmp_path, rootfs):
    """Finding 12's class: a commit (it freezes the cgroup too) whose sandbox a stop ended
    between its check and its lock is a Conflict, not ENOENT."""
    st = sandtree.Sandtree(str(tmp_path / "home"), warm=0)
    try:
        eng, sbs = st.engine, st.engine.sandboxes
        img = st.import_image(rootfs)
        sid = eng.sandbox_start(img.id)["id"]
        got = {}
        with sbs._commit_lock(sid):
            def committer():
                got["tid"] = threading.get_native_id()
                try:
                    got["image"] = eng.sandbox_commit(sid)
                except Exception as exc:                        # noqa: BLE001 - what the test looks for
                    got["error"] = exc
            t = threading.Thread(target=committer)
            t.start()
            end = time.monotonic() + 30
            while not ("tid" in got and _blocked_in_flock(got["tid"])) and time.monotonic() < end:
                time.sleep(0.01)
            assert _blocked_in_flock(got["tid"])
            sbs.live.stop(sbs._row(sid)["handle"])
            sbs._set_state(sid, "stopped")
        t.join(60)
        assert isinstance(got.get("error"), Conflict), repr(got)
    finally:
        st.close()


# ---- finding 13: one error shape everywhere ---------------------------------------------------------
def test_framework_errors_have_the_one_shape(server):
    """Finding 13: FastAPI's own answers ({"detail"}) were 3,132 of 40,322 errors: a body it
    cannot parse, a method a path does not take, an unknown path. Contree's /v1 keeps its shape."""
    assert shaped(server.post("/api/v1/runs", content=b'{"image":"\xff"}', headers=J), 400)["error"] == "invalid_input"
    assert shaped(server.delete("/api/v1/runs"), 405)["error"] == "method_not_allowed"
    assert shaped(server.get("/api/v1/no/such/route"), 404)["error"] == "not_found"
    assert shaped(server.post("/api/v1/sandboxes", content=b'{"image":' + b"1" * 5000 + b"}", headers=J), 400)
    shaped(server.get("/v1/no/such/route"), 404, contree=True)
    shaped(server.post("/v1/instances", content=b'{"image":"\xff"}', headers=J), 400, contree=True)
    shaped(server.post("/v1/instances", content=('{"image":%s}' % DEEP).encode(), headers=J), 400, contree=True)
    shaped(server.post("/v1/instances", content=b'{"image":"x","command":"\\ud800"}', headers=J), 400, contree=True)
    shaped(server.delete("/v1/images"), 405, contree=True)
    big = b'{"image":"bb","labels":{"x":"' + b"y" * (33 << 20) + b'"}}'
    def chunks():                                # no Content-Length: FastAPI's read meets the cap
        for i in range(0, len(big), 1 << 20):
            yield big[i:i + (1 << 20)]
    assert shaped(server.post("/api/v1/sandboxes", content=chunks(), headers=J), 413)["error"] == "too_large"


def test_an_over_cap_body_gets_its_413_not_a_reset(server):
    """A Content-Length over the cap is refused before the route runs; the server reads and drops the
    rest of the body first (bounded), so a client that sends it all and then reads gets the 413, not
    a reset (CI saw E2B's SDK get `Connection reset by peer` once). A raw socket: httpx hides a reset
    of its write when the answer came first."""
    host, port = server.base_url.host, server.base_url.port
    body = b"{" + b" " * (40 << 20) + b"}"
    for _ in range(3):
        with socket.create_connection((host, port), timeout=30) as s:
            s.sendall(b"POST /api/v1/runs HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % (host.encode(), port, len(body)))
            s.sendall(body)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b'"too_large"' in answer


def test_a_bug_is_a_logged_typed_500(tmp_path):
    """Finding 12: a handler's bug (an exception that is no SandtreeError) was a text/plain
    "Internal Server Error"; it is a 500 in the one shape (Contree's under /v1), and logged with
    its traceback. A real uvicorn on loopback serving the real app, plus two routes that fail
    (the bug to find has to be made: there is none left to reach from outside)."""
    import uvicorn
    from sandtree.http.server import build_app
    engine = Engine(str(tmp_path / "home"), warm=0)
    app = build_app(engine)

    @app.get("/api/v1/test-bug")
    async def bug():
        raise KeyError("limits")

    @app.get("/v1/test-bug")
    async def contree_bug():
        raise KeyError("limits")

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("sandtree.http").addHandler(handler)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    t = threading.Thread(target=srv.run)
    t.start()
    try:
        wait_for_port(port, 30)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            err = shaped(c.get("/api/v1/test-bug"), 500)
            assert err["error"] == "internal" and "KeyError" in err["message"]
            shaped(c.get("/v1/test-bug"), 500, contree=True)
        assert any(r.exc_info and r.exc_info[0] is KeyError for r in records)
    finally:
        srv.should_exit = True
        t.join(30)
        logging.getLogger("sandtree.http").removeHandler(handler)
        engine.close()


# ---- finding 9: the OpenAPI document lists the error answers -----------------------------------------
def test_openapi_declares_every_error_status(server):
    """Finding 9: each route declares the statuses of errors.py's table (and 422, 500) with the
    error body's schema; Contree's routes with Contree's."""
    spec = server.get("/openapi.json").json()
    statuses = {str(c.http_status) for c in ERRORS.values()} - {"405"} | {"422", "500"}
    schemas = spec["components"]["schemas"]
    assert set(schemas["ErrorOut"]["required"]) == {"error", "message"}
    assert set(schemas["ContreeErrorOut"]["required"]) == {"error", "status"}
    n = 0
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for status in statuses:
                got = op["responses"].get(status)
                assert got is not None, f"{method} {path} does not declare {status}"
                ref = got["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ContreeErrorOut" if path.startswith("/v1/") else "/ErrorOut"), (path, ref)
            n += 1
    assert n > 80


# ---- finding 14: connections are bounded ------------------------------------------------------------
@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """A server with short limits (so the tests are quick): (port, pid)."""
    home = tmp_path_factory.mktemp("limited-home")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", str(home), "serve", "--port", str(port),
                             "--ports-port", "0", "--access-log", "off", "--header-timeout", "1",
                             "--keep-alive", "1", "--max-client-connections", "50"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 30)
        yield port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _exchange(port: int, data: bytes, wait: float = 10.0) -> tuple[bytes, bool]:
    """Send `data` (as much as the server takes), then read until the server closes: (what
    came, whether it closed)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(wait)
    try:
        try:
            s.sendall(data)
        except OSError:
            pass                                     # closed on us mid-send: what it answered still counts
        got, closed = b"", False
        try:
            while chunk := s.recv(65536):
                got += chunk
            closed = True
        except ConnectionResetError:
            closed = True
        except socket.timeout:
            pass
        return got, closed
    finally:
        s.close()


def _status_and_body(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_huge_header_is_refused_and_closed(limited):
    """Finding 14: a 16 MiB header was read whole; it gets 431 headers_too_large and the
    connection is closed (the server stops reading at the cap)."""
    port, _ = limited
    got, closed = _exchange(port, b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (16 << 20) + b"\r\n\r\n")
    assert closed
    status, body = _status_and_body(got)
    assert status == 431 and body["error"] == "headers_too_large", got[:300]


def test_too_many_headers_are_refused(limited):
    """Finding 14: 20,000 headers were taken."""
    port, _ = limited
    headers = b"".join(b"X-%d: a\r\n" % i for i in range(20000))
    got, closed = _exchange(port, b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert closed and _status_and_body(got)[0] == 431, got[:300]


def test_a_partial_request_is_timed_out(limited):
    """Finding 14: 300 half-sent requests were held for 60 s; one whose headers do not end is
    answered 408 request_timeout and closed after the header timeout (1 s here)."""
    port, _ = limited
    got, closed = _exchange(port, b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ", wait=20)
    assert closed
    status, body = _status_and_body(got)
    assert status == 408 and body["error"] == "request_timeout"
    got, closed = _exchange(port, b"", wait=20)                  # sends nothing at all: closed too
    assert closed and got == b""


def test_idle_connections_do_not_hold_the_servers_files(limited):
    """Finding 14: 1,000 idle connections took the server to 1,022 open files. With 50 per
    client, the rest are refused (429) and closed at once; the 50 are closed by the header
    timeout. The server's files are counted in /proc/PID/fd."""
    port, pid = limited
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        assert c.get("/api/v1/health").status_code == 200           # (the engine's files are open)
    time.sleep(1.5)                                                  # (its keep-alive connection closed)
    base = _fds(pid)
    socks = []
    try:
        for _ in range(1000):
            socks.append(socket.create_connection(("127.0.0.1", port)))
        refused = socks[-1]                                          # (answered: all 1,000 were accepted)
        refused.settimeout(10)
        raw = b""
        while chunk := refused.recv(65536):
            raw += chunk
        status, body = _status_and_body(raw)
        assert status == 429 and body["error"] == "limit_exceeded"
        held = max(_fds(pid) for _ in range(20))
        assert held <= base + 50 + 5, (base, held)
        end = time.monotonic() + 30
        while _fds(pid) > base + 2 and time.monotonic() < end:
            time.sleep(0.1)
        assert _fds(pid) <= base + 2
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:  # and it still serves
            assert c.get("/api/v1/health").status_code == 200
    finally:
        for s in socks:
            s.close()


def test_keep_alive_clients_still_work(limited):
    """The limits leave an ordinary client alone: many requests on one kept-alive connection,
    a body in pieces, headers near the cap."""
    port, _ = limited
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        for _ in range(20):
            assert c.get("/api/v1/health", headers={"X-Pad": "a" * 30000}).status_code == 200
        r = c.post("/api/v1/files", content=iter([b"x" * 70000] * 20))
        assert r.status_code == 201, r.text


def test_mcp_over_http_has_the_same_limits(tmp_path):
    """Finding 14 on `sandtree mcp --http` (a uvicorn of its own): the same header cap and
    header timeout as `serve`."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", str(tmp_path / "home"), "mcp", "--http",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 60)
        got, closed = _exchange(port, b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (16 << 20) + b"\r\n\r\n")
        assert closed and _status_and_body(got)[0] == 431, got[:300]
        headers = b"".join(b"X-%d: a\r\n" % i for i in range(20000))
        got, closed = _exchange(port, b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers + b"\r\n")
        assert closed and _status_and_body(got)[0] == 431, got[:300]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
