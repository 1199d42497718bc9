"""stat, rename and directory watches of a live sandbox (sandbox_stat, sandbox_rename, sandbox_watch with
sandbox_watch_events and sandbox_unwatch), and ls with depth / remove recursive: through the SDK on the
in-process engine and over HTTP alike, REST's NDJSON stream of a watch, the CLI, and both tiers. Every host-side
step stays inside the sandbox's root (a link it plants is resolved inside it, never followed out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import httpx
import pytest

import sandtree
from conftest import serve_process

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def base(sdk, rootfs):
    return sdk.import_image(rootfs, tag="livefiles/base")


def _until(sb, wid, pred, rounds=20):
    """Events of a watch until pred(events) holds (each call waits up to 1 s for the next ones)."""
    events = []
    for _ in range(rounds):
        events += sb.watch_events(wid, timeout=1.0)["events"]
        if pred(events):
            break
    return events


def test_stat_and_rename(base):
    sb = base.start()
    try:
        sb.exec("mkdir -p /w/d && echo hi > /w/f && chmod 640 /w/f && chown 1000:1000 /w/f && ln -s f /w/l")
        st = sb.stat("/w/f")
        assert {k: st[k] for k in ("name", "kind", "path", "size", "mode", "permissions", "uid", "gid")} == \
            {"name": "f", "kind": "file", "path": "/w/f", "size": 3, "mode": 0o640, "permissions": "-rw-r-----",
             "uid": 1000, "gid": 1000}
        assert st["mtime"] > 0 and st["target"] is None
        assert sb.stat("/")["kind"] == "dir"
        link = sb.stat("/w/l")
        assert (link["kind"], link["target"]) == ("symlink", "f")                   # not followed
        assert sb.stat("/etc/passwd")["owner"] == "root"
        with pytest.raises(sandtree.PathNotFound):
            sb.stat("/w/none")
        with pytest.raises(sandtree.InvalidInput):
            sb.stat("relative")

        moved = sb.rename("/w/f", "/w/d/g")
        assert moved["path"] == "/w/d/g" and moved["size"] == 3
        assert sb.exec("cat /w/d/g; test -e /w/f").stdout == b"hi\n"
        sb.exec("echo other > /w/o")
        with pytest.raises(sandtree.Conflict):
            sb.rename("/w/o", "/w/d/g")                                           # there: refused ...
        assert sb.read("/w/d/g") == b"hi\n"                                        # ... and unchanged
        sb.rename("/w/o", "/w/d/g", replace=True)
        assert sb.read("/w/d/g") == b"other\n" and not sb.exists("/w/o")
        sb.rename("/w/d", "/w/e")                                                   # a directory, whole
        assert sb.exec("cat /w/e/g").stdout == b"other\n"
        with pytest.raises(sandtree.InvalidInput):
            sb.rename("/w/e", "/w/e/inside")                                        # into itself
        with pytest.raises(sandtree.PathNotFound):
            sb.rename("/w/none", "/w/x")
        with pytest.raises(sandtree.InvalidInput):
            sb.rename("/w/e/g", "/w/../etc/g")
        with pytest.raises(sandtree.InvalidInput):
            sb.rename("/", "/w/root")

        sb.exec("ln -s / /w/hostroot")                                              # a link out: resolved inside
        sb.rename("/w/e/g", "/w/hostroot/tmp/g")
        assert sb.exec("cat /tmp/g").stdout == b"other\n"
        assert sb.stat("/w/hostroot/tmp/g")["size"] == 6
        with pytest.raises(sandtree.NotRegularFile):
            sb.stat("/proc/1/status")                                               # not its own files
    finally:
        sb.stop()


def test_ls_depth_and_recursive_remove(base):
    sb = base.start()
    try:
        sb.exec("mkdir -p /t/a/b/c && echo 1 > /t/a/one && echo 2 > /t/a/b/two && ln -s /etc /t/etc")
        assert {e["path"] for e in sb.ls("/t")} == {"/t/a", "/t/etc"}
        two = {e["path"]: e for e in sb.ls("/t", depth=3)}
        assert {"/t/a/one", "/t/a/b", "/t/a/b/two", "/t/a/b/c"} <= set(two)
        assert not any(p.startswith("/t/etc/") for p in two)                        # links not followed
        assert two["/t/a/one"]["owner"] == "root" and two["/t/etc"]["target"] == "/etc"
        with pytest.raises(sandtree.InvalidInput):
            sb.ls("/t", depth=0)
        with pytest.raises(sandtree.InvalidInput, match="files in it"):
            sb.remove("/t/a")
        sb.remove("/t", recursive=True)
        assert not sb.exists("/t") and sb.exec("test -f /etc/passwd").exit_code == 0   # the link's target stays
    finally:
        sb.stop()


def test_watch_events(base):
    sb = base.start()
    try:
        sb.exec("mkdir -p /w/sub")
        w = sb.watch("/w", recursive=True)
        flat = sb.watch("/w")
        sb.exec("echo a > /w/sub/f; chmod 600 /w/sub/f; mv /w/sub/f /w/g; rm /w/g; mkdir /w/new && echo b > /w/new/h")
        sb.write("/w/sub/written", b"x")
        events = _until(sb, w["watch"], lambda ev: ("sub/written", "write") in {(e["name"], e["type"]) for e in ev})
        got = [(e["name"], e["type"]) for e in events]
        for want in [("sub/f", "create"), ("sub/f", "write"), ("sub/f", "chmod"), ("sub/f", "rename"),
                     ("g", "create"), ("g", "remove"), ("new", "create"), ("new/h", "write"),
                     ("sub/written", "create"), ("sub/written", "write")]:
            assert want in got, (want, got)
        assert not any(".sandtree-write-" in n for n, _ in got)                    # the engine's temporary name
        names = {e["name"] for e in sb.watch_events(flat["watch"], timeout=1.0)["events"]}
        assert "g" in names and not any("/" in n for n in names)                   # not recursive: its own entries
        assert sb.watch_events(w["watch"])["events"] == []                          # taken: nothing new
        sb.unwatch(flat["watch"])
        with pytest.raises(sandtree.NotFound):
            sb.watch_events(flat["watch"])
        with pytest.raises(sandtree.InvalidInput):
            sb.watch_events(w["watch"], timeout=-1)
        with pytest.raises(sandtree.PathNotFound):
            sb.watch("/none")
        sb.exec("echo late > /w/late")
        sb.stop()
        with pytest.raises((sandtree.Ended, sandtree.NotFound)):                    # ends with its sandbox
            for _ in range(5):
                sb.watch_events(w["watch"], timeout=1.0)
    finally:
        if sb.info()["state"] == "running":
            sb.stop()


def test_watch_on_each_tier(bb, each_tier):
    """The host's inotify sees a gVisor sandbox's writes too: its root is a host overlay the gofer writes."""
    sb = bb.start()
    try:
        sb.exec("mkdir -p /w")
        w = sb.watch("/w", recursive=True)
        sb.exec("mkdir /w/d; echo in > /w/d/f")
        got = {(e["name"], e["type"]) for e in _until(sb, w["watch"], lambda ev: any(e["name"] == "d/f" and e["type"] == "write" for e in ev))}
        assert ("d", "create") in got and ("d/f", "write") in got, got
        sb.unwatch(w["watch"])
    finally:
        sb.stop()


def test_rest_stream_and_cli(rootfs, tmp_path):
    home = tmp_path / "home"
    with serve_process(str(home)) as url:
        st = sandtree.connect(url)
        sb = st.import_image(rootfs, tag="bb").start()
        try:
            sb.exec("mkdir -p /w")
            with httpx.Client(base_url=url + "/api/v1", trust_env=False, timeout=30) as c:
                w = c.post(f"/sandboxes/{sb.id}/watches", json={"path": "/w", "recursive": True})
                assert w.status_code == 201, w.text
                wid = w.json()["watch"]
                lines = []
                with c.stream("GET", f"/sandboxes/{sb.id}/watches/{wid}/events", params={"stream": "true"}) as r:
                    assert r.headers["content-type"].startswith("application/x-ndjson")
                    threading.Timer(0.3, lambda: sb.write("/w/streamed", b"s")).start()
                    for line in r.iter_lines():
                        if line.strip():
                            lines.append(json.loads(line))
                        if ("streamed", "write") in {(e["name"], e["type"]) for e in lines}:
                            break
                assert lines[0]["name"] == "streamed"
                assert c.delete(f"/sandboxes/{sb.id}/watches/{wid}").status_code == 204
                assert c.get(f"/sandboxes/{sb.id}/watches/{wid}/events").status_code == 404
                assert c.get(f"/sandboxes/{sb.id}/watches/{wid}/events", params={"timeout": 61}).status_code == 422
                r = c.get(f"/sandboxes/{sb.id}/stat", params={"path": "/w/streamed"})
                assert r.json()["size"] == 1
                r = c.post(f"/sandboxes/{sb.id}/rename", json={"source": "/w/streamed", "destination": "/w/x"})
                assert r.status_code == 200 and r.json()["path"] == "/w/x"
                r = c.post(f"/sandboxes/{sb.id}/rename", json={"source": "/w/x", "destination": "/w"})
                assert r.status_code == 409 and r.json()["error"] == "conflict"
        finally:
            sb.stop()
        st.close()

    env = {**os.environ, "SANDTREE_HOME": str(home)}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "sandtree", *args], env=env, capture_output=True, timeout=120)
    sid = json.loads(cli("start", "bb", "--json").stdout)["id"]
    try:
        cli("exec", sid, "--", "mkdir -p /c")
        watcher = subprocess.Popen([sys.executable, "-m", "sandtree", "sandbox", "watch", sid, "/c", "--count", "2"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            for _ in range(100):                       # until its watch is made: then the write is seen
                cli("exec", sid, "--", "echo x >> /c/f")
                try:
                    watcher.wait(0.2)
                    break
                except subprocess.TimeoutExpired:
                    continue
            out, err = watcher.communicate(timeout=30)
        finally:
            if watcher.poll() is None:
                watcher.kill()
        events = [json.loads(x) for x in out.decode().splitlines()]
        assert len(events) == 2 and {e["name"] for e in events} == {"f"}, err
        st = json.loads(cli("sandbox", "stat", sid, "/c/f", "--json").stdout)
        assert st["kind"] == "file" and st["size"] > 0
        assert cli("sandbox", "mv", sid, "/c/f", "/c/g").returncode == 0
        p = cli("sandbox", "mv", sid, "/c/none", "/c/h")
        assert p.returncode != 0 and b"no such file" in p.stderr
        assert json.loads(cli("sandbox", "stat", sid, "/c/g", "--json").stdout)["name"] == "g"
    finally:
        cli("stop", sid)
