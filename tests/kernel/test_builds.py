"""Engine.build (issue 15): a Recipe executed as a chain of real runs and commits on the real
kernel, cached on the image DAG. A cache hit gives the same ID with no operation; a changed copied
file reruns only from its COPY on; a failed RUN names its line and tags nothing; multi-stage builds
copy between stages; the Python builder gives the same steps (and ID) as a hand-written recipe."""

import io
import os
import tarfile

import pytest

from sandtree.errors import BuildFailed, Conflict, InvalidInput, PathEscape
from sandtree.engine.builds.copies import placements
from sandtree.recipe.builder import RecipeBuilder, list_context
from sandtree.recipe.steps import Configure, Copy, From, Recipe, Run, Stage
from sandtree.store.imageconfig import ImageConfig


@pytest.fixture
def eng(st, rootfs):
    st.import_image(rootfs, tag="bb")
    return st.engine


@pytest.fixture
def ctx(tmp_path):
    d = tmp_path / "ctx"
    (d / "src" / "pkg").mkdir(parents=True)
    (d / "app.py").write_text("print('hi')\n")
    (d / "src" / "main.c").write_text("int main(){return 0;}\n")
    (d / "src" / "pkg" / "data.txt").write_text("data\n")
    os.chmod(d / "src" / "pkg" / "data.txt", 0o600)
    os.symlink("main.c", d / "src" / "link")
    return d


def ops_count(eng) -> int:
    return eng.store.db.one("SELECT COUNT(*) FROM operations")[0]


def ten_steps(ctx) -> Recipe:
    """FROM + 9 steps: config, runs, a copy at step 8 (what the bench changes)."""
    c = str(ctx)
    steps = [From("bb", "FROM bb", 1),
             Configure((("env", (("GREETING", "hello world"),)),), 'ENV GREETING="hello world"', 2),
             Configure((("cwd", "/app"),), "WORKDIR /app", 3),
             Run("echo \"$GREETING\" > greeting.txt", 'RUN echo "$GREETING" > greeting.txt', 4),
             Run("mkdir -p out && echo $BUILD_ARG > out/arg", "RUN mkdir -p out && echo $BUILD_ARG > out/arg", 5,
                 env=(("BUILD_ARG", "v1"),)),
             Copy(list_context(c, "src"), "/app/src", "COPY src /app/src", 6),
             Configure((("labels", (("stage", "one"),)),), "LABEL stage=one", 7),
             Copy(list_context(c, "app.py"), ".", "COPY app.py .", 8, dest_is_dir=True),
             Run("cat app.py src/pkg/data.txt > combined", "RUN cat app.py src/pkg/data.txt > combined", 9),
             Configure((("cmd", ("python3", "app.py")),), 'CMD ["python3", "app.py"]', 10)]
    return Recipe((Stage(None, tuple(steps)),), context=c)


