"""E2B's code interpreter, served by sandtree: the real `e2b-code-interpreter` package (pinned in
pyproject's e2b extra), sync and async, against a real `sandtree serve` on loopback, configured
as an E2B user does: E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY only.

Its calls go to port 49999 of the sandbox (http/e2b/interpreter.py over the table's
sandbox_run_code and sandbox_code_context_* rows); the kernel is python3 of the bookworm image
(conftest's `bookworm`). The sandbox is started through sandtree's own REST API and the SDK's
Sandbox made for that ID with the SDK's own constructor, as its connect() does after asking the
control plane (connect_to below); the README's quick start goes through the control plane's
Sandbox.create() (http/e2b/control.py).

The image has no matplotlib: the PNG result comes from an object with _repr_png_ (IPython's way,
which matplotlib's figures take too); test_e2b_interpreter_plots.py installs matplotlib through
the egress path and checks a figure."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import subprocess
import sys
import time
import zlib

import httpx
import pytest

from conftest import serve_process
from sandtree.engine import Engine

e2b = pytest.importorskip("e2b")
eci = pytest.importorskip("e2b_code_interpreter")


@pytest.fixture(scope="module")
def server(bookworm, rootfs):
    home, image, _ = bookworm
    eng = Engine(home, warm=0)
    try:                                    # E2B's default template for Sandbox.create() (the quick start)
        eng.tag(image, "code-interpreter-v1")
        eng.import_path(rootfs, tag="busybox-no-python")
    finally:
        eng.close()
    with serve_process(home) as url:
        yield url, image, home


@pytest.fixture
def sid(server, monkeypatch):
    """A live sandbox on the bookworm image, started through sandtree's API; E2B's variables set."""
    url, image, _ = server
    monkeypatch.setenv("E2B_API_URL", f"{url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{url}/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", "e2b_local")        # any value: a loopback server without tokens
    r = httpx.post(f"{url}/api/v1/sandboxes", json={"image": image}, timeout=60, trust_env=False)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    yield sid
    httpx.post(f"{url}/api/v1/sandboxes/{sid}/stop", timeout=30, trust_env=False)


def connect_to(cls, sid: str):
    """The SDK's Sandbox (sync or async class) for an existing sandbox: what its connect() builds
    from the control plane's answer (e2b's _cls_connect_sandbox), made here from the ID."""
    from e2b.connection_config import ConnectionConfig
    from packaging.version import Version
    config = ConnectionConfig(extra_sandbox_headers={"E2b-Sandbox-Id": sid,
                                                     "E2b-Sandbox-Port": str(ConnectionConfig.envd_port)})
    return cls(sandbox_id=sid, sandbox_domain=None, envd_version=Version("0.5.0"), envd_access_token=None,
               traffic_access_token=None, connection_config=config)


def png_bytes() -> bytes:
    """A real 1x1 PNG (what the code in the sandbox makes, to compare)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


PNG_CLASS = '''
import struct, zlib
def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
class Dot:
    def _repr_png_(self):
        return (b"\\x89PNG\\r\\n\\x1a\\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
                + _chunk(b"IDAT", zlib.compress(b"\\x00\\xff\\x00\\x00")) + _chunk(b"IEND", b""))
    def _repr_html_(self):
        return "<b>dot</b>"
    def __repr__(self):
        return "Dot()"
'''


