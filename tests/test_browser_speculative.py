"""Speculative decoding on the browser path: headless Chromium (WebGPU on SwiftShader), Pyodide, the built app.

The app has no setting for it yet; the worker's `generate_tokens` command takes any SamplingParams field,
`speculate` included, and runs Engine.generate_async: the same step generator as natively, driven by
awaited readbacks. A fixture model opened through the file input generates greedily with and without
speculation: the same tokens, and those of the native engine. (Whether drafts were accepted is checked
natively, tests/test_speculative.py: the command returns only the tokens.)
"""

from __future__ import annotations

import json

import pytest

from test_browser import (CHROMIUM, FIXTURES, FLAGS, TIMEOUT, _under_csp, server,  # noqa: F401
                          wait_loaded_file, wait_state)
from test_speculative import RANDOM, REPEATING

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page(server):  # noqa: F811
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        pg = _under_csp(browser.new_context(viewport={"width": 1280, "height": 860}).new_page())
        pg.set_default_timeout(TIMEOUT)
        pg.errors = []
        pg.on("pageerror", lambda e: pg.errors.append(str(e)))
        pg.goto(server + "/index.html")
        wait_state(pg, "ready", "no-webgpu")
        assert pg.evaluate("document.body.dataset.state") == "ready", pg.inner_text("#webgpu-help")
        yield pg
        browser.close()


def _generate(page, tokens, **params) -> dict:
    return page.evaluate("([t, p]) => window.app.call('generate_tokens', t, p)",
                         [json.dumps(tokens), json.dumps({"temperature": 0, **params})])


@pytest.mark.parametrize("stem,prompt", [("gemma4-dense-q4_k", REPEATING), ("gemma4-moe-q8_0", RANDOM)],
                         ids=["dense-q4_k", "moe-q8_0"])
def test_speculative_greedy_tokens_in_the_browser(page, stem, prompt):
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    path = FIXTURES / f"{stem}.gguf"
    page.set_input_files("#file-input", str(path))
    wait_loaded_file(page, path.name)
    plain = _generate(page, prompt, max_tokens=12)
    spec = _generate(page, prompt, max_tokens=12, speculate=5)
    assert "error" not in spec, spec
    native = Engine.open(read_gguf(path), backend="native", context_length=128)
    want = native.generate(prompt, SamplingParams(temperature=0, max_tokens=12), stop_ids=()).tokens
    assert spec["tokens"] == plain["tokens"] == want and spec["stop_reason"] == "length"
    assert not page.errors
