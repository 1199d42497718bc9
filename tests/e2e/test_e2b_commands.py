"""E2B's own `e2b` SDK (as published, pinned), sync and async, running commands and terminals in a
sandtree live sandbox through envd's process service (http/e2b/envd/process.py), against a real
`sandtree serve` on loopback with only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.

Sandboxes are made by Sandbox.create (the control plane, http/e2b/control.py), which answers envd's
version and access token. Also: the native process list (sandbox_ps) on REST, CLI and SDK, bad
input as Connect errors (never a 500), and who may reach a sandbox's envd (its access token, its
tenant's token; nothing else)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import pytest
from packaging.version import Version

import sandtree
from conftest import make_rootfs, serve_process

e2b = pytest.importorskip("e2b")
from e2b import AsyncSandbox, CommandExitException, ConnectionConfig, PtySize, Sandbox  # noqa: E402
from e2b.exceptions import NotFoundException  # noqa: E402

from sandtree.http.e2b.wire import ENVD_VERSION  # noqa: E402

IMAGE = "e2b-base"
# E2B's clients run commands with /bin/bash -l -c and terminals with /bin/bash -i -l: the busybox
# image gets a bash that is its sh
BASH = '#!/bin/sh\nexec /bin/sh "$@"\n'


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> str:
    root = make_rootfs(str(tmp_path_factory.mktemp("e2b-rootfs") / "root"))
    with open(os.path.join(root, "bin", "bash"), "w") as f:
        f.write(BASH)
    os.chmod(os.path.join(root, "bin", "bash"), 0o755)
    h = str(tmp_path_factory.mktemp("e2b-home") / "home")
    st = sandtree.Sandtree(h)
    st.import_image(root, tag=IMAGE)
    st.close()
    return h


@pytest.fixture(scope="module")
def server(home):
    with serve_process(home) as url:
        yield url


@pytest.fixture
def e2b_env(monkeypatch, server):
    for name in list(os.environ):
        if name.startswith("E2B_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("E2B_API_URL", f"{server}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{server}/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", "e2b_any-key-on-a-loopback-server")
    return server


@pytest.fixture
def sid(e2b_env):
    sb = Sandbox.create(IMAGE)
    yield sb.sandbox_id
    sb.kill()


def _opts(sid: str, token: str | None) -> dict:
    """The SDK's own constructor's arguments for sandbox `sid` with envd access token `token` (to
    try a token on a sandbox it is not for)."""
    headers = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983", **({"X-Access-Token": token} if token else {})}
    return dict(sandbox_id=sid, sandbox_domain=None, envd_version=Version(ENVD_VERSION), envd_access_token=token,
                traffic_access_token=None, connection_config=ConnectionConfig(extra_sandbox_headers=headers))


def sandbox(sid: str) -> Sandbox:
    return Sandbox.connect(sid)


async def async_sandbox(sid: str) -> AsyncSandbox:
    return await AsyncSandbox.connect(sid)


# ---- commands ----------------------------------------------------------------------------------
def test_run_in_the_foreground(sid):
    sb = sandbox(sid)
    r = sb.commands.run("echo out; echo err >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 0)
    with pytest.raises(CommandExitException) as failed:
        sb.commands.run("echo why >&2; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stderr == "why\n"
    assert sb.commands.run("echo $GREETING", envs={"GREETING": "hallo"}).stdout == "hallo\n"
    assert sb.commands.run("pwd", cwd="/etc").stdout == "/etc\n"
    # E2B's default user, `user` (the image has one), in its home; or the one named
    assert sb.commands.run("id -u; pwd").stdout == "1000\n/tmp\n"
    assert sb.commands.run("id -u; pwd", user="root").stdout == "0\n/root\n"
    assert sb.commands.run("id -un", user="nobody").stdout == "nobody\n"
    assert sb.is_running()


def test_a_user_not_in_the_image_is_invalid(sid):
    from e2b.exceptions import InvalidArgumentException
    with pytest.raises(InvalidArgumentException, match="no such user"):
        sandbox(sid).commands.run("true", user="nosuchuser")


def test_background_with_on_stdout_then_wait_list_and_connect(sid):
    sb = sandbox(sid)
    heard = []
    h = sb.commands.run("for i in 1 2 3; do echo $i; sleep 0.2; done; echo done >&2", background=True)
    listed = {p.pid: p for p in sb.commands.list()}
    assert h.pid in listed and listed[h.pid].cmd == "/bin/bash" and listed[h.pid].args[-1].startswith("for i")
    r = h.wait(on_stdout=heard.append)         # (the sync SDK calls a background command's callbacks here)
    assert "".join(heard) == "1\n2\n3\n" and r.stdout == "1\n2\n3\n" and r.stderr == "done\n"
    assert h.pid not in {p.pid for p in sb.commands.list()}         # ended: no longer listed

    bg = sb.commands.run("sleep 0.5; echo later", background=True)
    again = sb.commands.connect(bg.pid)
    assert again.wait().stdout == "later\n"
    with pytest.raises(NotFoundException):
        sb.commands.connect(bg.pid)                                   # ended: as envd, not found


def test_stdin_send_and_close(sid):
    sb = sandbox(sid)
    h = sb.commands.run("cat; echo eof", background=True, stdin=True)
    sb.commands.send_stdin(h.pid, "abc\n")
    sb.commands.send_stdin(h.pid, "def\n")
    sb.commands.close_stdin(h.pid)
    assert h.wait().stdout == "abc\ndef\neof\n"


def test_kill_and_signals_to_what_is_not_running(sid):
    sb = sandbox(sid)
    h = sb.commands.run("sleep 100", background=True)
    assert sb.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException) as killed:
        h.wait()
    assert killed.value.exit_code == -1 and "signal" in (killed.value.error or killed.value.stderr or "signal")
    assert sb.commands.kill(h.pid) is False                         # finished: not found, as envd says
    assert sb.commands.kill(99999) is False                         # never was
    with pytest.raises(NotFoundException):
        sb.commands.send_stdin(99999, "x")


def test_envs_cwd_and_tag_are_listed(sid):
    sb = sandbox(sid)
    h = sb.commands.run("sleep 30", background=True, envs={"A": "1"}, cwd="/tmp")
    try:
        p = {p.pid: p for p in sb.commands.list()}[h.pid]
        assert p.envs == {"A": "1"} and p.cwd == "/tmp"
    finally:
        sb.commands.kill(h.pid)


# ---- terminals -----------------------------------------------------------------------------------
def test_pty_create_input_resize_kill(sid):
    sb = sandbox(sid)
    t = sb.pty.create(PtySize(rows=24, cols=80))
    sb.pty.resize(t.pid, PtySize(rows=30, cols=100))
    sb.pty.send_stdin(t.pid, b"stty size; echo $((6*7)); exit\n")
    seen = bytearray()
    r = t.wait(on_pty=seen.extend)
    assert r.exit_code == 0 and b"30 100" in seen and b"42" in seen, bytes(seen)

    t = sb.pty.create(PtySize(rows=24, cols=80))
    assert sb.pty.kill(t.pid) is True
    with pytest.raises(CommandExitException):
        t.wait()
    assert sb.pty.kill(t.pid) is False


# ---- async -------------------------------------------------------------------------------------
def test_async_commands_and_pty(sid):
    async def main():
        sb = await async_sandbox(sid)
        r = await sb.commands.run("echo $X", envs={"X": "async"})
        assert r.stdout == "async\n"
        heard = []
        h = await sb.commands.run("echo a; sleep 0.2; echo b", background=True, on_stdout=heard.append)
        assert (await h.wait()).stdout == "a\nb\n" and "".join(heard) == "a\nb\n"
        h = await sb.commands.run("cat", background=True, stdin=True)
        await sb.commands.send_stdin(h.pid, "in\n")
        await sb.commands.close_stdin(h.pid)
        assert (await h.wait()).stdout == "in\n"
        seen = bytearray()
        t = await sb.pty.create(PtySize(rows=24, cols=80), on_data=seen.extend)
        await sb.pty.resize(t.pid, PtySize(rows=40, cols=120))
        await sb.pty.send_stdin(t.pid, b"stty size; exit\n")
        await t.wait()
        assert b"40 120" in seen, bytes(seen)
        h = await sb.commands.run("sleep 100", background=True)
        assert await sb.commands.kill(h.pid) is True
        with pytest.raises(CommandExitException):
            await h.wait()
        assert await sb.commands.kill(h.pid) is False
    asyncio.run(main())


# ---- the native process list -------------------------------------------------------------------------
def test_sandbox_ps_on_rest_sdk_and_cli(sid, e2b_env, home):
    sb = sandbox(sid)
    h = sb.commands.run("sleep 77; true", background=True, user="user")
    try:
        rows = httpx.get(f"{e2b_env}/api/v1/sandboxes/{sid}/ps", timeout=30).json()
        sleeper = [r for r in rows if r["argv"] == ["sleep", "77"]]
        assert len(sleeper) == 1, rows
        s = sleeper[0]
        assert s["user"] == "user" and s["uid"] == 1000 and s["state"] == "sleeping"
        parent = {r["pid"]: r for r in rows}[s["ppid"]]              # the bash -l -c that runs it
        assert parent["argv"][:3] == ["/bin/sh", "-l", "-c"] and parent["user"] == "user", parent
        assert any(r["pid"] == 1 for r in rows)

        remote = sandtree.connect(e2b_env)
        mine = next(x for x in remote.sandboxes() if x.id == sid)
        assert ["sleep", "77"] in [r["argv"] for r in mine.ps()]
        # the rows E2B's envd uses, over REST through sandtree's own SDK: a terminal, its size, a tag
        t = mine.spawn(["sh", "-i"], pty=True, cols=90, rows=20, tag="term", user="root")
        t.resize(91, 21)
        t.write(b"stty size; exit\n")
        end = time.monotonic() + 15
        while (v := t.state())["running"] and time.monotonic() < end:
            time.sleep(0.05)
        assert "21 91" in v["stdout"] and v["uid"] == 0 and v["tag"] == "term", v
        assert ("term", False) in [(p["tag"], p["running"]) for p in mine.processes()]
        out = subprocess.run([sys.executable, "-m", "sandtree", "--home", home, "top", sid, "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert ["sleep", "77"] in [r["argv"] for r in json.loads(out.stdout)]
    finally:
        sb.commands.kill(h.pid)


# ---- bad input -----------------------------------------------------------------------------------
def _raw(url: str, sid: str, method: str, body: bytes, content_type: str, **headers) -> httpx.Response:
    return httpx.post(f"{url}/e2b/sandbox/process.Process/{method}", content=body, timeout=30,
                      headers={"content-type": content_type, "E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
                               **headers})


def test_malformed_connect_requests_get_connect_errors(sid, e2b_env):
    r = _raw(e2b_env, sid, "List", b"{not json", "application/json")
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
    r = _raw(e2b_env, sid, "SendSignal", b'{"process": {"pid": 1}, "signal": "SIGNAL_UNSPECIFIED"}',
             "application/json")
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
    r = _raw(e2b_env, sid, "SendSignal", b'{"process": {"pid": 4242}, "signal": "SIGNAL_SIGKILL"}',
             "application/json")
    assert r.status_code == 404 and r.json()["code"] == "not_found", r.text
    r = _raw(e2b_env, sid, "Start", b"\x00\x00\x00\x00\x05{oops", "application/connect+json")
    assert r.status_code == 200 and b'"code":"invalid_argument"' in r.content.replace(b" ", b""), r.content
    r = _raw(e2b_env, sid, "Start", b"\x00\x00\x00", "application/connect+json")      # a cut frame
    assert r.status_code == 200 and b'"code": "unimplemented"' in r.content, r.content   # (connectrpc's answer)
    r = _raw(e2b_env, sid, "Start", b'\x00\x00\x00\x00\x02{}', "application/connect+json")   # no command
    assert b"invalid_argument" in r.content and b"cmd" in r.content, r.content
    r = _raw(e2b_env, sid, "NoSuchMethod", b"{}", "application/json")
    assert r.status_code == 404
    r = _raw(e2b_env, "0" * 32, "List", b"{}", "application/json")
    assert r.status_code == 502 and "was not found" in r.json()["message"]


# ---- who reaches a sandbox ---------------------------------------------------------------------------
def test_only_its_access_token_or_its_tenant_reaches_a_sandbox(tmp_path, home, monkeypatch):
    th = str(tmp_path / "home")
    st = sandtree.Sandtree(th)
    base = st.import_image(home_image_root(home, tmp_path), tag=IMAGE)
    st.share(base.id)                             # every tenant may start sandboxes on it
    st.close()
    tokens = {}
    for tenant in ("alice", "bob"):
        out = subprocess.run([sys.executable, "-m", "sandtree", "--home", th, "token", "create", "--tenant", tenant,
                              "--json"], capture_output=True, text=True, check=True)
        tokens[tenant] = json.loads(out.stdout)["token"]
    with serve_process(th) as url:
        monkeypatch.setenv("E2B_API_URL", f"{url}/e2b")
        monkeypatch.setenv("E2B_SANDBOX_URL", f"{url}/e2b/sandbox")
        monkeypatch.setenv("E2B_API_KEY", tokens["alice"])
        # (no internet: these tokens grant no network policy)
        sa = Sandbox.create(base.id, api_key=tokens["alice"], allow_internet_access=False)
        sb = Sandbox.create(base.id, api_key=tokens["bob"], allow_internet_access=False)
        try:
            check_who_reaches(url, tokens, sa, sb)
        finally:
            sa.kill()
            sb.kill()


def check_who_reaches(url: str, tokens: dict, sa: Sandbox, sb: Sandbox) -> None:
    from e2b.exceptions import AuthenticationException
    a, b, ta, tb = sa.sandbox_id, sb.sandbox_id, sa._envd_access_token, sb._envd_access_token
    assert ta and tb and ta != tb
    # its access token (what create answered): the SDK works
    assert sa.commands.run("echo mine").stdout == "mine\n"
    # none, another sandbox's, a made-up one: refused, and one answer for each
    for given in ({}, {"X-Access-Token": tb}, {"X-Access-Token": "0" * 64}):
        r = _raw(url, a, "List", b"{}", "application/json", **given)
        assert r.status_code == 401, (given, r.text)
    with pytest.raises(AuthenticationException):
        Sandbox(**_opts(b, ta)).commands.run("true")
    # a tenant's token: its own sandbox; another tenant's does not exist for it (E2B's words for that)
    mine = _raw(url, a, "List", b"{}", "application/json", Authorization=f"Bearer {tokens['alice']}")
    assert mine.status_code == 200, mine.text
    for header in ({"Authorization": f"Bearer {tokens['bob']}"}, {"X-API-Key": tokens["bob"]}):
        r = _raw(url, a, "List", b"{}", "application/json", **header)
        assert r.status_code == 502 and r.json()["message"] == f"The sandbox {a} was not found", r.text


def test_an_access_token_grants_its_sandbox_s_operations_only():
    """gate.SandboxGrant (what X-Access-Token gives) over a stand-in view: only rows on a sandbox,
    only on its own (a prefix of its id names it too)."""
    from types import SimpleNamespace

    from sandtree.errors import Forbidden
    from sandtree.http.gate import SandboxGrant
    view = SimpleNamespace(sandbox_info=lambda sid: {"id": sid}, sandbox_list=lambda: [], images=lambda: [])
    grant = SandboxGrant(view, "ab" * 16)
    assert grant.sandbox_info("ab" * 16) == {"id": "ab" * 16} and grant.sandbox_info("abab")["id"] == "abab"
    for call in (lambda: grant.sandbox_info("cd" * 16), lambda: grant.sandbox_info(sid="cd" * 16),
                 lambda: grant.sandbox_list(), lambda: grant.images(), lambda: grant.sandbox_info("")):
        with pytest.raises(Forbidden):
            call()


def home_image_root(home: str, tmp_path) -> str:
    root = make_rootfs(str(tmp_path / "root"))
    with open(os.path.join(root, "bin", "bash"), "w") as f:
        f.write(BASH)
    os.chmod(os.path.join(root, "bin", "bash"), 0o755)
    return root


def test_readme_quick_start(e2b_env, home):
    """e2b's README, as written: `Sandbox.create()` with no template is E2B's default, `base`, a tag of
    this store's image here; only the three variables set."""
    st = sandtree.Sandtree(home)
    try:
        st.image(IMAGE).tag("base")
    finally:
        st.close()
    from e2b import Sandbox

    with Sandbox.create() as sandbox:
        result = sandbox.commands.run('echo "Hello from E2B!"')
        print(result.stdout)  # Hello from E2B!
        assert result.stdout == "Hello from E2B!\n"
