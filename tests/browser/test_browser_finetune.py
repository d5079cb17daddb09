"""The Fine-tune panel end to end in headless Chromium (WebGPU on SwiftShader), like test_browser.py.

Before a model is loaded the panel says to load one (a page of its own, never loaded); a damaged JSONL gives
the data error naming its line; a small chat JSONL, dropped on the panel, shows the statistics and warnings
pyapp.train.data gives natively; the fields are checked beside themselves and the presets fill them; a short
run's progress, loss chart and summary move update by update, and Stop ends it early keeping the best
parameters; the adapter downloads as llama.cpp's LoRA GGUF (parsed with pyapp.gguf) and, applied in the chat,
gives the native engine's greedy reply with that adapter; the adapter and its log are kept in OPFS across a
reload, and an OPFS failure is a message; the panel's controls are reachable by keyboard and named; a
mixture-of-experts model whose experts stream from the file (a small GPU memory setting) is refused in plain
words. A screenshot of the panel after the run goes to test-artifacts/.

Each test sets up what it needs (ensure_data, ...), so any runs alone and in any order. The run is the `run`
fixture: made once, on a page of its own, by whichever test needs it first; it records what the page showed
while it ran (for test_a_run_draws_its_loss_and_stop_keeps_the_best) and downloads the adapter (for the tests
that check the file). Its page keeps the run's result for *Chat with the tuned model*: the module's page
loads other models and starts runs that fail, either of which drops a result.

SwiftShader runs a training update of the demo model in about ten seconds (the first in about a minute:
the pipelines compile), so the run is a few updates of short examples.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from support.browser import (ARTIFACTS, FIXTURES, TIMEOUT, click_and_wait_reply, ensure_model, messages, open_app,
                             open_page, reload_model, set_field, under_csp, wait_loaded_file, wait_state)

pytestmark = pytest.mark.browser

SEQ_LEN = 64
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
# ten short chats and one longer than SEQ_LEN (cut: a warning)
CHATS = [{"messages": [{"role": "user", "content": f"Say {n}."}, {"role": "assistant", "content": w}]}
         for n, w in enumerate(WORDS, 1)]
CHATS.append({"messages": [{"role": "user", "content": "Count to 40."},
                           {"role": "assistant", "content": " ".join(str(k) for k in range(1, 41))}]})
DATA = "\n".join(json.dumps(c) for c in CHATS).encode()
STEPS = 4            # planned; Stop comes after the second update
VIEWPORT = (1280, 900)


def drop(page, selector: str, name: str, data: bytes) -> None:
    """A file dropped on an element, as a real drop delivers it."""
    page.evaluate("""([sel, name, bytes]) => {
        const dt = new DataTransfer();
        dt.items.add(new File([new Uint8Array(bytes)], name));
        document.querySelector(sel).dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true,
                                                                          cancelable: true}));
    }""", [selector, name, list(data)])


def ft(page, key: str):
    return page.evaluate(f"window.app.state.finetune.{key}")


def native_dataset():
    from pyapp.chat import style_for
    from pyapp.gguf import read_gguf, summarize
    from pyapp.tokenizer import Tokenizer
    from pyapp.train.data import load_dataset
    g = read_gguf(FIXTURES / "demo.gguf")
    style = style_for(g.metadata, summarize(g)["n_elements"])      # as the app's chat renders the demo model
    return load_dataset(DATA, "counting.jsonl", Tokenizer.from_metadata(g.metadata), SEQ_LEN, style=style,
                        val_fraction=0.1, seed=0)


def ensure_panel(page) -> None:
    """The demo model loaded, the Fine-tune tab shown with its options read, no data being read, every field
    good (the quick preset if one is not)."""
    ensure_model(page)
    page.click("#tab-finetune")
    page.wait_for_function("window.app.state.finetune.options !== null && !window.app.state.finetune.reading")
    if page.evaluate("document.querySelector('#finetune [aria-invalid=\"true\"]') !== null"
                     " || !document.getElementById('ft-targets-problem').hidden"):
        page.select_option("#ft_preset", "quick")
        page.wait_for_function("!window.app.state.finetune.reading")


def ensure_data(page) -> None:
    """ensure_panel, and the counting chats read for the demo model in sequences of SEQ_LEN."""
    ensure_panel(page)
    if page.input_value("#ft_seq_len") != str(SEQ_LEN):
        set_field(page, "ft_seq_len", SEQ_LEN)
    if not page.evaluate("(d => d !== null && d.name === 'counting.jsonl')(window.app.state.finetune.data)"):
        drop(page, "#ft-drop", "counting.jsonl", DATA)
    page.wait_for_function("(ft => ft.data !== null && !ft.reading && ft.data.name === 'counting.jsonl' && "
                           f"ft.data.stats.seq_len === {SEQ_LEN})(window.app.state.finetune)")


def run_fields(page) -> None:
    """The run's fields: the quick preset with a few updates of one example each, on short sequences."""
    page.select_option("#ft_preset", "quick")
    page.wait_for_function("!window.app.state.finetune.reading")
    for field, value in (("ft_seq_len", SEQ_LEN), ("ft_batch", 1), ("ft_steps", STEPS)):
        set_field(page, field, value)


