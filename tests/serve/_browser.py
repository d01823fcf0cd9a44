"""The browser tests' Chromium (Debian's package through playwright; never ``playwright install``)
and the UI login they all start with."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def need_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (scripts/test.sh installs it)")


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium for a module's tests (closed at the end)."""
    need_chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def login(
    browser: Any, url: str, key: str, *, width: int = 1280, path: str = "/ui/datasets"
) -> Any:
    """A new page logged in with ``key`` through the login form (``path`` shows it first)."""
    page = browser.new_context(viewport={"width": width, "height": 900}).new_page()
    page.set_default_timeout(15_000)
    page.goto(url + path)
    page.fill("#key", key)
    page.click("form[action='/ui/login'] button[type=submit]")
    page.wait_for_selector("nav[aria-label=Main]")
    return page


def expect(target: Any) -> Any:
    """Playwright's ``expect`` (imported when a browser test runs: playwright is an extra): waits
    for a condition on a page or locator instead of sleeping."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(target)