def test_build_runs_each_step_and_a_rebuild_is_all_cache_hits(eng, ctx):
    events = []
    res = eng.build(ten_steps(ctx), tag="built", progress=events.append)
    img = res.image
    assert eng.resolve("built") == img
    assert [s.cached for s in res.steps] == [True] + [False] * 9      # (FROM a ref: resolved, nothing to run)
    assert [s.index for s in res.steps] == list(range(1, 11))
    assert all(s.operation for s in res.steps[1:])
    assert eng.read(img, "/app/greeting.txt") == b"hello world\n"
    assert eng.read(img, "/app/out/arg") == b"v1\n"
    assert eng.read(img, "/app/app.py") == b"print('hi')\n"
    assert eng.read(img, "/app/src/main.c") == (ctx / "src" / "main.c").read_bytes()
    assert eng.stat(img, "/app/src/link").to_dict()["target"] == "main.c"
    data = eng.stat(img, "/app/src/pkg/data.txt")
    assert (data.mode, data.uid, data.gid) == (0o600, 0, 0)
    assert eng.read(img, "/app/combined") == b"print('hi')\ndata\n"
    cfg = eng.image_config(img)
    assert cfg == ImageConfig(env={"GREETING": "hello world"}, cwd="/app", labels={"stage": "one"},
                              cmd=["python3", "app.py"])
    # the ARG is not kept; the run of the image sees the config
    assert eng.run(img, "pwd; echo $GREETING; echo ${BUILD_ARG:-unset}", disposable=True).stdout.decode().split("\n")[:3] \
        == ["/app", "hello world", "unset"]
    # the lineage reads like the Dockerfile
    log = [e["command"] for e in eng.log(img)]
    assert [t for t in reversed(log) if t][-9:] == [s.text for s in res.steps[1:]]
    # progress: running then done per step, the output of runs folded in
    assert [e["status"] for e in events if e["step"] == 4 and "output" not in e] == ["running", "done"]
    assert events[0]["total"] == 10

    # each cache row names the operation that made its image (rows of the same transaction)
    made = {s.operation: s.image for s in res.steps[1:]}
    rows = dict(eng.store.db.query("SELECT op, image FROM build_cache_by WHERE op IS NOT NULL"))
    assert all(rows[op] == image for op, image in made.items())
    assert {eng.operation(op)["result"] for op in made} == set(made.values())

    before = ops_count(eng)
    again = eng.build(ten_steps(ctx), progress=events.append)
    assert again.image == img
    assert all(s.cached for s in again.steps) and not any(s.operation for s in again.steps)
    assert ops_count(eng) == before                                       # no run, no commit
    assert {e["status"] for e in events[-10:]} == {"cached"}


def test_a_changed_copied_file_reruns_only_from_that_copy(eng, ctx):
    first = eng.build(ten_steps(ctx))
    (ctx / "app.py").write_text("print('changed')\n")
    second = eng.build(ten_steps(ctx))
    assert [s.cached for s in second.steps] == [True] * 7 + [False] * 3
    assert [s.image for s in second.steps[:7]] == [s.image for s in first.steps[:7]]
    assert second.image != first.image
    assert eng.read(second.image, "/app/combined") == b"print('changed')\ndata\n"
    # back to the first content: the first image again, from the cache
    (ctx / "app.py").write_text("print('hi')\n")
    third = eng.build(ten_steps(ctx))
    assert third.image == first.image and all(s.cached for s in third.steps)


def test_a_failed_run_names_its_line_and_tags_nothing(eng, ctx):
    r = Recipe((Stage(None, (From("bb", "FROM bb", 1), Run("echo fine", "RUN echo fine", 2),
                             Run("echo broken >&2; exit 3", "RUN echo broken >&2; exit 3", 7),
                             Run("echo never", "RUN echo never", 8))),))
    events = []
    with pytest.raises(BuildFailed) as e:
        eng.build(r, tag="failed", progress=events.append)
    assert "line 7" in e.value.message and "RUN echo broken" in e.value.message and "broken" in e.value.message
    assert e.value.details["line"] == 7 and e.value.details["exit_code"] == 3
    assert "failed" not in eng.tags()
    assert [ev["step"] for ev in events if ev["status"] == "failed"] == [3]
    assert not [ev for ev in events if ev["step"] == 4]
    # the step before it was cached; the failed one was not (a rebuild runs it again)
    with pytest.raises(BuildFailed):
        eng.build(r)


def test_cache_misses_once_the_image_is_gone_and_no_cache_reruns(eng, ctx):
    r = Recipe((Stage(None, (From("bb", "FROM bb"), Run("echo a > /a", "RUN echo a > /a"))),))
    first = eng.build(r)
    again = eng.build(r, no_cache=True)
    assert again.image == first.image and not again.steps[1].cached       # ran again, same state
    eng.remove_image(first.image, force=True)
    third = eng.build(r)
    assert not third.steps[1].cached and third.image == first.image
    assert eng.build(r, no_cache_filter=[2]).steps[1].cached is False
    assert eng.build(r, no_cache_filter=["other"]).steps[1].cached is True