def test_state_stream_results_errors_sync(sid):
    sbx = connect_to(eci.Sandbox, sid)
    # state across run_code calls (the README's example)
    assert sbx.run_code("x = 1").error is None
    execution = sbx.run_code("x+=1; x")
    assert execution.text == "2" and execution.error is None
    assert execution.results[0].is_main_result

    # stdout streamed as it is written: the first line reaches the callback before the code ends
    seen: list[tuple[str, float]] = []
    ex = sbx.run_code("import time\nprint('one')\ntime.sleep(1.5)\nprint('two')",
                      on_stdout=lambda m: seen.append((m.line, time.monotonic())),
                      on_stderr=lambda m: seen.append(("err:" + m.line, time.monotonic())))
    assert [s for s, _ in seen] == ["one\n", "two\n"] and ex.logs.stdout == ["one\n", "two\n"]
    assert seen[1][1] - seen[0][1] >= 1.0              # apart by the sleep: not delivered at the end
    ex = sbx.run_code("import sys, os\nprint('to err', file=sys.stderr)\nos.system('echo from a child')")
    assert ex.logs.stderr == ["to err\n"] and ex.logs.stdout == ["from a child\n"]

    # a result with text, one with PNG (and HTML): the _repr_*_ formats, as IPython shows them
    sbx.run_code(PNG_CLASS)
    got: list = []
    ex = sbx.run_code("Dot()", on_result=got.append)
    (res,) = ex.results
    assert got == [res] and res.is_main_result and res.text == "Dot()" and res.html == "<b>dot</b>"
    assert base64.b64decode(res.png) == png_bytes()
    assert set(res.formats()) == {"text", "html", "png"}
    ex = sbx.run_code("{'a': [1, 2]}")
    assert ex.text == "{'a': [1, 2]}"
    ex = sbx.run_code("class Rich:\n"
                      "    def _repr_json_(self): return {'k': [1, 2]}\n"
                      "    def _repr_markdown_(self): return '# title'\n"
                      "    def _repr_latex_(self): return r'$x^2$'\n"
                      "    def _repr_mimebundle_(self, include=None, exclude=None):\n"
                      "        return {'application/vnd.custom+json': {'v': 1}, 'image/svg+xml': '<svg/>'}\n"
                      "Rich()")
    (res,) = ex.results
    assert res.json == {"k": [1, 2]} and res.markdown == "# title" and res.latex == "$x^2$"
    assert res.svg == "<svg/>" and res.extra == {"application/vnd.custom+json": {"v": 1}}
    ex = sbx.run_code("display(Dot()); 'last'")
    assert [r.is_main_result for r in ex.results] == [False, True] and ex.results[0].png and ex.text == "'last'"

    # an error with its name, value and traceback (the code's own frames)
    errors: list = []
    ex = sbx.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    assert ex.error is not None and errors == [ex.error]
    assert ex.error.name == "ZeroDivisionError" and ex.error.value == "division by zero"
    assert "return 1 / 0" in ex.error.traceback and "in f" in ex.error.traceback
    assert "kernel" not in ex.error.traceback
    ex = sbx.run_code("def broken(:")
    assert ex.error.name == "SyntaxError"
    assert sbx.run_code("x").text == "2"              # an error keeps the state

    # per-execution environment variables
    assert sbx.run_code("import os; os.environ.get('GREETING')", envs={"GREETING": "hi"}).text == "'hi'"
    assert sbx.run_code("import os; os.environ.get('GREETING')").text is None


def test_timeout_interrupts_and_keeps_the_context(sid):
    sbx = connect_to(eci.Sandbox, sid)
    sbx.run_code("y = 41")
    with pytest.raises(e2b.TimeoutException):
        sbx.run_code("import time\nwhile True: time.sleep(0.05)", timeout=1.5)
    # the dropped connection interrupted the code: the context answers again, its state kept
    deadline = time.monotonic() + 30
    while True:
        ex = sbx.run_code("y + 1", timeout=10)
        if ex.text == "42" or time.monotonic() > deadline:
            break
    assert ex.text == "42" and ex.error is None


def test_contexts(sid):
    sbx = connect_to(eci.Sandbox, sid)
    ctx = sbx.create_code_context(cwd="/tmp")
    assert ctx.language == "python" and ctx.cwd == "/tmp" and ctx.id
    assert sbx.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"
    sbx.run_code("z = 'in ctx'", context=ctx)
    assert sbx.run_code("z", context=ctx).text == "'in ctx'"
    # contexts do not share state: the default one has no z
    assert sbx.run_code("z").error.name == "NameError"
    assert ctx.id in {c.id for c in sbx.list_code_contexts()}
    sbx.restart_code_context(ctx)
    assert sbx.run_code("z", context=ctx).error.name == "NameError"
    sbx.remove_code_context(ctx.id)
    assert ctx.id not in {c.id for c in sbx.list_code_contexts()}
    with pytest.raises(e2b.NotFoundException):
        sbx.run_code("1", context=ctx)
    # a language the image has no interpreter for: refused, with what there is
    with pytest.raises(e2b.SandboxException, match="python"):
        sbx.run_code("1", language="r")
    with pytest.raises(e2b.SandboxException):
        sbx.create_code_context(cwd="/no/such/dir")


def test_unknown_sandbox_is_not_found(server, monkeypatch):
    url, _, _ = server
    monkeypatch.setenv("E2B_API_URL", f"{url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{url}/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", "e2b_local")
    sbx = connect_to(eci.Sandbox, "0" * 32)
    with pytest.raises(e2b.NotFoundException):
        sbx.run_code("1")


