"""DiffusionGemma in the app, end to end in headless Chromium (WebGPU on SwiftShader), like test_browser.py.

The tiny DiffusionGemma (tests/fixtures/diffusion-tiny-hf, converted by tools/convert_diffusion_gemma.py with the
Gemma 4 tokenizer cut to its 512 ids) is opened through the file input (by each test that finds another model
loaded: each test sets up what it needs, so any runs alone and in any order): it loads with its own
sampler settings (the GGUF's defaults, checked like every setting); one decoder step's logits in the page match
transformers' (tests/fixtures/diffusion-tiny.golden.npz: step 0, self-conditioned, a prompt past the window, after
a committed block); a generation with transformers' random draws injected reproduces its every decision
(tests/fixtures/diffusion-tiny.generate.npz, as tests/test_diffusion_generate.py replays it); a reply is shown
denoising step by step and committed block by block, the same text as the native engine's for the seed; Stop ends
a reply between steps; the undamped tiny model (issue 25), opened after it, matches transformers on a self-
conditioned step. A screenshot of a reply being denoised goes to test-artifacts/.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from support.browser import ARTIFACTS, FIXTURES, ensure_model, messages, set_field, wait_loaded_file, wait_state
from support.paths import VOCAB, load_tool

pytestmark = pytest.mark.browser

HF = FIXTURES / "diffusion-tiny-hf"
GOLDEN = np.load(FIXTURES / "diffusion-tiny.golden.npz")
TRACE = np.load(FIXTURES / "diffusion-tiny.generate.npz")
NAME = "diffusion-tiny.gguf"


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    if not VOCAB.exists():
        pytest.skip(f"{VOCAB} missing: run `python3 build.py setup`")
    path = tmp_path_factory.mktemp("diffusion-browser") / NAME
    load_tool("convert_diffusion_gemma").convert(HF, path, "f32", vocab=VOCAB, log=lambda _msg: None)
    return path


def ensure_tiny(page, gguf_path, defaults=False) -> None:
    """The tiny DiffusionGemma loaded on the module's page (a test before may have opened the undamped one);
    defaults: its settings the GGUF's again and a conversation of its own."""
    ensure_model(page, gguf_path, defaults=defaults)
    if defaults:
        page.click("#new-chat")


def call(page, cmd: str, *args):
    return page.evaluate("([c, a]) => window.app.call(c, ...a)", [cmd, list(args)])


def test_loads_with_its_own_sampler_settings(page, gguf_path):
    """A DiffusionGemma file loads like any model; the settings show its denoising sampler with the GGUF's
    defaults (tools/make_diffusion_fixture.py's generation config), not the next-token sampler's fields; a bad
    value is named beside its field in plain words; a temperature range the wrong way round is refused."""
    page.set_input_files("#file-input", str(gguf_path))     # opened now, whatever the page held before
    wait_loaded_file(page, NAME)
    info = page.inner_text("#model-info")
    assert "DiffusionGemma (text diffusion): 4 layers (SGSG)" in info and "canvas 16" in info and "Loaded in" in info
    assert page.is_visible("#denoise-settings") and page.is_hidden("#temperature")
    values = {k: page.input_value(f"#{k}") for k in ("denoise_steps", "denoise_t_min", "denoise_t_max",
                                                      "denoise_entropy_bound", "max_tokens")}
    assert values == {"denoise_steps": "12", "denoise_t_min": "0.3", "denoise_t_max": "0.9",
                      "denoise_entropy_bound": "0.25", "max_tokens": "32"}
    page.fill("#denoise_t_max", "0")
    page.dispatch_event("#denoise_t_max", "input")
    assert page.inner_text("#denoise_t_max-problem") == ("Highest temperature must be a number above 0 and at most "
                                                         "100 (the first step's).")
    assert page.get_attribute("#denoise_t_max", "aria-invalid") == "true" and page.is_disabled("#send")
    page.fill("#denoise_steps", "2.5")
    page.dispatch_event("#denoise_steps", "input")
    assert page.inner_text("#denoise_steps-problem").startswith("Max steps must be an integer from 1 to 65536")
    set_field(page, "denoise_t_max", "0.9")
    set_field(page, "denoise_steps", "12")
    assert page.is_hidden("#denoise_t_max-problem") and page.is_hidden("#denoise_steps-problem")
    assert page.is_enabled("#send")
    set_field(page, "denoise_t_min", "0.95")                # each field good, the range the wrong way round
    page.fill("#prompt", "Hello")
    page.click("#send")
    page.wait_for_function("document.getElementById('chat-error').textContent.length > 0")
    wait_state(page, "loaded")
    assert page.inner_text("#chat-error") == "The lowest temperature (0.95) must not be above the highest (0.9)"
    assert messages(page)[-1] == {"role": "user", "content": "Hello"}     # kept, unanswered
    page.click("#reset-settings")                            # Model defaults: the GGUF's again
    assert page.input_value("#denoise_t_min") == "0.3" and page.input_value("#denoise_steps") == "12"
    page.click("#new-chat")


