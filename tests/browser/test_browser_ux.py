"""The app as a new user meets it (issue 26), in headless Chromium (WebGPU on SwiftShader): no dead ends, honest
pictures, a layout that works on a laptop and a phone.

Each test sets up what it needs (its model, its conversation) on the module's page, so any one of them runs
alone and in any order; the phone layout, the screenshots and the browser without WebGPU have pages of their
own. The models are the tiny fixtures (tests/fixtures/demo.gguf, gemma4-moe-q8_0.gguf); replies are a token or
two. The screenshots (chat, model picker, settings, Fine-tune tab at 390x844, 1280x800 and 1600x1000) go to
test-artifacts/ux/.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from support.browser import (ARTIFACTS, CHROMIUM, FIXTURES, click_and_wait_reply, ensure_model, ensure_reply, greedy,
                             messages, ollama_folder, open_app, reload_model, send, set_field, type_field,
                             wait_loaded_file, wait_state, write_opfs_folder)

pytestmark = pytest.mark.browser

MOE = FIXTURES / "gemma4-moe-q8_0.gguf"
SHOTS = ARTIFACTS / "ux"


def box(page, selector: str) -> dict:
    return page.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                         " return {x: r.x, y: r.y, w: r.width, h: r.height, bottom: r.bottom, right: r.right}; })()")


LONG = "A reply long enough to wrap over several lines on a phone. " * 6


def broken_folder() -> dict[str, bytes]:
    """An Ollama folder: the demo model as gemma4:tiny, one entry whose blob is missing (a long digest in its
    reason) and one with a manifest that is not JSON."""
    demo = (FIXTURES / "demo.gguf").read_bytes()
    files = ollama_folder({"gemma4:tiny": [("model", demo)], "gemma4:missing": [("model", b"x" * 64)]})
    missing = "blobs/sha256-" + hashlib.sha256(b"x" * 64).hexdigest()
    del files[missing]
    files["manifests/registry.ollama.ai/library/broken/latest"] = b"{not json"
    return files


# ------------------------------------------------------------------ 1. every failure leaves a way to try again
def test_a_failed_load_leaves_a_way_to_try_again(page):
    """A model loaded, then GPU memory 1 MiB and Reload: the error says how much it needs, the card under it no
    longer says "Loaded", the header says it is not loaded, and Reload stays offered; GPU memory back to 2048:
    the stale error goes, the plan fits, and one click loads it again."""
    ensure_model(page)
    set_field(page, "gpu_memory", 1)
    page.click("#reload-model")
    page.wait_for_function("document.getElementById('model-error').textContent.includes('needs at least')")
    wait_state(page, "ready")
    info = page.inner_text("#model-info")
    assert "Loaded in" not in info and "Not loaded" in info, info
    assert page.inner_text("#model-status") == "not loaded" and page.is_disabled("#send")
    assert page.is_visible("#reload-model") and page.is_enabled("#reload-model")
    set_field(page, "gpu_memory", 2048)
    page.wait_for_function("document.getElementById('memory-plan').textContent.includes('of a 2.0 GiB budget')")
    assert page.inner_text("#model-error") == "" and "Not loaded" in page.inner_text("#model-info")
    assert page.is_visible("#reload-model") and page.inner_text("#reload-model") == "Reload the model"
    page.click("#reload-model")
    wait_loaded_file(page, "demo.gguf")
    assert page.inner_text("#model-status") == "loaded" and page.is_hidden("#reload-model")
    # a cancelled first load also leaves Load offered
    page.evaluate("window.app.loadModel(); window.app.call('cancel_load', window.app.state.loadId)")
    wait_state(page, "ready", "loaded")
    if not page.evaluate("window.app.state.loaded"):
        assert page.is_visible("#reload-model") and "cancelled" in page.inner_text("#model-info")
        page.click("#reload-model")
        wait_loaded_file(page, "demo.gguf")


# ------------------------------------------------------------------ 2. Model defaults: every field good again
def test_model_defaults_make_every_field_good(page):
    ensure_model(page)
    type_field(page, "temperature", "-1")
    assert page.is_disabled("#send")
    set_field(page, "context_length", 8192)
    assert "takes at most 4096 tokens" in page.inner_text("#context-note")
    page.click("#reset-settings")
    assert page.is_enabled("#send") and page.is_hidden("#temperature-problem")
    assert page.input_value("#context_length") == "4096" and page.is_hidden("#context-note")
    assert page.inner_text("#composer-hint") == ""


# ------------------------------------------------------------------ 4. nothing runs with a setting marked invalid
def test_regenerate_waits_for_valid_settings(page):
    ensure_reply(page)
    assert page.is_enabled("#regen")
    type_field(page, "temperature", "-1")
    assert page.is_disabled("#regen") and page.is_disabled("#send")
    hint = page.inner_text("#composer-hint")
    assert hint.startswith("Send waits: Temperature must be a number from 0 to 100") and "Show the setting" in hint
    count = len(messages(page))
    page.evaluate("document.getElementById('regen').click(); document.getElementById('composer').requestSubmit()")
    assert page.evaluate("window.app.state.streaming") is None and len(messages(page)) == count
    page.click("#reset-settings")
    assert page.is_enabled("#regen") and page.inner_text("#composer-hint") == ""
    # a negative GPU memory is refused beside its field and not used
    before = page.evaluate("window.app.state.gpuMemory")
    type_field(page, "gpu_memory", "-5")
    page.dispatch_event("#gpu_memory", "change")
    assert page.inner_text("#gpu_memory-problem").startswith("GPU memory (MiB) must be a number, 0 or more")
    assert page.get_attribute("#gpu_memory", "aria-invalid") == "true"
    assert page.evaluate("window.app.state.gpuMemory") == before
    set_field(page, "gpu_memory", before)
    assert page.is_hidden("#gpu_memory-problem")


# ------------------------------------------------------------------ 5. a CPU adapter named; the prompt's progress
def test_a_cpu_adapter_is_named_and_the_prompt_shows_progress(page):
    """SwiftShader is named as the CPU it is, in the header and a notice; before a reply's first token the
    page shows the prompt being read (its tokens, the seconds so far, the time left once a rate is known)."""
    ensure_model(page)
    assert "CPU, no GPU (SwiftShader)" in page.inner_text("#gpu")
    assert page.is_visible("#cpu-notice") and "WebGPU runs on the CPU" in page.inner_text("#cpu-notice")
    set_field(page, "temperature", 0)
    set_field(page, "max_tokens", 1)
    page.evaluate("""() => { window.__prefill = [];
        window.__obs = new MutationObserver(() => { const p = document.querySelector('.msg.streaming .prefill');
            if (p) window.__prefill.push([p.textContent, +p.dataset.tokens, window.app.state.streamedTokens]); });
        window.__obs.observe(document.getElementById('messages'), {subtree: true, childList: true,
                                                                   characterData: true}); }""")
    page.click("#new-chat")
    send(page, "Hello there")
    send(page, "And again")
    seen = page.evaluate("window.__obs.disconnect(), window.__prefill")
    assert seen and all(streamed == 0 for *_, streamed in seen), seen   # only before the first token
    assert all(t.startswith("Reading the prompt: ") and " s so far" in t for t, *_ in seen), seen
    counts = page.evaluate("window.app.state.chat.messages.filter((m) => m.stats).map((m) => m.stats.evaluated)")
    assert {n for _, n, _ in seen} == set(counts), (seen, counts)               # the tokens it then read
    assert any("s left" in t or "longer" in t for t, *_ in seen[-3:]), seen   # the second reply: an estimate
    assert page.query_selector(".prefill") is None                              # gone with the first token


def test_a_long_prompt_shows_the_tokens_read(page):
    """A prompt longer than one chunk (512 tokens): after its first chunk's GPU work the line says how many
    of its tokens are read, the bar stands there, and the time left comes from this prompt's own rate."""
    ensure_model(page)
    set_field(page, "temperature", 0)
    set_field(page, "max_tokens", 1)
    page.evaluate("""() => { window.__read = [];
        window.__obs = new MutationObserver(() => { const p = document.querySelector('.msg.streaming .prefill');
            if (p) window.__read.push([p.textContent, +p.dataset.done, +p.dataset.tokens,
                                       +p.querySelector('progress').value]); });
        window.__obs.observe(document.getElementById('messages'), {subtree: true, childList: true,
                                                                   characterData: true, attributes: true}); }""")
    page.click("#new-chat")
    send(page, " ".join(f"item {i}" for i in range(60)))     # 733 tokens of the demo model's tiny vocabulary
    seen = page.evaluate("window.__obs.disconnect(), window.__read")
    evaluated = page.evaluate("window.app.state.chat.messages.at(-1).stats.evaluated")
    assert evaluated > 512
    read = [(t, bar) for t, done, tokens, bar in seen if done == 512 and tokens == evaluated]
    assert read, seen
    text, bar = read[-1]
    assert f"512 of {evaluated} read" in text and " s left" in text, text
    assert bar == pytest.approx(512 / evaluated, abs=1e-6)


