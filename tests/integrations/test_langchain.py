"""LangChain / deepagents sandboxes on sandtree (issue 17, deliverable 5).

Two adapters, each on a real Debian image with Python (the session's bookworm image, copied into
this module's store by bundle, plus a `python` link: LangChain's standard tests call `python`):
- sandtree's own `SandtreeSandbox` (src/sandtree/integrations/langchain_sandbox.py), on an
  in-process engine and through a real `sandtree serve` on loopback (`sandtree.connect`);
- contree-sdk 0.3.6's own `ContreeSandbox` (contree_sdk/langchain/sandbox.py), unchanged, against
  that server's Contree API (`/v1`).
Each runs one script of execute / upload / download calls with the error cases, sync and async, and
langchain-tests' standard `SandboxIntegrationTests` (85 tests each).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os

import pytest
from conftest import serve_process

import sandtree

deepagents = pytest.importorskip("deepagents")
contree_langchain = pytest.importorskip("contree_sdk.langchain.sandbox")
from contree_sdk import Contree, ContreeSync  # noqa: E402
from deepagents import create_deep_agent  # noqa: E402
from deepagents.backends.protocol import FileDownloadResponse, FileUploadResponse  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage  # noqa: E402
from langchain_tests.integration_tests import SandboxIntegrationTests  # noqa: E402

from sandtree.integrations.langchain_sandbox import SandtreeSandbox  # noqa: E402

TAG = "bookworm-py"
USER = 1000                    # the standard tests' permission case needs a user that is not root


@pytest.fixture(scope="module")
def home(bookworm) -> str:
    """The session's bookworm store (conftest), with the image that has `python` tagged TAG: opened as it
    is, not copied (a bundle of the image into a store of its own cost a minute of every run)."""
    h, image, _ = bookworm
    st = sandtree.Sandtree(h)
    try:
        r = st.image(image).run("ln -sf python3 /usr/bin/python && python -V")
        assert r.exit_code == 0, r.stderr
        r.image.tag(TAG)
    finally:
        st.close()
    return h


@pytest.fixture(scope="module")
def server(home):
    with serve_process(home) as url:
        yield url


@pytest.fixture(scope="module", params=["local", "remote"])
def st(request, home, server):
    s = sandtree.Sandtree(home) if request.param == "local" else sandtree.connect(server)
    yield s
    s.close()


def contree_sandbox(url: str):
    """contree-sdk's LangChain sandbox exactly as its users make one: a session of an image."""
    session = ContreeSync(base_url=url, token="fake-token").images.use(TAG).session()
    return contree_langchain.ContreeSandbox(session)


# ---- one script for both adapters -----------------------------------------------------------------
BLOB = bytes(range(256)) * 64 + b"\x00end"


def script(backend, *, native: bool) -> None:
    """execute / upload / download, state kept between calls, and every error case."""
    r = backend.execute("echo out; echo err >&2; exit 3")
    assert r.exit_code == 3 and "out\n" in r.output and "err\n" in r.output and not r.truncated
    assert backend.execute("true").exit_code == 0
    # the sandbox keeps its state between calls: files (both), cwd and exported variables (native)
    assert backend.execute("mkdir -p /work/s && cd /work/s && export MODE=dev && echo 1 > state").exit_code == 0
    r = backend.execute("cat /work/s/state; pwd; echo mode=$MODE")
    assert r.output.startswith("1\n")
    if native:
        assert r.output == "1\n/work/s\nmode=dev\n"
    # upload: several at once, in order, binary, parents made; then read back by a command and by download
    up = backend.upload_files([("/work/up/a.bin", BLOB), ("/work/up/deep/er/b.txt", b"hello\n"),
                               ("relative.txt", b"x")])
    assert up == [FileUploadResponse("/work/up/a.bin", None), FileUploadResponse("/work/up/deep/er/b.txt", None),
                  FileUploadResponse("relative.txt", "invalid_path")]
    r = backend.execute("wc -c < /work/up/a.bin; cat /work/up/deep/er/b.txt")
    assert r.output == f"{len(BLOB)}\nhello\n"
    backend.execute("printf made-inside > /work/s/inside.txt")
    down = backend.download_files(["/work/up/a.bin", "/work/s/inside.txt", "/work/s/missing", "rel/x",
                                   "/work/up/deep"])
    assert down[:4] == [FileDownloadResponse("/work/up/a.bin", BLOB, None),
                        FileDownloadResponse("/work/s/inside.txt", b"made-inside", None),
                        FileDownloadResponse("/work/s/missing", None, "file_not_found"),
                        FileDownloadResponse("rel/x", None, "invalid_path")]
    assert down[4].content is None
    assert down[4].error == "is_directory" if native else down[4].error in ("is_directory", "invalid_path")
    # overwrite; the file tools deepagents builds on the three primitives
    assert backend.upload_files([("/work/up/deep/er/b.txt", b"again\n")])[0].error is None
    if native:                     # a directory at the path, a file where a directory should be
        assert [u.error for u in backend.upload_files([("/work/up/deep", b"x"), ("/work/up/a.bin/x", b"x")])] \
            == ["is_directory", "file_not_found"]
    assert backend.download_files(["/work/up/deep/er/b.txt"])[0].content == b"again\n"
    assert backend.write("/work/t/notes.md", "one\ntwo\n").error is None
    assert backend.edit("/work/t/notes.md", "two", "three").occurrences == 1
    assert backend.read("/work/t/notes.md").file_data["content"] == "one\nthree"
    assert [m["path"] for m in backend.grep("three", "/work/t").matches] == ["/work/t/notes.md"]
    assert sorted(m["path"] for m in backend.glob("**/*.txt", "/work").matches) == \
        ["/work/s/inside.txt", "/work/up/deep/er/b.txt"]


