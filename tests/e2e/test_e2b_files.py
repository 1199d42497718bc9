"""E2B's own `e2b` SDK (sync and async), unmodified, on sandtree's envd filesystem: files write/read (text,
bytes, several, octet-stream, gzip), list with depth, exists, make_dir, rename, remove, get_info, watch_dir
(recursive: an event arrives after a write), and bad input answered with E2B's errors, never a 500.

Against a real `sandtree serve` on loopback with only E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY set. The
sandbox is started with sandtree's own SDK and reached with E2B's Sandbox / AsyncSandbox built the way
`Sandbox.connect` builds them from the control plane's answer (its id in E2b-Sandbox-Id, envd's port in
E2b-Sandbox-Port, the envd version): the control plane's connect is another part of E2B's protocol
(http/e2b/control.py), tested on its own."""

from __future__ import annotations

import asyncio
import gzip
import io
import time

import httpx
import pytest

import sandtree
from conftest import serve_process

e2b = pytest.importorskip("e2b")
from e2b import AsyncSandbox, ConnectionConfig, FileType, Sandbox  # noqa: E402
from e2b.exceptions import FileNotFoundException, InvalidArgumentException, SandboxException  # noqa: E402
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType  # noqa: E402
from packaging.version import Version  # noqa: E402

pytestmark = pytest.mark.root
ENVD_VERSION = Version("0.6.4")          # what sandtree's envd implements of the filesystem (see envd/)
MAX_UPLOAD = 4 << 20                     # the server's upload cap here (serve --max-upload)


@pytest.fixture(scope="module")
def served(tmp_path_factory, rootfs):
    home = tmp_path_factory.mktemp("e2bfs")
    with serve_process(str(home), "--max-upload", str(MAX_UPLOAD)) as url:
        st = sandtree.connect(url)
        img = st.import_image(rootfs, tag="e2b/bb")
        yield url, st, img
        st.close()


@pytest.fixture
def live(served, monkeypatch):
    url, st, img = served
    monkeypatch.setenv("E2B_API_URL", url + "/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", url + "/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", "e2b_unused_on_a_loopback_server")
    sb = img.start()
    try:
        yield sb
    finally:
        sb.stop()


def _opts(sid: str) -> dict:
    cc = ConnectionConfig(extra_sandbox_headers={"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983"})
    return dict(sandbox_id=sid, envd_version=ENVD_VERSION, envd_access_token=None, sandbox_domain=None,
                connection_config=cc)


def sync_sandbox(sid: str) -> Sandbox:
    return Sandbox(**_opts(sid))


def test_files_sync(live):
    s = sync_sandbox(live.id)
    info = s.files.write("/work/a.txt", "hello")
    assert (info.name, info.path, info.type) == ("a.txt", "/work/a.txt", FileType.FILE)
    assert s.files.read("/work/a.txt") == "hello"
    s.files.write("/work/bin", b"\x00\xff\x01")
    assert s.files.read("/work/bin", format="bytes") == bytearray(b"\x00\xff\x01")
    assert b"".join(s.files.read("/work/a.txt", format="stream")) == b"hello"
    several = s.files.write_files([{"path": "/work/m/one", "data": "1"}, {"path": "/work/m/two", "data": b"2"}])
    assert [w.path for w in several] == ["/work/m/one", "/work/m/two"]
    s.files.write("/work/stream", io.BytesIO(b"streamed"))                     # octet-stream (envd >= 0.5.7)
    s.files.write("/work/zipped", b"z" * 1000, gzip=True)                      # octet-stream, gzip
    assert live.exec("cat /work/m/one /work/m/two /work/stream; wc -c < /work/zipped").stdout == b"12streamed1000\n"
    assert s.files.exists("/work/a.txt") and not s.files.exists("/work/nope")

    # relative paths start at the user's home, as E2B's envd resolves them
    home = live.exec("awk -F: '$1==\"user\"{print $6}' /etc/passwd").stdout.decode().strip() or "/root"
    assert s.files.write("rel.txt", "r").path == f"{home}/rel.txt"
    assert s.files.read(f"{home}/rel.txt") == "r"
    assert s.files.write("mine.txt", "r", user="root").path == "/root/mine.txt"

    assert s.files.make_dir("/work/d/e") is True
    assert s.files.make_dir("/work/d/e") is False                               # there already
    top = {e.name: e for e in s.files.list("/work")}
    assert top["d"].type == FileType.DIR and top["a.txt"].size == 5 and "e" not in top
    assert top["d"].size == 0 and top["d"].permissions == "drwxr-xr-x"                # as envd reports a directory
    deep = [e.path for e in s.files.list("/work", depth=3)]
    assert {"/work/d", "/work/d/e", "/work/m/one"} <= set(deep)
    assert deep == sorted(deep, key=lambda p: p.split("/"))                     # walk order, as envd lists
    assert [e.name for e in s.files.list("/work/m", depth=2)] == ["one", "two"]

    got = s.files.get_info("/work/a.txt")
    assert (got.size, got.permissions, got.mode) == (5, "-rw-r--r--", 0o644)
    live.exec("ln -s a.txt /work/link")
    link = s.files.get_info("/work/link")
    assert link.type == FileType.SYMLINK and link.symlink_target == "/work/a.txt"

    moved = s.files.rename("/work/a.txt", "/work/d/e/b.txt")
    assert moved.path == "/work/d/e/b.txt" and not s.files.exists("/work/a.txt")
    s.files.rename("/work/bin", "/work/new/dir/bin")                            # parents made, as envd does
    s.files.write("/work/x", "x")
    s.files.rename("/work/x", "/work/d/e/b.txt")                                # replaced, as os.Rename
    assert s.files.read("/work/d/e/b.txt") == "x"
    s.files.remove("/work/d")                                                   # a whole tree
    assert not s.files.exists("/work/d")
    assert live.exec("test -e /work/d").exit_code == 1


