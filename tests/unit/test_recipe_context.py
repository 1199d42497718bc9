"""The build context (recipe/context.py, recipe/patterns.py): Docker's COPY source rules and
.dockerignore on a real directory tree, and everything a hostile context may plant."""

from __future__ import annotations

import hashlib
import os
import stat
import sys

import pytest

from sandtree.errors import InvalidInput, NotRegularFile, PathEscape, TooLarge
from sandtree.recipe import context as ctxmod
from sandtree.recipe.context import BuildContext, placements
from sandtree.recipe.patterns import IgnoreRules


def write(root, rel, data=b"x", mode=0o644):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(data)
    os.chmod(p, mode)
    return p


@pytest.fixture
def ctx(tmp_path):
    root = str(tmp_path / "ctx")
    write(root, "app.py", b"print('hi')\n", 0o755)
    write(root, "README.md", b"# readme\n")
    write(root, "src/main.c", b"int main(){return 0;}\n")
    write(root, "src/util.c", b"/* util */\n")
    write(root, "src/inc/util.h", b"#pragma once\n")
    write(root, "a.txt", b"a")
    write(root, "b.txt", b"b")
    write(root, "*", b"star")                    # a file literally named '*'
    return root


def paths(entries):
    return [e.path for e in entries]


def test_a_file_its_hash_mode_and_size(ctx):
    (f,) = BuildContext(ctx).select(["app.py"])
    assert (f.path, f.kind, f.mode, f.size) == ("app.py", "file", 0o755, 12)
    assert f.sha256 == hashlib.sha256(b"print('hi')\n").hexdigest()


def test_a_directory_root_then_its_descendants_sorted(ctx):
    got = BuildContext(ctx).select(["src"])
    assert paths(got) == ["src", "src/inc", "src/inc/util.h", "src/main.c", "src/util.c"]
    assert [e.kind for e in got][:2] == ["dir", "dir"]
    assert placements(got) == [(got[0], ""), (got[1], "inc"), (got[2], "inc/util.h"), (got[3], "main.c"),
                               (got[4], "util.c")]


def test_the_context_itself_and_leading_slash_and_dot_segments(ctx):
    bc = BuildContext(ctx)
    whole = bc.select(["."])
    assert whole[0].path == "." and "src/inc/util.h" in paths(whole) and "app.py" in paths(whole)
    assert placements(whole)[1][1] == whole[1].path            # relative to the context root
    assert paths(bc.select(["/app.py"])) == ["app.py"]
    assert paths(bc.select(["./src/../app.py"])) == ["app.py"]


def test_globs_match_one_component_at_a_time(ctx):
    bc = BuildContext(ctx)
    assert paths(bc.select(["*.txt"])) == ["a.txt", "b.txt"]
    assert paths(bc.select(["?.txt"])) == ["a.txt", "b.txt"]
    assert paths(bc.select(["[a].txt"])) == ["a.txt"]
    assert paths(bc.select(["[^a].txt"])) == ["b.txt"]
    assert paths(bc.select(["src/*.c"])) == ["src/main.c", "src/util.c"]
    assert paths(bc.select(["*/*.c"])) == ["src/main.c", "src/util.c"]     # '*' never crosses '/'
    assert paths(bc.select(["\\*"])) == ["*"]                              # escaped: the literal name
    got = bc.select(["a.txt", "src"])                                      # several roots, in order
    assert paths(got)[:2] == ["a.txt", "src"]
    assert [r for _, r in placements(got)][:3] == ["a.txt", "", "inc"]


def test_missing_sources_name_the_line(ctx):
    bc = BuildContext(ctx)
    with pytest.raises(InvalidInput, match=r"line 7: COPY source 'nope\.py' not found"):
        bc.select(["nope.py"], line=7)
    with pytest.raises(InvalidInput, match=r"line 3: COPY source '\*\.rs' matches nothing"):
        bc.select(["*.rs"], line=3)
    with pytest.raises(InvalidInput, match="line 2: COPY needs at least one source"):
        bc.select([], line=2)


def test_paths_out_of_the_context_are_refused(ctx):
    bc = BuildContext(ctx)
    for src in ("../outside", "src/../../x", "../ctx/app.py"):
        with pytest.raises(PathEscape, match="line 4: .*outside the build context") as e:
            bc.select([src], line=4)
        assert e.value.details["line"] == 4


