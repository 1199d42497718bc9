"""The CLI contract: commands, --json shapes and exit statuses, driven as a user would."""

from __future__ import annotations

import json
import subprocess
import sys





def j(p):
    return json.loads(p.stdout)


def test_cli_end_to_end(cli, rootfs, tmp_path):
    img = j(cli("image", "import", rootfs, "--tag", "bb", "--json"))["image"]
    assert len(img) == 64
    r = j(cli("run", "bb", "--json", "--env", "X=1", "--", "sh", "-c", "echo $X > /x; cat /x"))
    assert {"image", "exit_code", "stdout", "stderr", "timed_out", "oom_killed"} <= set(r)
    assert r["stdout"] == "1\n" and r["exit_code"] == 0 and r["image"] != img
    child = r["image"]
    assert cli("cat", child, "/x").stdout == b"1\n"
    names = [e["name"] for e in j(cli("ls", child, "/", "--json"))]
    assert "x" in names and "etc" in names
    hits = j(cli("grep", child, "root", "/etc", "--json"))
    assert any(h["path"] == "/etc/passwd" for h in hits)
    log = j(cli("log", child, "--json"))
    assert [e["image"] for e in log] == [child, img]
    assert "echo $X" in log[0]["command"]
    cli("tag", child, "stage/one")
    assert j(cli("image", "list", "--json"))[-1]["tags"] == ["stage/one"]
    cli("untag", "stage/one")
    out = tmp_path / "out.tar"
    cli("image", "export", child, str(out))
    assert j(cli("image", "import", str(out), "--json"))["image"] == child
    assert j(cli("fsck", "--json")) == {**j(cli("fsck", "--json")), "ok": True, "problems": []}
    assert "removed_images" in j(cli("gc", "--json"))


def test_cli_exit_status_is_the_commands(cli, rootfs):
    cli("image", "import", rootfs, "--tag", "bb")
    assert cli("run", "bb", "--", "exit 7", check=False).returncode == 7
    p = cli("run", "bb", "--timeout", "0.3", "--json", "--", "sleep 5", check=False)
    assert p.returncode == 124 and j(p)["timed_out"] is True
    p = cli("run", "bb", "--disposable", "--", "echo", "streamed")
    assert p.stdout == b"streamed\nimage: (disposable)\n"


def test_cli_errors_are_clear(cli, rootfs):
    p = cli("run", "nope", "--", "true", check=False)
    assert p.returncode == 125 and b"error: no image or tag 'nope'" in p.stderr
    p = cli("cat", "nope", "/x", "--json", check=False)
    assert p.returncode == 1 and j(p)["error"] == "image_not_found"
    cli("image", "import", rootfs, "--tag", "bb")
    p = cli("run", "bb", "--timeout", "0", "--", "true", check=False)
    assert p.returncode == 125 and b"timeout must be positive" in p.stderr
    p = cli("cat", "bb", "/../etc/shadow", check=False)
    assert p.returncode == 1 and b"escapes" in p.stderr


def test_cli_branching(cli, rootfs, tmp_path):
    base = j(cli("image", "import", rootfs, "--tag", "bb", "--json"))["image"]
    cli("branch", "create", "work", "bb")
    a = j(cli("run", "work", "--json", "--", "echo a > /a"))["image"]
    assert j(cli("branch", "list", "--json")) == {"work": a}
    b = j(cli("run", "bb", "--json", "--", "echo b > /b"))["image"]
    d = j(cli("diff", base, a, "--json", "--patch"))
    assert [c["path"] for c in d["changes"]] == ["/a"] and "+a" in d["patch"]
    m = j(cli("merge", a, b, "--json"))                   # base from lineage
    assert m["image"] and m["conflicts"] == [] and m["base"] == base
    c1 = j(cli("run", "bb", "--json", "--", "echo 1 > /c"))["image"]
    c2 = j(cli("run", "bb", "--json", "--", "echo 2 > /c"))["image"]
    p = cli("merge", "bb", c1, c2, "--json", check=False)
    assert p.returncode == 1 and j(p)["image"] is None and j(p)["conflicts"][0]["path"] == "/c"
    made = len(j(cli("image", "list", "--json")))
    pv = cli("merge", "bb", c1, c2, "--preview", "--json", check=False)       # merge_preview: exit 1, would conflict
    assert pv.returncode == 1 and j(pv)["clean"] is False and [c["path"] for c in j(pv)["conflicts"]] == ["/c"]
    assert j(cli("merge", a, b, "--preview", "--json"))["clean"] is True
    assert len(j(cli("image", "list", "--json"))) == made                     # a preview makes no image
    bad = cli("merge", a, b, "--preview", "--strategy", "ours", check=False)
    assert bad.returncode == 1 and b"--preview takes no --strategy" in bad.stderr
    assert [e["parent"] for e in j(cli("parents", a, "--json"))] == [base]                 # the rows' own verbs
    assert a in [e["child"] for e in j(cli("children", base, "--json"))]
    assert j(cli("merge", "bb", c1, c2, "--strategy", "theirs", "--json"))["image"]
    assert j(cli("branch", "rollback", "work", "--steps", "1", "--json"))["image"] == base
    assert [r["reason"] for r in j(cli("branch", "log", "work", "--json"))][-1] == "rollback"
    svg = tmp_path / "t.svg"
    cli("tree", "bb", "--svg", str(svg))
    assert svg.read_text().startswith("<svg")
    assert b"echo a > /a" in cli("tree", "bb").stdout
    assert j(cli("lineage", "common", a, b, "--json"))["image"] == base
    rows = j(cli("fork", "bb", "--cmd", "echo 1 > /f", "--cmd", "exit 3", "--json"))
    assert [r["exit_code"] for r in rows] == [0, 3]
    bundle = tmp_path / "x.bundle"
    cli("bundle", "create", str(bundle), m["image"], "--with-ancestry")
    env_home = tmp_path / "other"
    p = subprocess.run([sys.executable, "-m", "sandtree", "--home", str(env_home), "bundle", "import", str(bundle),
                        "--json"], capture_output=True)
    assert m["image"] in json.loads(p.stdout)["images"]


