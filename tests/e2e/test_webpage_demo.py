"""The web page on the demo's own story (examples/demo.py, issue 19's end-to-end test): a Debian
checkpoint with a buggy calc.py, three candidate fixes forked from it, the passing one kept and
tagged demo/fixed. In headless Chromium against a real `sandtree serve`: open the checkpoint's
tree, click the winning branch, see its command and output, open its diff against the checkpoint
and see the changed line, browse to the file and read it.

Uses the session's Debian bookworm image (tests/conftest.py's `bookworm`; SANDTREE_TEST_BOOKWORM
points it at a store that has it), copied into this test's store as a bundle."""

from __future__ import annotations

import pytest
from browser import headless_chromium
from conftest import serve_process

import sandtree

FIXES = {"swap": "sed -i 's/a - b/b - a/' calc.py", "plus": "sed -i 's/a - b/a + b/' calc.py",
         "times": "sed -i 's/a - b/a * b/' calc.py"}


@pytest.fixture(scope="module")
def demo(bookworm, tmp_path_factory):
    src_home, image, _ = bookworm
    work = tmp_path_factory.mktemp("web-demo")
    src = sandtree.Sandtree(src_home)
    try:
        src.bundle(str(work / "base.bundle"), [src.image(image)])
    finally:
        src.close()
    st = sandtree.Sandtree(str(work / "home"))
    try:
        st.import_bundle(str(work / "base.bundle"))
        base = st.image(image)
        setup = base.run("mkdir -p /work && cd /work && printf 'def add(a, b):\\n    return a - b\\n' > calc.py "
                         "&& printf 'from calc import add\\nassert add(2, 3) == 5, add(2, 3)\\nprint(\"ok\")\\n' > test.py")
        checkpoint = setup.image.tag("demo/checkpoint")
        results = checkpoint.fork([f"cd /work && {c} && python3 test.py" for c in FIXES.values()], parallel=3)
        best = sandtree.best_of(results, score=lambda r: r.exit_code == 0)
        winner = best.image.tag("demo/fixed")
        ids = {"checkpoint": checkpoint.id, "winner": winner.id, "command": f"cd /work && {FIXES['plus']} && python3 test.py"}
    finally:
        st.close()
    with serve_process(work / "home") as url:
        yield {"url": url, **ids}


def test_the_demo_in_the_page(demo, tmp_path):
    url = demo["url"]
    with headless_chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 860})
        page.set_default_timeout(20_000)
        page.goto(f"{url}/#tree=demo/checkpoint")
        node = page.locator(f'#viewport .node[data-image="{demo["winner"]}"]')
        node.wait_for()
        assert "demo/fixed" in node.text_content()
        page.screenshot(path=str(tmp_path / "demo-tree.png"))
        node.click()
        page.wait_for_selector("#panel pre.command")
        assert page.inner_text("#panel pre.command") == demo["command"]
        assert page.inner_text("#panel pre.stdout").strip() == "ok"
        page.click("#panel button.diffparent")
        page.wait_for_selector("#panel .patch")
        assert page.inner_text("#panel .patch .del").strip() == "-    return a - b"
        assert page.inner_text("#panel .patch .add").strip() == "+    return a + b"
        page.goto(f"{url}/#tree=demo/checkpoint&node={demo['winner']}&files=/work")
        page.click("#panel a.entry:text-is('calc.py')")
        page.wait_for_selector("#panel pre.filetext")
        assert page.inner_text("#panel pre.filetext") == "def add(a, b):\n    return a + b\n"