def test_async_sdk(sid):
    async def main():
        sbx = connect_to(eci.AsyncSandbox, sid)
        await sbx.run_code("a = [1, 2, 3]")
        lines: list[str] = []

        async def on_stdout(m):                        # the async SDK awaits coroutine callbacks
            lines.append(m.line)
        ex = await sbx.run_code("print(sum(a)); len(a)", on_stdout=on_stdout)
        assert ex.text == "3" and lines == ["6\n"]
        ex = await sbx.run_code("raise ValueError('bad value')")
        assert ex.error.name == "ValueError" and ex.error.value == "bad value"
        assert "raise ValueError" in ex.error.traceback
        await sbx.run_code(PNG_CLASS)
        ex = await sbx.run_code("Dot()")
        assert base64.b64decode(ex.results[0].png) == png_bytes()
        ctx = await sbx.create_code_context()
        assert (await sbx.run_code("'a' in dir()", context=ctx)).text == "False"
        assert ctx.id in {c.id for c in await sbx.list_code_contexts()}
        await sbx.remove_code_context(ctx)
        with pytest.raises(e2b.TimeoutException):
            await sbx.run_code("import time; time.sleep(30)", timeout=1)
    asyncio.run(main())


def test_readme_quick_start(server, monkeypatch):
    """e2b-code-interpreter's README, as written: only the variables set (the default template,
    code-interpreter-v1, is a tag of the bookworm image here)."""
    url, image, _ = server
    monkeypatch.setenv("E2B_API_URL", f"{url}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{url}/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", "e2b_local")
    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sandbox:
        sandbox.run_code("x = 1")
        execution = sandbox.run_code("x+=1; x")
        print(execution.text)  # outputs 2
        assert execution.text == "2"