@pytest.fixture(scope="module")
def run(browser, server, tmp_path_factory):
    """A short run, made once on a page of its own for every test that needs it, whichever comes first: the demo
    model, the counting chats, run_fields; Start; Stop after the second update. What the page showed at each point
    is recorded (test_a_run_draws_its_loss_and_stop_keeps_the_best checks it), then the adapter downloaded. The
    page stays on the Fine-tune tab with the run's result, as the run left it."""
    page = open_app(browser, server, VIEWPORT)
    ensure_data(page)
    run_fields(page)
    page.wait_for_function(f"window.app.state.finetune.data.stats.seq_len === {SEQ_LEN}"
                           " && !window.app.state.finetune.reading")
    seen = {}
    disabled = lambda *ids: {i: page.is_disabled(i) for i in ids}     # noqa: E731
    page.evaluate("""() => { window.__summaries = [];
        new MutationObserver(() => window.__summaries.push(document.getElementById('ft-summary').textContent))
            .observe(document.getElementById('ft-summary'), {childList: true, characterData: true, subtree: true}); }""")
    page.click("#ft-start")
    page.wait_for_function("window.app.state.finetune.running")
    seen["running"] = disabled("#send", "#demo", "#ft-start", "#ft-stop", "#ft_rank")
    # the first update compiles every pipeline the run needs: 68 s when the run is the module's first work on a
    # busy 2-core machine, over 180 s with two more browsers running beside it (a wait, not a bound)
    page.wait_for_function("document.getElementById('ft-chart').dataset.points === '1'", timeout=3 * TIMEOUT)
    seen["first"] = {"summary": page.inner_text("#ft-summary"),
                     "progress": page.evaluate("[document.getElementById('ft-progress').value, "
                                               "document.getElementById('ft-progress').max]"),
                     "status": page.inner_text("#ft-status"),
                     "polyline": page.query_selector("#ft-chart polyline.train") is not None,
                     "label": page.get_attribute("#ft-chart", "aria-label")}
    page.wait_for_function("document.getElementById('ft-chart').dataset.points === '2'")
    page.click("#ft-stop")
    seen["stopping"] = {"status": page.inner_text("#ft-status"), **disabled("#ft-stop")}
    page.wait_for_function("!window.app.state.finetune.running")
    seen["done"] = {"error": page.inner_text("#ft-error"), "points": ft(page, "points"),
                    "summary": page.inner_text("#ft-summary"), "summaries": page.evaluate("window.__summaries"),
                    "data-points": page.get_attribute("#ft-chart", "data-points"),
                    "xy": page.evaluate("document.querySelector('#ft-chart polyline.train').getAttribute('points')"),
                    "labels": page.evaluate("[...document.querySelectorAll('#ft-chart text.label')]"
                                            ".map((t) => t.textContent)"),
                    "result": page.inner_text("#ft-result-text"), "status": page.inner_text("#ft-status"),
                    "r": ft(page, "result"), **disabled("#send", "#demo", "#ft-start")}
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser-finetune.png"), full_page=True)
    with page.expect_download() as info:
        page.click("#ft-download")
    dl = info.value
    path = tmp_path_factory.mktemp("finetune") / dl.suggested_filename
    dl.save_as(path)
    seen["download"] = {"name": dl.suggested_filename,
                        "bytes": page.evaluate("window.app.state.finetune.result.adapter.byteLength")}
    yield SimpleNamespace(page=page, seen=seen, adapter=path)
    page.context.close()


