"""`sandtree build` end to end (issue 15's "must hold"), driven as a user would through
`python -m sandtree` on a store of its own: a multi-stage Dockerfile compiles a C program with gcc
and copies the binary into a busybox stage; the result runs; a rebuild is all cache hits with the
same ID; a changed source reruns only the steps from its COPY on; `sandtree log` reads like the
Dockerfile; a failed RUN names its line and tags nothing.

The gcc base image is made from this host's own installed gcc-12/binutils/libc6-dev packages
(their files as dpkg lists them, no download) plus busybox for the shell: Docker Hub is not
reachable here, and debootstrap with gcc takes minutes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import BUSYBOX, make_rootfs

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

# gcc's closure without what a small C program does not need (sanitizers, profilers, Kerberos)
PACKAGES = ("gcc-12", "cpp-12", "binutils", "libc6-dev")
SKIP = {"libasan8", "libtsan2", "liblsan0", "libubsan1", "libgprofng0", "libgssapi-krb5-2", "libkrb5-3",
        "libk5crypto3", "libkrb5support0", "libssl3", "libcom-err2", "libkeyutils1"}
SKIP_DIRS = ("/usr/share/doc", "/usr/share/man", "/usr/share/info", "/usr/share/locale", "/usr/share/lintian")


def _installed(name: str) -> bool:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.endswith(" installed")


def _closure(roots) -> set[str]:
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p in seen or p in SKIP:
            continue
        seen.add(p)
        deps = subprocess.run(["dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}", p], capture_output=True,
                              text=True).stdout
        for alt in filter(None, (a.strip() for a in deps.split(","))):
            for choice in alt.split("|"):
                name = re.split(r"[ (:]", choice.strip())[0]
                if _installed(name):
                    todo.append(name)
                    break
    return seen


def make_gcc_rootfs(path: str) -> str:
    """A rootfs with the host's gcc-12 toolchain (merged /usr, as Debian 12) and busybox."""
    for d in ("usr/bin", "usr/lib", "usr/lib64", "usr/sbin", "etc", "tmp", "root"):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        os.symlink(f"usr/{link}", os.path.join(path, link))
    for pkg in sorted(_closure(PACKAGES)):
        for f in subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True).stdout.splitlines():
            if not f.startswith("/") or f.startswith(SKIP_DIRS) or not os.path.lexists(f) or os.path.isdir(f) \
                    and not os.path.islink(f):
                continue
            real_dir = os.path.realpath(os.path.dirname(f))          # /lib/x -> /usr/lib/x (merged /usr)
            dest = os.path.join(path, real_dir.lstrip("/"), os.path.basename(f))
            if os.path.lexists(dest):
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if os.path.islink(f):
                os.symlink(os.readlink(f), dest)
            else:
                shutil.copy2(f, dest)
    bindir = os.path.join(path, "usr", "bin")
    shutil.copy2(BUSYBOX, os.path.join(bindir, "busybox"))
    for a in subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split():
        if not os.path.lexists(os.path.join(bindir, a)):
            os.symlink("busybox", os.path.join(bindir, a))
    for name in ("gcc", "cc"):
        os.symlink("gcc-12", os.path.join(bindir, name))
    with open(os.path.join(path, "etc", "passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
    with open(os.path.join(path, "etc", "group"), "w") as f:
        f.write("root:x:0:\n")
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A store with `gcc` (the host's toolchain) and `busybox` tagged, and a `sandtree` to drive it."""
    if not all(_installed(p) for p in PACKAGES):
        pytest.skip(f"needs the host packages {PACKAGES} to make a gcc base image")
    base = tmp_path_factory.mktemp("build-e2e")
    h = str(base / "home")
    env = {**os.environ, "SANDTREE_HOME": h}

    def cli(*args, check=True, input=None):
        p = subprocess.run([sys.executable, "-m", "sandtree", *args], env=env, capture_output=True, input=input,
                           timeout=600)
        if check and p.returncode != 0:
            raise AssertionError(f"sandtree {args} -> {p.returncode}: {p.stderr.decode()}")
        return p
    cli("image", "import", make_gcc_rootfs(str(base / "gcc")), "--tag", "gcc")
    cli("image", "import", make_rootfs(str(base / "busybox")), "--tag", "busybox")
    return cli, base


HELLO = '#include <stdio.h>\nint main(void) { puts("%s"); return 0; }\n'
DOCKERFILE = """\
# the issue's multi-stage build: compile in one stage, ship the binary in busybox
FROM gcc AS build
WORKDIR /src
COPY hello.c .
RUN mkdir -p /out && \\
    gcc -static -O1 -o /out/hello hello.c
FROM busybox
COPY --from=build /out/hello /usr/local/bin/hello
ENV GREETING=built
WORKDIR /work
CMD ["hello"]
"""


def test_multi_stage_c_program_into_busybox(home):
    cli, base = home
    ctx = base / "ctx"
    ctx.mkdir()
    (ctx / "hello.c").write_text(HELLO % "hello from a build")
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    (ctx / "notes.tmp").write_text("ignored")
    (ctx / ".dockerignore").write_text("*.tmp\n")

    p = cli("build", str(ctx), "--tag", "hello", "--progress", "plain")
    image = p.stdout.decode().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", image)
    plain = p.stderr.decode()
    assert "#1 [build 1/4] FROM gcc AS build" in plain
    assert "#4 [build 4/4] RUN mkdir -p /out &&     gcc -static -O1 -o /out/hello hello.c" in plain
    assert "#6 [stage-1 2/5] COPY --from=build /out/hello /usr/local/bin/hello" in plain
    assert re.search(r"^#4 DONE \d+\.\ds$", plain, re.M)

    r = json.loads(cli("run", "hello", "--json", "--", "hello").stdout)
    assert r["exit_code"] == 0 and r["stdout"] == "hello from a build\n"
    r = json.loads(cli("run", "hello", "--json", "--", "sh", "-c", "echo $GREETING; pwd").stdout)
    assert r["stdout"] == "built\n/work\n"                       # the image's config is honoured

    # `sandtree log` reads like the Dockerfile (the final stage's steps, newest first)
    log = [row["command"] for row in json.loads(cli("log", "hello", "--json").stdout)]
    assert log[:4] == ['CMD ["hello"]', "WORKDIR /work", "ENV GREETING=built",
                       "COPY --from=build /out/hello /usr/local/bin/hello"]

    # nothing changed: every step a cache hit, the same ID, no run
    t0 = time.perf_counter()
    p = cli("build", str(ctx), "--tag", "hello", "--json", "--progress", "plain")
    cached_cli = time.perf_counter() - t0
    res = json.loads(p.stdout)
    assert res["image"] == image and all(s["cached"] for s in res["steps"]), res["steps"]
    assert p.stderr.decode().count("CACHED") == len(res["steps"]) == 9
    print(f"\ncached rebuild through the CLI (process start included): {cached_cli * 1000:.0f} ms")

    # a changed copied file reruns only the steps from that COPY on
    (ctx / "hello.c").write_text(HELLO % "hello again")
    (ctx / "notes.tmp").write_text("ignored, changed: no effect")
    res = json.loads(cli("build", str(ctx), "--tag", "hello", "--json", "--progress", "quiet").stdout)
    # FROM, WORKDIR cached; COPY, RUN rerun; FROM busybox cached; what follows has a new parent
    assert [s["cached"] for s in res["steps"]] == [True, True, False, False, True, False, False, False, False]
    assert res["image"] != image
    r = json.loads(cli("run", "hello", "--json", "--", "hello").stdout)
    assert r["stdout"] == "hello again\n"


def test_a_failed_run_names_its_line_and_tags_nothing(home):
    cli, base = home
    ctx = base / "ctx-fail"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM busybox\nRUN echo fine\n\nRUN echo to-stderr >&2; exit 3\nRUN echo never\n")
    p = cli("build", str(ctx), "--tag", "broken", "--progress", "plain", check=False)
    assert p.returncode == 1
    err = p.stderr.decode()
    assert "error: line 4: RUN echo to-stderr >&2; exit 3: exit code 3" in err and "to-stderr" in err
    assert "#3 [3/4] RUN echo to-stderr >&2; exit 3" in err and "#3 ERROR:" in err
    assert "#4 [" not in err                                     # nothing after the failed step ran
    tags = [t for row in json.loads(cli("image", "list", "--json").stdout) for t in row["tags"]]
    assert "broken" not in tags


def test_args_target_no_cache_filter_stdin_and_json_progress(home):
    cli, base = home
    ctx = base / "ctx-args"
    ctx.mkdir()
    (ctx / "data.txt").write_text("data\n")
    text = ("ARG BASE=busybox\nFROM $BASE AS one\nARG WHO=nobody\nRUN echo \"$WHO\" > /who\n"
            "FROM one AS two\nCOPY data.txt /data.txt\nRUN cat /who /data.txt > /both\n")
    p = cli("build", str(ctx), "-f", "-", "--build-arg", "WHO=builder", "--target", "one", "--json",
            "--progress", "json", input=text.encode())
    res = json.loads(p.stdout)
    assert [s["text"] for s in res["steps"]] == ["FROM busybox AS one", 'RUN echo "$WHO" > /who']
    events = [json.loads(line) for line in p.stderr.decode().splitlines()]
    assert {e["status"] for e in events} >= {"cached", "running", "done"}
    assert all({"step", "total", "stage", "text", "line", "status"} <= set(e) for e in events)
    r = json.loads(cli("run", res["image"], "--json", "--", "cat", "/who").stdout)
    assert r["stdout"] == "builder\n"                               # --build-arg reached the RUN

    (ctx / "Dockerfile").write_text(text)
    full = json.loads(cli("build", str(ctx), "--build-arg", "WHO=builder", "--json", "--progress", "quiet").stdout)
    assert [s["cached"] for s in full["steps"]] == [True, True, True, False, False]   # stage one from the cache
    again = json.loads(cli("build", str(ctx), "--build-arg", "WHO=builder", "--no-cache-filter", "two", "--json",
                           "--progress", "quiet").stdout)
    assert [s["cached"] for s in again["steps"]] == [True, True, True, False, False]  # only stage two again
    assert again["image"] == full["image"]                          # the same state, the same ID
    other = json.loads(cli("build", str(ctx), "--build-arg", "WHO=someone", "--json", "--progress", "quiet").stdout)
    assert other["image"] != full["image"] and not other["steps"][1]["cached"]       # the ARG is in the key


def test_the_live_view_on_a_terminal(home):
    cli, base = home
    ctx = base / "ctx-tty"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM busybox\nRUN for i in 1 2 3; do echo step-output-$i; done\n")
    master, slave = os.openpty()
    try:
        env = {**os.environ, "SANDTREE_HOME": str(base / "home"), "COLUMNS": "100"}
        p = subprocess.run([sys.executable, "-m", "sandtree", "build", str(ctx), "--tag", "tty"], env=env,
                           stdout=subprocess.PIPE, stderr=slave, timeout=600)
        os.close(slave)
        slave = None
        shown = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:                                          # EIO: the writer is gone
                break
            if not chunk:
                break
            shown += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert p.returncode == 0 and re.fullmatch(rb"[0-9a-f]{64}\n", p.stdout)
    plain = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", shown).decode("utf-8", "replace")
    assert "[+] Building" in plain and "=> CACHED [1/2] FROM busybox" in plain
    assert "[2/2] RUN for i in 1 2 3; do echo step-output-$i; done" in plain


def test_add_unpacks_a_local_tar_and_copies_other_files(home):
    import io
    import tarfile
    cli, base = home
    ctx = base / "ctx-add"
    ctx.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        info = tarfile.TarInfo("pkg/hello.txt")
        info.size = 6
        t.addfile(info, io.BytesIO(b"inside"))
    (ctx / "bundle.tgz").write_bytes(buf.getvalue())
    (ctx / "plain.txt").write_text("plain\n")
    (ctx / "Dockerfile").write_text("FROM busybox\nADD bundle.tgz /opt/\nADD plain.txt /opt/\n")
    res = json.loads(cli("build", str(ctx), "--json", "--progress", "quiet").stdout)
    r = json.loads(cli("run", res["image"], "--json", "--", "sh", "-c",
                       "cat /opt/pkg/hello.txt; echo; cat /opt/plain.txt; ls /opt").stdout)
    assert r["stdout"] == "inside\nplain\npkg\nplain.txt\n"          # the tar unpacked, not copied
