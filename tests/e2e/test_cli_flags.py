"""The CLI flags for what the Python API already had (issue 13 item 6): --uid/--gid, --hostname,
--file LOCAL:PATH and --output PATH on run, exec and start, driven as a user would (the real
`sandtree` command against a real store)."""

from __future__ import annotations

import json
import os

import pytest




def j(p):
    return json.loads(p.stdout)


@pytest.fixture
def bb(cli, rootfs):
    return j(cli("image", "import", rootfs, "--tag", "bb", "--json"))["image"]


def images(cli) -> list[str]:
    return sorted(r["id"] for r in j(cli("image", "list", "--json")))


def test_run_as_user_and_hostname(cli, bb):
    r = j(cli("run", "bb", "--uid", "1000", "--gid", "1001", "--hostname", "box-1", "--json", "--",
              "id -u; id -g; hostname; touch /tmp/mine"))
    assert r["stdout"] == "1000\n1001\nbox-1\n" and r["exit_code"] == 0
    made = j(cli("stat", r["image"], "/tmp/mine", "--json"))
    assert (made["uid"], made["gid"]) == (1000, 1001)
    # the defaults stay the engine's: root, hostname sandtree
    assert j(cli("run", "bb", "--disposable", "--json", "--", "id -u; hostname"))["stdout"] == "0\nsandtree\n"
    before = images(cli)
    for bad, why in ((["--hostname", "no spaces"], b"bad hostname"), (["--uid", "70000"], b"uid and gid")):
        p = cli("run", "bb", *bad, "--", "true", check=False)
        assert p.returncode == 125 and why in p.stderr
    assert images(cli) == before


def test_run_output_to_a_file(cli, bb, tmp_path):
    dest = tmp_path / "out.bin"
    p = cli("run", "bb", "--output", str(dest), "--", "printf 'a\\000b\\377'; echo to-stderr >&2; exit 3",
            check=False)
    assert p.returncode == 3                               # the command's status, as without --output
    assert dest.read_bytes() == b"a\x00b\xff"              # its bytes, not a decoded text
    assert p.stdout.startswith(b"image: ") and b"to-stderr" in p.stderr   # stdout: only the image line
    assert oct(dest.stat().st_mode & 0o777) == oct(0o666 & ~_umask())

    # --json: the report says where stdout went; an existing file's mode is kept
    dest.chmod(0o600)
    r = j(cli("run", "bb", "--output", str(dest), "--json", "--", "echo hi; echo err >&2"))
    assert dest.read_bytes() == b"hi\n" and r["stdout"] == "" and r["stdout_file"] == str(dest)
    assert r["stderr"] == "err\n" and dest.stat().st_mode & 0o777 == 0o600

    # a refused run leaves the file as it was and nothing beside it
    p = cli("run", "nope", "--output", str(dest), "--", "echo replaced", check=False)
    assert p.returncode == 125 and dest.read_bytes() == b"hi\n"
    p = cli("run", "bb", "--timeout", "0", "--output", str(dest), "--", "echo replaced", check=False)
    assert p.returncode == 125 and dest.read_bytes() == b"hi\n"
    assert sorted(os.listdir(tmp_path)) == sorted(["out.bin", "home"])

    # a path that cannot be written refuses the run before it starts
    before = images(cli)
    for where in (tmp_path / "missing" / "x", tmp_path):
        p = cli("run", "bb", "--output", str(where), "--", "touch /made", check=False)
        assert p.returncode == 125 and b"--output" in p.stderr
    assert images(cli) == before


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_run_puts_files_and_trees_in(cli, bb, tmp_path):
    script = tmp_path / "go.sh"
    script.write_text("#!/bin/sh\necho script ran\n")
    script.chmod(0o750)
    tree = tmp_path / "proj"
    (tree / "src" / "deep").mkdir(parents=True)
    (tree / "README").write_text("top\n")
    (tree / "src" / "deep" / "data.bin").write_bytes(bytes(range(256)))
    (tree / "src" / "deep" / "data.bin").chmod(0o600)
    r = j(cli("run", "bb", "--file", f"{script}:/usr/bin/go.sh", "--file", f"{tree}:/work", "--cwd", "/work",
              "--file", f"{script}:/opt/new/", "--json", "--", "go.sh; cat README; wc -c < src/deep/data.bin"))
    assert r["exit_code"] == 0 and r["stdout"].split() == ["script", "ran", "top", "256"]
    img = r["image"]
    assert cli("cat", img, "/opt/new/go.sh").stdout == script.read_bytes()     # PATH/: under its own name
    assert cli("cat", img, "/work/src/deep/data.bin").stdout == bytes(range(256))
    modes = {p: j(cli("stat", img, p, "--json"))["mode"] for p in ("/usr/bin/go.sh", "/work/src/deep/data.bin")}
    assert modes == {"/usr/bin/go.sh": "0750", "/work/src/deep/data.bin": "0600"}

    # with --uid the files belong to the user the command runs as (it can write to them)
    r = j(cli("run", "bb", "--uid", "1000", "--gid", "1000", "--file", f"{tree}:/work", "--json", "--",
              "echo more >> /work/README && cat /work/README"))
    assert r["stdout"] == "top\nmore\n"
    st = j(cli("stat", r["image"], "/work/README", "--json"))
    assert (st["uid"], st["gid"]) == (1000, 1000)


