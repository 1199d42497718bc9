"""The sandbox helper's sources (sandtree-exec, runtime/helper/): one file per concern, one header.

Checked from the files themselves, as tests/test_architecture.py checks the Python layout: each
file opens with a comment naming itself and its concern; helper.h is the one header and declares
exactly what crosses files (everything else stays static in its file); the build compiles every .c
there and keys the binary by all of them, so a change to any one file builds a new helper; the
package data ships them (a wheel builds the helper too). Each checker has a self-test on a planted
copy in tmp_path, never on the real sources.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from sandtree.errors import RuntimeUnavailable
from sandtree.runtime import build

ROOT = Path(__file__).resolve().parents[2]
HELPER = Path(build.HELPER_DIR)
HEADER = "helper.h"


def sources(directory: Path) -> list[Path]:
    return [Path(p) for p in build.helper_sources(str(directory))]


def _code(text: str) -> str:
    """The text without comments and string literals (names in them are not uses)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def concern_offenders(directory: Path) -> list[str]:
    """Files that do not open with `/*` and ` * NAME: what it holds...` over two lines or more."""
    bad = []
    for p in sources(directory):
        text = p.read_text()
        m = re.match(r"/\*\n((?: \*[^\n]*\n)+?) \*/\n", text)
        lines = [l[3:] for l in m.group(1).splitlines()] if m else []
        first = lines[0] if lines else ""
        if not first.startswith(f"{p.name}: ") or len(first.split()) < 4 or len([l for l in lines if l]) < 2:
            bad.append(p.name)
    return bad


def header_offenders(directory: Path) -> list[str]:
    """One header, included by every .c and no other local include; every name defined outside a
    `static` in a .c is declared in it and used in another file (else it should be static), and
    every function it declares is defined in exactly one .c."""
    files = sources(directory)
    headers = [p.name for p in files if p.suffix == ".h"]
    bad = [f"headers: {headers}"] if headers != [HEADER] else []
    if bad:
        return bad
    header = _code((directory / HEADER).read_text())
    raw = {p.name: p.read_text() for p in files if p.suffix == ".c"}
    code = {name: _code(text) for name, text in raw.items()}
    defined: dict[str, list[str]] = {}
    for name, text in code.items():
        local = re.findall(r'^#include "([^"]+)"', raw[name], flags=re.M)
        if local != [HEADER]:
            bad.append(f"{name}: includes {local}")
        # top-level definitions (at column 0, not static): functions and variables
        for m in re.finditer(r"^(?:__attribute__\(\(\w+\)\) )?(?!static\b|extern\b|#|struct \w+ \{|typedef\b)"
                             r"[A-Za-z_][^;{(=\n]*?\b(\w+)\s*(?:\(|\[|=|;)",
                             text, flags=re.M):
            defined.setdefault(m.group(1), []).append(name)
    for sym, where in sorted(defined.items()):
        if sym == "main":
            continue
        if len(where) != 1:
            bad.append(f"{sym}: defined in {where}")
        if not re.search(rf"\b{sym}\b", header):
            bad.append(f"{sym} ({where[0]}): not static and not in {HEADER}")
        elif not any(re.search(rf"\b{sym}\b", t) for n, t in code.items() if n not in where):
            bad.append(f"{sym} ({where[0]}): used in no other file, so static")
    for m in re.finditer(r"^(?:__attribute__\(\(\w+\)\) )?[\w ]+?\**\b(\w+)\(", header, flags=re.M):
        if m.group(1) not in defined:
            bad.append(f"{m.group(1)}: declared in {HEADER}, defined in no .c")
    return bad


def packaged(rel: str) -> bool:
    """Whether pyproject's package data ships the file at src/sandtree/REL."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = conf["tool"]["setuptools"]["package-data"]["sandtree"]
    return any(fnmatch.fnmatch(rel, g) and rel.count("/") == g.count("/") for g in globs)


def test_each_helper_file_opens_with_its_concern():
    assert len(sources(HELPER)) > 2
    assert concern_offenders(HELPER) == []


def listed_files(directory: Path) -> list[str]:
    """The files helper.h's top comment lists (`  NAME.c  what it holds`), in its order."""
    return re.findall(r"^ \*   (\w+\.c) {2,}\S", (directory / HEADER).read_text(), flags=re.M)


def test_helper_h_lists_every_file_with_its_concern():
    assert sorted(listed_files(HELPER)) == sorted(p.name for p in sources(HELPER) if p.suffix == ".c")


def test_helper_h_is_the_one_header_and_declares_what_crosses_files():
    assert header_offenders(HELPER) == []


def test_the_helper_sources_are_package_data():
    for p in sources(HELPER):
        assert packaged(p.relative_to(ROOT / "src" / "sandtree").as_posix()), p.name