def test_cli_command_tail_and_error_statuses(cli, rootfs):
    """`--` is for the verbs that take a command; a sandtree error is 125 where the exit status is
    the command's (run, exec) and 1 elsewhere."""
    cli("image", "import", rootfs, "--tag", "bb")
    p = cli("ls", "bb", "--", "/", check=False)
    assert p.returncode == 2 and b"'--' is only for" in p.stderr
    p = cli("exec", "no-such-sandbox", "--", "true", check=False)
    assert p.returncode == 125 and p.stderr.startswith(b"error: ")
    p = cli("exec", "no-such-sandbox", "--json", "--", "true", check=False)
    assert p.returncode == 125 and j(p)["error"]
    p = cli("start", "nope", check=False)
    assert p.returncode == 1 and p.stderr.startswith(b"error: ")
    p = cli("stat", "bb", "/missing", "--json", check=False)
    assert p.returncode == 1 and j(p)["error"] == "path_not_found"


def test_cli_new_image_id_on_stdout(cli, rootfs):
    """The new image's ID on stdout: last, after the command's own output; with -q alone (the command's stdout
    goes to stderr), so `A=$(sandtree run -q ...)` captures it. Every verb that makes an image takes -q."""
    cli("image", "import", rootfs, "--tag", "bb")
    p = cli("run", "bb", "--", "echo out; echo err >&2")
    lines = p.stdout.decode().splitlines()
    assert lines[0] == "out" and lines[-1].startswith("image: ") and len(lines) == 2
    a = lines[-1].removeprefix("image: ")
    assert j(cli("log", a, "--json"))[0]["image"] == a and p.stderr == b"err\n"
    p = cli("run", "bb", "-q", "--", "echo out > /o; cat /o; echo err >&2")
    b = p.stdout.decode()
    assert len(b) == 65 and b.endswith("\n") and p.stderr == b"out\nerr\n"
    assert cli("cat", b.strip(), "/o").stdout == b"out\n"
    assert cli("run", "bb", "-q", "--disposable", "--", "echo x").stdout == b""
    p = cli("run", "bb", "-q", "--", "exit 4", check=False)              # the status stays the command's
    assert p.returncode == 4 and len(p.stdout.strip()) == 64
    c = cli("run", "bb", "-q", "--", "echo c > /c").stdout.strip().decode()
    m = cli("merge", "-q", b.strip(), c).stdout.decode()
    assert len(m) == 65 and cli("cat", m.strip(), "/c").stdout == b"c\n"
    i = cli("image", "import", "-q", rootfs).stdout.decode()
    assert len(i) == 65 and i.strip() in [r["id"] for r in j(cli("image", "list", "--json"))]
    for verb in (["commit"], ["image", "pull"], ["build"], ["image", "bootstrap"]):
        assert b"-q, --quiet" in cli(*verb, "--help").stdout


def test_cli_usage_errors_say_did_you_mean(cli, rootfs):
    """A wrong command line: that verb's usage, the error, the nearest flag or word, exit 2 (exits.USAGE); a
    merge of one image is one of them, not a traceback."""
    cli("image", "import", rootfs, "--tag", "bb")
    p = cli("merge", "bb", check=False)
    assert p.returncode == 2 and p.stderr.startswith(b"usage: sandtree merge ")
    assert b"2 or 3 images, not 1" in p.stderr and b"Traceback" not in p.stderr
    p = cli("run", "bb", "--tiemout", "3", "--", "true", check=False)
    assert p.returncode == 2 and p.stderr.startswith(b"usage: sandtree run ")
    assert b"unrecognized arguments: --tiemout" in p.stderr and b"did you mean '--timeout'?" in p.stderr
    p = cli("rnu", "bb", check=False)
    assert p.returncode == 2 and b"did you mean 'run'?" in p.stderr
    p = cli("image", "imprt", rootfs, check=False)
    assert p.returncode == 2 and p.stderr.startswith(b"usage: sandtree image ") and b"did you mean 'import'?" in p.stderr
    p = cli("image", "list", "--jsn", check=False)
    assert p.returncode == 2 and p.stderr.startswith(b"usage: sandtree image list ")
    assert b"did you mean '--json'?" in p.stderr
    p = cli("ls", "bb", "--qqqqqqqq", check=False)                       # nothing near: no guess
    assert p.returncode == 2 and b"did you mean" not in p.stderr