def test_overlapping_roots_are_refused_duplicates_merged(ctx):
    bc = BuildContext(ctx)
    with pytest.raises(InvalidInput, match="overlap"):
        bc.select(["src", "src/main.c"], line=1)
    with pytest.raises(InvalidInput, match="overlap"):
        bc.select([".", "app.py"])
    assert paths(bc.select(["a.txt", "a.txt"])) == ["a.txt"]


# ---- symlinks -------------------------------------------------------------------------------------

def test_symlinks_inside_a_directory_are_kept_never_followed(ctx, tmp_path):
    secret = write(str(tmp_path), "secret", b"host secret")
    os.symlink(secret, os.path.join(ctx, "src", "abs-out"))
    os.symlink("../../../etc/passwd", os.path.join(ctx, "src", "rel-out"))
    os.symlink("main.c", os.path.join(ctx, "src", "in"))
    got = {e.path: e for e in BuildContext(ctx).select(["src"])}
    assert got["src/abs-out"].kind == "symlink" and got["src/abs-out"].target == secret
    assert got["src/abs-out"].sha256 is None                    # its target was not read
    assert got["src/rel-out"].target == "../../../etc/passwd"
    assert got["src/in"].kind == "symlink" and got["src/in"].target == "main.c"


def test_a_symlink_root_out_of_the_context_is_refused(ctx, tmp_path):
    write(str(tmp_path), "secret", b"host secret")
    os.symlink(str(tmp_path / "secret"), os.path.join(ctx, "abs"))
    os.symlink("../secret", os.path.join(ctx, "rel"))
    os.symlink("../../secret", os.path.join(ctx, "src", "deep"))
    os.symlink("../app.py", os.path.join(ctx, "src", "ok"))
    bc = BuildContext(ctx)
    for src in ("abs", "rel", "src/deep", "ab?"):
        with pytest.raises(PathEscape, match="line 9: .*symlink .*outside the build context"):
            bc.select([src], line=9)
    (ok,) = bc.select(["src/ok"])
    assert (ok.kind, ok.target) == ("symlink", "../app.py")     # inside: kept as the link


def test_a_source_path_through_a_symlinked_directory_is_refused(ctx, tmp_path):
    os.makedirs(tmp_path / "elsewhere")
    write(str(tmp_path), "elsewhere/f", b"outside")
    os.symlink(str(tmp_path / "elsewhere"), os.path.join(ctx, "linkdir"))
    os.symlink("src", os.path.join(ctx, "srclink"))
    bc = BuildContext(ctx)
    for src in ("linkdir/f", "srclink/main.c"):
        with pytest.raises(InvalidInput, match="symlink"):
            bc.select([src], line=5)
    with pytest.raises(InvalidInput, match="matches nothing"):
        bc.select(["linkdir/*"], line=1)                        # a glob does not enter it either


