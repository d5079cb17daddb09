"""The browser tests' fixtures: the built app served from dist/, a Chromium for each module, and the module's page
(booted once: Pyodide on SwiftShader is slow). Every test sets up on that page what it needs (support/browser.py's
ensure_model, fresh_chat, ...), so any test runs alone and in any order (--random-order); a test that needs a page
of its own (a browser profile of its own, never a model loaded) makes one with support.browser.open_app."""

import pytest

from support.browser import CHROMIUM, FLAGS, open_app, serve


@pytest.fixture(scope="session")
def server():
    with serve() as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(request, browser, server):
    """The module's page: the app booted with WebGPU in a context of its own (the module's VIEWPORT, else
    1280x860). pg.booted: the state it booted to."""
    pg = open_app(browser, server, getattr(request.module, "VIEWPORT", (1280, 860)))
    pg.booted = pg.evaluate("document.body.dataset.state")
    assert pg.booted == "ready", pg.inner_text("#webgpu-help")
    yield pg
    pg.context.close()


@pytest.fixture(autouse=True)
def page_stays_clean(request):
    """After each test on the module's page: no uncaught page error and no Content-Security-Policy violation (the
    document's or the worker's) came while it ran, whichever tests ran before it."""
    if "page" not in request.fixturenames:
        yield
        return
    pg = request.getfixturevalue("page")
    errors, violations = len(pg.errors), len(pg.csp_violations)
    yield
    assert pg.errors[errors:] == [] and pg.csp_violations[violations:] == [], (pg.errors, pg.csp_violations)
