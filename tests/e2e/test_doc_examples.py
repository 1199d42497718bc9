"""Every runnable code block of README.md and docs/*.md runs as written (tests/docexamples.py has
the conventions: ```sh and ```python run in order per file, ```text and config blocks are shown
only, `<!-- setup ... -->` above a block is its hidden preamble).

The store is the test session's Debian bookworm store (conftest `bookworm`) with the demo's tag,
`debian:bookworm-python`, on its image: what a reader has after `make demo`. Each file runs in a
directory of its own, as root (the CI's user: the tour's live sandboxes and networks need it). From a git
checkout the README's blocks and the demo run in test_newcomer.py instead (a fresh clone, `make demo`, the
tour as written), not twice."""

import glob
import os
import subprocess
import sys

import pytest

import sandtree
from docexamples import Reader, blocks, newcomer_cannot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = [os.path.relpath(p, ROOT) for p in [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]]


@pytest.fixture(scope="module")
def demo_home(bookworm):
    home, image, _ = bookworm
    st = sandtree.Sandtree(home, warm=0)
    try:
        st.image(image).tag("debian:bookworm-python")
    finally:
        st.close()
    return home


def test_the_docs_have_examples_to_run():
    runnable = [b for d in DOCS for b in blocks(os.path.join(ROOT, d)) if b.runs]
    assert len(runnable) >= 10, [b.where() for b in runnable]


@pytest.mark.parametrize("doc", DOCS)
def test_every_example_runs_as_written(doc, demo_home, tmp_path):
    found = [b for b in blocks(doc, open(os.path.join(ROOT, doc)).read()) if b.runs]
    if not found:
        pytest.skip(f"{doc} has no runnable block")
    if doc == "README.md" and not newcomer_cannot(ROOT):
        pytest.skip("the README's tour runs in test_newcomer.py (a fresh clone after `make demo`)")
    env = {**os.environ, "SANDTREE_HOME": demo_home,
           "PATH": os.path.dirname(sys.executable) + ":" + os.environ.get("PATH", "/usr/bin:/bin")}
    reader = Reader(str(tmp_path), env)
    try:
        for block in found:
            reader.run(block)
    finally:
        reader.close()


def test_the_demo_runs_on_a_store_that_has_its_base_image(demo_home, tmp_path):
    """`make demo`'s program (examples/demo.py) as a newcomer runs it, after its base image is built:
    branching, fork, rollback, lineage and a live sandbox, end to end. (From a git checkout: test_newcomer.py,
    through `make demo` in a fresh clone.)"""
    if not newcomer_cannot(ROOT):
        pytest.skip("the demo runs in test_newcomer.py (`make demo` in a fresh clone)")
    env = {**os.environ, "SANDTREE_HOME": demo_home}
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo.py")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "already built" in p.stdout and "ok" in p.stdout, p.stdout