# ------------------------------------------------------------------ 8. screen readers; counts; the skip link
def test_screen_readers_hear_who_said_what_and_counts_read_right(page):
    reply = ensure_reply(page)
    if reply["stats"]["tokens"] != 1:                   # a one-token reply: "1 token", never "1 tokens"
        page.click("#new-chat")
        set_field(page, "max_tokens", 1)
        reply = send(page, "Hi")
    assert reply["stats"]["tokens"] == 1
    meta = page.inner_text(".msg.assistant >> nth=-1")
    assert "1 token ·" in meta and "1 tokens" not in meta
    authors = page.evaluate("[...document.querySelectorAll('#messages article.msg')].map((a) => "
                            "[a.classList.contains('user') ? 'user' : 'assistant', "
                            "document.getElementById(a.getAttribute('aria-labelledby')).textContent])")
    assert authors and all(name == ("You" if role == "user" else "Gemma") for role, name in authors), authors
    cdp = page.context.new_cdp_session(page)
    tree = cdp.send("Accessibility.getFullAXTree")["nodes"]
    named = {(n["role"]["value"], n.get("name", {}).get("value")) for n in tree if not n.get("ignored")}
    assert ("article", "You") in named and ("article", "Gemma") in named
    # one reply on the chart: "the last reply" (a reply of one token has no decode speed: one made here)
    page.click("#new-chat")
    page.evaluate("""() => { window.app.state.chat.messages.push({role: 'user', content: 'Hello'},
        {role: 'assistant', content: 'Hi.', stats: {tokens: 3, decode_tps: 3.5, prefill_s: 1, evaluated: 9,
                                                     stop_reason: 'stop', drafted: 0, accepted: 0}});
        window.app.renderChat(); }""")
    assert page.get_attribute("#speed-chart", "aria-label") == "Tokens per second of the last reply: 3.5"
    # four conversations: the message box is two key presses away
    page.evaluate("""() => { const s = window.app.state; const now = Date.now();
        while (s.chats.chats.filter((c) => c.messages.length).length < 4) {
            s.chats.chats.push({id: 'x' + Math.random(), created: now, updated: now - 1000, system: '',
                                thinking: false, messages: [{role: 'user', content: 'An older question'}]}); }
        window.app.renderChat(); }""")
    assert len(page.query_selector_all("#chat-list li")) >= 4
    page.evaluate("""() => { const start = document.createElement('span');   // as the page opens: focus at its top
        start.tabIndex = -1; document.body.prepend(start); start.focus(); start.remove(); }""")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "skip-link"
    link = box(page, "#skip-link")
    assert link["y"] >= 0 and link["h"] > 0                               # visible while focused
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "prompt"