def test_watch_dir_sync(live):
    s = sync_sandbox(live.id)
    s.files.make_dir("/work/w/sub")
    h = s.files.watch_dir("/work/w", recursive=True)
    try:
        s.files.write("/work/w/sub/f.txt", "one")
        # as E2B's own test_watch_directory_changes: there when the write returns, create, chmod, write
        assert [(e.name, e.type) for e in h.get_new_events()] == [
            ("sub/f.txt", FilesystemEventType.CREATE), ("sub/f.txt", FilesystemEventType.CHMOD),
            ("sub/f.txt", FilesystemEventType.WRITE)]
        s.files.write("/work/w/sub/f.txt", "one")
        live.exec("echo two > /work/w/made; rm /work/w/made")
        events, deadline = [], time.monotonic() + 10
        while time.monotonic() < deadline and not any(e.type == FilesystemEventType.REMOVE for e in events):
            events += h.get_new_events()
            time.sleep(0.05)
        seen = {(e.name, e.type) for e in events}
        assert ("sub/f.txt", FilesystemEventType.WRITE) in seen and ("sub/f.txt", FilesystemEventType.CREATE) in seen
        assert ("made", FilesystemEventType.CREATE) in seen and ("made", FilesystemEventType.REMOVE) in seen
    finally:
        h.stop()
    with pytest.raises(SandboxException):
        h.get_new_events()                                                      # stopped
    with pytest.raises(InvalidArgumentException):
        s.files.watch_dir("/etc/passwd")                                        # not a directory
    with pytest.raises(FileNotFoundException):
        s.files.watch_dir("/work/none")


def test_files_async(live):
    async def main():
        s = AsyncSandbox(**_opts(live.id))
        await s.files.write("/work/as.txt", "async")
        assert await s.files.read("/work/as.txt") == "async"
        await s.files.write_files([{"path": "/work/as/1", "data": "1"}, {"path": "/work/as/2", "data": "2"}])
        assert [e.name for e in await s.files.list("/work/as")] == ["1", "2"]
        assert await s.files.exists("/work/as/1") and await s.files.make_dir("/work/as/sub")
        assert (await s.files.rename("/work/as/1", "/work/as/sub/1")).path == "/work/as/sub/1"
        assert (await s.files.get_info("/work/as/sub/1")).size == 1

        seen, arrived = [], asyncio.Event()

        def on_event(ev):
            seen.append(ev)
            if ev.name == "sub/new" and ev.type == FilesystemEventType.WRITE:
                arrived.set()
        h = await s.files.watch_dir("/work/as", on_event, recursive=True, include_entry=True)
        try:
            await s.files.write("/work/as/sub/new", "n")
            await asyncio.wait_for(arrived.wait(), 10)
        finally:
            await h.stop()
        entry = [e.entry for e in seen if e.name == "sub/new" and e.type == FilesystemEventType.WRITE][0]
        assert entry is not None and (entry.path, entry.size) == ("/work/as/sub/new", 1)
        await s.files.remove("/work/as")
        assert not await s.files.exists("/work/as")
        with pytest.raises(FileNotFoundException):
            await s.files.read("/work/as/2")
    asyncio.run(main())