def test_panel_waits_for_a_gemma_model(browser, server):
    """Before any model is loaded (a page of its own: the module's may hold one) the panel says to load one,
    its fields hold the quick preset; once the demo model loads, the panel is free."""
    page = open_app(browser, server, VIEWPORT)
    try:
        page.click("#tab-finetune")
        assert page.is_visible("#finetune") and page.is_hidden("#chat")
        assert page.get_attribute("#tab-finetune", "aria-selected") == "true"
        assert "Load a Gemma 4 model first" in page.inner_text("#ft-needs-model")
        assert page.is_disabled("#ft-pick") and page.is_disabled("#ft-start")
        page.wait_for_function("window.app.state.finetune.options !== null")
        # the quick preset fills the fields (pyapp.train.trainer.PRESETS)
        from pyapp.train.trainer import PRESETS
        q = PRESETS["quick"]
        assert page.input_value("#ft_preset") == "quick"
        assert [page.input_value(f"#ft_{k}") for k in ("rank", "alpha", "lr", "batch", "epochs", "seq_len")] == \
            [str(q.rank), str(int(q.alpha)), str(q.lr), str(q.batch), str(int(q.epochs)), str(q.seq_len)]
        assert page.input_value("#ft_steps") == ""                                  # by epochs
        checked = page.evaluate("[...document.querySelectorAll('#ft-target-list input:checked')].map((b) => b.value)")
        assert ",".join(checked) == q.targets
        page.click("#tab-chat")
        page.click("#demo")
        wait_state(page, "loaded")
        page.click("#tab-finetune")
        assert page.is_hidden("#ft-needs-model") and page.is_enabled("#ft-pick")
        assert not page.errors, page.errors
    finally:
        page.context.close()


def test_a_damaged_file_gives_the_data_error(page):
    ensure_panel(page)
    bad = json.dumps(CHATS[0]).encode() + b"\nnot json\n"
    page.set_input_files("#ft-file", {"name": "bad.jsonl", "mimeType": "application/json", "buffer": bad})
    page.wait_for_function("document.getElementById('ft-data-error').textContent.includes('bad.jsonl')")
    assert page.inner_text("#ft-data-error").startswith("bad.jsonl line 2: not valid JSON")
    assert ft(page, "data") is None and page.is_disabled("#ft-start")
    no_reply = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    page.set_input_files("#ft-file", {"name": "q.jsonl", "mimeType": "application/json", "buffer": no_reply})
    page.wait_for_function("document.getElementById('ft-data-error').textContent.includes('no assistant turn')")


def test_dropped_data_shows_its_statistics_and_warnings(page):
    ensure_panel(page)
    page.select_option("#ft_preset", "quick")                  # the statistics below are for its fields
    page.wait_for_function("!window.app.state.finetune.reading")
    set_field(page, "ft_seq_len", SEQ_LEN)
    drop(page, "#ft-drop", "counting.jsonl", DATA)             # a data file dropped: the panel takes it
    page.wait_for_function("window.app.state.finetune.data !== null && !window.app.state.finetune.reading")
    assert page.inner_text("#ft-data-error") == "" and page.evaluate("window.app.state.model.file") == "demo.gguf"
    s = native_dataset().stats
    got = ft(page, "data")["stats"]
    assert got == s.as_dict()
    assert (s.n_examples, s.n_val, s.n_cut) == (11, 1, 1)
    info = page.inner_text("#ft-data-info")
    assert "counting.jsonl: chats (JSONL)" in info
    assert f"{s.n_train} examples · {s.train_tokens} tokens, {s.train_targets} of them learned" in info
    assert f"1 example · {s.val_tokens} tokens (validation loss)" in info
    assert f"{s.longest} tokens (sequences of {SEQ_LEN})" in info
    assert page.inner_text(".ft-warnings") == (f"1 example(s) longer than seq_len {SEQ_LEN} (longest {s.longest} "
                                               "tokens) were cut to it.")
    assert page.is_enabled("#ft-start")
    # a longer sequence length reads the file again: nothing is cut
    set_field(page, "ft_seq_len", 256)
    page.wait_for_function("window.app.state.finetune.data.stats.seq_len === 256")
    assert ft(page, "data")["stats"]["n_cut"] == 0 and page.query_selector(".ft-warnings") is None
    set_field(page, "ft_seq_len", SEQ_LEN)
    page.wait_for_function(f"window.app.state.finetune.data.stats.seq_len === {SEQ_LEN}")