# ------------------------------------------------------------------ smaller things
def test_smaller_things(page):
    """Copy says it copied (without the clipboard API too); an empty file is called empty; Edit last edits in
    place like Edit (Cancel keeps everything); the empty chat's words know a model is loaded; the router is
    not offered for a dense model; the Ollama folder's Reopen says what it reopens."""
    ensure_reply(page)
    assert "is loaded" not in page.inner_text("#messages")
    page.click("#new-chat")
    assert "is loaded: say hello" in page.inner_text("#messages .empty")
    page.click("#chat-list li:first-child .chat-open")
    assert page.query_selector(".msg.assistant .copy"), page.evaluate("window.app.state.chat")
    page.evaluate("Object.defineProperty(navigator, 'clipboard', {value: undefined, configurable: true})")
    page.click(".msg.assistant .copy >> nth=-1")
    page.wait_for_selector(".msg.assistant .copied")
    assert page.inner_text(".msg.assistant .copied") in ("Copied", "Could not copy: select the text and press Ctrl+C (⌘C)")
    before = messages(page)
    page.click("#edit")
    assert page.is_visible(".msg.editing textarea")
    page.click(".msg.editing .cancel-edit")
    assert messages(page) == before
    page.set_input_files("#file-input", {"name": "empty.gguf", "mimeType": "application/octet-stream", "buffer": b""})
    page.wait_for_function("document.getElementById('model-error').textContent.includes('is empty')")
    assert page.inner_text("#model-error").startswith("\u201cempty.gguf\u201d is empty (0 bytes)")
    page.click("#tab-finetune")
    page.wait_for_function("window.app.state.finetune.options !== null")
    assert page.is_hidden("#ft-target-list label:has(input[value='router'])")
    assert page.is_visible("#ft-target-list label:has(input[value='q'])")
    page.click("#tab-chat")


