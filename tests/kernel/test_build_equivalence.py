"""The Python builder (recipe/builder.py) and an equivalent Dockerfile (recipe/dockerfile.py) write
the same steps -- the same canonical texts, so the same cache keys -- and build the same image ID
(issue 15, "must hold"). Real builds on the real kernel over the busybox image."""

from __future__ import annotations

import dataclasses

import pytest

from sandtree.recipe.builder import RecipeBuilder
from sandtree.recipe.context import BuildContext
from sandtree.recipe.dockerfile import parse
from test_builds import eng  # noqa: F401 (fixture: an engine with busybox tagged bb)

DOCKERFILE = """\
FROM bb
ENV GREETING="hello world" MODE=prod LITERAL='$HOME'
WORKDIR /app
WORKDIR sub
RUN echo "$GREETING" > greeting.txt
RUN ["/bin/sh", "-c", "echo exec > exec.txt"]
COPY src /app/src
COPY --chmod=0755 app.py ./
COPY app.py .
LABEL stage=one org.example.v=1.2
EXPOSE 8080 53/udp 9000-9001
USER 1000:1000
ENTRYPOINT ["/bin/sh", "-c"]
CMD ["python3", "app.py"]
"""


@pytest.fixture
def ctx(tmp_path):
    d = tmp_path / "ctx"
    (d / "src" / "pkg").mkdir(parents=True)
    (d / "app.py").write_text("print('hi')\n")
    (d / "src" / "main.c").write_text("int main(){return 0;}\n")
    (d / "src" / "pkg" / "data.txt").write_text("data\n")
    return d


def builder(eng, ctx):
    return (RecipeBuilder("bb", str(ctx), build=eng.build)
            .env(GREETING="hello world", MODE="prod", LITERAL="$HOME").workdir("/app").workdir("sub")
            .run('echo "$GREETING" > greeting.txt').run(["/bin/sh", "-c", "echo exec > exec.txt"])
            .copy("src", "/app/src").copy("app.py", "./", chmod=0o755).copy("app.py", ".")
            .label({"stage": "one", "org.example.v": "1.2"}).expose(8080, "53/udp", "9000-9001").user("1000:1000")
            .entrypoint(["/bin/sh", "-c"]).cmd(["python3", "app.py"]))


def unlined(recipe):
    """The steps without their Dockerfile line numbers (the builder has none)."""
    return [dataclasses.replace(s, line=0) for st in recipe.stages for s in st.steps]


def test_builder_and_dockerfile_write_the_same_steps_and_build_the_same_id(eng, ctx):
    from_file = parse(DOCKERFILE, context=BuildContext(str(ctx)))
    from_code = builder(eng, ctx).recipe()
    assert [s.text for s in unlined(from_file)] == [s.text for s in unlined(from_code)]
    assert unlined(from_file) == unlined(from_code)          # sources, hashes, flags, changes: all equal
    a = eng.build(from_file, tag="from-file")
    b = eng.build(from_code, tag="from-code")
    assert a.image == b.image
    assert all(s.cached for s in b.steps)                     # the same keys: the second build ran nothing
    cfg = eng.image_config(a.image)
    assert cfg.cwd == "/app/sub" and cfg.user == "1000:1000" and dict(cfg.env)["MODE"] == "prod"
    assert dict(cfg.env)["LITERAL"] == "$HOME" and cfg.expose == ("53/udp", "8080/tcp", "9000/tcp", "9001/tcp")
    assert eng.read(a.image, "/app/sub/app.py") == b"print('hi')\n"           # COPY x . lands in the WORKDIR
    assert eng.read(a.image, "/app/sub/greeting.txt") == b"hello world\n"