def test_sandtree_surfaces_run_code(server, sid, tmp_path):
    """The rows behind E2B's run_code are sandtree's own on every surface: REST, the SDK (here
    remote, over that REST), the CLI (a one-shot engine: its context lasts the command)."""
    url, _, home = server
    base = f"{url}/api/v1/sandboxes/{sid}/code"
    with httpx.Client(trust_env=False, timeout=60) as c:
        assert c.post(base, json={"code": "n = 20"}).status_code == 200
        r = c.post(base, json={"code": "print('hey'); n * 2 + 2"}).json()
        assert r["results"][0]["text"] == "42" and r["logs"]["stdout"] == ["hey\n"] and r["error"] is None
        err = c.post(base, json={"code": "import nope"}).json()["error"]
        assert err["name"] == "ModuleNotFoundError" and "import nope" in err["traceback"]
        r = c.post(base, json={"code": "import time; time.sleep(60)", "timeout": 1}).json()
        assert r["timed_out"] and r["error"]["name"] == "KeyboardInterrupt"
        ctx = c.post(f"{base}/contexts", json={"cwd": "/tmp"})
        assert ctx.status_code == 201 and ctx.json()["cwd"] == "/tmp"
        cid = ctx.json()["id"]
        assert cid in {x["id"] for x in c.get(f"{base}/contexts").json()}
        assert c.post(f"{base}/contexts/{cid}/restart").status_code == 200
        assert c.delete(f"{base}/contexts/{cid}").status_code == 204
        bad = c.post(base, json={"code": "1", "context": cid})
        assert bad.status_code == 404 and bad.json()["error"] == "not_found"
        bad = c.post(base, json={"code": "1", "language": "cobol"})
        assert bad.status_code == 400 and "python" in bad.json()["message"]

    import sandtree
    st = sandtree.connect(url)
    sbx = st.sandbox(sid)
    assert sbx.run_code("n + 1")["results"][0]["text"] == "21"   # the same default context as REST's
    made = sbx.create_code_context()
    assert made["id"] in {x["id"] for x in sbx.list_code_contexts()}
    sbx.remove_code_context(made["id"])

    # the CLI is an engine process of its own: it finds the same context in the sandbox, state and all
    out = subprocess.run([sys.executable, "-m", "sandtree", "--home", home, "sandbox", "code", sid,
                          "import sys; print(sys.version_info[0]); n * 2 + 2", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["results"][0]["text"] == "42" and got["logs"]["stdout"] == ["3\n"]


def test_state_survives_hibernate_and_resume(server, sid):
    """A context's kernel is a process of the sandbox: hibernating the sandbox (E2B's pause) keeps
    it with its memory, and the code's state is there after the resume."""
    url, _, _ = server
    sbx = connect_to(eci.Sandbox, sid)
    sbx.run_code("import os\nkept = [os.getpid(), 'before the pause']")
    with httpx.Client(trust_env=False, timeout=120) as c:
        r = c.post(f"{url}/api/v1/sandboxes/{sid}/hibernate")
        if r.status_code == 503:
            pytest.skip(f"hibernation is not available here: {r.json()['message']}")
        assert r.status_code == 200 and r.json()["state"] == "hibernated", r.text
        r = c.post(f"{url}/api/v1/sandboxes/{sid}/resume")
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
    ex = sbx.run_code("kept[1], kept[0] == os.getpid()")
    assert ex.error is None and ex.text == "('before the pause', True)"


def test_gvisor_tier_and_isolation(server, sid, monkeypatch):
    """The same on the gVisor tier (its interrupts too); and a sandbox sees no other's kernel (a
    context's socket is in its sandbox's own network namespace)."""
    url, image, _ = server
    with httpx.Client(trust_env=False, timeout=120) as c:
        r = c.post(f"{url}/api/v1/sandboxes", json={"image": image, "tier": "gvisor"})
        if r.status_code == 503:
            pytest.skip(f"the gVisor tier is not available here: {r.json()['message']}")
        assert r.status_code == 201, r.text
        other = r.json()["id"]
        try:
            sbx = connect_to(eci.Sandbox, other)
            sbx.run_code("g = 'gvisor'")
            with pytest.raises(e2b.TimeoutException):
                sbx.run_code("import time\nwhile True: time.sleep(0.05)", timeout=1.5)
            deadline = time.monotonic() + 30
            while (ex := sbx.run_code("g", timeout=10)).text != "'gvisor'" and time.monotonic() < deadline:
                pass
            assert ex.text == "'gvisor'"
            connect_to(eci.Sandbox, sid).run_code("1")
            for one in (sid, other):        # each sandbox lists its own kernel's socket only
                got = c.post(f"{url}/api/v1/sandboxes/{one}/exec",
                             json={"command": ["python3", "-c", "print(open('/proc/net/unix').read().count("
                                                                "'@sandtree-kernel-'))"]}).json()
                assert got["stdout"].strip() == "1", got
        finally:
            c.post(f"{url}/api/v1/sandboxes/{other}/stop")


def test_an_image_without_python_is_told(server, monkeypatch):
    url, _, _ = server
    for k, v in {"E2B_API_URL": f"{url}/e2b", "E2B_SANDBOX_URL": f"{url}/e2b/sandbox", "E2B_API_KEY": "k"}.items():
        monkeypatch.setenv(k, v)
    with httpx.Client(trust_env=False, timeout=60) as c:
        r = c.post(f"{url}/api/v1/sandboxes", json={"image": "busybox-no-python"})
        assert r.status_code == 201, r.text
        bare = r.json()["id"]
        try:
            with pytest.raises(e2b.SandboxException, match="400.*needs python3"):
                connect_to(eci.Sandbox, bare).run_code("1")
        finally:
            c.post(f"{url}/api/v1/sandboxes/{bare}/stop")


def test_a_tenant_cannot_run_code_in_another_s_sandbox(tmp_path, rootfs):
    """On a server with tokens, the interpreter's rows are the caller's tenant's view: another
    tenant's sandbox is not found, through E2B's port (its key as X-API-Key) and sandtree's REST.
    (The image is busybox: the owner's call reaching the engine is told it needs python3.)"""
    home = str(tmp_path / "home")
    eng = Engine(home, warm=0)
    try:
        image = eng.import_path(rootfs)
        eng.share(image)                    # every tenant's, by its ID
    finally:
        eng.close()

    def token(tenant):
        out = subprocess.run([sys.executable, "-m", "sandtree", "--home", home, "token", "create", "--tenant",
                              tenant, "--json"], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)["token"]
    a, b = token("a"), token("b")
    with serve_process(home) as url, httpx.Client(trust_env=False, timeout=60) as c:
        r = c.post(f"{url}/api/v1/sandboxes", json={"image": image}, headers={"Authorization": f"Bearer {a}"})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            e2b_headers = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49999"}
            for key, status in ((b, 404), (a, 400)):
                got = c.post(f"{url}/e2b/sandbox/execute", json={"code": "1"},
                             headers={**e2b_headers, "X-API-Key": key})
                assert got.status_code == status, got.text
                got = c.get(f"{url}/e2b/sandbox/contexts", headers={**e2b_headers, "X-API-Key": key})
                assert got.status_code == status, got.text
                got = c.post(f"{url}/api/v1/sandboxes/{sid}/code", json={"code": "1"},
                             headers={"Authorization": f"Bearer {key}"})
                assert got.status_code == status, got.text
            assert "python3" in got.json()["message"]
            got = c.post(f"{url}/e2b/sandbox/execute", json={"code": "1"}, headers=e2b_headers)
            assert got.status_code == 401, got.text                   # no key at all
        finally:
            c.post(f"{url}/api/v1/sandboxes/{sid}/stop", headers={"Authorization": f"Bearer {a}"})
