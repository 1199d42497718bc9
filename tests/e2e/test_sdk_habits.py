"""Habits SDK users bring from E2B and Modal (issue 13 item 6), on the in-process engine and over
HTTP alike: files= as a {path: bytes | str | Path} dict and whole local directories, per-stream
output callbacks."""

from __future__ import annotations

import os
import pathlib

import pytest

import sandtree




@pytest.fixture(scope="module")
def base(sdk, rootfs):
    return sdk.import_image(rootfs, tag="habits/base")


def test_files_as_a_dict_and_a_directory(base, tmp_path):
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("print('hi')\n")
    (src / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(src / "run.sh", 0o755)
    single = tmp_path / "one.txt"
    single.write_bytes(b"one\n")
    r = base.run("cat /a /b /c/one.txt /app/pkg/mod.py; /app/run.sh; stat -c %a /app/run.sh",
                 files={"/a": b"bytes\n", "/b": "text\n", "/c/one.txt": single, "/app": src})
    assert r.exit_code == 0, r.stderr
    assert r.stdout == b"bytes\ntext\none\nprint('hi')\nrun\n755\n"
    assert r.image.read("/app/pkg/mod.py") == b"print('hi')\n"


def test_files_refused_before_anything_runs(base, tmp_path):
    with pytest.raises(sandtree.InvalidInput, match="names a directory"):
        base.run("true", files={"/etc/": b"x"})
    with pytest.raises(sandtree.InvalidInput, match="absolute"):
        base.run("true", files={"rel": b"x"})
    with pytest.raises(sandtree.InvalidInput, match="no such local"):
        base.run("true", files={"/x": pathlib.Path(tmp_path / "missing")})
    d = tmp_path / "withlink"
    d.mkdir()
    os.symlink("/etc/shadow", d / "shadow")
    with pytest.raises(sandtree.InvalidInput, match="symbolic link"):
        base.run("true", files={"/x": d})


def test_per_stream_callbacks(base):
    out, err, both = [], [], []
    r = base.run("echo to-out; echo to-err >&2", disposable=True, on_stdout=out.append, on_stderr=err.append,
                 on_output=lambda s, c: both.append(s))
    assert r.exit_code == 0
    assert b"".join(out) == b"to-out\n" and b"".join(err) == b"to-err\n"
    assert set(both) == {"stdout", "stderr"}


def test_per_stream_callbacks_in_a_live_sandbox(base):
    sb = base.start()
    try:
        out, err = [], []
        r = sb.exec("echo live; echo oops >&2", on_stdout=out.append, on_stderr=err.append)
        assert r.exit_code == 0
        assert b"".join(out) == b"live\n" and b"".join(err) == b"oops\n"
    finally:
        sb.stop()


def test_live_sandbox_file_helpers(base):
    """ls / exists / remove / mkdir on a running sandbox, and writes that make their parents,
    each seen from inside the sandbox too."""
    sb = base.start()
    try:
        sb.write("/work/deep/er/note.txt", "hi\n")                  # parents made (mkdir -p)
        assert sb.exec("cat /work/deep/er/note.txt").stdout == b"hi\n"
        assert sb.exists("/work/deep") and not sb.exists("/work/nothing")
        names = {e["name"]: e for e in sb.ls("/work/deep/er")}
        assert names["note.txt"]["kind"] == "file" and names["note.txt"]["size"] == 3
        sb.mkdir("/srv/a/b", mode=0o700, uid=1000, gid=1000)
        assert sb.exec("stat -c '%a %u' /srv/a/b").stdout == b"700 1000\n"
        with pytest.raises(sandtree.InvalidInput, match="files in it"):
            sb.remove("/work/deep")                                  # not emptied from outside
        sb.remove("/work/deep/er/note.txt")
        assert sb.exec("test -e /work/deep/er/note.txt").exit_code == 1
        sb.remove("/work/deep/er")
        assert not sb.exists("/work/deep/er")
        with pytest.raises(sandtree.PathNotFound):
            sb.remove("/work/deep/er")
        sb.exec("ln -s /etc /work/etclink")
        sb.remove("/work/etclink")                                   # the link, not what it names
        assert sb.exec("test -f /etc/passwd").exit_code == 0
        with pytest.raises(sandtree.InvalidInput):
            sb.write("/x/y", b"data", mode=0o77777)                   # refused before any dir is made
        assert not sb.exists("/x")
    finally:
        sb.stop()


def test_live_sandbox_helpers_stay_inside(base):
    """A link the sandbox points at the host is resolved inside the sandbox's root; /proc is not
    the sandbox's own filesystem."""
    sb = base.start()
    try:
        sb.exec("ln -s / /work-root && mkdir -p /tmp")
        sb.mkdir("/work-root/tmp/made")                              # lands in the sandbox's /tmp
        assert sb.exec("test -d /tmp/made").exit_code == 0
        with pytest.raises(sandtree.NotRegularFile):
            sb.ls("/proc")
        with pytest.raises(sandtree.InvalidInput):
            sb.mkdir("/tmp/../etc/x")
    finally:
        sb.stop()


def test_set_timeout_moves_the_end_of_a_live_sandbox(base):
    """E2B's set_timeout: later than the lifetime keeps it past it (its helper's own alarm
    re-reads the deadline), sooner ends it then; bad values change nothing."""
    import time
    sb = base.start(lifetime=2)
    try:
        assert sb.set_timeout(30)["expires"] > time.time() + 25
        time.sleep(3.5)                                             # past the 2 s it started with
        assert sb.exec("echo alive").stdout == b"alive\n"
        with pytest.raises(sandtree.InvalidInput):
            sb.set_timeout(-1)
        with pytest.raises(sandtree.InvalidInput):
            sb.set_timeout(10 ** 9)
        assert sb.exec("true").exit_code == 0                        # unchanged by the refusals
        sb.set_timeout(1)
        time.sleep(2.5)
        with pytest.raises(sandtree.SandtreeError):
            sb.exec("true")                                          # its helper ended it
    finally:
        try:
            sb.stop()
        except sandtree.SandtreeError:
            pass


def test_labels_on_runs_and_sandboxes(sdk, base):
    """labels= (E2B's metadata): kept with a run's operation and a sandbox, which lists filter by;
    bad labels refused before anything starts."""
    r = base.run("true", disposable=True, labels={"exp": "tot-1", "branch": "a"})
    assert sdk.operation(r.operation)["spec"]["labels"] == {"exp": "tot-1", "branch": "a"}
    a = base.start(labels={"pool": "golden", "n": "1"})
    b = base.start(labels={"pool": "other"})
    try:
        assert a.info()["labels"] == {"pool": "golden", "n": "1"}
        assert [s.id for s in sdk.sandboxes(labels={"pool": "golden"})] == [a.id]
        assert {s.id for s in sdk.sandboxes()} >= {a.id, b.id}
        assert sdk.sandboxes(labels={"pool": "golden", "n": "2"}) == []
        before = len(sdk.sandboxes(all=True))
        for bad in ({"bad name": "x"}, {"k": 1}, {f"k{i}": "v" for i in range(65)}):
            with pytest.raises(sandtree.InvalidInput):
                base.start(labels=bad)
            with pytest.raises(sandtree.InvalidInput):
                base.run("true", labels=bad)
        assert len(sdk.sandboxes(all=True)) == before
    finally:
        a.stop()
        b.stop()


def test_mkdir_through_a_link_never_looks_at_the_host(base):
    """A link to an absolute path is resolved inside the sandbox, never from the host's root:
    /etc/os-release is a file on the host and absent from the image, so mkdir through a link to it
    answers as for a dangling link (PathNotFound), not as for a file that exists (NotRegularFile)."""
    assert os.path.isfile("/etc/os-release")                  # on the host
    sb = base.start()
    try:
        assert not sb.exists("/etc/os-release")
        sb.exec("ln -s /etc/os-release /tmp/hostfile")
        with pytest.raises(sandtree.PathNotFound):
            sb.mkdir("/tmp/hostfile/new")
    finally:
        sb.stop()