async def ascript(backend, *, native: bool) -> None:
    """The async half: the same primitives awaited, five commands at once."""
    rs = await asyncio.gather(*(backend.aexecute(f"echo {i}; exit {i}") for i in range(5)))
    assert [(r.output, r.exit_code) for r in rs] == [(f"{i}\n", i) for i in range(5)]
    up = await backend.aupload_files([("/work/async/x.bin", BLOB), ("nope", b"")])
    assert up == [FileUploadResponse("/work/async/x.bin", None), FileUploadResponse("nope", "invalid_path")]
    down = await backend.adownload_files(["/work/async/x.bin", "/work/async/none"])
    assert down == [FileDownloadResponse("/work/async/x.bin", BLOB, None),
                    FileDownloadResponse("/work/async/none", None, "file_not_found")]
    digest = hashlib.sha256(BLOB).hexdigest()
    assert (await backend.aexecute("sha256sum < /work/async/x.bin")).output.split()[0] == digest


def test_native_script(st):
    with SandtreeSandbox.start(st.image(TAG)) as backend:
        assert backend.id == backend.sandbox.id and backend.sandbox.state == "running"
        script(backend, native=True)
        asyncio.run(ascript(backend, native=True))
    assert st.sandbox(backend.id).state == "stopped"


def test_contree_sdk_script(server):
    backend = contree_sandbox(server)
    script(backend, native=False)
    asyncio.run(ascript(backend, native=False))


def test_contree_sdk_async_client_script(server):
    """The same through contree-sdk's async client (ContreeSession, not ContreeSessionSync)."""
    async def main():
        session = (await Contree(base_url=server, token="fake-token").images.use(TAG)).session()
        backend = contree_langchain.ContreeSandbox(session)
        await ascript(backend, native=False)
    asyncio.run(main())


def test_native_as_a_user_checks_permissions(st):
    """uid=1000: what that user may not do answers permission_denied; root's files stay root's."""
    with SandtreeSandbox.start(st.image(TAG), uid=USER) as backend:
        assert backend.execute("id -u").output == f"{USER}\n"
        backend.execute("mkdir -p /tmp/u && echo secret > /tmp/u/no && chmod 000 /tmp/u/no")
        down = backend.download_files(["/etc/shadow", "/tmp/u/no", "/tmp/u", "/tmp/u/none"])
        assert [d.error for d in down] == ["permission_denied", "permission_denied", "is_directory", "file_not_found"]
        assert all(d.content is None for d in down)
        up = backend.upload_files([("/etc/new.conf", b"x"), ("/usr/lib/x/y", b"x"), ("/tmp/u/no", b"x"),
                                   ("/tmp/u/mine/a.txt", b"mine"), ("/tmp/u", b"x"), ("/etc/passwd/x", b"x")])
        assert [u.error for u in up] == ["permission_denied", "permission_denied", "permission_denied", None,
                                         "is_directory", "file_not_found"]
        assert backend.execute("stat -c %u:%g /tmp/u/mine /tmp/u/mine/a.txt; cat /tmp/u/mine/a.txt").output == \
            f"{USER}:{USER}\n{USER}:{USER}\nmine"
        assert backend.execute("ls /etc/new.conf /usr/lib/x 2>&1; true").output.count("No such file") == 2
        assert backend.sandbox.read("/tmp/u/no") == b"secret\n"     # unchanged


