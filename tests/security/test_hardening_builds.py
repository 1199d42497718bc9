"""Attack review of issue 15's builds, from the side of whoever writes the Dockerfile and the
context, or publishes the image a build or a run starts from.

Each test is an attack: passing means it is held. The parser and context tests run on real files
(no sandbox); the engine tests build with the real engine (busybox image, real runs and commits).
Findings of this review (fixed, with the test that failed before): F1 .dockerignore patterns and
COPY globs backtracked for minutes (Python's re; now RE2), F2 expansion without bounds
(`ENV A=$A$A` doubling, copies of a large value, ${...} nested into RecursionError)."""

from __future__ import annotations

import io
import os
import tarfile
import time

import pytest

from sandtree.errors import Forbidden, InvalidInput, NotFound, PathEscape, SandtreeError
from sandtree.recipe import dockerfile
from sandtree.recipe.builder import list_context
from sandtree.recipe.context import BuildContext
from sandtree.recipe.lexer import MAX_NESTING, MAX_WORD_CHARS
from sandtree.recipe.patterns import IgnoreRules
from sandtree.recipe.steps import Copy, From, Recipe, Run, Stage
from sandtree.store.imageconfig import ImageConfig
from test_builds import eng  # noqa: F401 (fixture: an engine with busybox tagged bb)


def _write(root, rel, data=b"x"):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(data)
    return p


# ---- F1: patterns from the context are matched in linear time ----------------------------------

def test_dockerignore_patterns_match_in_linear_time(tmp_path):
    """A context's .dockerignore is the attacker's: `*a*a*...*b` against a long name made Python's
    re backtrack (6 stars on 120 characters: 41 s; 20 stars: forever, one core held)."""
    root = str(tmp_path / "ctx")
    _write(root, "a" * 250)
    _write(root, "keep.txt")
    _write(root, ".dockerignore", ("*a" * 20 + "b\n" + "**/" * 30 + "zz\n").encode())
    t = time.monotonic()
    got = [e.path for e in BuildContext(root).select(["."])]
    assert time.monotonic() - t < 2
    assert "a" * 250 in got and "keep.txt" in got          # neither pattern matches them
    rules = IgnoreRules("*a" * 20 + "\n")
    assert rules.ignored("a" * 250) and not rules.ignored("b" * 250)


def test_copy_source_globs_match_in_linear_time(tmp_path):
    """A COPY source glob is the Dockerfile's: the same backtracking, per name of the directory."""
    root = str(tmp_path / "ctx")
    for i in range(20):
        _write(root, f"{'a' * 200}{i}")
    t = time.monotonic()
    with pytest.raises(InvalidInput):                     # nothing matches: said, not hung
        BuildContext(root).select(["*a" * 25 + "b"])
    assert time.monotonic() - t < 2
    assert len(BuildContext(root).select(["*a*a*a*a*a*a*a*a19"])) == 1


def test_undecodable_names_still_match_a_star(tmp_path):
    """RE2 reads UTF-8: a name with bytes that are not (a surrogate escape) matches as Go's RuneError."""
    root = str(tmp_path / "ctx")
    os.makedirs(root)
    with open(os.path.join(root.encode(), b"x\xffy.txt"), "wb") as f:
        f.write(b"1")
    got = BuildContext(root).select(["x?y.*"])
    assert [e.path for e in got] == ["x\udcffy.txt"]
    assert IgnoreRules("x*\n").ignored("x\udcffy.txt")


# ---- F2: expansion is bounded -----------------------------------------------------------------

def _parse(text, **kw):
    return dockerfile.parse(text, **kw)


def test_env_doubling_is_refused_before_it_grows():
    """45 lines of `ENV A=$A$A` asked for 2^45 bytes of the engine's memory."""
    text = "FROM scratch\nENV A=xxxxxxxxxxxxxxxx\n" + "ENV A=$A$A\n" * 45
    t = time.monotonic()
    with pytest.raises(InvalidInput, match="expand"):
        _parse(text)
    assert time.monotonic() - t < 5


def test_copies_of_a_large_value_cannot_add_up():
    """Each word under the cap, but 200 copies of a 600 KB value: refused by the whole's cap."""
    big = "v" * 600_000
    text = f"FROM scratch\nENV A={big}\n" + "ENV B=$A\n" * 200
    with pytest.raises(InvalidInput, match="expand to over"):
        _parse(text)
    ok = f"FROM scratch\nENV A={big}\nENV B=$A\n"            # a large value used once is fine
    assert len(_parse(ok).stages[0].steps) == 3