def test_multi_stage_scratch_and_copy_from(eng, ctx):
    build = Stage("build", (From("bb", "FROM bb AS build", 1),
                            Run("mkdir -p /out && echo binary > /out/prog && chmod 755 /out/prog",
                                "RUN mkdir -p /out && echo binary > /out/prog && chmod 755 /out/prog", 2),
                            Run("echo unused > /unused", "RUN echo unused > /unused", 3)))
    unused = Stage("unused", (From("bb", "FROM bb AS unused", 4), Run("exit 1", "RUN exit 1", 5)))
    final = Stage(None, (From("scratch", "FROM scratch", 6),
                         Copy((), "/bin/", "COPY --from=build /out/prog /bin/", 7, from_stage="build",
                              paths=("/out/prog",), dest_is_dir=True),
                         Copy((), "/etc", "COPY --from=bb /etc/passwd /etc/group /etc", 8, from_stage="bb",
                              paths=("/etc/passwd", "/etc/group"), chown="1000:65534", chmod=0o640)))
    res = eng.build(Recipe((build, unused, final)))           # the unused stage (it would fail) is skipped
    assert len(res.steps) == 6
    names = sorted(e.name for e in eng.ls(res.image, "/"))
    assert names == ["bin", "etc"]
    assert eng.read(res.image, "/bin/prog") == b"binary\n"
    assert eng.stat(res.image, "/bin/prog").mode == 0o755
    pw = eng.stat(res.image, "/etc/passwd")
    assert (pw.mode, pw.uid, pw.gid) == (0o640, 1000, 65534)
    # a --chown name is resolved in the destination's /etc/passwd (scratch has none: as Docker, an error)
    with pytest.raises(InvalidInput, match="user"):
        eng.build(Recipe((Stage(None, (From("scratch", "FROM scratch"),
                                       Copy((), "/p", "COPY --from=bb --chown=user /etc/passwd /p", from_stage="bb",
                                            paths=("/etc/passwd",), chown="user"))),)))
    # FROM an earlier stage
    r2 = Recipe((build, Stage(None, (From("stage:build", "FROM build", 9), Run("cat /out/prog", "RUN cat /out/prog", 10)))))
    res2 = eng.build(r2)
    assert [s.cached for s in res2.steps] == [True, True, True, True, False]   # build stage: from the cache
    assert res2.steps[3].image == res2.steps[2].image
    with pytest.raises(InvalidInput, match="does not exist"):
        eng.build(Recipe((build, Stage(None, (From("scratch", "FROM scratch"),
                                              Copy((), "/x", "COPY --from=build /nope /x", 3, from_stage="build",
                                                   paths=("/nope",)))))))