def test_native_commit_fork_rollback(st):
    """The backend's state is an image: commit it, fork a second backend from it, roll back to it."""
    with SandtreeSandbox.start(st.image(TAG), memory="512M") as backend:
        assert backend.image.id == st.image(TAG).id
        backend.upload_files([("/app/state.txt", b"v1\n")])
        v1 = backend.commit(tag="agent/v1")
        assert st.image("agent/v1") == v1 and v1.run("cat /app/state.txt").stdout == b"v1\n"
        backend.execute("echo v2 > /app/state.txt && rm -rf /usr/share/doc")
        with backend.fork() as other:                        # its own sandbox, from the files now
            assert other.id != backend.id
            assert other.execute("cat /app/state.txt").output == "v2\n"
            other.execute("echo fork > /app/state.txt")
            assert other.sandbox.info()["limits"]["memory"] == 512 << 20     # started as this one was
        assert backend.execute("cat /app/state.txt").output == "v2\n"   # the fork changed only its own
        first = backend.id
        backend.rollback(v1)
        assert backend.id != first and st.sandbox(first).state == "stopped"
        assert backend.image == v1 and backend.sandbox.info()["limits"]["memory"] == 512 << 20
        assert backend.execute("cat /app/state.txt; ls /usr/share/doc | wc -l").output.split()[0] == "v1"
        assert int(backend.execute("ls /usr/share/doc | wc -l").output) > 0

        async def amain():
            v2 = await backend.acommit()
            assert v2.run("cat /app/state.txt").stdout == b"v1\n"
            forked = await backend.afork()
            async with forked:
                assert (await forked.aexecute("cat /app/state.txt")).output == "v1\n"
            assert st.sandbox(forked.id).state == "stopped"
        asyncio.run(amain())


def test_native_timeout_and_bad_input(st):
    with SandtreeSandbox.start(st.image(TAG), timeout=1, lifetime=120) as backend:
        assert backend.execute("sleep 3").exit_code == 124                    # the backend's default
    with SandtreeSandbox.start(st.image(TAG), timeout=60) as backend:
        r = backend.execute("echo started; sleep 30; echo never", timeout=1)
        assert r.exit_code == 124 and r.output.startswith("started\n") and "timed out after 1" in r.output
        assert "never" not in r.output
        assert backend.execute("echo still here").output == "still here\n"     # the sandbox goes on
        r = backend.execute("sleep 2; echo no limit of its own", timeout=0)     # the lifetime bounds it
        assert r.exit_code == 0 and r.output == "no limit of its own\n"
        r = backend.execute("head -c 20000000 /dev/zero")                       # past 16 MiB a stream
        assert r.truncated
        with pytest.raises(sandtree.InvalidInput):
            backend.execute("true", timeout=-1)
    with pytest.raises(sandtree.InvalidInput):
        SandtreeSandbox(backend.sandbox, uid=-1)
    running = {sb.id for sb in st.sandboxes()}
    for bad in ({"uid": "root"}, {"gid": -1}, {"timeout": -5}):        # refused before anything starts
        with pytest.raises(sandtree.InvalidInput):
            SandtreeSandbox.start(st.image(TAG), **bad)
    assert {sb.id for sb in st.sandboxes()} == running


class ScriptedModel(GenericFakeChatModel):
    """LangChain's own fake chat model answering a fixed list of messages (tool calls included);
    the agent binds its tools to it, which a script does not need."""

    def bind_tools(self, tools, **kwargs):
        return self


