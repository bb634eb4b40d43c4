"""Headless Chromium for the console's end-to-end tests and benchmarks, driven by Playwright.

Debian's ``chromium`` package is used as it is (``playwright install`` is never run: it
downloads a browser of its own). ``BOLT_REQUIRE_BROWSER=1`` (set by CI) turns a missing browser
from a skip into a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, Page, sync_playwright

ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
)
VIEWPORT = {"width": 1440, "height": 900}
TOKEN_KEY = "bolt.token"


def chromium() -> str | None:
    """The Chromium executable, or None when it is not installed."""
    return shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None
    )


def required() -> bool:
    return os.environ.get("BOLT_REQUIRE_BROWSER") == "1"


@contextmanager
def browser() -> Iterator[Browser]:
    """A headless Chromium, closed on exit (``RuntimeError`` when none is installed)."""
    path = chromium()
    if path is None:
        raise RuntimeError("no chromium. To fix: apt-get install -y chromium")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=list(ARGS))
        try:
            yield b
        finally:
            b.close()


def signed_in_page(b: Browser, token: str) -> Page:
    """A new page whose console finds ``token`` already stored (no login form)."""
    page = b.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
    page.add_init_script(f"window.sessionStorage.setItem({TOKEN_KEY!r}, {token!r});")
    return page