def test_copy_chown_chmod_unpack_and_escapes(eng, ctx):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        data = b"from the tar\n"
        info = tarfile.TarInfo("inner/file.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    (ctx / "bundle.tar.gz").write_bytes(buf.getvalue())
    c = str(ctx)
    r = Recipe((Stage(None, (From("bb", "FROM bb"),
                             Copy(list_context(c, "src/main.c"), "/opt/main.c", "COPY --chown=user --chmod=0600 src/main.c /opt/main.c",
                                  chown="user", chmod=0o600),
                             Copy(list_context(c, "bundle.tar.gz"), "/opt/unpacked", "ADD bundle.tar.gz /opt/unpacked",
                                  unpack=True))),), context=c)
    img = eng.build(r).image
    e = eng.stat(img, "/opt/main.c")
    assert (e.mode, e.uid, e.gid) == (0o600, 1000, 1000)
    assert eng.read(img, "/opt/unpacked/inner/file.txt") == b"from the tar\n"
    with pytest.raises(PathEscape):
        list_context(c, "../outside")
    os.symlink("/etc/passwd", ctx / "escape")
    with pytest.raises(PathEscape):
        list_context(c, "escape")
    # a file changed after it was listed (and keyed): the copy fails, nothing is made
    listed = list_context(c, "app.py")
    (ctx / "app.py").write_text("swapped\n")
    before = eng.images()
    with pytest.raises(Conflict, match="changed"):
        eng.build(Recipe((Stage(None, (From("bb", "FROM bb"), Copy(listed, "/x", "COPY app.py /x"))),), context=c))
    assert eng.images() == before


def test_step_errors_name_the_line(eng):
    from sandtree.errors import ImageNotFound
    with pytest.raises(ImageNotFound, match="line 3: FROM ghost"):
        eng.build(Recipe((Stage(None, (From("ghost", "FROM ghost", 3),)),)))
    with pytest.raises(InvalidInput, match="line 5: FROM later") as e:
        eng.build(Recipe((Stage(None, (From("stage:later", "FROM later", 5),)), Stage("later", (From("bb", "FROM bb"),))),
                         target=0))
    assert e.value.details["line"] == 5


def test_placements_follow_the_listing_order(ctx):
    got = [(f.path, rel, root) for f, rel, root in placements(list_context(str(ctx), "src"))]
    assert got[0] == ("src", "", True)
    assert ("src/pkg/data.txt", "pkg/data.txt", False) in got
    assert [(f.path, rel) for f, rel, _ in placements(list_context(str(ctx), "app.py"))] == [("app.py", "app.py")]


def test_python_builder_gives_the_hand_written_recipe_and_id(eng, ctx):
    b = (RecipeBuilder("bb", str(ctx), build=eng.build)
         .env(GREETING="hello world").workdir("/app")
         .run('echo "$GREETING" > greeting.txt')
         .copy("src", "/app/src").label(stage="one").copy("app.py", "./")
         .cmd(["python3", "app.py"]))
    base = b
    b2 = b.run("true")
    assert len(base.recipe().stages[0].steps) == 8 and len(b2.recipe().stages[0].steps) == 9   # immutable
    want = ['FROM bb', 'ENV GREETING="hello world"', "WORKDIR /app", 'RUN echo "$GREETING" > greeting.txt',
            "COPY src /app/src", "LABEL stage=one", "COPY app.py ./", 'CMD ["python3", "app.py"]']
    assert [s.text for s in b.recipe().stages[0].steps] == want
    hand = Recipe((Stage(None, (From("bb", "FROM bb"),
                                Configure((("env", (("GREETING", "hello world"),)),), want[1]),
                                Configure((("cwd", "/app"),), want[2]),
                                Run('echo "$GREETING" > greeting.txt', want[3]),
                                Copy(list_context(str(ctx), "src"), "/app/src", want[4]),
                                Configure((("labels", (("stage", "one"),)),), want[5]),
                                Copy(list_context(str(ctx), "app.py"), "./", want[6], dest_is_dir=True),
                                Configure((("cmd", ("python3", "app.py")),), want[7]))),), context=str(ctx))
    assert b.recipe() == hand
    built = b.build(tag="from-builder")
    assert eng.build(hand).image == built.image
    assert eng.read(built.image, "/app/app.py") == b"print('hi')\n"
    texts = [s.text for s in RecipeBuilder("bb").apt_install("git", "curl").pip_install("numpy==2.1.3", "x>=1")
             .recipe().stages[0].steps[1:]]
    assert texts == ["RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
                     "--no-install-recommends git curl && rm -rf /var/lib/apt/lists/*",
                     "RUN python3 -m pip install --no-cache-dir numpy==2.1.3 'x>=1'"]


def test_bad_recipes_change_nothing(eng):
    before = eng.images()
    with pytest.raises(InvalidInput):
        eng.build("FROM bb")
    with pytest.raises(InvalidInput, match="FROM"):
        eng.build(Recipe((Stage(None, (Run("true", "RUN true"),)),)))
    with pytest.raises(InvalidInput, match="ghost"):
        eng.build(Recipe((Stage(None, (From("bb", "FROM bb"), Copy((), "/x", "COPY --chown=ghost", from_stage="bb",
                                                                   paths=("/etc/passwd",), chown="ghost"))),)))
    assert eng.images() == before


def test_gc_keeps_a_built_image_s_steps_and_drops_rows_of_removed_ones(eng):
    r = Recipe((Stage(None, (From("bb", "FROM bb"), Run("echo 1 > /one", "RUN echo 1 > /one"),
                             Run("echo 2 > /two", "RUN echo 2 > /two"))),))
    res = eng.build(r, tag="kept")
    eng.gc(retention=0, grace=0)
    assert all(s.cached for s in eng.build(r).steps)       # the tagged result keeps its ancestors
    eng.untag("kept")
    eng.gc(retention=0, grace=0)
    assert eng.store.db.one("SELECT COUNT(*) FROM build_cache_by WHERE image=?", (res.image,))[0] == 0
    assert not eng.build(r).steps[2].cached


def test_builder_texts_follow_the_dockerfile_rules():
    b = RecipeBuilder("bb", None).env(P="$HOME/x y", Q='say "hi"').expose(8080, "53/udp", "9000-9001") \
        .entrypoint(["srv"]).cmd(["--help"]).entrypoint(["srv2"])
    steps = b.recipe().stages[0].steps
    assert [s.text for s in steps[1:]] == ['ENV P="\\$HOME/x y" Q="say \\"hi\\""',
                                           "EXPOSE 8080/tcp 53/udp 9000/tcp 9001/tcp",
                                           'ENTRYPOINT ["srv"]', 'CMD ["--help"]', 'ENTRYPOINT ["srv2"]']
    assert steps[2].changes == (("expose", ("8080/tcp", "53/udp", "9000/tcp", "9001/tcp")),)
    assert steps[3].changes == (("entrypoint", ("srv",)), ("cmd", None))      # drops the base's CMD
    assert steps[5].changes == (("entrypoint", ("srv2",)),)                    # a CMD was set before it
    with pytest.raises(InvalidInput):
        RecipeBuilder("bb").expose("99999")
    with pytest.raises(InvalidInput, match="context"):
        RecipeBuilder("bb", None).copy("a", "/a")


def test_entrypoint_drops_the_base_cmd_in_the_image(eng):
    base = eng.configure("bb", ImageConfig(cmd=["sh"]))
    img = RecipeBuilder(base, None, build=eng.build).entrypoint(["/bin/echo"]).build().image
    assert eng.image_config(img) == ImageConfig(entrypoint=["/bin/echo"])


def test_a_copied_symlink_is_never_followed_on_the_host(eng, tmp_path):
    """Two copy roots landing on the same name: a symlink to a host directory, then a directory
    with a file under that name. The file must land in the image, never through the link."""
    host_dir = tmp_path / "host-target"
    host_dir.mkdir()
    a, b = tmp_path / "ctx" / "a", tmp_path / "ctx" / "b"
    (a).mkdir(parents=True)
    os.symlink(str(host_dir), a / "sub")                 # a link whose target is a host directory
    (b / "sub").mkdir(parents=True)
    (b / "sub" / "planted").write_text("x\n")
    c = str(tmp_path / "ctx")
    os.chmod(host_dir, 0o700)
    for order in (("a", "b"), ("b", "a", "b")):
        sources = tuple(f for src in order for f in list_context(c, src))
        r = Recipe((Stage(None, (From("bb", "FROM bb"),
                                 Copy(sources, "/d/", "COPY " + " ".join(order) + " /d/", dest_is_dir=True))),),
                   context=c)
        img = eng.build(r, no_cache=True).image
        assert os.listdir(host_dir) == [], order               # nothing written on the host
        assert host_dir.stat().st_mode & 0o7777 == 0o700        # nor its mode changed
        assert eng.read(img, "/d/sub/planted") == b"x\n"        # the directory won, in the image


def test_workdir_joins_and_cleans_as_docker(eng):
    b = RecipeBuilder("bb", None, build=eng.build).workdir("/app").workdir("sub").workdir("../x/./y/")
    img = b.run("pwd > /pwd").build().image
    assert eng.image_config(img).cwd == "/app/x/y"
    assert eng.read(img, "/pwd") == b"/app/x/y\n"              # WORKDIR made the directory; the RUN ran in it
    assert eng.stat(img, "/app/sub").kind == "d"