def test_the_helper_compiles_without_warnings(tmp_path):
    """The build's flags plus -Wextra -Werror (a split that lost a declaration warns)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    files = [str(p) for p in sources(HELPER) if p.suffix == ".c"]
    r = subprocess.run([cc, *build.HELPER_FLAGS[1], "-Wextra", "-Werror", "-o", str(tmp_path / "x"), *files],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_build_key_changes_with_every_helper_file(tmp_path):
    copy = tmp_path / "helper"
    shutil.copytree(HELPER, copy)
    files = sources(copy)
    assert [p.name for p in files] == [p.name for p in sources(HELPER)]
    before = build.source_tag([str(p) for p in files])
    assert before == build.source_tag(build.helper_sources(str(HELPER)))   # names and bytes, not paths
    for p in files:
        original = p.read_bytes()
        p.write_bytes(original + b"\n")
        assert build.source_tag(build.helper_sources(str(copy))) != before, p.name
        p.write_bytes(original)
    assert build.source_tag(build.helper_sources(str(copy))) == before
    (copy / "extra.c").write_text("/*\n * extra.c: planted.\n */\n")
    assert build.source_tag(build.helper_sources(str(copy))) != before
    (copy / "extra.c").unlink()
    # a line moved from the end of one file to the start of the next is another key
    a, b = files[0], files[1]
    ta, tb = a.read_bytes(), b.read_bytes()
    a.write_bytes(ta + b"int moved;\n")
    one = build.source_tag(build.helper_sources(str(copy)))
    a.write_bytes(ta)
    b.write_bytes(b"int moved;\n" + tb)
    assert build.source_tag(build.helper_sources(str(copy))) != one


def test_the_build_compiles_every_helper_file(tmp_path):
    """A copy builds into a helper that runs; a .c planted beside the others is compiled (its
    #error fails the build), so no file is left out of the binary."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    copy = tmp_path / "helper"
    shutil.copytree(HELPER, copy)
    path = build.helper_path(str(tmp_path / "cache"), directory=str(copy))
    assert Path(path).name == f"sandtree-exec-{build.source_tag(build.helper_sources(str(copy)))}"
    r = subprocess.run([path], capture_output=True, text=True)
    assert r.returncode == 125 and r.stderr.startswith("usage: sandtree-exec")
    (copy / "zz_planted.c").write_text('/*\n * zz_planted.c: planted.\n */\n#error "planted file compiled"\n')
    with pytest.raises(RuntimeUnavailable, match="planted file compiled"):
        build.helper_path(str(tmp_path / "cache"), directory=str(copy))


# -- self-tests: each checker finds what is planted on a copy --

def test_selftest_concern_comment(tmp_path):
    copy = tmp_path / "helper"
    shutil.copytree(HELPER, copy)
    assert concern_offenders(copy) == []
    mounts = copy / "mounts.c"
    text = mounts.read_text()
    mounts.write_text(text.replace("mounts.c: ", "options.c: ", 1))
    assert concern_offenders(copy) == ["mounts.c"]
    mounts.write_text(text.split("*/\n", 1)[1])              # no top comment at all
    assert concern_offenders(copy) == ["mounts.c"]
    mounts.write_text("/*\n * mounts.c: mounts.\n */\n" + text.split("*/\n", 1)[1])   # names nothing
    assert concern_offenders(copy) == ["mounts.c"]


def test_selftest_header(tmp_path):
    copy = tmp_path / "helper"
    shutil.copytree(HELPER, copy)
    assert header_offenders(copy) == []
    steps = copy / "steps.c"
    text = steps.read_text()
    steps.write_text(text + "\nint planted_global;\nvoid planted_fn(void) {}\n")
    got = header_offenders(copy)
    assert "planted_global (steps.c): not static and not in helper.h" in got
    assert "planted_fn (steps.c): not static and not in helper.h" in got
    steps.write_text(text.replace("void touch(const char", "static void touch(const char", 1))
    assert header_offenders(copy) == ["touch: declared in helper.h, defined in no .c"]
    steps.write_text(text)
    network = copy / "network.c"
    net = network.read_text()
    network.write_text(net + "\nvoid lone_fn(void) {}\n")
    h = (copy / HEADER).read_text()
    (copy / HEADER).write_text(h.replace("void loopback_up(void);", "void loopback_up(void);\nvoid lone_fn(void);"))
    assert header_offenders(copy) == ["lone_fn (network.c): used in no other file, so static"]
    network.write_text(net)
    (copy / HEADER).write_text(h)
    (copy / "other.h").write_text("/*\n * other.h: a second header, planted.\n */\n")
    assert header_offenders(copy) == ["headers: ['helper.h', 'other.h']"]


def test_selftest_listed_files(tmp_path):
    copy = tmp_path / "helper"
    shutil.copytree(HELPER, copy)
    (copy / "extra.c").write_text("/*\n * extra.c: planted, and not in helper.h's list.\n */\n")
    assert "extra.c" not in listed_files(copy) and "mounts.c" in listed_files(copy)


def test_selftest_package_data():
    assert packaged("runtime/helper/mounts.c")
    assert not packaged("runtime/helper/deeper/mounts.c")
    assert not packaged("runtime/elsewhere/mounts.c")
