"""The browser tests' fixtures: the built app served from dist/, one Chromium for the session, and one page that
every module's tests use (booted once: Pyodide on SwiftShader is slow, and a new page's worker compiles every GPU
program a model needs again, about 30 s a model on SwiftShader, where a page that compiled them keeps them). Every
test sets up on that page what it needs (support/browser.py's ensure_model, fresh_chat, ...), so any test runs
alone and in any order (--random-order); each module finds the page as the `page` fixture leaves it (idle, on the
Chat tab, at the module's VIEWPORT, a loaded model's settings those it opened with). A test that needs a page of
its own (a browser profile of its own, never a model loaded) makes one with support.browser.open_app; the tests
that throw away what a page's worker compiled (a reload, a lost GPU device) use `own_page`."""

import pytest

from support.audio import wav
from support.browser import CHROMIUM, FLAGS, open_app, serve, wait_idle


@pytest.fixture(scope="session")
def server():
    with serve() as url:
        yield url


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """Chromium with WebGPU, and a fake microphone that plays a 2 s chirp at 48 kHz over and over (what
    test_browser_audio records; no other test asks for a microphone)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    mic = tmp_path_factory.mktemp("mic") / "chirp.wav"
    mic.write_bytes(wav(48_000, 2.0))
    args = [*FLAGS, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={mic}"]
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=args, headless=True)
        yield b
        b.close()


def booted_app(browser, server, viewport=(1280, 860)):
    """The app booted with WebGPU in a context of its own (the microphone allowed). pg.booted: the state it
    booted to."""
    pg = open_app(browser, server, viewport, permissions=["microphone"])
    pg.booted = pg.evaluate("document.body.dataset.state")
    assert pg.booted == "ready", pg.inner_text("#webgpu-help")
    return pg


@pytest.fixture(scope="session")
def session_page(browser, server):
    pg = booted_app(browser, server)
    yield pg
    pg.context.close()


@pytest.fixture(scope="module")
def page(request, session_page):
    """The module's page: the session's page as a module before may have left it, brought to what a new page
    shows (a module's tests set up what they need from that): idle, at the module's VIEWPORT (else 1280x860), on
    the Chat tab, a new conversation with nothing attached and nothing typed, no error line, and, where a model
    is loaded, its settings those it opened with (Model defaults). So a module before leaves no conversation for
    this one's replies to answer after, nor a setting (Speculative drafts, say) they would run with."""
    pg = session_page
    wait_idle(pg)
    w, h = getattr(request.module, "VIEWPORT", (1280, 860))
    if pg.viewport_size != {"width": w, "height": h}:
        pg.set_viewport_size({"width": w, "height": h})
    if pg.get_attribute("#tab-chat", "aria-selected") != "true":
        pg.click("#tab-chat")
    for remove in ("#attachments .remove-image", "#audio-attachments .remove-clip"):
        while pg.query_selector(remove):
            pg.click(remove)
    pg.fill("#prompt", "")
    # no error line a module before left (a refused file, clip or image says so until something replaces it)
    pg.evaluate("document.querySelectorAll('.error[role=alert]').forEach((e) => { e.textContent = ''; })")
    pg.click("#new-chat")
    assert pg.evaluate("window.app.state.chat.messages.length") == 0
    if pg.evaluate("window.app.state.loaded"):
        pg.click("#reset-settings")
    return pg


@pytest.fixture(scope="module")
def own_page(request, browser, server):
    """A page of the module's own, booted like the session's, for the tests that throw away what its worker
    compiled: a reload (a new worker) or a lost GPU device (a new device). On the session's page, every test after
    them would compile its models' GPU programs again."""
    pg = booted_app(browser, server, getattr(request.module, "VIEWPORT", (1280, 860)))
    yield pg
    pg.context.close()


@pytest.fixture(autouse=True)
def page_stays_clean(request):
    """After each test on the module's page (or its own_page): no uncaught page error and no Content-Security-Policy
    violation (the document's or the worker's) came while it ran, whichever tests ran before it."""
    pages = [request.getfixturevalue(name) for name in ("page", "own_page") if name in request.fixturenames]
    before = [(len(pg.errors), len(pg.csp_violations)) for pg in pages]
    yield
    for pg, (errors, violations) in zip(pages, before):
        assert pg.errors[errors:] == [] and pg.csp_violations[violations:] == [], (pg.errors, pg.csp_violations)