def test_run_refuses_files_it_cannot_put_in(cli, bb, tmp_path):
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "ok").write_text("x")
    (tree / "link").symlink_to("ok")
    before = images(cli)
    for spec, why in ((f"{tree}:/t", b"symbolic link"), (f"{tmp_path}/absent:/x", b"No such file"),
                      ("no-colon", b"LOCAL:/ABSOLUTE/PATH"), (f"{tree / 'ok'}:relative", b"LOCAL:/ABSOLUTE/PATH")):
        p = cli("run", "bb", "--file", spec, "--", "touch /made", check=False)
        assert p.returncode == 125 and why in p.stderr, (spec, p.stderr)
    p = cli("run", "bb", "--json", "--file", "no-colon", "--", "true", check=False)
    assert j(p)["error"] == "invalid_input" and j(p)["file"] == "no-colon"
    assert images(cli) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="live sandboxes need root")
def test_live_sandbox_flags(cli, bb, tmp_path):
    conf = tmp_path / "app.conf"
    conf.write_text("port=8080\n")
    sid = cli("start", "bb", "--hostname", "live-1", "--file", f"{conf}:/etc/app.conf").stdout.decode().strip()
    try:
        assert cli("exec", sid, "--", "hostname").stdout == b"live-1\n"
        assert cli("exec", sid, "--", "cat", "/etc/app.conf").stdout == b"port=8080\n"
        assert cli("exec", sid, "--uid", "1000", "--gid", "1001", "--", "sh", "-c", "id -u; id -g").stdout \
            == b"1000\n1001\n"
        dest = tmp_path / "ls.out"
        p = cli("exec", sid, "--output", str(dest), "--", "sh", "-c", "printf '\\001\\002'; echo e >&2; exit 4",
                check=False)
        assert p.returncode == 4 and dest.read_bytes() == b"\x01\x02" and p.stdout == b"" and p.stderr == b"e\n"
        r = j(cli("exec", sid, "--output", str(dest), "--json", "--", "echo", "json"))
        assert r["stdout"] == "" and r["stdout_file"] == str(dest) and dest.read_bytes() == b"json\n"
        p = cli("shell", sid, "--uid", "1000", input=b"id -u\nexit 6\n", check=False)
        assert p.returncode == 6 and b"1000" in p.stdout
    finally:
        cli("stop", sid)
    p = cli("start", "bb", "--file", "no-colon", check=False)
    assert p.returncode == 1 and b"LOCAL:/ABSOLUTE/PATH" in p.stderr


def test_run_takes_the_run_options_start_takes(cli, bb):
    """--label and --max-output (RunOptions' labels and output) reach `run` as they reach `start`: the CLI's
    conformance test found `run` without them."""
    # (endless output: `head -c 4000` could write all of it into the pipe and exit 0 before the cap's kill)
    p = cli("run", "bb", "--label", "team=ml", "--max-output", "1K", "--json", "--", "cat /dev/zero",
            check=False)
    r = j(p)                                              # past the cap the command is stopped: 128+SIGKILL
    assert p.returncode == 137 and r["stdout_truncated"] and len(r["stdout"]) <= 1024
    assert j(cli("op", r["operation"], "--json"))["spec"]["labels"] == {"team": "ml"}
    bad = cli("run", "bb", "--label", "no-equals", "--", "true", check=False)
    assert bad.returncode == 125 and b"KEY=VALUE" in bad.stderr


def test_bad_command_line_values_are_sandtree_errors(cli, bb):
    """A malformed --env, or run without a command, is InvalidInput: `error: ...` and run's 125 (a JSON error
    object with --json), as a malformed --label is; other verbs answer 1."""
    p = cli("run", "bb", "--env", "NOEQUALS", "--", "true", check=False)
    assert p.returncode == 125 and b"error: " in p.stderr and b"KEY=VALUE" in p.stderr
    p = cli("run", "bb", "--json", check=False)
    assert p.returncode == 125 and j(p)["error"] == "invalid_input"
    p = cli("fork", "bb", check=False)
    assert p.returncode == 1 and b"--cmd" in p.stderr