def test_a_word_with_many_references_is_refused_while_it_is_built():
    """One word naming a 500 KB value 3,000 times (a 1.5 GB string) is refused as it grows."""
    big = "v" * 500_000
    text = f"FROM scratch\nARG A={big}\nENV B={'$A' * 3000}\n"
    with pytest.raises(InvalidInput, match=str(MAX_WORD_CHARS)):
        _parse(text)


def test_deeply_nested_substitution_is_a_typed_error():
    """${A:-${A:-...}} 600 deep was a RecursionError (a traceback from the CLI) after quadratic scans."""
    text = "FROM scratch\nENV B=" + "${A:-" * 600 + "x" + "}" * 600 + "\n"
    t = time.monotonic()
    with pytest.raises(InvalidInput, match="nested"):
        _parse(text)
    assert time.monotonic() - t < 2
    fine = "FROM scratch\nENV B=" + "${A:-" * MAX_NESTING + "x" + "}" * MAX_NESTING + "\n"
    step = _parse(fine).stages[0].steps[1]
    assert step.changes == (("env", (("B", "x"),)),)


# ---- the engine: a build never writes the host ----------------------------------------------------

def _host_dir(tmp_path):
    d = tmp_path / "host-target"
    d.mkdir()
    return d


def test_copy_through_an_image_symlink_never_writes_the_host(eng, tmp_path):
    """A RUN plants /evil -> a host directory's path; a later COPY into /evil/ resolves the link
    in the image (as Docker), never on the host (the upper is host paths)."""
    host = _host_dir(tmp_path)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "f").write_text("payload\n")
    for link in (str(host), "../../../../../../../../.." + str(host)):
        steps = (From("bb", "FROM bb", 1), Run(f"ln -s {link} /evil", f"RUN ln -s {link} /evil", 2),
                 Copy(list_context(str(ctx), "f"), "/evil/f", "COPY f /evil/f", 3),
                 Copy(list_context(str(ctx), "f"), "/evil/", "COPY f /evil/", 4, dest_is_dir=True))
        try:
            res = eng.build(Recipe((Stage(None, steps),), context=str(ctx)))
        except (InvalidInput, NotFound, PathEscape):
            res = None
        assert os.listdir(host) == [], f"the COPY wrote through {link} on the host"
        if res is not None:
            assert eng.read(res.image, "/evil/f") == b"payload\n"     # (in the image, where the link leads)


def _evil_tar(host) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        def add(name, data=b"", **kw):
            info = tarfile.TarInfo(name)
            for k, v in kw.items():
                setattr(info, k, v)
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            t.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
        add("l", type=tarfile.SYMTYPE, linkname=str(host))
        add("l/pwned", b"through the link\n")
        add("../../../../../../../../tmp/../" + str(host).lstrip("/") + "/up", b"up\n")
        add("h", type=tarfile.LNKTYPE, linkname="/etc/hostname")
    return buf.getvalue()


def test_add_of_a_tar_with_escaping_members_never_writes_or_reads_the_host(eng, tmp_path):
    host = _host_dir(tmp_path)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "evil.tar").write_bytes(_evil_tar(host))
    steps = (From("bb", "FROM bb", 1),
             Copy(list_context(str(ctx), "evil.tar"), "/opt/", "ADD evil.tar /opt/", 2, unpack=True,
                  dest_is_dir=True))
    try:
        res = eng.build(Recipe((Stage(None, steps),), context=str(ctx)))
    except SandtreeError:
        res = None                                                # refused, typed
    assert os.listdir(host) == []
    for top, _, files in os.walk(eng.store.home):
        assert "pwned" not in files and "up" not in files, top
    if res is not None:
        with open("/etc/hostname", "rb") as f:
            hostname = f.read()
        try:
            assert eng.read(res.image, "/opt/h") != hostname or not hostname
        except SandtreeError:
            pass