def test_devices_fifos_are_refused(ctx):
    os.mkfifo(os.path.join(ctx, "src", "pipe"))
    with pytest.raises(NotRegularFile, match="line 6: 'src/pipe'"):
        BuildContext(ctx).select(["src"], line=6)
    os.unlink(os.path.join(ctx, "src", "pipe"))
    os.mknod(os.path.join(ctx, "null"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    with pytest.raises(NotRegularFile, match="null"):
        BuildContext(ctx).select(["null"])
    with pytest.raises(NotRegularFile):
        BuildContext(ctx).select(["."])


# ---- bounds -----------------------------------------------------------------------------------------

def test_depth_entries_and_bytes_are_bounded(ctx, monkeypatch):
    deep = os.path.join(ctx, *["d"] * 6)
    os.makedirs(deep)
    monkeypatch.setattr(ctxmod, "MAX_DEPTH", 4)
    with pytest.raises(TooLarge, match="deeper than 4"):
        BuildContext(ctx).select(["d"], line=2)
    monkeypatch.setattr(ctxmod, "MAX_DEPTH", 128)
    monkeypatch.setattr(ctxmod, "MAX_ENTRIES", 3)
    with pytest.raises(TooLarge, match="over 3 entries"):
        BuildContext(ctx).select(["src"])
    monkeypatch.setattr(ctxmod, "MAX_ENTRIES", 1000)
    monkeypatch.setattr(ctxmod, "MAX_BYTES", 20)
    with pytest.raises(TooLarge, match="over 20 bytes"):
        BuildContext(ctx).select(["src"])


def test_an_oversized_or_odd_ignore_file_is_refused(ctx, monkeypatch):
    monkeypatch.setattr(ctxmod, "MAX_IGNORE_BYTES", 10)
    write(ctx, ".dockerignore", b"*.log\n" * 5)
    with pytest.raises(TooLarge):
        BuildContext(ctx)
    os.unlink(os.path.join(ctx, ".dockerignore"))
    os.symlink("/etc/passwd", os.path.join(ctx, ".dockerignore"))
    with pytest.raises(InvalidInput, match="symlink"):
        BuildContext(ctx)
    assert BuildContext(ctx, ignore_file=None).ignore.patterns == []


def test_a_missing_context_is_refused(tmp_path):
    with pytest.raises(InvalidInput, match="does not exist"):
        BuildContext(str(tmp_path / "nope"))
    write(str(tmp_path), "f")
    with pytest.raises(InvalidInput, match="not a directory"):
        BuildContext(str(tmp_path / "f"))


# ---- .dockerignore ----------------------------------------------------------------------------------

def test_dockerignore_patterns_as_moby_reads_them():
    r = IgnoreRules("# comment\n\n*.log\n!keep.log\nbuild\n**/*.tmp\n/abs/x\nsecret/**\n docs/*.md \n")
    assert r.ignored("a.log") and not r.ignored("keep.log") and not r.ignored("dir/a.log")  # '*' is one level
    assert r.ignored("build") and r.ignored("build/out/x.o")                   # a parent matches
    assert r.ignored("x.tmp") and r.ignored("a/b/c.tmp")                       # '**/' any depth, even none
    assert r.ignored("abs/x") and not r.ignored("abs/y")                       # leading '/' dropped
    assert r.ignored("secret/a/b") and not r.ignored("secret")                 # 'secret/**' only below it
    assert r.ignored("docs/a.md") and not r.ignored("docs/a/b.md")             # spaces trimmed
    assert not r.ignored("# comment") and not r.ignored(".")
    last = IgnoreRules("!a.txt\n*.txt\n")                                      # the last match wins
    assert last.ignored("a.txt")
    esc = IgnoreRules("\\*.txt\nfile[0-9]\n")
    assert esc.ignored("*.txt") and not esc.ignored("a.txt")
    assert esc.ignored("file7") and not esc.ignored("filex")
    assert IgnoreRules("a/../b\n").ignored("b")                                # cleaned like Go's Clean
    with pytest.raises(InvalidInput, match="unclosed"):
        IgnoreRules("[abc\n")


def test_dockerignore_applies_to_copy(ctx):
    write(ctx, "logs/a.log", b"l")
    write(ctx, "logs/keep.log", b"k")
    write(ctx, "build/out.o", b"o")
    write(ctx, "build/keep/me.txt", b"m")
    write(ctx, "src/x.tmp", b"t")
    write(ctx, ".dockerignore", b"build\n!build/keep\n**/*.tmp\nlogs/*.log\n!logs/keep.log\nREADME.md\n")
    bc = BuildContext(ctx)
    whole = paths(bc.select(["."]))
    assert "build/out.o" not in whole and "src/x.tmp" not in whole and "logs/a.log" not in whole
    assert "build/keep/me.txt" in whole and "build" in whole and "logs/keep.log" in whole
    with pytest.raises(InvalidInput, match="line 8: COPY source 'README.md' is excluded by .dockerignore"):
        bc.select(["README.md"], line=8)
    with pytest.raises(InvalidInput, match="matches nothing"):
        bc.select(["src/*.tmp"], line=8)
    assert paths(bc.select(["logs"])) == ["logs", "logs/keep.log"]
    with pytest.raises(InvalidInput, match="matches nothing"):
        bc.select(["a.txt", "*.md"])                            # an ignored file is not there for globs


def test_an_unreadable_entry_is_a_clear_error():
    import shutil
    import subprocess
    import tempfile
    # as an unprivileged user (root reads anything), in a directory that user may enter
    top = tempfile.mkdtemp(prefix="sandtree-ctx-")
    try:
        os.chmod(top, 0o755)
        write(top, "src/ok.txt", b"ok")
        os.makedirs(os.path.join(top, "src", "closed"))
        os.chmod(os.path.join(top, "src", "closed"), 0)
        code = ("import sys; sys.path.insert(0, %r)\n"
                "from sandtree.recipe.context import BuildContext\n"
                "from sandtree.errors import InvalidInput\n"
                "try:\n    BuildContext(%r).select(['src'], line=3)\n"
                "except InvalidInput as e:\n    print(e.message)\n") % (
            os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src")), top)
        r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                            sys.executable, "-c", code], capture_output=True, text=True)
        assert r.stdout.strip() == "line 3: cannot read the build context: Permission denied (src/closed)", \
            r.stdout + r.stderr
    finally:
        shutil.rmtree(top)            # a plain tree this test made (no mounts)
