"""Fixtures of the viewer's browser tests: one chromium per module, a fresh page per test that
fails the test on any JavaScript error (its waits have ``_browser.DEADLINE_MS``), and ``served``:
the viewer over the module's ``run`` fixture (its root first), in a thread."""

from __future__ import annotations

import pytest

from tests.viewer._browser import ARGS, CHROMIUM, new_page, sync_playwright


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
    pg = new_page(browser)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    pg.close()
    assert not errors, errors


@pytest.fixture(scope="module")
def served(run):
    from vagent.viewer.data import open_source
    from vagent.viewer.server import serve_in_thread

    server, url = serve_in_thread(open_source(run[0]), port=0)
    yield url
    server.shutdown()
    server.server_close()