def page_logits(page, i, golden=GOLDEN):
    prev, block = golden[f"prev_{i}"], golden[f"block_{i}"]
    r = call(page, "diffusion_logits", json.dumps(golden[f"prompt_{i}"].tolist()),
             json.dumps(golden[f"canvas_{i}"].tolist()), json.dumps(prev.tolist() if len(prev) else None),
             json.dumps([block.tolist()] if len(block) else []))
    assert "error" not in r, r
    got, want = np.array(r["rows"], dtype=np.float32), golden[f"logits_{i}"]
    assert got.shape == want.shape == (16, 512)
    return got, want


@pytest.mark.parametrize("i", range(4))
def test_decoder_step_logits_match_transformers(page, gguf_path, i):
    """One denoising step's [canvas, vocab] logits on the page's GPU: step 0, self-conditioned on given previous
    logits, a prompt longer than the sliding window, after a committed block: argmax equal everywhere and within
    issue 12's 1e-3 (SwiftShader's built-in sin/cos once put RoPE, and so these, 3e-2 off: shaders/sincos.wgsl)."""
    ensure_tiny(page, gguf_path)
    got, want = page_logits(page, i)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert np.abs(got - want).max() <= 1e-3


def replay(page, i) -> dict:
    """transformers' generate for trace i, its random draws replayed in the page."""
    s = json.loads(str(TRACE[f"settings_{i}"]))
    s["eos_ids"] = s.pop("eos_token_id", [1, 106, 50])                  # as tests/test_diffusion_generate.py
    if "max_denoising_steps" in s:
        s["steps"] = s.pop("max_denoising_steps")
    draws = {"init": TRACE[f"init_{i}"].tolist(), "sample": TRACE[f"sample_{i}"].tolist(),
             "renoise": TRACE[f"renoise_{i}"].tolist()}
    r = call(page, "denoise_tokens", json.dumps(TRACE[f"prompt_{i}"].tolist()), json.dumps(s), json.dumps(draws))
    assert "error" not in r, r
    return r


@pytest.mark.parametrize("i", [1, 2])
def test_generation_with_injected_draws_matches_transformers(page, gguf_path, i):
    """Every step's acceptance mask and argmax draft, each block's stop step, the committed tokens (pad after the
    eos in trace 2, which stops at it), tokens per forward: token for token."""
    ensure_tiny(page, gguf_path)
    r = replay(page, i)
    assert r["steps"] == TRACE[f"steps_{i}"].tolist()
    if i == 2:
        assert r["stop_reason"] == "stop"
    np.testing.assert_array_equal(np.array(r["accepted"], dtype=bool), TRACE[f"accepted_{i}"])
    np.testing.assert_array_equal(np.array(r["argmax"]), TRACE[f"argmax_{i}"])
    assert TRACE[f"prompt_{i}"].tolist() + r["tokens"] == TRACE[f"sequences_{i}"].tolist()
    assert r["tokens_per_forward"] == pytest.approx(float(TRACE[f"tpf_{i}"]), rel=1e-6)