def test_a_conversation_longer_than_the_context_says_so(page):
    """A conversation kept while the model is loaded again with a smaller context: the meter says the
    conversation is more than the context holds (its text in the error colour, its bar in the meter's worst
    band: 75% full is its warning band, 95% its worst), and Send's refusal names the ways out,
    Context among them (the model takes more); the context back, the meter reads plainly again."""
    ensure_model(page, defaults=True)
    page.click("#new-chat")
    greedy(page, 2)
    send(page, "one two three four five six seven eight nine ten " * 4)
    set_field(page, "context_length", 32)
    reload_model(page)
    wait_state(page, "loaded")
    page.wait_for_function("document.getElementById('ctx-text').textContent.includes('more than the context holds')")
    assert page.evaluate("document.getElementById('ctx-text').classList.contains('over')")
    # the bar in its worst band (the browser draws it red), not a calm full bar
    assert page.evaluate("(m => m.value === 1 && m.value > m.high && m.optimum < m.low)(document.getElementById('ctx-meter'))")
    page.fill("#prompt", "And now?")
    click_and_wait_reply(page, "#send")
    error = page.inner_text("#chat-error")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "context-over.png"))
    assert "fills the context of 32" in error and "raise Context (this model takes up to 4,096 tokens)" in error, error
    set_field(page, "context_length", 4096)
    reload_model(page)
    wait_state(page, "loaded")
    page.wait_for_function("!document.getElementById('ctx-text').classList.contains('over')")
    assert "more than" not in page.inner_text("#ctx-text")
    assert page.evaluate("(m => m.value < m.low)(document.getElementById('ctx-meter'))")


