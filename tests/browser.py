"""A real headless browser for the web page's tests: Debian's `chromium` (scripts/install-deps)
driven by Playwright for Python through `executable_path` (Playwright's own browser download is
not reachable here, and never used). Skips, saying why, where either is missing.

    with headless_chromium() as browser:
        page = browser.new_page()
        page.goto(url)

Chromium runs as root here, so it needs `--no-sandbox` (its own sandbox refuses root); it only
ever loads pages from the test's own server on loopback. Closing the browser ends every process
it started; Playwright's driver ends with the `sync_playwright` block.
"""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@contextlib.contextmanager
def headless_chromium():
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (scripts/install-deps installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed "
                                   "(pyproject's test extra)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield browser
        finally:
            browser.close()
