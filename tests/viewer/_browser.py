"""Headless chromium for the viewer's browser tests: where it is, its flags, playwright if installed,
and how long a step may take."""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or "")
                 if p and Path(p).is_file()), None)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]
#: the deadline of every wait of a page (a navigation, a selector, a readiness signal): a step takes
#: about a second on an idle machine; 120 s holds on a loaded 2-core one (Playwright's own 30 s did not)
DEADLINE_MS = 120_000

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the test extra
    sync_playwright = None


def new_page(browser):
    """A page of ``browser`` (1500 x 1000 viewport) whose every wait has :data:`DEADLINE_MS`."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.set_default_timeout(DEADLINE_MS)
    return page
