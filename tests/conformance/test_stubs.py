"""The type stubs (src/sandtree/**/*.pyi, written by scripts/stubs.py) are the API as it runs: the SDK's methods
are made from the operation table's rows, so a static tool sees them only through the stubs. A row's new
parameter, or a new method, makes them stale: this says so (and how to rewrite them). And mypy, as a user's IDE
runs it, reads the stubs: the types a call returns, and a misspelled option as an error."""

from __future__ import annotations

import difflib
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SRC = os.path.join(ROOT, "src")


def _stubs():
    spec = importlib.util.spec_from_file_location("stubs", os.path.join(ROOT, "scripts", "stubs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_stubs_are_the_api_as_it_runs():
    stale, diffs = [], []
    for rel, text in _stubs().stubs().items():
        path = os.path.join(SRC, rel)
        old = open(path).read() if os.path.exists(path) else ""
        if old != text:
            stale.append(rel)
            diffs += difflib.unified_diff(old.splitlines(True), text.splitlines(True), rel, "as it runs", n=0)
    assert not stale, (f"stale type stubs {stale}: rewrite them with `PYTHONPATH=src .venv/bin/python scripts/stubs.py`\n"
                       + "".join(diffs[:40]))


def test_a_stale_stub_is_seen(monkeypatch):
    # planted drift: a row's method gains a parameter; the stub written from the classes differs from the file
    from sandtree.client import objects
    import inspect
    sig = inspect.signature(objects.Image.run)
    planted = sig.replace(parameters=[*sig.parameters.values(),
                                      inspect.Parameter("planted", inspect.Parameter.KEYWORD_ONLY, default=None)])
    monkeypatch.setattr(objects.Image.run, "__signature__", planted)
    text = _stubs().stubs()["sandtree/client/objects.pyi"]
    assert "planted" in text and text != open(os.path.join(SRC, "sandtree/client/objects.pyi")).read()


USER = '''
import sandtree

with sandtree.Sandtree() as st:
    img = st.image("debian:bookworm")
    r = img.run("echo hi", timeout=5)
    reveal_type(r)
    reveal_type(img.start(memory="1G").exec("ls"))
    img.run("echo", timout=5)


async def main() -> None:
    async with sandtree.AsyncSandtree() as ast:
        reveal_type(await (await ast.image("x")).run("echo"))
'''


def test_mypy_reads_the_rows_signatures(tmp_path):
    (tmp_path / "user.py").write_text(USER)
    p = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent",
                        "--cache-dir", str(tmp_path / "cache"), "user.py"],
                       cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "MYPYPATH": SRC}, timeout=600)
    out = p.stdout
    assert 'Revealed type is "sandtree.client.objects.RunResult"' in out, out
    assert 'Revealed type is "sandtree.client.aio.AsyncRunResult"' in out, out
    assert 'Unexpected keyword argument "timout" for "run" of "Image"; did you mean "timeout"?' in out, out
    assert out.count("error:") == 1, out                 # nothing else in the stubs is wrong for mypy
