"""Headless chromium for the viewer's browser tests: where it is, its flags, playwright if installed."""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or "")
                 if p and Path(p).is_file()), None)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the test extra
    sync_playwright = None
