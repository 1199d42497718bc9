"""The Dockerfile parser (recipe/lexer.py, recipe/dockerfile.py): every instruction of the subset,
Docker's continuation, quoting, directive and expansion rules, multi-stage references, and every bad
input refused with its line (and nothing else: parse has no side effects)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile

import pytest

from sandtree.errors import InvalidInput, PathEscape
from sandtree.network.policy import Policy
from sandtree.recipe.context import BuildContext
from sandtree.recipe.dockerfile import parse
from sandtree.recipe.lexer import expand, quote, split_words, word
from sandtree.recipe.steps import Configure, Copy, From, Run


def steps(text, **kw):
    r = parse(text, **kw)
    return [s for st in r.stages for s in st.steps]


def texts(text, **kw):
    return [s.text for s in steps(text, **kw)]


def bad(text, line, match, cls=InvalidInput, **kw):
    with pytest.raises(cls, match=match) as e:
        parse(text, **kw)
    assert e.value.details.get("line") == line, e.value.message
    assert f"line {line}" in e.value.message
    return e.value


@pytest.fixture
def ctx(tmp_path):
    root = tmp_path / "ctx"
    (root / "src").mkdir(parents=True)
    (root / "app.py").write_text("print(1)\n")
    (root / "a b.txt").write_text("space\n")
    (root / "src" / "main.c").write_text("int main(){return 0;}\n")
    (root / "src" / "util.c").write_text("\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("hello.txt")
        info.size = 2
        t.addfile(info, io.BytesIO(b"hi"))
    (root / "bundle.tar").write_bytes(buf.getvalue())
    (root / "bundle.tgz").write_bytes(gzip.compress(buf.getvalue()))
    (root / "notatar.gz").write_bytes(gzip.compress(b"just text" * 100))
    return BuildContext(str(root))


# ---- each instruction ---------------------------------------------------------------------------------

def test_from_forms_and_stage_names():
    r = parse("FROM scratch\nFROM busybox AS Build\nFROM docker://127.0.0.1:5000/x:1 as rt\nFROM build\n"
              "FROM branch:main\n")
    bases = [st.steps[0] for st in r.stages]
    assert [b.base for b in bases] == ["scratch", "busybox", "docker://127.0.0.1:5000/x:1", "stage:build",
                                       "branch:main"]
    assert [b.text for b in bases] == ["FROM scratch", "FROM busybox AS build", "FROM docker://127.0.0.1:5000/x:1 AS rt",
                                       "FROM build", "FROM branch:main"]
    assert [st.name for st in r.stages] == [None, "build", "rt", None, None]
    assert [b.line for b in bases] == [1, 2, 3, 4, 5]
    assert r.target == -1 and r.context is None


def test_target_picks_a_stage():
    assert parse("FROM a AS one\nFROM b AS two\n", target="ONE").target == 0
    with pytest.raises(InvalidInput, match="no stage has that name"):
        parse("FROM a AS one\n", target="three")


def test_run_shell_and_exec_forms_not_expanded():
    got = steps('FROM x\nARG V=1\nENV E=2\nRUN echo $V $E "q"\nRUN ["/bin/echo", "$V", "é"]\nRUN [not json\n')
    run, ex, broken = got[2], got[3], got[4]
    assert (run.command, run.text) == ('echo $V $E "q"', 'RUN echo $V $E "q"')
    assert run.env == (("V", "1"),)                 # the ARG, for the shell to expand; not kept
    assert ex.command == ("/bin/echo", "$V", "é") and ex.text == 'RUN ["/bin/echo", "$V", "é"]'
    assert broken.command == "[not json"            # Docker: not JSON, so the shell form


def test_run_network_flag_and_build_wide_network():
    got = steps("FROM x\nRUN --network=pypi.org:443 pip install a\nRUN --network=none true\nRUN true\n"
                "RUN --network=default true\n", network="all")
    assert got[1].network == Policy.from_value("pypi.org:443")
    assert got[1].text == "RUN pip install a"        # the policy is its own part of the cache key
    tabbed = steps("FROM x\nRUN --network=all\tprintf 'a\tb'\n", network="all")[1]
    assert tabbed.command == "printf 'a\tb'" and tabbed.network == Policy.from_value("all")
    assert got[2].network is False                   # off, even where the build is given a network again
    assert got[3].network == Policy.from_value("all") and got[4].network == Policy.from_value("all")
    assert steps("FROM x\nRUN true\n")[1].network is None         # no network unless asked


def test_env_forms_and_docker_expansion_order():
    got = steps('FROM x\nENV A=1\nENV B=$A C="two words" D=${A}0 A=9 E=$A\nENV OLD legacy  value $A\n'
                "ENV F='$A' G=\\$A H=${UNSET:-dflt} I=${A:+set} J=${UNSET:+set} K=${A-x} L=\"a\\\"b\"\n")
    assert got[1] == Configure((("env", (("A", "1"),)),), "ENV A=1", 2)
    assert dict(got[2].changes)["env"] == (("B", "1"), ("C", "two words"), ("D", "10"), ("A", "9"), ("E", "1"))
    assert got[2].text == 'ENV B=1 C="two words" D=10 A=9 E=1'
    assert dict(got[3].changes)["env"] == (("OLD", "legacy  value 9"),)
    env = dict(dict(got[4].changes)["env"])
    assert env == {"F": "$A", "G": "$A", "H": "dflt", "I": "set", "J": "", "K": "9", "L": 'a"b'}
    assert got[4].text == 'ENV F="\\$A" G="\\$A" H=dflt I=set J="" K=9 L="a\\"b"'


def test_canonical_quoting_reads_back():
    for s in ("plain", "two words", 'q"uote', "$dollar", "back\\slash", "", "[bracket", "tab\tx", "a*b"):
        for form in (quote, word):
            (w,) = split_words(form(s), "\\", 1)
            assert expand(w, {}, "\\", 1) == s
    assert word("src/*.c") == "src/*.c" and quote("src/*.c") == '"src/*.c"'
    assert quote("1.2.3") == "1.2.3" and quote("x~y") == '"x~y"'


def test_arg_scoping_before_and_after_from():
    r = parse("ARG TAG=1.0\nARG BASE=busybox\nFROM ${BASE}:$TAG AS a\nRUN echo\nARG TAG\nARG LOCAL=x-$TAG\n"
              "RUN echo\nFROM scratch\nRUN echo\n", build_args={"BASE": "alpine", "LOCAL": "given"})
    a, b = r.stages
    assert a.steps[0].base == "alpine:1.0"
    assert a.steps[1].env == ()                     # global ARGs are not in a stage until declared
    assert a.steps[2].env == (("TAG", "1.0"), ("LOCAL", "given"))
    assert b.steps[1].env == ()
    assert r.args == (("BASE", "alpine"), ("LOCAL", "given"))
    assert steps("ARG X\nFROM a\nARG X\nARG Y=$X-y\nRUN t\n", build_args={"X": "7"})[1].env == (("X", "7"), ("Y", "7-y"))
    assert steps("FROM a\nARG A=1\nENV A=2\nRUN t\n")[2].env == ()     # ENV wins over ARG


def test_workdir_user_label_cmd_entrypoint_expose():
    got = steps("FROM x\nENV D=/srv\nWORKDIR $D\nWORKDIR app\nWORKDIR ../other\nUSER app:staff\nUSER 1000\n"
                'LABEL org.x.v=1 "k 2"="v 2"\nLABEL legacy the value\nCMD ["python", "app.py"]\nCMD echo hi\n'
                'ENTRYPOINT ["/init"]\nEXPOSE 8080 53/udp 9000-9002/TCP\n')
    cfg = [(s.changes, s.text) for s in got[2:]]
    assert cfg[0] == ((("cwd", "/srv"),), "WORKDIR /srv")
    assert cfg[1] == ((("cwd", "app"),), "WORKDIR app")              # the engine joins it to the image's
    assert cfg[2] == ((("cwd", "../other"),), "WORKDIR ../other")
    assert cfg[3] == ((("user", "app:staff"),), "USER app:staff")
    assert cfg[4] == ((("user", "1000"),), "USER 1000")
    assert cfg[5] == ((("labels", (("org.x.v", "1"), ("k 2", "v 2"))),), 'LABEL org.x.v=1 "k 2"="v 2"')
    assert cfg[6][0] == (("labels", (("legacy", "the value"),)),)
    assert cfg[7] == ((("cmd", ("python", "app.py")),), 'CMD ["python", "app.py"]')
    assert cfg[8] == ((("cmd", ("/bin/sh", "-c", "echo hi")),), "CMD echo hi")
    assert cfg[9] == ((("entrypoint", ("/init",)),), 'ENTRYPOINT ["/init"]')   # CMD set here: kept
    assert cfg[10] == ((("expose", ("8080/tcp", "53/udp", "9000/tcp", "9001/tcp", "9002/tcp")),),
                       "EXPOSE 8080/tcp 53/udp 9000/tcp 9001/tcp 9002/tcp")
    ep = steps("FROM x\nENTRYPOINT /run.sh\n")[1]
    assert ep.changes == (("entrypoint", ("/bin/sh", "-c", "/run.sh")), ("cmd", None))  # the base's CMD dropped


# ---- COPY / ADD ---------------------------------------------------------------------------------------

def test_copy_from_the_context(ctx):
    got = steps('FROM x\nENV D=/app/\nCOPY app.py $D\nCOPY --chown=app:app --chmod=0755 src/*.c /src/\n'
                'COPY ["a b.txt", "/data/"]\nCOPY src /s\nCOPY app.py /app.py\nCOPY . .\n', context=ctx)
    c1, c2, c3, c4, c5, c6 = got[2:]
    assert isinstance(c1, Copy) and c1.text == "COPY app.py /app/" and c1.dest == "/app/" and c1.dest_is_dir
    assert [f.path for f in c1.sources] == ["app.py"] and c1.sources[0].sha256
    assert c2.text == "COPY --chown=app:app --chmod=0755 src/*.c /src/"
    assert (c2.chown, c2.chmod) == ("app:app", 0o755)
    assert [f.path for f in c2.sources] == ["src/main.c", "src/util.c"]
    assert c3.text == 'COPY "a b.txt" /data/' and c3.sources[0].path == "a b.txt"
    assert [f.path for f in c4.sources] == ["src", "src/main.c", "src/util.c"] and not c4.dest_is_dir
    assert not c5.dest_is_dir and c5.dest == "/app.py"
    assert c6.dest_is_dir and c6.sources[0].path == "."
    assert all(c.line == n for c, n in zip(got[2:], range(3, 9), strict=True))


def test_copy_from_a_stage_or_image():
    r = parse("FROM gcc AS build\nRUN cc\nFROM busybox\nCOPY --from=build /out/hello /usr/bin/\n"
              "COPY --from=0 out/a out/b /x/\nCOPY --from=docker://r/img:1 /etc/os-release /\n")
    c1, c2, c3 = r.stages[1].steps[1:]
    assert (c1.from_stage, c1.paths, c1.sources, c1.text) == ("build", ("/out/hello",), (),
                                                             "COPY --from=build /out/hello /usr/bin/")
    assert (c2.from_stage, c2.paths, c2.dest_is_dir) == ("0", ("/out/a", "/out/b"), True)
    assert c3.from_stage == "docker://r/img:1"


def test_add_unpacks_local_tars_by_content(ctx):
    got = steps("FROM x\nADD bundle.tar /opt/\nADD bundle.tgz /opt/\nADD notatar.gz /opt/\nADD app.py /a\n",
                context=ctx)
    assert [s.unpack for s in got[1:]] == [True, True, False, False]
    assert got[1].text == "ADD bundle.tar /opt/"
    bad("FROM x\nADD bundle.tar app.py /opt/\n", 2, "mixes tar archives", context=ctx)


# ---- lexing ------------------------------------------------------------------------------------------

def test_continuations_comments_and_line_numbers():
    text = ("# a comment\n\nFROM x\nRUN apt-get update && \\\n    # a comment inside\n\n"
            "    apt-get install -y git \\  \n    curl\n\n  run   echo  lower\nENV A=1 \\\n    B=2\n")
    got = steps(text)
    assert got[1].text == "RUN apt-get update &&     apt-get install -y git     curl" and got[1].line == 4
    assert got[2].text == "RUN echo  lower" and got[2].line == 10
    assert got[3].line == 11 and dict(got[3].changes)["env"] == (("A", "1"), ("B", "2"))


def test_escape_directive_and_syntax_directive():
    got = steps("# syntax=docker/dockerfile:1\n# escape=`\nFROM x\nRUN dir c:\\ `\n  && echo\nENV P=a`$b\n")
    assert got[1].text == "RUN dir c:\\   && echo"
    assert dict(got[2].changes)["env"] == (("P", "a$b"),)
    # a directive after an instruction or a blank line is only a comment
    assert steps("FROM x\n# escape=`\nRUN a \\\n b\n")[1].text == "RUN a  b"
    bad("# escape=x\nFROM x\n", 1, "escape directive")


# ---- bad input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,line,match", [
    ("FROM x\nFOO bar\n", 2, "unknown instruction 'FOO'"),
    ("FROM x\n\nHEALTHCHECK CMD true\n", 3, "HEALTHCHECK is not supported"),
    ("FROM x\nSHELL [\"/bin/bash\"]\n", 2, "SHELL is not supported"),
    ("FROM x\nVOLUME /data\n", 2, "VOLUME is not supported"),
    ("FROM x\nONBUILD RUN x\n", 2, "ONBUILD is not supported"),
    ("RUN echo\nFROM x\n", 1, "before the first FROM"),
    ("FROM --platform=linux/arm64 x\n", 1, "--platform is not supported"),
    ("FROM x AS 1bad\n", 1, "bad stage name"),
    ("FROM x AS a\nFROM y AS a\n", 2, "used twice"),
    ("FROM x y\n", 1, "expected FROM IMAGE"),
    ("ARG B\nFROM $B\n", 2, "names no image"),
    ("FROM x\nRUN\n", 2, "needs a command"),
    ("FROM x\nRUN <<EOF\necho\nEOF\n", 2, "heredocs"),
    ("FROM x\nRUN cat <<-'END' > f\n", 2, "heredocs"),
    ("FROM x\nRUN --mount=type=cache,target=/x true\n", 2, "--mount is not supported"),
    ("FROM x\nRUN --network=host true\n", 2, "--network=host"),
    ("FROM x\nRUN --network=bad_rule!! true\n", 2, "network rule"),
    ("FROM x\nRUN --network true\n", 2, "needs a value"),
    ("FROM x\nCOPY a\n", 2, "needs a source and a destination"),
    ("FROM x\nCOPY --link a /b\n", 2, "--link is not supported"),
    ("FROM x\nCOPY --chmod=u+x a /b\n", 2, "octal mode"),
    ("FROM x\nCOPY --chown=a/b a /b\n", 2, "USER\\[:GROUP\\]"),
    ("FROM x AS a\nCOPY --from=a /x /y\n", 2, "this stage itself"),
    ("FROM x\nCOPY --from=3 /x /y\n", 2, "not an earlier stage"),
    ("FROM x\nFROM y\nCOPY --from=0 /a /b /dest\n", 3, "ending in /"),
    ("FROM x\nCOPY a /b\n", 2, "needs a build context"),
    ("FROM x\nADD https://example.org/x.tar /x\n", 2, "URLs are not supported"),
    ("FROM x\nADD git@github.com:a/b.git /x\n", 2, "URLs are not supported"),
    ("FROM x\nENV\n", 2, "needs a variable"),
    ("FROM x\nENV A\n", 2, "needs a value"),
    ("FROM x\nENV A=1 B\n", 2, "'B' is not K=V"),
    ("FROM x\nENV A=\"open\n", 2, "unmatched"),
    ("FROM x\nENV A=${B\n", 2, "missing '}'"),
    ("FROM x\nENV A=\"${B:?must be set}\"\n", 2, "B: must be set"),
    ("FROM x\nENV A=${B/x/y}\n", 2, "unsupported substitution"),
    ("FROM x\nENV A=${1x}\n", 2, "bad substitution"),
    ("FROM x\nARG 9x=1\n", 2, "bad argument name"),
    ("FROM x\nARG\n", 2, "needs a name"),
    ("FROM x\nWORKDIR\n", 2, "needs a value"),
    ("FROM x\nWORKDIR $NOPE\n", 2, "expands to nothing"),
    ("FROM x\nUSER a b\n", 2, "expected USER"),
    ("FROM x\nEXPOSE http\n", 2, "is not a port"),
    ("FROM x\nEXPOSE 70000\n", 2, "is not a port"),
    ("FROM x\nEXPOSE 1-5000\n", 2, "at most 1024"),
    ("FROM x\nEXPOSE 80/icmp\n", 2, "is not a port"),
    ("FROM x\nCMD\n", 2, "needs a command"),
    ("FROM x\nLABEL\n", 2, "needs a label"),
])
def test_bad_input_names_its_line(text, line, match):
    bad(text, line, match)


def test_bad_copy_sources_name_their_line(ctx, tmp_path):
    os.symlink(str(tmp_path), os.path.join(ctx.root, "out"))
    ctx = BuildContext(ctx.root)
    e = bad("FROM x\n\nCOPY missing.py /app/\n", 3, "COPY: source 'missing.py' not found", context=ctx)
    assert e.details["instruction"] == "COPY"
    bad("FROM x\nADD ../outside /x\n", 2, "ADD: source '../outside' is outside", PathEscape, context=ctx)
    bad("FROM x\nCOPY out /x\n", 2, "symlink .*outside the build context", PathEscape, context=ctx)
    bad("FROM x\nCOPY src app.py /dir\n", 2, "2 sources need a destination ending in /", context=ctx)


def test_whole_file_refusals():
    with pytest.raises(InvalidInput, match="no FROM"):
        parse("# only a comment\nARG A=1\n")
    with pytest.raises(InvalidInput, match="NUL"):
        parse("FROM x\0\n")
    with pytest.raises(InvalidInput, match="over 64 stages"):
        parse("FROM x\n" * 65)


def test_parse_is_pure_and_deterministic(ctx):
    text = "FROM x\nCOPY src /s/\nENV A=1\nRUN make\n"
    assert parse(text, context=ctx) == parse(text, context=ctx)
    assert isinstance(steps(text, context=ctx)[0], From) and isinstance(steps(text, context=ctx)[3], Run)


def test_image_env_feeds_expansion():
    seen = []

    def image_env(ref):
        seen.append(ref)
        return {"PATH": "/usr/bin:/bin"}
    r = parse("FROM img AS a\nENV PATH=/opt/bin:$PATH\nFROM a\nENV X=$PATH\nFROM scratch\nENV Y=${PATH:-none}\n",
              image_env=image_env)
    assert seen == ["img"]
    assert dict(r.stages[0].steps[1].changes)["env"] == (("PATH", "/opt/bin:/usr/bin:/bin"),)
    assert dict(r.stages[1].steps[1].changes)["env"] == (("X", "/opt/bin:/usr/bin:/bin"),)
    assert dict(r.stages[2].steps[1].changes)["env"] == (("Y", "none"),)


def test_image_env_is_asked_only_when_a_name_is_unknown():
    asked = []
    r = parse("FROM img\nARG V=1\nENV A=$V\nRUN echo\nENV B=$A\n", image_env=lambda ref: asked.append(ref) or {"V": "img"})
    assert asked == ["img"]                                         # for V: the image's env wins over the ARG
    assert dict(r.stages[0].steps[1].changes)["env"] == (("A", "img"),)
    asked.clear()
    parse("FROM img\nENV A=1\nENV B=$A\nWORKDIR /x\n", image_env=lambda ref: asked.append(ref) or {})
    assert asked == []
