"""The documentation's code blocks as a program: extracted from Markdown and run in order.

What the docs promise is what the tests run (tests/e2e/test_doc_examples.py): every ```sh and
```python block of README.md and docs/*.md, in the order a reader meets them, against a store that
holds the demo's image. Conventions (docs/README of the docs: the contents of tests/README.md):

- ```sh / ```bash / ```shell: bash, `set -eo pipefail`; variables a block assigns are kept for the
  next sh block of the same file (`A=$(sandtree run ...)` then `sandtree diff $A ...`).
- ```python / ```py: one interpreter per file, blocks executed in order in one namespace.
- anything else (```text, ```json, ```yaml, ```toml, ```dockerfile, no language): shown, never run;
  so is a block whose info string says `no-run` (```sh no-run: `make test` itself, a command for
  another machine), which is still highlighted as its language.
- a hidden preamble: an HTML comment `<!-- setup ... -->` right above a block (blank lines between
  allowed) holds shell commands run just before it, with the block's variables in scope.
"""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass

SHELL = ("sh", "bash", "shell")
PYTHON = ("python", "py", "python3")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>```+|~~~+)\s*(?P<info>[^`\n]*)$")
SETUP = re.compile(r"<!--\s*setup\s*\n(?P<body>.*?)-->\s*$", re.S)


@dataclass
class Block:
    path: str
    line: int          # the opening fence's line (1-based)
    lang: str          # the info string's first word, lower-cased ("" for none)
    code: str
    setup: str = ""    # a hidden preamble's shell commands
    no_run: bool = False

    @property
    def runs(self) -> bool:
        return not self.no_run and (self.lang in SHELL or self.lang in PYTHON)

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def blocks(path: str, text: str | None = None) -> list[Block]:
    """The fenced code blocks of a Markdown file, in order, each with the setup comment above it."""
    text = open(path).read() if text is None else text
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group("fence"), m.group("info").strip(), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        before = "\n".join(lines[:start]).rstrip()
        found = SETUP.search(before[-4000:]) if before.endswith("-->") else None
        code = textwrap.dedent("\n".join(body)) + "\n"
        words = info.replace("{", " ").replace("}", " ").replace(",", " ").split()
        out.append(Block(path, start + 1, (words or [""])[0].lower(), code,
                         textwrap.dedent(found.group("body")) if found else "", "no-run" in words[1:]))
    return out


def newcomer_cannot(root: str) -> str | None:
    """Why tests/e2e/test_newcomer.py (a fresh clone, `make demo`, the README tour) cannot run from checkout
    `root`; None when it can (then the README's blocks and the demo are its, not test_doc_examples.py's)."""
    import shutil
    if shutil.which("git") is None or shutil.which("make") is None:
        return "needs git and make"
    if not os.path.exists(os.path.join(root, ".git")):
        return "not a git checkout: nothing to clone"
    return None


# A Python driver: reads blocks as JSON lines, executes each in one namespace, answers one JSON line.
DRIVER = r"""
import json, sys, traceback
ns = {"__name__": "__main__"}
for line in sys.stdin:
    block = json.loads(line)
    try:
        exec(compile(block["code"], block["where"], "exec"), ns)
        answer = {"ok": True}
    except BaseException:
        answer = {"ok": False, "error": traceback.format_exc(limit=6)}
    sys.stdout.flush(); sys.stderr.flush()
    print("\x00" + json.dumps(answer), flush=True)
"""


class Failed(AssertionError):
    pass


class Reader:
    """Runs one file's blocks in order in `cwd` with `env`: bash per sh block (its variables kept in a
    state file), one Python interpreter for the file's python blocks."""

    def __init__(self, cwd: str, env: dict, timeout: float = 600, python: str = sys.executable):
        # every process the blocks start carries this mark, so close() ends what they left running
        # (a `sandtree serve &` of a REST example) and nothing else
        self.mark = uuid.uuid4().hex
        self.cwd, self.env, self.timeout = cwd, {**env, "SANDTREE_DOC_EXAMPLES": self.mark}, timeout
        self.state = os.path.join(cwd, ".doc-shell-state")
        open(self.state, "w").close()
        self.py = None
        self.interpreter = python              # the python blocks' (a newcomer's venv: test_newcomer.py)

    def shell(self, code: str, where: str) -> str:
        # `set -a`: what a block assigns is exported, so `export -p` keeps it (and its cwd) for the next
        script = (f"source {self.state}\nset -a -eo pipefail\n{code}\n"
                  f"export -p > {self.state}.new; echo \"cd $(printf %q \"$PWD\")\" >> {self.state}.new; "
                  f"mv {self.state}.new {self.state}\n")
        # output to files, not pipes: a server a block leaves in the background keeps its ends open
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            p = subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.env, stdout=out, stderr=err,
                               stdin=subprocess.DEVNULL, timeout=self.timeout)
            out.seek(0), err.seek(0)
            stdout, stderr = out.read(), err.read()
        if p.returncode != 0:
            raise Failed(f"{where}: exit {p.returncode}\n--- block\n{code}--- stdout\n{stdout[-3000:]}"
                         f"--- stderr\n{stderr[-3000:]}")
        return stdout

    def python(self, code: str, where: str) -> None:
        if self.py is None:
            self.py = subprocess.Popen([self.interpreter, "-u", "-c", DRIVER], cwd=self.cwd, env=self.env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.py.stdin.write(json.dumps({"code": code, "where": where}) + "\n")
        self.py.stdin.flush()
        shown = []
        for line in self.py.stdout:
            if line.startswith("\x00"):
                answer = json.loads(line[1:])
                if not answer["ok"]:
                    raise Failed(f"{where}:\n--- block\n{code}--- printed\n{''.join(shown)[-2000:]}"
                                 f"--- error\n{answer['error']}")
                return
            shown.append(line)
        raise Failed(f"{where}: the Python interpreter ended ({self.py.wait()})\n{''.join(shown)[-2000:]}")

    def run(self, block: Block) -> None:
        if not block.runs:
            return
        if block.setup:
            self.shell(block.setup, f"{block.where()} (its setup)")
        if block.lang in SHELL:
            self.shell(block.code, block.where())
        elif block.lang in PYTHON:
            self.python(block.code, block.where())

    def left_running(self) -> list[int]:
        needle = f"SANDTREE_DOC_EXAMPLES={self.mark}".encode()
        out = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        out.append(int(pid))
            except OSError:
                pass
        return out

    def close(self) -> None:
        # the python blocks' interpreter first, by the end of its input: it exits as a reader's would, its
        # engines' exit handlers stopping what they started ahead (a SIGTERM left those to their lifetimes)
        if self.py is not None:
            self.py.stdin.close()
            try:
                self.py.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.py.kill()
                self.py.wait()
        for pid in self.left_running():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