def test_fields_are_checked_and_presets_fill_them(page):
    ensure_data(page)
    page.fill("#ft_rank", "0")
    page.dispatch_event("#ft_rank", "input")
    assert page.inner_text("#ft_rank-problem").startswith("Rank must be an integer from 1 to 16")
    assert page.get_attribute("#ft_rank", "aria-invalid") == "true" and page.is_disabled("#ft-start")
    page.fill("#ft_lr", "2")
    page.dispatch_event("#ft_lr", "input")
    assert page.inner_text("#ft_lr-problem").startswith("Learning rate must be a number above 0 and at most 0.1")
    page.uncheck("#ft-target-list input[value=q]")
    for t in ("k", "v", "o", "gate", "up", "down"):
        page.uncheck(f"#ft-target-list input[value={t}]")
    assert page.inner_text("#ft-targets-problem") == "Choose at least one projection to adapt."
    assert page.input_value("#ft_preset") == "custom" and page.inner_text("#ft-preset-help").startswith("Custom")
    page.select_option("#ft_preset", "thorough")                 # a preset puts every field back
    from pyapp.train.trainer import PRESETS
    t = PRESETS["thorough"]
    assert page.input_value("#ft_rank") == str(t.rank) and page.input_value("#ft_lr") == str(t.lr)
    assert page.is_hidden("#ft_rank-problem") and page.is_hidden("#ft-targets-problem")
    assert page.inner_text("#ft-preset-help").startswith(f"Thorough: rank {t.rank}")
    run_fields(page)                                              # the quick preset, then three fields
    assert page.input_value("#ft_preset") == "custom"
    page.wait_for_function(f"window.app.state.finetune.data.stats.seq_len === {SEQ_LEN}")
    assert page.is_enabled("#ft-start")


def test_a_run_draws_its_loss_and_stop_keeps_the_best(run):
    """Start: the chart gains a point per update and its summary moves; Stop after the second update ends
    the run there (the page asks for no more updates), and the result offers the adapter (what the page
    showed at each point, as the run fixture recorded it)."""
    running, first, stopping, done = (run.seen[k] for k in ("running", "first", "stopping", "done"))
    assert running["#send"] and running["#demo"] and running["#ft-start"]
    assert not running["#ft-stop"] and running["#ft_rank"]
    assert first["summary"].startswith(f"Step 1 of {STEPS}, loss ")
    assert first["progress"] == [1, STEPS]
    assert "tokens/s" in first["status"] and "left" in first["status"]
    assert first["polyline"]
    assert first["label"].startswith(f"Loss chart over {STEPS} updates: training loss")
    assert stopping["status"] == "Stopping after this update…" and stopping["#ft-stop"]
    assert done["error"] == ""
    points = done["points"]
    assert 2 <= len(points) < STEPS and [p["step"] for p in points] == list(range(1, len(points) + 1))
    second = done["summary"]
    assert second != first["summary"] and second.startswith(f"Step {len(points)} of {STEPS}, loss ")
    summaries = done["summaries"]
    assert any(s.startswith("Step 1 of") for s in summaries) and any(s.startswith("Step 2 of") for s in summaries)
    # the chart: one training point per update, drawn to scale on labelled axes
    assert done["data-points"] == str(len(points))
    xy = done["xy"].split()
    assert len(xy) == len(points)
    ys = [float(p.split(",")[1]) for p in xy]
    losses = [p["loss"] for p in points]
    assert np.all(np.diff(ys) * np.diff(losses) <= 0)           # SVG y grows downwards
    assert done["labels"] == ["update", "loss"]
    # stopped before the first validation (every 10 updates and after the last): the latest parameters
    assert done["result"] == (f"Trained {len(points)} updates (stopped before the {STEPS} planned). The adapter holds "
                              f"the parameters after update {len(points)} (stopped before the first validation loss). "
                              "It is kept in this browser (below).")
    assert done["status"].startswith(f"Stopped after update {len(points)} · ")
    r = done["r"]
    assert r["steps"] == r["kept_step"] == len(points) and r["stopped"] and r["saved"]
    assert [row["loss"] for row in r["log"]] == pytest.approx(losses)
    assert not (done["#send"] or done["#demo"] or done["#ft-start"])          # all free again


