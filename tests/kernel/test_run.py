"""The run → new image loop: inputs, results, commit semantics, convergence and bad input."""

from __future__ import annotations

import threading
import time

import pytest

import sandtree
from sandtree import CommandNotFound, ImageNotFound, InvalidInput

pytestmark = pytest.mark.usefixtures("each_tier")     # the whole module, once per tier


def test_run_shell_and_argv(bb):
    r = bb.run("echo hello; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.ok) == (b"hello\n", b"err\n", 3, False)
    r = bb.run(["echo", "a b", "$HOME"])
    assert r.stdout == b"a b $HOME\n" and r.exit_code == 0


def test_inputs_env_cwd_stdin_uid_hostname(bb):
    r = bb.run("echo $FOO; pwd; cat; id -u; id -g; hostname", env={"FOO": "bar"}, cwd="/etc",
               stdin=b"from stdin\n", uid=1000, gid=1000, hostname="box1", disposable=True)
    assert r.stdout.decode().split("\n")[:6] == ["bar", "/etc", "from stdin", "1000", "1000", "box1"]


def test_files_injected_and_committed(bb):
    r = bb.run("cat /app/main.sh; echo; stat -c '%a %u' /app/main.sh; sh /app/main.sh",
               files=[{"path": "/app/main.sh", "content": "echo injected", "mode": 0o750, "uid": 1000}])
    lines = r.stdout.decode().split("\n")
    assert lines[:3] == ["echo injected", "750 1000", "injected"]
    assert r.image.read("/app/main.sh") == b"echo injected"
    assert r.image.stat("/etc")["mode"] == bb.stat("/etc")["mode"]
    with pytest.raises(sandtree.PathEscape):
        bb.run("true", files=[{"path": "/etc/greeting/x", "content": "no"}])


def test_result_image_and_lineage(bb):
    r = bb.run("echo one > /f")
    assert r.image is not None and r.image != bb
    assert r.image.read("/f") == b"one\n"
    assert bb in r.image.parents()
    assert r.image in bb.children()
    r2 = r.image.run("echo two >> /f")
    assert r2.image.read("/f") == b"one\ntwo\n"
    log = r2.image.log()
    assert [e["image"] for e in log[:3]] == [r2.image.id, r.image.id, bb.id]
    assert log[0]["command"] == "echo two >> /f" and log[0]["exit_code"] == 0
    op = r2.image._st.operation(r2.operation)
    assert op["source"] == r.image.id and op["result"] == r2.image.id


def test_no_change_keeps_id_and_convergence(bb):
    assert bb.run("true").image == bb
    assert bb.run("cat /etc/greeting > /dev/null; touch /tmp").image == bb   # mtime is not state
    a = bb.run("printf same > /tmp/x").image
    b = bb.run("printf same > /tmp/x").image
    assert a == b                                        # branches that converge share one ID
    c = bb.run("printf same > /tmp/x; mkdir -p /tmp && true").image
    assert c == a


def test_deletions_opaque_dirs_and_metadata(bb, each_tier):
    r = bb.run("rm /etc/greeting; rm -rf /usr; mkdir /usr; echo n > /usr/new; chmod 700 /var; "
               "chown 1000:1000 /root; ln -s /etc/passwd /pw; mkfifo /fifo")
    img = r.image
    names = [e["name"] for e in img.ls("/etc")]
    assert "greeting" not in names and "passwd" in names
    assert [e["name"] for e in img.ls("/usr")] == ["new"]
    assert img.stat("/var")["mode"] == "0700"
    assert (img.stat("/root")["uid"], img.stat("/root")["gid"]) == (1000, 1000)
    assert img.stat("/pw")["target"] == "/etc/passwd"
    if each_tier != "gvisor":                            # gVisor keeps named pipes in its memory
        assert img.stat("/fifo")["type"] == "fifo"
    # and what was committed is what the next sandbox sees
    out = img.run("ls /usr; test -e /etc/greeting || echo gone; stat -c %a /var").stdout.decode().split()
    assert out == ["new", "gone", "700"]


def test_hard_links_made_and_broken(bb):
    img = bb.run("echo x > /a; ln /a /b; ln /a /c").image
    assert img.stat("/b")["hardlink"] == img.stat("/c")["hardlink"] == "/a"
    assert img.run("stat -c %h /a").stdout == b"3\n"
    img2 = img.run("echo y > /b.new; mv /b.new /b").image        # /b leaves the group
    assert img2.stat("/a")["hardlink"] == img2.stat("/c")["hardlink"] == "/a"
    assert "hardlink" not in img2.stat("/b")
    img3 = img2.run("rm /a").image                                # only /c is left: no group
    assert "hardlink" not in img3.stat("/c")
    assert img3.read("/c") == b"x\n"


def test_same_result_from_same_change_via_files_or_run(bb):
    via_run = bb.run("printf data > /x.txt; chmod 644 /x.txt").image
    via_files = bb.run("true", files=[{"path": "/x.txt", "content": b"data", "mode": 0o644}]).image
    assert via_run == via_files


def test_disposable(bb):
    r = bb.run("echo x > /junk", disposable=True)
    assert r.image is None and r.exit_code == 0


def test_non_utf8_output_and_truncation(bb):
    r = bb.run(r"printf '\377\376\n'; yes | head -c 300000", output="64K")
    assert r.stdout.startswith(b"\xff\xfe\n")
    assert len(r.stdout) == 64 * 1024 and r.stdout_truncated and not r.stderr_truncated
    assert r.to_dict()["stdout"].startswith("\ufffd")


def test_live_output_streams(bb):
    chunks = []
    bb.run("echo one; sleep 0.2; echo two >&2", on_output=lambda s, c: chunks.append((s, c)), disposable=True)
    assert ("stdout", b"one\n") in chunks and ("stderr", b"two\n") in chunks


def test_timeout_kills_the_tree(bb):
    r = bb.run("sleep 100 & sleep 100 & sleep 100", timeout=0.5)
    assert r.timed_out and r.exit_code is None and r.signal == 9
    assert r.usage["wall_s"] < 5


def test_exit_by_signal(bb):
    r = bb.run("kill -TERM $$", disposable=True)
    assert r.signal == 15 and r.exit_code is None


@pytest.mark.parametrize("kwargs,err", [
    ({"timeout": 0}, InvalidInput),
    ({"timeout": -1}, InvalidInput),
    ({"memory": "lots"}, InvalidInput),
    ({"env": {"X": "y" * 300_000}}, InvalidInput),
    ({"env": {"A=B": "c"}}, InvalidInput),
    ({"cwd": "relative"}, InvalidInput),
    ({"cwd": "/no/such/dir"}, InvalidInput),
    ({"files": [{"path": "/../x", "content": "no"}]}, sandtree.PathEscape),
])
def test_bad_input_changes_nothing(bb, kwargs, err):
    before = len(bb._st.images())
    with pytest.raises(err):
        bb.run("echo x > /should-not-exist", **kwargs)
    assert len(bb._st.images()) == before


def test_missing_command_and_unknown_image(bb):
    with pytest.raises(CommandNotFound):
        bb.run(["/no/such/binary"])
    r = bb.run("no-such-command")                       # the shell's own answer
    assert r.exit_code == 127
    with pytest.raises(ImageNotFound):
        bb._st.image("nope:latest")
    with pytest.raises(InvalidInput):
        bb.run([])


def test_secrets_masked_in_records(bb):
    r = bb.run("echo $API_TOKEN > /dev/null; echo s3cr3tvalue", env={"API_TOKEN": "s3cr3tvalue", "PLAIN": "ok"},
               disposable=True)
    op = bb._st.operation(r.operation)
    assert op["spec"]["env"] == {"API_TOKEN": "***", "PLAIN": "ok"}
    assert "s3cr3tvalue" not in str(op)
    assert r.stdout == b"s3cr3tvalue\n"                  # the run itself sees the real value


def test_concurrent_runs_from_one_image(bb):
    results = {}

    def go(i):
        results[i] = bb.run(f"echo {i} > /who; cat /who")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {results[i].stdout for i in range(6)} == {f"{i}\n".encode() for i in range(6)}
    assert len({results[i].image.id for i in range(6)}) == 6
    assert all(results[i].image.read("/who") == f"{i}\n".encode() for i in range(6))


def test_deep_chain_is_squashed(st, rootfs):
    img = st.import_image(rootfs)
    for i in range(70):
        img = img.run(f"echo {i} >> /count").image
    layers = st._engine.store.image(img.id).layers
    assert len(layers) < 64
    assert img.read("/count").decode().split() == [str(i) for i in range(70)]
    assert img.run("wc -l < /count").stdout.strip() == b"70"
    assert st.fsck()["ok"]


def test_submit_wait_cancel(bb):
    st = bb._st
    a = st.submit(bb, "sleep 0.2; echo a > /a")
    b = st.submit(bb, "sleep 30")
    time.sleep(0.3)
    assert st.cancel(b)["id"] == b
    done = {r["id"]: r for r in st.wait([a, b], timeout=20)}
    assert done[a]["status"] == "done" and st.image(done[a]["result"]).read("/a") == b"a\n"
    assert done[b]["status"] == "cancelled" and done[b]["result"] is None
    with pytest.raises(sandtree.NotFound):
        st.wait(["no-such-operation"])