def test_bad_input_gets_e2b_errors(live, served):
    s = sync_sandbox(live.id)
    with pytest.raises(FileNotFoundException):
        s.files.read("/work/missing")
    with pytest.raises(FileNotFoundException):
        s.files.get_info("/work/missing")
    s.files.remove("/work/missing")                                              # nothing there: done, as E2B's
    with pytest.raises(FileNotFoundException):
        s.files.rename("/work/missing", "/work/else")
    for bad in ("../etc/passwd", "/work/../etc/x", "~/../x"):
        with pytest.raises(InvalidArgumentException, match=r"'\.\.'"):
            s.files.write(bad, "x")
        with pytest.raises(InvalidArgumentException):
            s.files.read(bad)
        with pytest.raises(InvalidArgumentException):
            s.files.list(bad)
    with pytest.raises(InvalidArgumentException):
        s.files.list("/etc/passwd")                                             # not a directory
    with pytest.raises(InvalidArgumentException, match="metadata"):
        s.files.write("/work/meta", "m", metadata={"k": "v"})                  # refused, not dropped
    with pytest.raises(InvalidArgumentException, match="no such user"):
        s.files.read("/etc/hostname", user="nobody-here")
    live.exec("mkdir -p /work && ln -s / /work/hostroot")                                       # a link stays inside the sandbox
    s.files.write("/work/hostroot/tmp/inside", "in")
    assert live.exec("cat /tmp/inside").stdout == b"in"

    # past the server's upload cap: refused in E2B's shape, nothing written
    with pytest.raises(SandboxException, match="413"):
        s.files.write("/work/huge", b"h" * (MAX_UPLOAD + 1))
    # streamed (no length ahead): cut at the cap while it comes; the server answers 413 and closes, which
    # a client still sending may see as the connection's reset (HTTP/1.1 has no other way to stop a body)
    with pytest.raises((SandboxException, httpx.TransportError)):
        s.files.write("/work/huge", io.BytesIO(b"h" * (MAX_UPLOAD + 1)))
    assert not s.files.exists("/work/huge")

    url = served[0] + "/e2b/sandbox"
    hdr = {"E2b-Sandbox-Id": live.id, "E2b-Sandbox-Port": "49983"}
    with httpx.Client(trust_env=False, timeout=30) as c:
        for r in (c.post(url + "/files", headers={**hdr, "Content-Type": "text/plain"}, content=b"x"),
                  c.post(url + "/files", headers={**hdr, "Content-Type": "multipart/form-data; boundary=zz"},
                         content=b"--zz\r\nnot a part"),
                  c.post(url + "/files", params={"path": "/work/g"}, content=b"not gzip",
                         headers={**hdr, "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}),
                  c.post(url + "/files", headers=hdr, content=b"no path"),
                  c.get(url + "/files", headers=hdr, params={"path": "/proc/self/status"}),
                  c.get(url + "/files", headers=hdr, params={"path": "/work"}),
                  c.put(url + "/files", headers=hdr, content=b"x"),
                  c.post(url + "/filesystem.Filesystem/Stat", headers={**hdr, "Content-Type": "application/json"},
                         content=b"{not json"),
                  c.post(url + "/filesystem.Filesystem/Stat", headers={**hdr, "Content-Type": "application/proto"},
                         content=b"\xff\xff\xff")):
            assert 400 <= r.status_code < 500, (r.request.url, r.status_code, r.text)
            assert r.json().get("code") and r.json().get("message"), r.text
        bomb = gzip.compress(b"\0" * (MAX_UPLOAD * 2))                          # inflates past the cap
        r = c.post(url + "/files", params={"path": "/work/bomb"}, content=bomb,
                   headers={**hdr, "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
        assert r.status_code == 413 and r.json()["code"] == 413
    assert not s.files.exists("/work/bomb") and not s.files.exists("/work/g")


@pytest.mark.gvisor
def test_files_and_watch_on_gvisor(served, monkeypatch):
    """The same envd on a gVisor sandbox: its files are the host overlay the gofer writes, so the host's
    inotify sees a process's writes there."""
    url, st, img = served
    if not {r["tier"]: r for r in st.doctor()}["gvisor"]["available"]:
        pytest.skip("gVisor is not available here")
    monkeypatch.setenv("E2B_API_URL", url + "/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", url + "/e2b/sandbox")
    monkeypatch.setenv("E2B_API_KEY", "e2b_unused_on_a_loopback_server")
    sb = img.start(tier="gvisor")
    try:
        s = sync_sandbox(sb.id)
        s.files.write("/work/g.txt", "gv")
        assert s.files.read("/work/g.txt") == "gv" and s.files.get_info("/work/g.txt").size == 2
        h = s.files.watch_dir("/work", recursive=True)
        try:
            sb.exec("mkdir /work/in && echo x > /work/in/made")
            events, deadline = [], time.monotonic() + 10
            while time.monotonic() < deadline and ("in/made", FilesystemEventType.WRITE) not in events:
                events += [(e.name, e.type) for e in h.get_new_events()]
                time.sleep(0.05)
            assert ("in/made", FilesystemEventType.WRITE) in events, events
        finally:
            h.stop()
    finally:
        sb.stop()