# ------------------------------------------------------------------ screenshots, looked at by people
NICE = [("What is a GGUF file?", "A **GGUF** file holds a model's weights and what it needs to run them: its "
         "tokenizer, its chat template and its settings, in one file.\n\n- read in ranges, never whole\n"
         "- quantized weights stay quantized"),
        ("Write a haiku about rain on a window.", "Drops race down the glass,\nthe street blurs to grey and "
         "gold,\ntea cools in my hands."),
        ("How do I use an adapter in Ollama?", "Write a Modelfile with `FROM gemma4` and `ADAPTER ./adapter.gguf`, "
         "then run `ollama create mymodel -f Modelfile`.")]


def test_screenshots(page):
    """The chat, the model picker, the settings and the Fine-tune tab at 390x844, 1280x800 and 1600x1000
    (test-artifacts/ux/), with three conversations and an Ollama folder's model loaded. The page's GPU programs
    are compiled first (a reply): SwiftShader shares the GPU process with the page's drawing, which a resize
    would otherwise wait on for a minute."""
    ensure_reply(page)
    page.evaluate("""(nice) => { const s = window.app.state; const now = Date.now();
        nice.forEach(([q, a], i) => s.chats.chats.push({id: 'nice' + i + now, created: now - 3e5 + i, updated: now + i,
            system: '', thinking: false, messages: [{role: 'user', content: q}, {role: 'assistant', content: a,
            stats: {tokens: 40 + 7 * i, decode_tps: 2.8 + i / 3, prefill_s: 1.2, evaluated: 18 + i,
                    stop_reason: 'stop', drafted: 0, accepted: 0}}]}));
        window.app.renderChat(); }""", NICE)
    page.click("#chat-list li:first-child .chat-open")
    write_opfs_folder(page, "shots-models", broken_folder())
    page.click("#open-folder")
    page.click("#model-list li:has-text('gemma4:tiny') button")
    page.wait_for_function("window.app.state.loaded && window.app.state.model.name === 'gemma4:tiny'")
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        for w, h in [(1600, 1000), (1280, 800), (390, 844)]:
            page.set_viewport_size({"width": w, "height": h})
            narrow = w <= 760
            page.wait_for_selector("#settings", state="visible" if w > 1100 else "hidden")
            page.evaluate("document.getElementById('sidebar').scrollTop = 0")
            page.screenshot(path=str(SHOTS / f"chat-{w}x{h}.png"))
            assert page.evaluate("document.documentElement.scrollWidth") <= w
            page.click("#model-button")                 # the model picker (the menu, on a phone)
            page.screenshot(path=str(SHOTS / f"model-picker-{w}x{h}.png"))
            if narrow:
                page.keyboard.press("Escape")
            if not page.is_visible("#settings"):
                page.click("#settings-toggle")
            page.evaluate("document.getElementById('advanced').open = true")
            page.screenshot(path=str(SHOTS / f"settings-{w}x{h}.png"))
            page.evaluate("document.getElementById('advanced').open = false")
            if page.is_visible("#settings-close"):
                page.click("#settings-close")
            page.click("#tab-finetune")
            page.wait_for_function("window.app.state.finetune.options !== null")
            page.screenshot(path=str(SHOTS / f"finetune-{w}x{h}.png"))
            page.click("#tab-chat")
    finally:
        page.set_viewport_size({"width": 1280, "height": 860})
    assert not page.errors, page.errors


