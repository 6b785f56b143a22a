"""Fixtures of the viewer's browser tests: one chromium per module, a fresh page per test that
fails the test on any JavaScript error."""

from __future__ import annotations

import pytest

from tests.viewer._browser import ARGS, CHROMIUM, sync_playwright


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture()
def page(browser):
    pg = browser.new_page(viewport={"width": 1500, "height": 1000})
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    pg.close()
    assert not errors, errors