def _check_adapter(path, rank: int, alpha: float):
    """A llama.cpp LoRA adapter for the demo model: the keys, types, names and shapes llama.cpp takes."""
    from pyapp.gguf import read_gguf
    from pyapp.families import model_config
    from pyapp.model.weights import bind
    from pyapp.train.adapter_out import lora_targets
    a = read_gguf(path)
    assert a.metadata["general.type"] == "adapter" and a.metadata["adapter.type"] == "lora"
    assert a.metadata["general.architecture"] == "gemma4" and a.metadata["adapter.lora.alpha"] == alpha
    base = read_gguf(FIXTURES / "demo.gguf")
    cfg = model_config(base)
    specs = lora_targets(cfg, bind(cfg, base.tensors), "q,k,v,o,gate,up,down")
    want = {}
    for s in specs:
        want[s.name + ".lora_a"] = (s.n_in, rank)
        want[s.name + ".lora_b"] = (rank, s.n_out)
    got = {name: tuple(t.shape) for name, t in a.tensors.items()}
    assert got == want
    assert all(t.type_name == "F32" for t in a.tensors.values())
    # trained: every B moved off its zero start (the initial parameters would make no difference)
    for name in a.tensors:
        if name.endswith(".lora_b"):
            b = np.frombuffer(a.read_tensor(name), np.float32)
            assert np.isfinite(b).all() and np.abs(b).max() > 0, name


def test_download_the_adapter(run):
    dl = run.seen["download"]
    assert dl["name"] == "counting-adapter.gguf"
    path = run.adapter
    assert path.name == dl["name"] and path.stat().st_size == dl["bytes"]
    _check_adapter(path, 8, 16.0)


def test_chat_with_the_tuned_model(run):
    """The adapter goes into the chat as the adapter box takes one: the model reloads with it, the box lists
    it, and the greedy reply is the native engine's with the same adapter file (the one downloaded)."""
    page = run.page
    page.click("#tab-finetune")
    page.click("#ft-use")
    assert page.get_attribute("#tab-chat", "aria-selected") == "true" and page.is_visible("#chat")
    page.wait_for_function("!document.getElementById('adapter-controls').hidden && window.app.state.loaded"
                           " && !window.app.state.busy")
    assert page.inner_text("#adapter-info").startswith("counting-adapter.gguf: 24 adapted tensors, rank 8")
    assert page.is_checked("#adapter-on")
    # a conversation of its own, no system prompt, no thinking: what the page sends is then exactly the one
    # message the native engine gets below (an earlier conversation's turns or settings would change the reply)
    page.click("#new-chat")
    page.evaluate("""() => {
        document.getElementById('system').value = '';
        document.getElementById('thinking').checked = false;
        window.app.state.chat.system = '';
        window.app.state.chat.thinking = false;
    }""")
    set_field(page, "temperature", 0)
    set_field(page, "max_tokens", 8)
    page.fill("#prompt", "Say 3.")
    click_and_wait_reply(page, "#send")
    wait_state(page, "loaded")
    sent = messages(page)
    assert [m["role"] for m in sent] == ["user", "assistant"] and sent[0]["content"] == "Say 3."
    assert not page.evaluate("window.app.state.chat.system || window.app.state.chat.thinking")
    reply = sent[-1]
    assert reply["role"] == "assistant" and reply["stats"]["tokens"] > 0
    # the worker says which adapter the reply ran with, and the reply's line shows it
    assert reply["stats"]["adapter"] == {"name": "counting-adapter.gguf", "scale": 1}, reply["stats"]
    assert "· adapter counting-adapter.gguf" in page.locator(".msg.assistant .meta").last.inner_text()
    pytest.importorskip("wgpu")
    from pyapp.chat import render_ids, style_for
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import summarize
    path = run.adapter
    eng = Engine.open(str(FIXTURES / "demo.gguf"), context_length=4096, lora=[(str(path), 1.0)])
    style = style_for(eng.gguf.metadata, summarize(eng.gguf)["n_elements"])
    ids = render_ids(eng.tokenizer, [{"role": "user", "content": "Say 3."}], style=style)
    native = eng.generate(ids, SamplingParams(temperature=0, max_tokens=8)).text
    # what the page and its worker logged goes with a mismatch (a GPU error would be among it)
    assert reply["content"] == native, (reply, page.errors, page.console[-20:])