def run_agent(backend) -> list:
    """A deepagents agent (create_deep_agent) whose scripted model writes a file, runs it through
    `execute` and reads what it wrote, all through `backend`."""
    calls = [("write_file", {"file_path": "/app/hello.py", "content": "print('hello from the agent')\n"}),
             ("execute", {"command": "cd /app && python3 hello.py > out.txt && cat out.txt"}),
             ("read_file", {"file_path": "/app/out.txt"})]
    script = [AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": f"call-{i}"}])
              for i, (n, a) in enumerate(calls)] + [AIMessage(content="done")]
    agent = create_deep_agent(model=ScriptedModel(messages=iter(script)), backend=backend)
    out = agent.invoke({"messages": [{"role": "user", "content": "say hello"}]})
    return [m.content for m in out["messages"] if m.type == "tool"]


def test_deep_agent_on_the_native_backend(st):
    with SandtreeSandbox.start(st.image(TAG)) as backend:
        tools = run_agent(backend)
        assert tools[0] == "Updated file /app/hello.py"
        assert tools[1].startswith("hello from the agent\n") and "exit code 0" in tools[1]
        assert tools[2].endswith("hello from the agent")
        assert backend.execute("pwd").output == "/app\n"          # the agent's cd is the session's
        assert backend.commit().run("cat /app/out.txt").stdout == b"hello from the agent\n"


def test_deep_agent_on_contree_sdk_backend(server):
    tools = run_agent(contree_sandbox(server))
    assert tools[0] == "Updated file /app/hello.py"
    assert tools[1].startswith("hello from the agent\n") and tools[2].endswith("hello from the agent")


# ---- langchain-tests' standard sandbox suite ----------------------------------------------------------
# langchain-tests 1.1.9 still expects what deepagents' BaseSandbox did before 0.7: glob answering
# paths relative to the search root and directories too, and write() refusing an existing file.
# deepagents 0.7.32 (installed) answers absolute paths of files only (its _absolutize_glob_path: deny
# rules match absolute paths) and overwrites (BaseSandbox.write: "creating or overwriting"). Those
# methods are BaseSandbox's own, not an adapter's: contree-sdk's backend fails them the same way.
# strict: when the two packages agree again, these fail and the list goes.
BASE_SANDBOX_CHANGED = ["test_glob", "test_glob_basic_pattern", "test_glob_with_directories",
                        "test_glob_hidden_files_explicitly", "test_glob_with_character_class",
                        "test_glob_with_question_mark", "test_write_existing_file_fails"]


def _standard(cls):
    """cls with the changed tests as strict xfails (the one override the suite allows: its
    test_no_overrides_DO_NOT_OVERRIDE checks) and its async tests run by pytest-asyncio (a class
    mark, so nothing else is overridden; on its sync tests the mark does nothing)."""
    for name in BASE_SANDBOX_CHANGED:
        base = getattr(SandboxIntegrationTests, name)

        def test(self, *args, _base=base, **kwargs):
            return _base(self, *args, **kwargs)
        test = functools.wraps(base)(test)
        setattr(cls, name, pytest.mark.xfail(strict=True, reason="BaseSandbox changed in deepagents 0.7")(test))
    cls = pytest.mark.asyncio(cls)
    return pytest.mark.filterwarnings("ignore:The test <Function .* is marked with '@pytest.mark.asyncio'")(cls)


@_standard
class TestSandtreeSandboxStandard(SandboxIntegrationTests):
    """The native backend in process, its commands as root (the default)."""

    @pytest.fixture(scope="class")
    @classmethod
    def sandbox(cls, home):
        st = sandtree.Sandtree(home)
        try:
            with SandtreeSandbox.start(st.image(TAG)) as backend:
                yield backend
        finally:
            st.close()


@_standard
class TestSandtreeSandboxRemoteUserStandard(SandboxIntegrationTests):
    """The same backend through `sandtree serve` (sandtree.connect), its commands as uid 1000."""

    @pytest.fixture(scope="class")
    @classmethod
    def sandbox(cls, server):
        st = sandtree.connect(server)
        try:
            with SandtreeSandbox.start(st.image(TAG), uid=USER) as backend:
                yield backend
        finally:
            st.close()


@_standard
class TestContreeSandboxStandard(SandboxIntegrationTests):
    """contree-sdk's own backend, unchanged, against our Contree API."""

    @pytest.fixture(scope="class")
    @classmethod
    def sandbox(cls, server):
        yield contree_sandbox(server)
