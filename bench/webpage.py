"""The web page's tree view at scale (issue 19): a 1,001-run lineage (every inner image branches
three ways, so all of it is drawn) and a 10,000-image one (a first page of 1,000, the rest behind
`+`), served by a real `sandtree serve` on loopback and opened in headless Chromium (Debian's,
through Playwright). Rows: time to first paint as the page measures it (request, layout, drawing,
two animation frames), the same from navigation as the browser sees it, and an expand click.

    PYTHONPATH=src .venv/bin/python bench/webpage.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

import workdir                     # bench/workdir.py: removes the work dir only if nothing is mounted under it

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import make_rootfs, serve_process  # noqa: E402

import sandtree  # noqa: E402
from sandtree import ImageConfig  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _ternary(make, root: str, n: int) -> list[str]:
    ids = [root]
    for i in range(n):
        ids.append(make(ids[i // 3], i))
    return ids


def _lineages(home: str, rootfs: str, big: int) -> None:
    st = sandtree.Sandtree(home)
    e = st.engine
    try:
        base = st.import_image(rootfs).id
        top = e.run(base, "echo top > /top").image
        _ternary(lambda p, i: e.run(p, f"echo {i} > /n; exit {1 if i % 7 == 3 else 0}").image, top, 1000)
        e.tag(top, "thousand")
        root = e.configure(base, ImageConfig(env={"ROOT": "1"}), tag="big")
        _ternary(lambda p, i: e.configure(p, ImageConfig(env={"N": str(i)})), root, big - 1)
    finally:
        st.close()


def web_table(work: str, rounds: int = 5, big: int = 10000) -> Table:
    table = Table(title=f"web page: tree view in headless Chromium ({rounds} rounds, median)")
    for c in ("what", "in the page ms", "from navigation ms"):
        table.add_column(c)
    try:
        from playwright.sync_api import sync_playwright        # the test extra's: skipped without it
    except ImportError:
        table.add_row("skipped: Playwright for Python is not installed (pyproject's test extra)", "", "")
        return table
    if not os.path.exists(CHROMIUM):
        table.add_row("skipped: Debian's chromium is not installed (scripts/install-deps)", "", "")
        return table
    home = os.path.join(work, "web-home")
    _lineages(home, make_rootfs(os.path.join(work, "web-rootfs")), big)
    with serve_process(home) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            for ref, label in (("thousand", "first paint, 1,001-run tree (all drawn)"),
                               ("big", f"first paint, {big:,}-image lineage (first 1,000)")):
                inner, outer = [], []
                for _ in range(rounds):
                    ctx = browser.new_context(viewport={"width": 1400, "height": 860})
                    page = ctx.new_page()
                    t = time.monotonic()
                    page.goto(f"{url}/#tree={ref}")
                    page.wait_for_selector("#tree[data-paint-ms]", state="attached", timeout=60_000)
                    outer.append((time.monotonic() - t) * 1000)
                    inner.append(int(page.get_attribute("#tree", "data-paint-ms")))
                    if ref == "big" and len(inner) == rounds:
                        image = page.locator("#viewport .node:has(.more)").last.get_attribute("data-image")
                        page.goto(f"{url}/#tree={ref}&node={image}")
                        t = time.monotonic()
                        page.locator(f'#viewport .node.sel[data-image="{image}"] .more').click()
                        page.wait_for_selector("#tree[data-expand-ms]", state="attached", timeout=60_000)
                        expand = (int(page.get_attribute("#tree", "data-expand-ms")), (time.monotonic() - t) * 1000)
                    ctx.close()
                table.add_row(label, f"{statistics.median(inner):.0f}", f"{statistics.median(outer):.0f}")
            table.add_row("expand click (+): the next 1,000 images", f"{expand[0]:.0f}", f"{expand[1]:.0f}")
        finally:
            browser.close()
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--big", type=int, default=10000, help="images in the big lineage")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="sandtree-webbench-")
    try:
        Console(width=120).print(web_table(work, args.rounds, args.big))
        print("Target (issue 19): first paint of a 1,000-node tree <= 1 s.")
    finally:
        workdir.remove_unless_mounted(work)


if __name__ == "__main__":
    main()