# ------------------------------------------------------------------ 3. the memory plan's picture tells the truth
def test_the_memory_plan_bar_of_a_mixture_of_experts_model(page):
    """A MoE model whose experts all fit: the bar shows them on the GPU (nothing left in the file), with a
    legend and sizes that are never "0.00 GiB"; the bar stays after loading. A budget that streams them shows
    the expert cache and what stays in the file."""
    ensure_model(page, MOE)
    legend = page.inner_text("#memory-plan .plan-legend")
    assert "experts (all 4 per layer) on the GPU" in legend and "left in the file" not in legend, legend
    assert "On the GPU now" in page.inner_text("#memory-plan") and "0.00 GiB" not in page.text_content("#memory-plan")
    assert page.evaluate("document.querySelectorAll('#memory-plan svg rect').length") == 3   # weights, experts, state
    whole = page.evaluate("window.app.call('memory_plan', 4096, 0)")
    assert whole["in_file"] == 0 and whole["experts"] > 0, whole
    # a budget for 2 of 4 experts at the model's usual step (1120: its images' tokens), too tight for the long one
    usual = page.evaluate("window.app.call('memory_plan', 4096, 0, '1120')")
    assert usual["state"] < whole["state"]         # no budget: the long step's activations
    type_field(page, "gpu_memory", f"{(usual['minimum'] + usual['expert_each'] // 2) / 2**20:.4f}")
    page.dispatch_event("#gpu_memory", "change")
    page.wait_for_function("document.getElementById('memory-plan').textContent.includes('After a reload')")
    legend = page.inner_text("#memory-plan .plan-legend")
    assert "expert cache on the GPU (2 of 4 per layer)" in legend and "left in the file, read as needed" in legend
    assert "0.00 GiB" not in page.text_content("#memory-plan")
    set_field(page, "gpu_memory", 2048)                          # as loaded: its plan again, no reload needed
    page.wait_for_function("document.getElementById('memory-plan').textContent.includes('On the GPU now')", timeout=20_000)
    assert page.is_hidden("#reload-model")


# ------------------------------------------------------------------ 6. without WebGPU: no model buttons to press
def test_without_webgpu_no_model_can_be_chosen(browser, server):
    other = browser.browser_type.launch(executable_path=str(CHROMIUM), headless=True,
                                        args=["--no-sandbox", "--disable-background-networking"])
    try:
        pg = open_app(other, server)
        assert pg.evaluate("document.body.dataset.state") == "no-webgpu"
        assert all(pg.is_disabled(f"#{b}") for b in ("demo", "open-file", "open-folder"))
        assert pg.is_visible("#needs-webgpu") and pg.inner_text("#model-status") == "needs WebGPU"
        pg.evaluate("""async () => {
            const blob = await (await fetch('models/demo.gguf')).blob();
            const dt = new DataTransfer();
            dt.items.add(new File([blob], 'demo.gguf'));
            window.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
        }""")
        pg.wait_for_function("document.getElementById('model-error').textContent.length > 0")
        err = pg.inner_text("#model-error")
        assert err.startswith("\u201cdemo.gguf\u201d cannot be opened here") and "no WebGPU" in err
        assert "Error:" not in err and pg.inner_text("#model-info") == "" and pg.inner_text("#memory-plan") == ""
        assert not pg.errors, pg.errors
    finally:
        other.close()


