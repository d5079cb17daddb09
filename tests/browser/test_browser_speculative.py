"""Speculative decoding on the browser path: headless Chromium (WebGPU on SwiftShader), Pyodide, the built app.

The worker's `generate_tokens` command takes any SamplingParams field, `speculate` included, and runs
Engine.generate_async: the same step generator as natively, driven by awaited readbacks. A fixture model
opened through the file input generates greedily with speculation: the native engine's greedy tokens (those
the page generates without it: test_browser.py's golden tests). The app's setting (Advanced sampling,
"Speculative drafts") goes with each chat request; the reply equals the native greedy one and its stats line
counts the drafts accepted.
"""

from __future__ import annotations

import json

import pytest

from support.browser import (FIXTURES, SCREENSHOTS, ensure_model, fresh_chat, native_greedy, send, set_field,
                             reload_model, wait_loaded_file, wait_state)

REPEATING = [2, 40, 41, 42, 43, 44, 45] * 3                   # a repetitive prompt (as tests/test_speculative.py's)
RANDOM = [2, 17, 500, 33, 499, 4, 5, 6, 7, 8, 9, 10, 11, 300, 301, 302, 12, 13, 14, 15]

pytestmark = pytest.mark.browser


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
    spec = _generate(page, prompt, max_tokens=12, speculate=5)
    assert "error" not in spec, spec
    native = Engine.open(read_gguf(path), backend="native", context_length=128)
    want = native.generate(prompt, SamplingParams(temperature=0, max_tokens=12), stop_ids=()).tokens
    # (the page's plain greedy tokens are the native ones: test_browser.py's golden tests, on these files)
    assert spec["tokens"] == want and spec["stop_reason"] == "length"
    assert not page.errors


def test_speculative_drafts_setting_in_the_chat(page):
    """The Advanced sampling field: kept with the settings, sent with the chat; the reply is the native
    greedy one, and its stats say how many drafts were accepted (a prompt that repeats: some are)."""
    ensure_model(page)
    fresh_chat(page, max_tokens=12)             # the one message native_greedy gets, nothing before it
    page.evaluate("document.getElementById('advanced').open = false")
    page.click("#advanced summary")
    assert page.is_visible("#speculate") and page.is_visible("#speculate-help")
    set_field(page, "speculate", 8)
    assert page.evaluate("window.app.state.settings.speculate") == "8"
    text = "one two three four five, one two three four five, one two three four five, one two three"
    reply = send(page, text)
    # (natively, 12 tokens draft 15 and accept 8 of them: "<channel|><channel|>" then "</code>" repeated)
    assert reply["content"] == native_greedy([{"role": "user", "content": text}], 12)
    stats = reply["stats"]
    assert stats["drafted"] > 0 and 0 <= stats["accepted"] <= stats["drafted"]
    meta = page.inner_text(".msg.assistant .meta")
    assert f"{stats['accepted']} of {stats['drafted']} drafts accepted" in meta
    set_field(page, "speculate", 99)                                 # beyond pyapp.sampling's rule: refused
    assert page.evaluate("window.app.state.settings.speculate") == "8"
    page.click("#advanced summary")
    assert not page.errors


def test_a_drafter_beside_the_model(page):
    """The Drafter box (sidebar): a file that is no drafter refused in a sentence; the tiny assistant drafter of
    tests/fixtures/assistant/ loaded on the GPU beside its model in the worker, Speculative drafts turned on at
    its 4, the greedy tokens the native engine's (it drafted, its drafts checked); removed again."""
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    path, drafter = FIXTURES / "gemma4-dense-f32.gguf", FIXTURES / "assistant" / "gemma4-assistant-f32.gguf"
    page.set_input_files("#file-input", str(path))
    wait_loaded_file(page, path.name)
    page.evaluate("document.getElementById('advanced').open = true")      # where Speculative drafts is
    set_field(page, "speculate", 0)
    assert page.is_visible("#open-drafter") and page.is_hidden("#remove-drafter")
    page.set_input_files("#drafter-input", str(FIXTURES / "demo.gguf"))            # a model, not a drafter
    page.wait_for_function("document.getElementById('drafter-error').textContent.length > 0")
    assert "is not an assistant drafter" in page.inner_text("#drafter-error")
    assert page.is_hidden("#remove-drafter")
    page.set_input_files("#drafter-input", str(drafter))
    page.wait_for_function("window.app.state.drafter.info && window.app.state.drafter.info.loaded")
    assert page.inner_text("#drafter-error") == ""
    assert f"Greedy replies draft with \u201c{drafter.name}\u201d" in page.inner_text("#drafter-info")
    assert page.input_value("#speculate") == "4" and page.evaluate("window.app.state.settings.speculate") == "4"
    page.locator("#drafter-box").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "drafter-added.png"))
    got = _generate(page, RANDOM, max_tokens=10, speculate=4)
    native = Engine.open(read_gguf(path), backend="native", context_length=128)
    want = native.generate(RANDOM, SamplingParams(temperature=0, max_tokens=10), stop_ids=()).tokens
    assert got["tokens"] == want and got["drafted"] > 0, got
    page.click("#remove-drafter")
    page.wait_for_function("!window.app.state.drafter.info")
    assert page.inner_text("#drafter-info") == "" and page.is_hidden("#remove-drafter")
    assert not page.errors


def test_a_drafter_the_gpu_memory_setting_has_no_room_for_waits_for_the_next_load(page):
    """A model loaded under a GPU memory setting its plan fills: a drafter added is refused on the GPU in words
    (what it needs, what the plan left, what to do) but stays added ("drafts once the model is loaded"); the plan
    shown counts it (a green part of the bar); with the setting raised, Reload loads both and it drafts."""
    path, drafter = FIXTURES / "gemma4-dense-f32.gguf", FIXTURES / "assistant" / "gemma4-assistant-f32.gguf"
    page.set_input_files("#file-input", str(path))
    wait_loaded_file(page, path.name)
    set_field(page, "context_length", 256)
    alone = page.evaluate("window.app.call('memory_plan', 256, 0)")
    set_field(page, "gpu_memory", f"{(alone['total'] + (64 << 10)) / 2**20:.4f}")    # 64 KiB to spare
    reload_model(page)
    wait_state(page, "loaded")
    page.set_input_files("#drafter-input", str(drafter))
    page.wait_for_function("document.getElementById('drafter-error').textContent.length > 0")
    error = page.inner_text("#drafter-error")
    assert "The assistant drafter needs 1." in error and "It stays added and loads with the model" in error, error
    assert "drafts once the model is loaded" in page.inner_text("#drafter-info")
    assert page.is_visible("#remove-drafter") and not page.evaluate("window.app.state.drafter.info.loaded")
    both = page.evaluate("window.app.call('memory_plan', 256, 0)")
    assert both["drafter"] > 0 and both["total"] == alone["total"] + both["drafter"], both
    set_field(page, "gpu_memory", f"{(both['total'] + (64 << 10)) / 2**20:.4f}")
    page.wait_for_function("document.querySelector('#memory-plan svg rect.drafter') !== null")
    page.locator("#drafter-box").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "drafter-waits-for-the-load.png"))
    reload_model(page)
    wait_state(page, "loaded")
    page.wait_for_function("window.app.state.drafter.info && window.app.state.drafter.info.loaded")
    assert "Greedy replies draft with" in page.inner_text("#drafter-info")
    page.click("#remove-drafter")
    page.wait_for_function("!window.app.state.drafter.info")
    for field, value in (("gpu_memory", 0), ("context_length", 4096)):      # as the tests after expect
        set_field(page, field, value)
    assert not page.errors