def test_workdir_through_an_image_symlink_is_made_in_the_image(eng, tmp_path):
    """An image's WORKDIR under a link to a host path: configure makes the directory (as Docker)
    inside the image, never on the host."""
    host = _host_dir(tmp_path)
    rec = eng.run("bb", f"ln -s {host} /w")
    img = eng.configure(rec.image, ImageConfig(cwd="/w/sub/dir"))
    assert os.listdir(host) == []
    # (the link's target is not in the image: the directory is made at /w itself, replacing the link)
    assert eng.stat(img, "/w/sub/dir").to_dict()["type"] == "dir"
    out = eng.run(img, "pwd", disposable=True)
    assert out.stdout.decode().strip() == "/w/sub/dir"
    assert os.listdir(host) == []


def test_copy_from_an_image_symlink_to_a_host_file_copies_no_host_bytes(eng, tmp_path):
    """COPY --from reads the source image's tree (store objects), never a host path a link names."""
    secret = tmp_path / "host-secret"
    secret.write_bytes(b"host only\n")
    src = eng.run("bb", f"ln -s {secret} /l; mkdir /d; ln -s {secret} /d/l").image
    eng.store.tag(src, "evilsrc")
    steps = (From("bb", "FROM bb", 1),
             Copy((), "/got", "COPY --from=evilsrc /l /got", 2, from_stage="evilsrc", paths=("/l",)),
             Copy((), "/gotd/", "COPY --from=evilsrc /d /gotd/", 3, from_stage="evilsrc", paths=("/d",),
                  dest_is_dir=True))
    try:
        res = eng.build(Recipe((Stage(None, steps),)))
    except (InvalidInput, NotFound):
        return                                                  # refused: the link's target is not in the image
    for p in ("/got", "/gotd/l"):
        e = eng.stat(res.image, p).to_dict()
        assert e["type"] == "symlink" or eng.read(res.image, p) != b"host only\n"


# ---- an image's config: USER, env ----------------------------------------------------------------

def test_an_image_user_with_an_out_of_range_id_is_refused_and_runs_nothing(eng):
    rec = eng.run("bb", "echo 'evil:x:99999999:0::/:/bin/sh' >> /etc/passwd; echo 'g:x:4294967295:' >> /etc/group")
    for user in ("evil", "0:g", "4294967296", "-1"):
        img = eng.configure(rec.image, ImageConfig(user=user))
        with pytest.raises(InvalidInput):
            eng.run(img, "touch /ran")


def test_a_huge_image_env_is_refused_typed(eng):
    """A pulled config's Env under the config's 1 MiB cap but over a run's 256 KiB env."""
    img = eng.configure("bb", ImageConfig(env={f"V{i}": "x" * 1000 for i in range(600)}))
    with pytest.raises(InvalidInput, match="environment is over"):
        eng.run(img, "true")


def _host_side_with(marker: bytes) -> list[int]:
    """Processes in the host's user namespace whose environment has a variable named `marker` or
    the image's LD_PRELOAD (what a loader would read; `_ST_`-prefixed entries it does not)."""
    mine = os.readlink("/proc/self/ns/user")
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/user") == mine:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if any(e.startswith((marker + b"=", b"LD_PRELOAD=/nonexistent")) for e in f.read().split(b"\0")):
                        out.append(int(pid))
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker + b"=" in f.read():        # (nor in argv: every host user reads it)
                        out.append(int(pid))
        except OSError:
            pass
    return out


def test_an_image_env_never_becomes_the_host_helpers_environment(tmp_path, rootfs):
    """F7: an image's env (a pulled config: attacker's) and a tenant's env= were the environment
    the host helper, root on the host, was started with (cold runs, live execs); a helper built
    dynamically (the fallback where libc.a is missing: glibc-static is not installed by default
    on Fedora/RHEL) would load LD_PRELOAD from it, and a layer's file sits at a host path the
    image's author can compute. The env now travels renamed: the helper starts with
    none of its own (the command's as `_ST_NAME` entries, which helper/options.c takes back)."""
    import threading
    from sandtree.engine import Engine
    eng = Engine(str(tmp_path / "home"), warm=0)           # cold starts: the helper's argv and environ
    try:
        marker = b"REVIEW_MARK_" + os.urandom(6).hex().encode()
        img = eng.configure(eng.import_path(rootfs), ImageConfig(env={"LD_PRELOAD": "/nonexistent.so",
                                                                      marker.decode(): "1"}))
        seen: list = []

        def scan(stop):
            while not stop.is_set():
                seen.extend(_host_side_with(marker))
                stop.wait(0.05)
        stop = threading.Event()
        t = threading.Thread(target=scan, args=(stop,))
        t.start()
        try:
            out = eng.run(img, f"sleep 1; echo ${marker.decode()}", disposable=True)
            sb = eng.sandbox_start(img)
            try:
                ex = eng.sandbox_exec(sb["id"], f"sleep 1; echo ${marker.decode()}")
            finally:
                eng.sandbox_stop(sb["id"])
        finally:
            stop.set()
            t.join()
        assert out.stdout == b"1\n" and ex.stdout == b"1\n"          # the command has it
        assert seen == []
    finally:
        eng.close()


