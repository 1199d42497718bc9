"""The documentation runner itself (tests/docexamples.py), on planted Markdown: a runner that ran
nothing, or let a failing block pass, would make test_doc_examples a test that cannot fail."""

import os
import sys

import pytest

from docexamples import Failed, Reader, blocks

DOC = '''# A page

```sh
A=$(echo made)
mkdir -p sub && cd sub
```

Some text.

<!-- setup
echo "$A" > from-setup.txt
-->

```python
import os
print("python sees", os.getcwd())
x = 41
```

```text
sandtree run IMAGE -- this is a synopsis, never run
```

```py
x += 1
assert x == 42
```

```sh no-run
exit 1
```

```bash
test "$A" = made                         # kept from the first block
test "$(basename "$PWD")" = sub          # and its cwd
cat from-setup.txt
```
'''


def reader(tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + ":" + os.environ.get("PATH", "")}
    return Reader(str(tmp_path), env, timeout=60)


def test_blocks_are_found_with_their_language_line_and_setup(tmp_path):
    found = blocks("page.md", DOC)
    assert [(b.lang, b.line, b.runs) for b in found] == [("sh", 3, True), ("python", 14, True),
                                                         ("text", 20, False), ("py", 24, True), ("sh", 29, False),
                                                         ("bash", 33, True)]
    assert found[1].setup.strip() == 'echo "$A" > from-setup.txt'
    assert not found[0].setup and not found[3].setup


def test_blocks_run_in_order_with_state_kept(tmp_path):
    r = reader(tmp_path)
    try:
        for b in blocks("page.md", DOC):
            r.run(b)
    finally:
        r.close()
    assert (tmp_path / "sub" / "from-setup.txt").read_text() == "made\n"   # the setup ran where the block had cd-ed


@pytest.mark.parametrize("bad, expect", [
    ("```sh\nfalse\necho never\n```\n", "page.md:1: exit 1"),
    ("```sh\nfalse | cat\n```\n", "page.md:1: exit 1"),                     # pipefail
    ("```python\nx = 1\n```\n\n```python\nassert x == 2, 'x is 1'\n```\n", "page.md:5:"),
    ("<!-- setup\nexit 3\n-->\n```sh\ntrue\n```\n", "page.md:4 (its setup): exit 3"),
])
def test_a_failing_block_fails_with_its_place(tmp_path, bad, expect):
    r = reader(tmp_path)
    try:
        with pytest.raises(Failed) as e:
            for b in blocks("page.md", bad):
                r.run(b)
    finally:
        r.close()
    assert str(e.value).startswith(expect), str(e.value)


def test_what_blocks_leave_running_is_ended_and_only_that(tmp_path):
    r = reader(tmp_path)
    try:
        r.run(blocks("page.md", "```sh\nsleep 300 &\necho $! > pid\n```\n")[0])
        pid = int((tmp_path / "pid").read_text())
        assert r.left_running() == [pid]
    finally:
        r.close()
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z":
            break
        import time
        time.sleep(0.05)
    else:
        raise AssertionError("the block's background sleep outlived the reader")