def test_cli_run_without_a_command_runs_the_images_cmd(cli, rootfs, tmp_path):
    """`run IMAGE` with no command runs the image's ENTRYPOINT then CMD (as `docker run IMAGE`); an image with
    neither is a clear error (125, a sandtree error where the status is the command's) and makes nothing."""
    cli("image", "import", rootfs, "--tag", "bb")
    p = cli("run", "bb", check=False)
    assert p.returncode == 125 and b"no CMD or ENTRYPOINT" in p.stderr and b"Traceback" not in p.stderr
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text('FROM bb\nENTRYPOINT ["/bin/sh", "-c"]\nCMD ["echo from-cmd > /f; cat /f"]\n')
    cli("build", "-q", str(tmp_path / "ctx"), "--tag", "withcmd")
    p = cli("run", "withcmd")
    assert p.stdout.startswith(b"from-cmd\nimage: ")
    made = p.stdout.decode().splitlines()[-1].removeprefix("image: ")
    assert cli("cat", made, "/f").stdout == b"from-cmd\n"
    p = cli("run", "withcmd", "--", "echo given")                          # a command given wins
    assert p.stdout.startswith(b"given\n")


def test_cli_build_failure_shows_the_steps_output_and_a_network_hint(cli, rootfs, tmp_path):
    """A failed RUN step: the error names its line and carries the tails of its stdout and stderr; a step that
    tried to reach the network (runs have none by default: busybox's wget cannot resolve a name, nothing leaves
    the sandbox) gets a hint naming --network; one that failed otherwise gets none."""
    cli("image", "import", rootfs, "--tag", "bb")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM bb\nRUN echo fetching; wget -q -O /x http://pypi.org/simple/\n")
    p = cli("build", str(ctx), check=False)
    assert p.returncode == 1 and p.stdout == b""
    err = p.stderr.decode()
    assert "line 2" in err and "--- stdout (end)\nfetching" in err and "bad address" in err, err
    assert "hint: the step could not reach the network" in err and "--network" in err
    p = cli("build", str(ctx), "--json", check=False)
    d = j(p)
    assert d["error"] == "build_failed" and d["stdout"] == "fetching\n" and "--network" in d["hint"]
    (ctx / "Dockerfile").write_text("FROM bb\nRUN echo out; echo broken >&2; exit 3\n")
    p = cli("build", str(ctx), check=False)
    err = p.stderr.decode()
    assert p.returncode == 1 and "exit code 3" in err and "out" in err and "broken" in err and "hint" not in err


def test_cli_long_work_reports_phases_off_a_terminal(cli, rootfs):
    """Not on a terminal (a CI log), long work still says what it does: a line when it starts and one with its
    total; --json and -q keep stderr free of it."""
    p = cli("image", "import", rootfs, "--tag", "bb")
    lines = p.stderr.decode().splitlines()
    assert lines[0] == "importing..." and lines[-1].startswith("importing: done, ") and " in " in lines[-1]
    assert p.stdout.decode().strip() in [r["id"] for r in j(cli("image", "list", "--json"))]
    assert cli("image", "import", rootfs, "-q").stderr == b""
    assert cli("image", "import", rootfs, "--json").stderr == b""


def test_status_line_prints_each_phase_once_off_a_terminal(capsys):
    """bootstrap's log lines (debootstrap's) off a terminal: one line per phase, however many lines each has."""
    import argparse
    from sandtree.cli.output import status_line
    args = argparse.Namespace(json=False)
    with status_line(args, "bootstrapping debian:bookworm") as log:
        for line in ("I: Retrieving InRelease", "I: Retrieving Packages", "I: Validating Packages",
                     "I: Retrieving libc6", "I: Validating libc6", "I: Extracting libc6", "I: Extracting bash"):
            log(line)
    err = capsys.readouterr().err.splitlines()
    assert err[:-1] == ["bootstrapping debian:bookworm: I: Retrieving InRelease",
                        "bootstrapping debian:bookworm: I: Validating Packages",
                        "bootstrapping debian:bookworm: I: Extracting libc6"]
    assert err[-1].startswith("bootstrapping debian:bookworm: done in ")
    with status_line(argparse.Namespace(json=True), "x") as log:
        assert log is None
