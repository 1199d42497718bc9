"""The web page with big lineages (issue 19): a generated 1,000-image tree of real runs draws all
at once, and a 10,000-image one loads a first page and expands lazily; both measured in a real
headless Chromium against a real `sandtree serve` (times printed: `pytest -s` shows them).

The lineages are made in-process first (the engine, then closed), then served: runs for the
1,000 (each changes a file, some fail), image configurations (an engine operation that runs
nothing: 1.3 ms each here, against 6 ms for a run) for the 10,000."""

from __future__ import annotations

import subprocess
import time

import pytest
from browser import headless_chromium
from conftest import serve_process

import sandtree
from sandtree import ImageConfig

FIRST_PAINT_BUDGET_S = 1.0     # the issue's: the tree view of a 1,000-node tree paints within a second


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as b:
        yield b


def ternary(make, root: str, n: int) -> list[str]:
    """n images under root, image i a child of image (i-1)//3: every inner node branches."""
    ids = [root]
    for i in range(n):
        ids.append(make(ids[i // 3], i))
    return ids


@pytest.fixture(scope="module")
def memory_disk(tmp_path_factory):
    """A tmpfs for the store: what this file measures is the page, and 11,000 commits each synced to a
    shared disk (the store's durability) took minutes of CI time when other work shared the disk."""
    home = tmp_path_factory.mktemp("web-scale")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4g,mode=0700", "sandtree-test-web-scale", str(home)],
                   check=True)
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=True)


@pytest.fixture(scope="module")
def big(memory_disk, rootfs):
    home = memory_disk
    st = sandtree.Sandtree(str(home))
    e = st.engine
    try:
        base = st.import_image(rootfs, tag="base").id
        t = time.monotonic()
        top = e.run(base, "echo top > /top").image
        runs = ternary(lambda parent, i: e.run(parent, f"echo {i} > /n; exit {1 if i % 7 == 3 else 0}").image, top, 1000)
        made_runs = time.monotonic() - t
        e.tag(runs[0], "thousand")
        cfg_root = e.configure(base, ImageConfig(env={"ROOT": "1"}), tag="tenthousand")
        t = time.monotonic()
        configs = ternary(lambda parent, i: e.configure(parent, ImageConfig(env={"N": str(i)})), cfg_root, 9999)
        made_configs = time.monotonic() - t
    finally:
        st.close()
    print(f"\nmade 1,000 runs in {made_runs:.1f} s, 9,999 configured images in {made_configs:.1f} s")
    assert len(set(runs)) == 1001 and len(set(configs)) == 10000
    with serve_process(home) as url:
        yield {"url": url, "runs": runs, "configs": configs}


def paint(browser, url: str, fragment: str, size=(1400, 860)) -> tuple[object, object, float, int]:
    ctx = browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    t = time.monotonic()
    page.goto(f"{url}/#{fragment}")
    page.wait_for_selector("#tree[data-paint-ms]", state="attached")
    wall = time.monotonic() - t
    return ctx, page, wall, int(page.get_attribute("#tree", "data-paint-ms"))


def test_thousand_node_tree_first_paint(big, browser, tmp_path):
    ctx, page, wall, in_page = paint(browser, big["url"], "tree=thousand")
    try:
        drawn = page.locator("#viewport .node[data-image]").count()
        fails = page.locator("#viewport path.edge.fail").count()
        fetch = page.get_attribute("#tree", "data-fetch-ms")
        print(f"\n1,001-image tree: first paint {in_page} ms in the page ({fetch} ms of it the lineage request), "
              f"{wall * 1000:.0f} ms from navigation; {drawn} nodes drawn, {fails} failing edges")
        assert drawn == 1001                      # every inner node branches: nothing to collapse
        assert fails == sum(1 for i in range(1000) if i % 7 == 3)
        # (the 1 s target is bench/webpage.py's, measured and printed there, never asserted here:
        # other tests share this machine's 2 cores)
        print(f"(target {FIRST_PAINT_BUDGET_S} s: bench/webpage.py)")
        page.screenshot(path=str(tmp_path / "thousand.png"))
        t = time.monotonic()                     # still interactive: a click selects and opens a node
        deep = big["runs"][-1]
        page.goto(f"{big['url']}/#tree=thousand&node={deep}")
        page.wait_for_selector(f'#viewport .node.sel[data-image="{deep}"]', state="attached")
        page.wait_for_selector("#panel pre.command")
        print(f"selecting a node of it and opening its page: {(time.monotonic() - t) * 1000:.0f} ms")
    finally:
        ctx.close()


def test_ten_thousand_node_lineage_loads_a_page_and_expands(big, browser):
    ctx, page, wall, in_page = paint(browser, big["url"], "tree=tenthousand")
    try:
        drawn = page.locator("#viewport .node[data-image]").count()
        more = page.locator("#viewport .more").count()
        print(f"\n10,000-image tree: first page ({drawn} drawn, {more} to expand) painted in {in_page} ms "
              f"in the page, {wall * 1000:.0f} ms from navigation")
        assert 900 <= drawn <= 1100 and more > 0
        image = page.locator("#viewport .node:has(.more)").last.get_attribute("data-image")
        page.goto(f"{big['url']}/#tree=tenthousand&node={image}")        # selected: brought into view
        target = page.locator(f'#viewport .node.sel[data-image="{image}"] .more')
        t = time.monotonic()
        target.click()
        page.wait_for_selector(f'#viewport .node[data-image="{image}"]:not(:has(.more))', state="attached")
        page.wait_for_selector("#tree[data-expand-ms]", state="attached")
        after = page.locator("#viewport .node[data-image]").count()
        print(f"expand click: {page.get_attribute('#tree', 'data-expand-ms')} ms in the page, "
              f"{(time.monotonic() - t) * 1000:.0f} ms observed; {after} nodes drawn now")
        assert after > drawn
    finally:
        ctx.close()