# ------------------------------------------------------------------ 7. a phone: the conversation owns the screen
def test_on_a_phone_the_conversation_owns_the_screen(page):
    """At 390x844 the conversation gets most of the screen and nothing covers it; the conversations and the model
    picker are a menu (the model button opens it), which lists an Ollama folder's models without overflowing
    (a long digest in a reason, a damaged manifest in plain words) and marks the one loaded, shown by its
    name:tag in the header; why the model takes no images is one line that Enter and Space open and close (a
    button there, plain text on a wide screen); the settings open as a panel and close again. (The module's page, its GPU programs
    compiled by a reply first: SwiftShader's drawing waits on them after a resize.)"""
    ensure_reply(page)
    page.evaluate("""(long) => { const s = window.app.state; const now = Date.now();
        s.chats.chats.push({id: 'phone' + now, created: now, updated: now + 5, system: '', thinking: false,
            messages: [{role: 'user', content: 'What is a GGUF file?'}, {role: 'assistant', content: long,
                        stats: {tokens: 57, decode_tps: 3.2, prefill_s: 1.5, evaluated: 20, stop_reason: 'stop',
                                drafted: 0, accepted: 0}}]});
        window.app.renderChat(); }""", LONG)
    page.click("#chat-list li:first-child .chat-open")
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        page.wait_for_selector("#settings", state="hidden")     # the media queries' change events came
        assert page.is_hidden("#sidebar") and page.is_hidden("#settings") and page.is_visible("#menu-toggle")
        write_opfs_folder(page, "phone-models", broken_folder())
        page.click("#model-button")
        assert page.is_visible("#sidebar") and page.get_attribute("#menu-toggle", "aria-expanded") == "true"
        page.click("#open-folder")
        page.wait_for_selector("#model-list li:has-text('gemma4:tiny') button.model")
        listing = page.inner_text("#model-list")
        assert "manifest (Ollama's list of the model's files) is damaged or unreadable" in listing and "Expecting" not in listing
        assert "model file is missing" in listing and "0.00 GiB" not in listing
        assert page.evaluate("(() => { const l = document.getElementById('model-list');"
                             " return l.scrollWidth <= l.clientWidth; })()"), "the list overflows sideways"
        page.click("#model-list li:has-text('gemma4:tiny') button")
        page.wait_for_function("window.app.state.loaded && window.app.state.model.name === 'gemma4:tiny'")
        assert page.inner_text("#model-name") == "gemma4:tiny"
        assert "loaded" in page.inner_text("#model-list li:has-text('gemma4:tiny')")
        assert page.get_attribute("#model-list li:has-text('gemma4:tiny') button", "aria-current") == "true"
        page.keyboard.press("Escape")
        assert page.is_hidden("#sidebar")
        # why this model takes no images: one line, a button a keyboard opens and closes
        assert page.get_attribute("#attach-why", "role") == "button"
        assert page.evaluate("document.getElementById('attach-why').tabIndex") == 0
        one_line = box(page, "#attach-why")["h"]
        page.focus("#attach-why")
        page.keyboard.press("Enter")
        assert page.get_attribute("#attach-why", "aria-expanded") == "true" and box(page, "#attach-why")["h"] > one_line
        page.keyboard.press(" ")
        assert page.get_attribute("#attach-why", "aria-expanded") == "false" and box(page, "#attach-why")["h"] == one_line
        # the conversation gets most of the screen; nothing covers the reply
        msgs, status, composer = box(page, "#messages"), box(page, ".chat-status"), box(page, "#composer")
        assert msgs["h"] >= 0.5 * 844, msgs
        assert msgs["bottom"] <= status["y"] + 1 and status["bottom"] <= composer["y"] + 1
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        # the settings open as a panel over the chat and close again
        page.click("#settings-toggle")
        assert page.is_visible("#settings") and page.is_visible("#settings-close")
        page.click("#settings-close")
        assert page.is_hidden("#settings")
    finally:
        page.set_viewport_size({"width": 1280, "height": 860})
    page.wait_for_selector("#settings", state="visible")       # wide again: all three columns
    assert page.is_visible("#sidebar")
    assert page.get_attribute("#attach-why", "role") is None and page.get_attribute("#attach-why", "tabindex") is None
    assert not page.errors, page.errors


# ------------------------------------------------------------------ a training file before any model
def test_a_training_file_dropped_before_a_model_waits_for_one(browser, server):
    pg = open_app(browser, server)
    try:
        pg.evaluate("""() => { const dt = new DataTransfer();
            dt.items.add(new File(['{"text": "one two three"}\\n{"text": "four five"}\\n'], 'notes.jsonl'));
            window.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true})); }""")
        pg.wait_for_function("document.getElementById('ft-data-info').textContent.includes('is kept')")
        assert "notes.jsonl is kept" in pg.inner_text("#ft-data-info") and pg.inner_text("#ft-data-error") == ""
        pg.evaluate("document.getElementById('demo').click()")
        pg.wait_for_function("window.app.state.loaded && window.app.state.finetune.data !== null")   # read now
        assert "notes.jsonl: " in pg.text_content("#ft-data-info") and "2" in pg.text_content("#ft-data-info")
        assert not pg.errors, pg.errors
    finally:
        pg.context.close()
