"""`sandtree build`'s progress (cli/buildprogress.py) from recorded engine events: docker's plain
format, JSON lines, and the live view folding each step's output; plus the CLI's refusals of bad
Dockerfiles (through the real `python -m sandtree`, on a fresh store that stays empty)."""

from __future__ import annotations

import io
import json

from rich.console import Console

from sandtree.cli.build import progress_view
from sandtree.cli.buildprogress import FOLD_LINES, JsonProgress, LiveProgress, PlainProgress, StepLabels
from sandtree.recipe.dockerfile import parse

DOCKERFILE = "FROM busybox AS build\nRUN make\nRUN make install\nFROM scratch\nCOPY --from=build /out /\n"


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def events(clock):
    """What Engine.build reports for DOCKERFILE (the recorded shape of engine/builds/builds.py's events)."""
    base = {"total": 5}
    yield {**base, "step": 1, "stage": "build", "line": 1, "text": "FROM busybox AS build", "status": "cached",
           "image": "a" * 64, "seconds": 0.0001}
    yield {**base, "step": 2, "stage": "build", "line": 2, "text": "RUN make", "status": "running"}
    clock.t += 0.25
    yield {**base, "step": 2, "stage": "build", "line": 2, "text": "RUN make", "status": "running",
           "stream": "stdout", "output": b"cc -o x x.c\npart"}
    clock.t += 0.5
    yield {**base, "step": 2, "stage": "build", "line": 2, "text": "RUN make", "status": "running",
           "stream": "stderr", "output": b"ial\x1b[2J\n"}
    yield {**base, "step": 2, "stage": "build", "line": 2, "text": "RUN make", "status": "done",
           "image": "b" * 64, "seconds": 0.8123}
    yield {**base, "step": 3, "stage": "build", "line": 3, "text": "RUN make install", "status": "cached",
           "image": "c" * 64, "seconds": 0.0002}
    yield {**base, "step": 4, "stage": "1", "line": 4, "text": "FROM scratch", "status": "cached",
           "image": "d" * 64, "seconds": 0.0}
    yield {**base, "step": 5, "stage": "1", "line": 5, "text": "COPY --from=build /out /", "status": "running"}
    yield {**base, "step": 5, "stage": "1", "line": 5, "text": "COPY --from=build /out /", "status": "failed",
           "error": "no /out in stage build"}


def test_plain_is_dockers_format():
    clock, buf = Clock(), io.StringIO()
    view = PlainProgress(buf, StepLabels(parse(DOCKERFILE)), clock=clock)
    for ev in events(clock):
        view(ev)
    assert buf.getvalue().splitlines() == [
        "#1 [build 1/3] FROM busybox AS build",
        "#1 CACHED",
        "#2 [build 2/3] RUN make",
        "#2 0.250 cc -o x x.c",
        "#2 0.750 partial?[2J",                 # a partial line waits for its end; ESC made harmless
        "#2 DONE 0.8s",
        "#3 [build 3/3] RUN make install",
        "#3 CACHED",
        "#4 [stage-1 1/2] FROM scratch",
        "#4 CACHED",
        "#5 [stage-1 2/2] COPY --from=build /out /",
        "#5 ERROR: no /out in stage build",
    ]


def test_plain_labels_a_lone_stage_without_a_name_and_unknown_steps():
    labels = StepLabels(parse("FROM x\nRUN a\n"))
    assert labels({"stage": "0", "line": 2}) == "2/2"
    assert StepLabels(None)({"step": 3, "total": 9, "stage": "0", "line": 7}) == "3/9"


def test_json_is_one_event_a_line():
    clock, buf = Clock(), io.StringIO()
    view = JsonProgress(buf)
    sent = list(events(clock))
    for ev in sent:
        view(ev)
    got = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert len(got) == len(sent)
    assert [g["status"] for g in got] == [e["status"] for e in sent]
    assert got[2]["output"] == "cc -o x x.c\npart" and got[2]["stream"] == "stdout"
    assert got[0]["image"] == "a" * 64 and got[-1]["error"] == "no /out in stage build"