# ---- tenants --------------------------------------------------------------------------------------

def test_a_tenant_cannot_build_nor_configure_an_image_it_does_not_see(eng, rootfs):
    """A tenant builds from what it sees only (no COPY --from an image of another's, no cache hit
    on one); configure and image_config work on images the tenant sees only."""
    from sandtree.tenancy import Tenant
    other = eng.as_tenant(Tenant("other"))
    own = other.import_path(rootfs)                       # (the same ID as the operator's bb)
    hidden = eng.run("bb", "echo operator > /mine").image
    with pytest.raises(NotFound):
        other.build(Recipe((Stage(None, (From(own, "FROM own", 1), Run("true", "RUN true", 2),
                                         Copy((), "/x", "COPY --from=h /mine /x", 3, from_stage=hidden,
                                              paths=("/mine",)))),)))
    with pytest.raises(NotFound):
        other.configure(hidden, ImageConfig(env={"A": "1"}))
    with pytest.raises(NotFound):
        other.image_config(hidden)
    assert other.image_config(own) == ImageConfig()


def test_a_copy_destination_through_a_self_referencing_link_is_not_a_recursion(eng, tmp_path):
    """F4: `RUN ln -s / /l` then `COPY f /l/l/l/.../f` (1,400 deep) was a RecursionError (a
    traceback, not a typed error) in the edit's directory walk; now a loop: it lands at /f."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "f").write_text("x\n")
    dest = "/l" * 1400 + "/f"
    steps = (From("bb", "FROM bb", 1), Run("ln -s / /l", "RUN ln -s / /l", 2),
             Copy(list_context(str(ctx), "f"), dest, f"COPY f {dest}", 3))
    res = eng.build(Recipe((Stage(None, steps),), context=str(ctx)))
    assert eng.read(res.image, "/f") == b"x\n"
    grow = "/g" * 1400 + "/f"                      # g -> a long path: the walk's path would grow
    steps = (From("bb", "FROM bb", 1), Run("mkdir -p /" + "d" * 200 + " && ln -s /" + "d" * 200 + "/.. /g", "RUN g", 2),
             Copy(list_context(str(ctx), "f"), grow, f"COPY f {grow}", 3))
    res = eng.build(Recipe((Stage(None, steps),), context=str(ctx)))
    assert eng.read(res.image, "/f") == b"x\n"


# ---- F5 (fixed): a Dockerfile's RUN --network may only narrow the build's network --------------

def test_a_dockerfile_cannot_widen_the_builds_network():
    """A step's --network may only narrow the build's (the caller's) network; a build without one
    refuses the flag, naming the line."""
    with pytest.raises(InvalidInput, match="line 2.*needs the build's network"):
        dockerfile.parse("FROM scratch\nRUN --network=all wget -qO- https://example.org\n")
    with pytest.raises(InvalidInput, match="beyond what the build allows"):
        dockerfile.parse("FROM scratch\nRUN --network=evil.example wget -qO- http://evil.example\n",
                         network=["pypi.org"])
    narrowed = dockerfile.parse("FROM scratch\nRUN --network=pypi.org true\nRUN --network=none true\n",
                                network="all")
    assert [str(r) for r in narrowed.stages[0].steps[1].network.allow] == ["pypi.org"]
    assert narrowed.stages[0].steps[2].network is False


@pytest.mark.parametrize("rule", ["169.254.169.254/32:80", "10.0.0.0/8"])
def test_a_dockerfile_cannot_name_private_destinations(rule):
    """A build's "all" is the public internet; a step naming a private or metadata network is
    beyond it. (A host name such as metadata.google.internal never reaches a non-public answer:
    only a network rule naming the address does, network/policy.py.)"""
    with pytest.raises(InvalidInput, match="beyond what the build allows"):
        dockerfile.parse(f"FROM scratch\nRUN --network={rule} wget -qO- http://169.254.169.254/\n",
                         network="all")
