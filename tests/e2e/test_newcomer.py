"""A newcomer's first hour, as written: a fresh clone of the repository (its HEAD commit), `make demo` in it with
a store of its own ($SANDTREE_HOME), then the README tour's blocks, in order, with the clone's `sandtree` and
Python.

Two steps are given rather than downloaded, and the test says which:
- the Python packages: `make demo`'s venv step installs them from PyPI, and a test reaches a package registry only
  through a sandbox's egress path. The clone's venv gets the declared dependencies (pyproject's
  [project.dependencies] and what they require, nothing of the test extras) from the test's own environment, and
  sandtree from the clone's src, as `pip install -e .` would; so a demo or tour that needs an undeclared package
  fails here as it would for a newcomer. Make's venv stamp is then up to date, and `make demo` runs the rest:
  `scripts/install-deps demo` and examples/demo.py.
- the Debian base image: a fresh store's first `make demo` bootstraps it (debootstrap, a minute and a half); the
  test session already has one (conftest `bookworm`, made by the same bootstrap call), exported and imported into
  the newcomer's store under the demo's tag, so the demo and the tour find it as they do on a second run."""

import glob
import importlib.metadata as md
import os
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

import sandtree
from docexamples import Reader, blocks, newcomer_cannot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def declared_closure(pyproject: str) -> list[md.Distribution]:
    """The installed distributions of [project.dependencies] and, transitively, what they require (no extras)."""
    with open(pyproject, "rb") as f:
        todo = [Requirement(r) for r in tomllib.load(f)["project"]["dependencies"]]
    env, seen = {**default_environment(), "extra": ""}, {}
    while todo:
        req = todo.pop()
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        if key in seen or (req.marker is not None and not req.marker.evaluate(env)):
            continue
        seen[key] = dist = md.distribution(req.name)
        todo += [Requirement(r) for r in dist.requires or []]
    return list(seen.values())


def only_these(dists: list[md.Distribution], into: str) -> None:
    """A directory holding (as symlinks) only these distributions' top-level files: what a venv's site-packages
    would after installing them."""
    os.makedirs(into)
    for dist in dists:
        site = str(dist.locate_file(""))
        for top in {str(f).split("/")[0] for f in dist.files or () if not str(f).startswith("..")}:
            if not os.path.lexists(os.path.join(into, top)) and os.path.exists(os.path.join(site, top)):
                os.symlink(os.path.join(site, top), os.path.join(into, top))


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    why = newcomer_cannot(ROOT)
    if why:
        pytest.skip(why)
    top = tmp_path_factory.mktemp("newcomer")
    repo = str(top / "sandtree")
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", ROOT, repo], check=True, timeout=120)
    # the venv `make demo` would make: the declared packages, sandtree from the clone's src, its console script
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", os.path.join(repo, ".venv")], check=True, timeout=120)
    site = glob.glob(os.path.join(repo, ".venv", "lib", "python3*", "site-packages"))[0]
    only_these(declared_closure(os.path.join(repo, "pyproject.toml")), str(top / "declared"))
    with open(os.path.join(site, "newcomer.pth"), "w") as f:
        f.write(f"{os.path.join(repo, 'src')}\n{top / 'declared'}\n")
    script = os.path.join(repo, ".venv", "bin", "sandtree")
    with open(script, "w") as f:                       # as pip writes a [project.scripts] entry
        f.write(f"#!{os.path.join(repo, '.venv', 'bin', 'python')}\nimport sys\nfrom sandtree.cli import main\n"
                "sys.exit(main())\n")
    os.chmod(script, 0o755)
    for stamp in (".installed-core",):                 # the venv step is done
        open(os.path.join(repo, ".venv", stamp), "w").close()
    return top, repo


def test_fresh_clone_make_demo_then_the_readme_tour(clone, bookworm):
    top, repo = clone
    home = str(top / "home")
    src, image, _ = bookworm
    tar = str(top / "bookworm.tar")
    st = sandtree.Sandtree(src, warm=0)
    try:
        st.image(image).export(tar)
    finally:
        st.close()
    venv_bin = os.path.join(repo, ".venv", "bin")
    env = {**os.environ, "SANDTREE_HOME": home, "PATH": venv_bin + ":" + os.environ.get("PATH", "/usr/bin:/bin")}
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    subprocess.run(["sandtree", "image", "import", tar, "--tag", "debian:bookworm-python", "-q"], env=env,
                   check=True, capture_output=True, timeout=600)
    os.unlink(tar)

    p = subprocess.run(["make", "demo"], cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "already built" in p.stdout and "ok" in p.stdout, p.stdout[-3000:]
    # the clone's sandtree ran, not this checkout's
    probe = subprocess.run([os.path.join(venv_bin, "python"), "-c", "import sandtree; print(sandtree.__file__)"],
                           env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.startswith(os.path.join(repo, "src")), probe.stdout

    tour = [b for b in blocks(os.path.join(repo, "README.md")) if b.runs]
    assert tour, "the README has no tour to run"
    work = top / "work"
    work.mkdir()
    reader = Reader(str(work), env, python=os.path.join(venv_bin, "python"))
    try:
        for block in tour:
            reader.run(block)
    finally:
        reader.close()