def render(view) -> str:
    out = io.StringIO()
    Console(file=out, width=100, color_system=None).print(view)
    return out.getvalue()


def test_live_view_folds_a_steps_output_when_it_is_done():
    clock = Clock()
    view = LiveProgress(io.StringIO(), StepLabels(parse(DOCKERFILE)), clock=clock, live=False)
    evs = list(events(clock))
    for ev in evs[:2]:
        view(ev)
    for i in range(10):
        view({**evs[1], "output": f"line {i}\n".encode()})
    shown = render(view)
    assert "=> CACHED [build 1/3] FROM busybox AS build" in shown
    assert "=> [build 2/3] RUN make" in shown
    assert [ln for ln in shown.splitlines() if "=> => #" in ln] == \
        [f" => => # line {i}" for i in range(10 - FOLD_LINES, 10)]          # the last lines only
    assert "(1/5)" in shown
    for ev in evs[4:7]:
        view(ev)
    shown = render(view)
    assert "=> => #" not in shown                                           # folded when done
    assert "[build 2/3] RUN make  0.8s" in shown and "(4/5)" in shown
    view(evs[7])
    view({**evs[7], "output": b"copying\n\x1b]0;pwned\x07\n"})
    view(evs[8])
    shown = render(view)
    assert "=> ERROR [stage-1 2/2] COPY --from=build /out /" in shown
    assert "=> => # copying" in shown and "\x1b" not in shown and "?]0;pwned?" in shown  # a failure keeps its tail


def test_progress_modes():
    recipe = parse(DOCKERFILE)
    assert isinstance(progress_view("auto", recipe, io.StringIO(), tty=False), PlainProgress)
    assert isinstance(progress_view("plain", recipe, io.StringIO(), tty=True), PlainProgress)
    assert isinstance(progress_view("json", recipe, io.StringIO(), tty=True), JsonProgress)
    assert progress_view("quiet", recipe, io.StringIO()) is None
    live = progress_view("auto", recipe, io.StringIO(), tty=True)
    try:
        assert isinstance(live, LiveProgress)
    finally:
        live.close()


# ---- the verb's refusals ---------------------------------------------------------------------------------

def test_bad_dockerfiles_fail_with_the_line_and_change_nothing(cli, tmp_path):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "ok.txt").write_text("x")
    (tmp_path / "outside").write_text("secret")
    (ctx / "out").symlink_to(tmp_path / "outside")
    cases = {
        "FROM scratch\nCOPY ok.txt /\nFROBNICATE now\n": "line 3: unknown instruction 'FROBNICATE'",
        "FROM scratch\n\nCOPY missing.txt /\n": "line 3: COPY: source 'missing.txt' not found",
        "FROM scratch\nCOPY ../outside /\n": "line 2: COPY: source '../outside' is outside the build context",
        "FROM scratch\nCOPY out /x\n": "line 2: COPY: source 'out' is a symlink",
    }
    for text, message in cases.items():
        (ctx / "Dockerfile").write_text(text)
        p = cli("build", str(ctx), "--tag", "t", check=False)
        assert p.returncode == 1 and f"error: {message}".encode() in p.stderr, p.stderr
        p = cli("build", str(ctx), "--json", check=False)
        assert p.returncode == 1 and json.loads(p.stdout)["line"] == int(message.split()[1].rstrip(":"))
    assert json.loads(cli("image", "list", "--json").stdout) == []           # nothing built, nothing tagged
    p = cli("build", str(tmp_path / "nope"), check=False)
    assert p.returncode == 1 and b"no Dockerfile at" in p.stderr
    p = cli("build", str(ctx), "--build-arg", "novalue", check=False)
    assert p.returncode == 1 and b"--build-arg wants NAME=VALUE" in p.stderr