def test_a_reply_is_shown_denoising_then_committed(page, gguf_path):
    """Each step's draft of the block replaces the last (accepted positions underlined, hidden from screen
    readers), the figures move (steps, tokens/s, tokens per forward pass), each committed block is appended and
    announced; the reply's text is its committed ids'."""
    ensure_tiny(page, gguf_path, defaults=True)
    page.evaluate("document.getElementById('advanced').open = false")
    page.click("#advanced summary")                         # the seed sits under Advanced sampling
    set_field(page, "seed", 5)
    page.click("#advanced summary")
    set_field(page, "max_tokens", 32)
    # at most 4 steps a block (the GGUF's 12 would run every one: random weights never settle, about 2.5 s a step on
    # SwiftShader): still several drafts a block, each replacing the last, and two blocks committed
    set_field(page, "denoise_steps", 4)
    # what the streaming reply shows, as the page changes it (a poll could miss a short reply whole)
    page.evaluate("""() => { window.__drafts = []; window.__stats = []; const seen = window.__drafts;
        new MutationObserver(() => { const d = document.querySelector('.msg.streaming .draft');
            if (d && d.children.length) seen.push([+d.dataset.block, +d.dataset.step, d.children.length,
                d.querySelectorAll('.accepted').length, d.getAttribute('aria-hidden')]);
            const st = document.querySelector('.msg.streaming .denoise-stats');
            if (st && st.textContent !== window.__stats.at(-1)) window.__stats.push(st.textContent); })
          .observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true}); }""")
    page.evaluate("window.app.state.denoise = null")
    page.fill("#prompt", "Write a poem about rain.")
    page.click("#send")
    page.wait_for_function("window.app.state.denoise && window.app.state.denoise.steps >= 2")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "diffusion-denoising.png"))      # mid-reply, unless it has ended
    wait_state(page, "loaded")
    stats = page.evaluate("window.__stats")
    assert any(s.startswith("Block 1, step ") and "tokens per forward pass" in s and "tok/s" in s for s in stats), stats
    drafts = page.evaluate("window.__drafts")
    assert drafts and all(n == 16 and hidden == "true" for _b, _s, n, _a, hidden in drafts)
    assert {b for b, *_ in drafts} == {0, 1}                           # two blocks of 16 for 32 tokens
    assert any(a > 0 for *_, a, _h in drafts)                          # accepted positions were marked
    reply = messages(page)[-1]
    d = reply["stats"]["denoise"]
    assert d["blocks"] == 2 and d["steps"] == sum(d["block_steps"]) and 2 <= d["steps"] <= 8
    assert d["tokens_per_forward"] == pytest.approx(32 / d["steps"], rel=1e-6) or reply["stats"]["stop_reason"] == "stop"
    meta = page.inner_text(".msg.assistant .meta")
    assert f"{d['steps']} denoising steps in 2 blocks" in meta and "tokens per forward pass" in meta
    assert page.inner_text("#denoise-announce").startswith("Block 2 written:")
    assert page.query_selector(".draft") is None                        # gone with the reply done
    from pyapp.gguf import read_gguf
    from pyapp.tokenizer import Tokenizer
    tok = Tokenizer.from_metadata(read_gguf(gguf_path).metadata)
    assert reply["content"] and tok.decode(reply["ids"]).endswith(reply["content"])


def test_stop_ends_a_reply_between_steps(page, gguf_path):
    ensure_tiny(page, gguf_path, defaults=True)
    set_field(page, "denoise_steps", 400)                    # random weights never settle: every step runs
    set_field(page, "denoise_entropy_bound", 0)
    page.evaluate("window.app.state.denoise = null")       # the last reply's figures
    page.fill("#prompt", "And another one.")
    page.click("#send")
    page.wait_for_function("window.app.state.denoise && window.app.state.denoise.steps >= 3")
    seen = page.evaluate("window.app.state.denoise.steps")
    page.click("#stop")
    wait_state(page, "loaded")
    stats = messages(page)[-1]["stats"]
    assert stats["stop_reason"] == "cancelled"
    assert seen <= stats["denoise"]["steps"] <= seen + 2 < 400
    assert "stopped" in page.inner_text(".msg.assistant:last-child .meta")
    page.click("#reset-settings")


def test_self_conditioned_step_of_the_undamped_model(page, tmp_path):
    """The undamped tiny DiffusionGemma (issue 25: tools/make_diffusion_fixture.py --undamped, its self-conditioning
    signal as large as the embedding), opened in the same page: one self-conditioned step after a prompt past the
    window and a committed block matches transformers (tests/fixtures/diffusion-undamped.golden.npz, case 3)."""
    path = tmp_path / "diffusion-undamped.gguf"
    load_tool("convert_diffusion_gemma").convert(FIXTURES / "diffusion-undamped-hf", path, "f32", vocab=VOCAB,
                                                 log=lambda _msg: None)
    page.set_input_files("#file-input", str(path))
    wait_loaded_file(page, path.name)
    got, want = page_logits(page, 3, np.load(FIXTURES / "diffusion-undamped.golden.npz"))
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert np.abs(got - want).max() <= 1e-3


def test_no_page_errors_or_policy_violations(page):
    assert not page.errors, page.errors
    assert not page.csp_violations and not page.evaluate("window.cspViolations")
