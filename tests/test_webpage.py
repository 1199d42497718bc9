"""The web page (issue 19) end to end: a real `sandtree serve` on a free loopback port (a
subprocess, as a user starts it) and a real headless Chromium (tests/browser.py) clicking through it."""

from __future__ import annotations

import pytest
from browser import headless_chromium
from conftest import serve_process


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as b:
        yield b


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def test_browser_reaches_a_real_server(tmp_path, page):
    """The fixtures themselves: the browser talks to `sandtree serve` on loopback."""
    with serve_process(tmp_path / "home") as url:
        answer = page.goto(url + "/api/v1/health")
        assert answer.status == 200 and '"ok"' in page.inner_text("body").replace(" ", "")