def saved_names(page) -> list[str]:
    return page.evaluate("[...document.querySelectorAll('#ft-saved .ft-entry strong')].map((e) => e.textContent)")


def test_adapters_are_kept_in_opfs_across_a_reload(run, server, tmp_path):
    """The run's adapter and log in OPFS, listed for the loaded model; after a reload (a second page of the same
    browser profile: reloading the run's page would drop the result Chat with the tuned model uses) the list is
    read back, downloads the same bytes, reports a storage failure, and Delete removes both files."""
    page = run.page
    page.click("#tab-finetune")
    assert saved_names(page) == ["counting-adapter.gguf"]
    entry = page.inner_text("#ft-saved li")
    assert "for demo (random weights, test model) (demo.gguf) · the loaded model" in entry
    assert "2 of 4 updates" in entry or "3 of 4 updates" in entry
    stored = page.evaluate("""async () => {
        const dir = await (await navigator.storage.getDirectory()).getDirectoryHandle('adapters');
        const names = [];
        for await (const [name] of dir.entries()) names.push(name);
        const json = names.find((n) => n.endsWith('.json'));
        return {names: names.sort(), entry: JSON.parse(await (await (await dir.getFileHandle(json)).getFile()).text())};
    }""")
    e = stored["entry"]
    assert sorted(stored["names"]) == sorted([f"{e['id']}.gguf", f"{e['id']}.json"])
    assert e["model"]["file"] == "demo.gguf" and e["model"]["name"] == "demo (random weights, test model)"
    assert e["data"]["name"] == "counting.jsonl" and e["config"]["steps"] == STEPS and e["config"]["seq_len"] == SEQ_LEN
    assert [row["step"] for row in e["log"]] == list(range(1, e["steps"] + 1))
    again = open_page(page.context, server)
    try:
        wait_state(again, "ready")
        again.click("#tab-finetune")
        again.wait_for_function("document.querySelectorAll('#ft-saved .ft-entry').length === 1")
        assert saved_names(again) == ["counting-adapter.gguf"]
        assert again.is_disabled("#ft-saved .ft-saved-use")                     # no model loaded after the reload
        with again.expect_download() as info:
            again.click("#ft-saved .ft-saved-download")
        path = tmp_path / "kept.gguf"
        info.value.save_as(path)
        assert path.read_bytes() == run.adapter.read_bytes()
        _check_adapter(path, 8, 16.0)
        # storage failing is a message, and the page goes on
        again.evaluate("""() => { window.__getDirectory = navigator.storage.getDirectory;
            navigator.storage.getDirectory = async () => {
                throw new DOMException('storage is off', 'SecurityError'); }; }""")
        again.click("#ft-saved .ft-saved-download")
        again.wait_for_function("document.getElementById('ft-saved-error').textContent.length > 0")
        assert again.inner_text("#ft-saved-error") == "Could not download “counting-adapter.gguf” (storage is off)."
        again.evaluate("() => { navigator.storage.getDirectory = window.__getDirectory; }")
        # Delete removes both files
        again.click("#ft-saved .ft-saved-delete")
        again.wait_for_function("document.querySelectorAll('#ft-saved .ft-entry').length === 0")
        assert again.inner_text("#ft-saved") == "None yet." and again.inner_text("#ft-saved-error") == ""
        left = again.evaluate("""async () => { const dir = await (await navigator.storage.getDirectory())
            .getDirectoryHandle('adapters'); const names = []; for await (const [n] of dir.entries()) names.push(n);
            return names; }""")
        assert left == []
        assert not again.errors, again.errors
    finally:
        again.close()
    assert not page.errors, page.errors


def test_unreadable_storage_is_a_message(browser, server):
    ctx = browser.new_context()
    try:
        pg = under_csp(ctx.new_page())
        pg.add_init_script("navigator.storage.getDirectory = async () => { throw new DOMException('denied', "
                           "'SecurityError'); };")
        errors = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(server + "/index.html")
        wait_state(pg, "ready")
        pg.click("#tab-finetune")
        pg.wait_for_function("document.getElementById('ft-saved-error').textContent.length > 0")
        assert pg.inner_text("#ft-saved-error") == "The adapters kept in this browser could not be read (denied)."
        assert not errors, errors
    finally:
        ctx.close()


def test_the_panel_is_reachable_by_keyboard_and_labelled(page):
    """Arrow keys move between the Chat and Fine-tune tabs; Tab reaches every control of the panel in turn,
    each with a visible focus ring and a name a screen reader says."""
    wait_state(page, "ready", "loaded")
    page.focus("#tab-chat")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.id") == "tab-finetune" and page.is_visible("#finetune")
    page.keyboard.press("ArrowLeft")
    assert page.evaluate("document.activeElement.id") == "tab-chat" and page.is_visible("#chat")
    page.keyboard.press("ArrowRight")
    page.click("#tab-chat")
    page.click("#demo")
    wait_state(page, "loaded")
    page.click("#tab-finetune")
    wanted = set(page.evaluate("""() => [...document.querySelectorAll(
            '#finetune button, #finetune input, #finetune select, #finetune textarea')]
        .filter((el) => !el.disabled && el.checkVisibility({visibilityProperty: true}))
        .map((el) => el.id ? '#' + el.id : el.outerHTML.slice(0, 60))"""))
    assert {"#ft-pick", "#ft_preset", "#ft_rank", "#ft_seq_len"} <= wanted
    page.focus("#tab-finetune")
    reached, rings = [], {}
    for _ in range(len(wanted) + 5):
        page.keyboard.press("Tab")
        here = page.evaluate("""() => { const el = document.activeElement; const s = getComputedStyle(el);
            return [el.id ? '#' + el.id : el.outerHTML.slice(0, 60), s.outlineStyle, parseFloat(s.outlineWidth),
                    !!el.closest('#finetune')]; }""")
        if not here[3]:
            break
        reached.append(here[0])
        rings[here[0]] = here[1] != "none" and here[2] >= 2
    assert wanted <= set(reached), wanted - set(reached)
    assert all(rings.values()), [k for k, ok in rings.items() if not ok]
    cdp = page.context.new_cdp_session(page)
    tree = cdp.send("Accessibility.getFullAXTree")["nodes"]
    controls = {"button", "textbox", "spinbutton", "checkbox", "combobox", "tab", "progressbar", "image"}
    unnamed = [n for n in tree if not n.get("ignored") and n.get("role", {}).get("value") in controls
               and not (n.get("name") or {}).get("value", "").strip()]
    assert not unnamed, [(n["role"]["value"], n.get("backendDOMNodeId")) for n in unnamed]
    # the file picker from the keyboard
    page.evaluate("() => { window.__picked = 0; document.getElementById('ft-file').click = () => { window.__picked += 1; }; }")
    page.focus("#ft-pick")
    page.keyboard.press("Enter")
    assert page.evaluate("window.__picked") == 1


def test_a_model_streaming_its_experts_is_refused_in_plain_words(page):
    """A mixture-of-experts model trains only with every expert on the GPU: under a GPU memory setting that
    streams them, Start says which setting to raise, and the model stays loaded and usable."""
    wait_state(page, "ready", "loaded")
    path = FIXTURES / "gemma4-moe-q8_0.gguf"
    page.click("#tab-chat")
    page.set_input_files("#file-input", str(path))
    wait_loaded_file(page, path.name)
    set_field(page, "context_length", 256)
    whole = page.evaluate("window.app.call('memory_plan', 256, 0)")
    set_field(page, "gpu_memory", f"{(whole['minimum'] + whole['expert_each'] // 2) / 2**20:.4f}")
    reload_model(page)
    wait_state(page, "loaded")
    assert "2 of 4 per layer cached" in page.text_content("#memory-plan")
    page.click("#tab-finetune")
    drop(page, "#ft-drop", "counting.jsonl", DATA)
    page.wait_for_function("window.app.state.finetune.data !== null && !window.app.state.finetune.reading")
    page.click("#ft-start")
    page.wait_for_function("document.getElementById('ft-error').textContent.includes('mixture-of-experts')")
    assert page.inner_text("#ft-error").startswith(
        "Fine-tuning a mixture-of-experts model needs all its experts in GPU memory, but with this GPU memory "
        "setting they are read from the file as needed. Raise GPU memory (MiB) in the settings")
    assert not ft(page, "running") and page.evaluate("window.app.state.loaded") and page.is_enabled("#send")
    for field, value in (("gpu_memory", 0), ("context_length", 4096)):
        set_field(page, field, value)
    assert not page.errors, page.errors
    assert page.evaluate("window.cspViolations") == [] and page.csp_violations == [], page.csp_violations
