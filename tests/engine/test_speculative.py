"""Speculative decoding (issue 9 item 4): prompt-lookup drafts checked in one step give the greedy tokens.

Each GPU test generates the same prompt greedily with and without `speculate` and wants the same
tokens, stop reason and cache bookkeeping. The committed fixtures' greedy output repeats itself,
so prompt lookup's drafts get accepted there (and their sliding window of 4 is passed many times
over, in steps of up to 5 tokens: a ring of 8 slots). The toy models (tools/make_bench_model.py)
answer a random prompt with varied tokens, where drafts get rejected. An oracle drafter (the
tokens a plain run produced, some replaced by wrong ones) makes every length of accepted run
happen, and puts stop tokens, max_tokens, the context end and a cancel inside accepted runs.
"""

from __future__ import annotations

import asyncio

import pytest

from support.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
REPEATING = [2, 40, 41, 42, 43, 44, 45] * 3                   # a repetitive prompt
RANDOM = [2, 17, 500, 33, 499, 4, 5, 6, 7, 8, 9, 10, 11, 300, 301, 302, 12, 13, 14, 15]


# -- prompt lookup (no GPU) ---------------------------------------------------------------------

def test_prompt_lookup_drafts_what_followed_the_longest_latest_match():
    from pyapp.prompt_lookup import PromptLookup
    p = PromptLookup([1, 2, 3, 9, 9, 2, 3, 7, 8, 5, 1, 2, 3])
    assert p.draft(3) == [9, 9, 2]         # (1 2 3) at 0, though (2 3) occurred later, at 5
    p = PromptLookup([5, 2, 3, 7, 8, 6, 2, 3, 4, 6, 9, 2, 3])
    assert p.draft(2) == [4, 6]            # (9 2 3) never occurred; (2 3): its latest earlier occurrence
    p.append(4)
    assert p.draft(4) == [6, 9, 2, 3]      # (2 3 4) occurred once
    assert PromptLookup([1, 2, 3]).draft(4) == []      # nothing occurs earlier
    assert PromptLookup([4, 4, 1, 4]).draft(2) == [1, 4]   # 1-gram (4): its latest earlier occurrence, at 1
    assert PromptLookup([1, 2, 3, 1, 2]).draft(0) == []
    p = PromptLookup([5, 2, 3, 7, 8, 6, 2, 3])
    assert p.draft(2, min_ngram=3) == [] and p.draft(2, min_ngram=2) == [7, 8]   # only (2 3) occurred before


def test_prompt_lookup_continues_a_loop_past_the_end_of_the_history():
    from pyapp.prompt_lookup import PromptLookup
    p = PromptLookup([9, 1, 2, 1, 2, 1, 2])
    assert p.draft(7) == [1, 2, 1, 2, 1, 2, 1]           # period 2, drafted as far as asked
    p = PromptLookup([7, 7, 7])
    assert p.draft(5) == [7] * 5


def test_speculate_is_checked_and_greedy_only():
    from pyapp.sampling import MAX_SPECULATE, ParamError, SamplingParams
    assert MAX_SPECULATE == 16
    with pytest.raises(ParamError, match="speculate must be an integer from 0 to 16"):
        SamplingParams(speculate=17)
    assert SamplingParams(temperature=0, speculate=4).speculates
    assert not SamplingParams(temperature=0.7, speculate=4).speculates
    assert not SamplingParams(temperature=0, speculate=4, repeat_penalty=1.1).speculates
    assert not SamplingParams(temperature=0).speculates
    assert SamplingParams.from_ollama({"speculate": 3, "temperature": 0}).speculate == 0   # not an Ollama option


# -- on the GPU ---------------------------------------------------------------------------------

def _open(dev, path, **kw):
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    kw.setdefault("context_length", 128)
    kw.setdefault("chunk", 5)
    return Engine.open(read_gguf(path), device=dev, **kw)


def _pair(eng, prompt, speculate, stop_ids=(), **params):
    """(plain result, its cached tokens and kv_end, speculative result, its cached and kv_end), each from an empty cache."""
    from pyapp.engine import SamplingParams
    out = []
    for n in (0, speculate):
        eng.reset()
        res = eng.generate(prompt, SamplingParams(temperature=0, speculate=n, **params), stop_ids=stop_ids)
        out += [res, list(eng.cached), eng.kv_end]
    return out


def _assert_same(plain, spec):
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.stop_reason == plain.stop_reason
    assert plain.drafted == plain.accepted == 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gemma4-dense-f32", "gemma4-dense-q4_k", "gemma4-dense-q8_0", "gemma4-moe-f32"])
def test_fixtures_repetitive_prompt_drafts_accepted_same_tokens(dev, name):
    """Dense: sliding window 4 with KV-shared layers and PLE; 48 tokens pass the window 12 times."""
    eng = _open(dev, FIXTURES / f"{name}.gguf")
    plain, plain_cached, _, spec, spec_cached, spec_end = _pair(eng, REPEATING, 6, max_tokens=48)
    _assert_same(plain, spec)
    assert len(spec.tokens) == 48 and spec.accepted > 10
    assert spec.decode_steps < plain.decode_steps and spec.tokens_per_step > 1.5
    assert spec_cached == plain_cached == REPEATING + plain.tokens[:-1]
    assert spec_end >= len(spec_cached)


def int8_few_token_matvecs(monkeypatch) -> list:
    """The (qtype, k, n) of every few-token matvec recorded on int8 x (kernels.matvec_tokens_x8) from now on."""
    from pyapp.gpu import kernels
    lowered = []
    x8 = kernels.matvec_tokens_x8

    def counted(*args, **kwargs):
        lowered.append(args[1:4])
        return x8(*args, **kwargs)
    monkeypatch.setattr(kernels, "matvec_tokens_x8", counted)
    return lowered


@pytest.mark.gpu
def test_few_token_steps_on_int8_activations_give_the_same_tokens(dev, monkeypatch):
    """The Q4_K projections of a speculative step on x rounded to int8 (quantize_q8 + matvec_tokens_q4k_x8,
    as E2B's from 512 rows; here every row count): the greedy tokens of plain decoding, drafts accepted."""
    from pyapp.gpu.kernels import few_tokens
    monkeypatch.setattr(few_tokens, "FEW_INT8_ROWS", 1)
    lowered = int8_few_token_matvecs(monkeypatch)
    eng = _open(dev, FIXTURES / "gemma4-dense-q4_k.gguf")
    plain, plain_cached, _, spec, spec_cached, _ = _pair(eng, REPEATING, 6, max_tokens=48)
    assert lowered                                   # the few-token plan's Q4_K projections took the int8 kernel
    _assert_same(plain, spec)
    assert spec.accepted > 10 and spec_cached == plain_cached


@pytest.mark.gpu
def test_few_token_downs_round_where_one_token_downs_read_rounded_codes(dev, monkeypatch):
    """Under the browser path's rules for Q8_0 (int8 units; downs reading the GeGLU's rounded codes, here at the
    fixture's widths), a speculative step rounds the down projections' x too (RoundedAsOneToken: the one-token
    plan's codes by the same rule) and nothing else below Q8_0's row threshold: the greedy tokens of plain
    decoding, drafts accepted."""
    import importlib
    monkeypatch.setattr(dev, "int8_block_units", True)
    monkeypatch.setattr(importlib.import_module("pyapp.gpu.kernels.matvec"), "ROUND_OUT_MIN_ROWS", 0)
    lowered = int8_few_token_matvecs(monkeypatch)
    eng = _open(dev, FIXTURES / "gemma4-dense-q8_0.gguf")
    ff = [t.shape[0] for name, t in eng.gguf.tensors.items() if name.endswith("ffn_down.weight")]
    plain, plain_cached, _, spec, spec_cached, _ = _pair(eng, REPEATING, 6, max_tokens=48)
    downs = [(q, k, n) for q, k, n in lowered if k in ff and n == eng.config.hidden]
    assert downs and len(downs) == len(lowered)      # the downs only: the other projections' rows stay on f32 x
    _assert_same(plain, spec)
    assert spec.accepted > 10 and spec_cached == plain_cached


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gemma4-dense-q4_k", "gemma4-moe-q8_0"])
def test_steps_of_few_tokens_give_the_prefill_logits(dev, name):
    """The plan a token and its drafts run in (matvec_tokens, per-slot experts) against the prefill plan
    (64-token tiles) and the numpy reference: 26 tokens as steps of 9 and 17, each row's logits within 1e-4."""
    import numpy as np
    from pyapp.reference.forward import ReferenceModel
    from pyapp.gguf import read_gguf
    eng = _open(dev, FIXTURES / f"{name}.gguf", chunk=32, int8=False)    # f32: the plans agree within float rounding
    tokens = (REPEATING + RANDOM)[:26]
    want = np.asarray(eng.forward(tokens))
    r, rows = eng.runner, []
    eng.reset()
    for pos, n in ((0, 9), (9, 17)):
        r.write_step(tokens[pos:pos + n], pos)
        eng.drive(r.run_layers(n, few=True))
        for row in range(n):
            dev.submit(r.head_plan(row, sample=False))
            rows.append(np.frombuffer(dev.read(r.state.logits, 0, 4 * eng.config.vocab_size), np.float32))
    got = np.stack(rows)
    assert np.abs(got - want).max() < 1e-4
    assert (got.argmax(-1) == want.argmax(-1)).all()
    ref = np.asarray(ReferenceModel(read_gguf(FIXTURES / f"{name}.gguf")).forward(tokens))
    assert np.abs(got - ref).max() < 1e-4                # seen: 5e-6


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["tiny"])
def test_toys_random_prompt_same_tokens(dev, toy, shape):
    """Varied tokens: most drafts are rejected, their K/V overwritten by the steps after. The prompt is
    one prefill step (a step of up to 64 tokens costs the same on lavapipe)."""
    eng = _open(dev, toy(shape), chunk=20)
    prompt = RANDOM[:4] + [999] + RANDOM[5:]          # the toys' vocabulary is 1000
    plain, plain_cached, _, spec, spec_cached, _ = _pair(eng, prompt, 4, max_tokens=24)
    _assert_same(plain, spec)
    assert spec.drafted > 0 and spec.accepted < spec.drafted
    assert spec_cached == plain_cached


class _Oracle:
    """A drafter that knows the plain run's tokens (`truth`, prompt first) and spoils some drafts:
    every third round drafts only truth, the others one wrong token at a varying place."""

    def __init__(self, truth: list, vocab: int, spoil: bool = True):
        self.truth, self.vocab, self.spoil, self.round = truth, vocab, spoil, 0

    def __call__(self, tokens):
        from pyapp.prompt_lookup import PromptLookup
        oracle = self

        class Lookup(PromptLookup):
            def draft(self, limit):
                at = len(self.tokens)
                out = list(oracle.truth[at:at + limit])
                oracle.round += 1
                if out and oracle.spoil and oracle.round % 3:
                    i = (oracle.round * 7) % len(out)
                    out[i] = (out[i] + 1) % oracle.vocab
                return out
        return Lookup(tokens)


def _with_oracle(monkeypatch, eng, prompt, plain, spoil=True):
    import pyapp.engine.speculative
    monkeypatch.setattr(pyapp.engine.speculative, "PromptLookup", _Oracle(prompt + plain.tokens, eng.config.vocab_size, spoil))


@pytest.mark.gpu
@pytest.mark.parametrize("model,speculate,chunk", [("gemma4-dense-f32", 4, 5), ("tiny", 16, 32),
                                                   ("gemma4-moe-q8_0", 7, 8)])
def test_partly_accepted_drafts_same_tokens_and_cache(dev, toy, monkeypatch, model, speculate, chunk):
    """Accepted runs of every length, after a token decoded ahead and after a known one; then a second
    turn keeps the speculative run's cache and answers as a fresh engine does."""
    from pyapp.engine import SamplingParams
    path = toy(model) if model == "tiny" else FIXTURES / f"{model}.gguf"
    eng = _open(dev, path, chunk=chunk)
    greedy = SamplingParams(temperature=0, max_tokens=28)
    eng.reset()
    plain = eng.generate(RANDOM, greedy, stop_ids=())
    _with_oracle(monkeypatch, eng, RANDOM, plain)
    eng.reset()
    spec = eng.generate(RANDOM, SamplingParams(temperature=0, max_tokens=28, speculate=speculate), stop_ids=())
    _assert_same(plain, spec)
    assert 0 < spec.accepted < spec.drafted and spec.tokens_per_step > 1.2
    assert eng.cached == RANDOM + plain.tokens[:-1] and eng.kv_end >= len(eng.cached)
    monkeypatch.undo()
    turn2 = RANDOM + spec.tokens + [40, 41, 42]
    again = eng.generate(turn2, SamplingParams(temperature=0, max_tokens=8, speculate=speculate), stop_ids=())
    assert again.cached_tokens == len(RANDOM) + len(spec.tokens) - 1
    fresh = _open(dev, path, chunk=chunk).generate(turn2, SamplingParams(temperature=0, max_tokens=8),
                                                         stop_ids=())
    assert again.tokens == fresh.tokens


@pytest.mark.gpu
def test_stops_inside_an_accepted_run_as_without_speculation(dev, toy, monkeypatch):
    """Every draft right (the oracle unspoiled, 6 a step): a stop token, max_tokens, a cancel and the
    context's end each land inside an accepted run; tokens, stop reason and cache as a plain run's.
    The prompt is one step of 8 (a prefill step costs seconds on lavapipe); the plain run to the
    context's end is the oracle's truth itself."""
    from pyapp.engine import SamplingParams
    prompt = RANDOM[:8]
    eng = _open(dev, toy("tiny"), chunk=8, context_length=24)
    eng.reset()
    truth = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=-1), stop_ids=())
    assert truth.stop_reason == "context" and len(truth.tokens) == 16
    plain_to_context = (truth.tokens, truth.stop_reason, list(eng.cached))
    _with_oracle(monkeypatch, eng, prompt, truth, spoil=False)
    stop = truth.tokens[9]
    calls = []

    def cancel_at(n):
        calls.clear()
        return lambda: calls.append(1) or len(calls) >= n

    cases = [({"max_tokens": 30}, {stop}, None, "stop"), ({"max_tokens": 11}, (), None, "length"),
             ({"max_tokens": 30}, (), 7, "cancelled"), ({"max_tokens": -1}, (), None, "context")]
    for params, stops, cancel, reason in cases:
        out = []
        for n in (0, 6):
            if n == 0 and reason == "context":       # the same call as the truth's
                out.append(plain_to_context)
                continue
            eng.reset()
            res = eng.generate(prompt, SamplingParams(temperature=0, speculate=n, **params), stop_ids=stops,
                               should_stop=cancel_at(cancel) if cancel else None)
            out.append((res.tokens, res.stop_reason, list(eng.cached)))
        assert out[0] == out[1], reason
        assert res.stop_reason == reason and res.accepted == res.drafted > 0


@pytest.mark.gpu
@pytest.mark.parametrize("speculate", [0, 4])
def test_a_turn_rolling_back_further_recomputes_what_the_ring_lost(dev, toy, monkeypatch, speculate):
    """Turn 1 stops at a stop token whose K/V were written anyway (decoded ahead; or drafts after it, in
    the same step); turn 2 rolls back 3 positions from there and is short; turn 3 rolls back 3 more. A
    sliding layer's ring (window 8 + chunk 5 - 1 = 12 slots) lost positions turn 3 needs to turn 1's
    writes past turn 2's end, so turn 3 is computed again: it answers as a fresh engine does. A prompt of
    two steps: what the ring loses depends on the positions after it, not on its length."""
    from pyapp.engine import SamplingParams
    prompt = RANDOM[:10]
    eng = _open(dev, toy("tiny"))
    truth = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=12), stop_ids=())
    if speculate:
        _with_oracle(monkeypatch, eng, prompt, truth, spoil=False)
    eng.reset()
    first = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=12, speculate=speculate),
                         stop_ids={truth.tokens[7]})
    assert first.stop_reason == "stop" and eng.kv_end > len(eng.cached)       # K/V written past the reply
    n2 = min(eng.kv_end - 3, len(eng.cached))
    second = eng.generate(eng.cached[:n2] + [77], SamplingParams(temperature=0, max_tokens=1), stop_ids=())
    assert second.cached_tokens == n2
    turn3 = eng.cached[:n2 - 3] + [88, 89, 90]
    third = eng.generate(turn3, SamplingParams(temperature=0, max_tokens=8, speculate=speculate), stop_ids=())
    assert third.cached_tokens == 0
    monkeypatch.undo()
    fresh = _open(dev, toy("tiny")).generate(turn3, SamplingParams(temperature=0, max_tokens=8), stop_ids=())
    assert third.tokens == fresh.tokens


@pytest.mark.gpu
def test_streamed_experts_and_ple_in_the_file(dev, monkeypatch):
    """A cache of 2 of 4 experts per layer: a step of drafts routes to more, served in rounds (the
    T > 1 program's expert rounds). The PLE table left in the file: no step decodes ahead, each step's
    rows are read for its tokens, drafts included."""
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    from pyapp.runtime.memory import MIB
    moe = FIXTURES / "gemma4-moe-q8_0.gguf"
    plain = _open(dev, moe).generate(RANDOM, SamplingParams(temperature=0, max_tokens=20), stop_ids=())
    each = Engine.plan(read_gguf(moe), dev.limits, 128, chunk=5).expert_each
    streamed = _open(dev, moe, expert_cache_mib=(2 * each + 64) / MIB)
    assert streamed.runner.experts.slots == 2
    _with_oracle(monkeypatch, streamed, RANDOM, plain)
    spec = streamed.generate(RANDOM, SamplingParams(temperature=0, max_tokens=20, speculate=4), stop_ids=())
    _assert_same(plain, spec)
    assert 0 < spec.accepted < spec.drafted and streamed.runner.experts.misses > 0
    monkeypatch.undo()

    dense = FIXTURES / "gemma4-dense-q8_0.gguf"
    plain = _open(dev, dense).generate(RANDOM, SamplingParams(temperature=0, max_tokens=20), stop_ids=())
    in_file = _open(dev, dense, ple_in_file=True)
    assert not in_file.runner.decodes_ahead
    _with_oracle(monkeypatch, in_file, RANDOM, plain)
    spec = in_file.generate(RANDOM, SamplingParams(temperature=0, max_tokens=20, speculate=4), stop_ids=())
    _assert_same(plain, spec)
    assert 0 < spec.accepted < spec.drafted


@pytest.mark.gpu
def test_generate_async_speculates_too(dev):
    """The browser's driver (drive_async: awaited readbacks) runs the same steps."""
    from pyapp.engine import SamplingParams
    eng = _open(dev, FIXTURES / "gemma4-dense-q8_0.gguf")
    params = SamplingParams(temperature=0, max_tokens=20, speculate=5)
    sync = eng.generate(REPEATING, params, stop_ids=())
    eng.reset()
    got = asyncio.run(eng.generate_async(REPEATING, params, stop_ids=()))
    assert got.tokens == sync.tokens and got.accepted == sync.accepted > 0


@pytest.mark.gpu
def test_sampling_and_repeat_penalty_turn_speculation_off(dev, toy):
    from pyapp.engine import SamplingParams
    eng = _open(dev, toy("tiny"), chunk=8)
    for params in (SamplingParams(temperature=0.8, seed=3, max_tokens=12, speculate=4),
                   SamplingParams(temperature=0, repeat_penalty=1.3, max_tokens=12, speculate=4)):
        res = eng.generate(REPEATING, params, stop_ids=())
        assert len(res.tokens) == 12 and res.drafted == 0 and res.decode_steps == 11


@pytest.mark.gpu
def test_bench_reports_speculation(dev):
    eng = _open(dev, FIXTURES / "gemma4-dense-q8_0.gguf", chunk=16)
    engine_bench = _load_script(ROOT / "bench" / "engine_bench.py")
    r = engine_bench.bench(eng, prompt_tokens=40, gen_tokens=24, repeat=1, speculate=6, prompt="repeat")
    assert r["prompt"] == "repeat" and r["speculate"] == 6 and r["generated_tokens"] == 24
    assert r["accepted"] > 0 and r["drafted"] >= r["accepted"] and r["tokens_per_step"] > 1
    assert r["acceptance"] == round(r["accepted"] / r["drafted"], 3)
    assert r["draft_step_tokens"] == 7 and r["one_token_step_ms"] > 0 and r["draft_step_ms"] > 0
    assert r["draft_step_tiles_ms"] > 0
    assert r["break_even_tokens_per_step"] == pytest.approx(r["draft_step_ms"] / r["one_token_step_ms"], abs=0.01)
    assert eng.cached == [] and eng.kv_end == 0           # the timed steps' K/V are not kept
    plain = engine_bench.bench(eng, prompt_tokens=40, gen_tokens=24, repeat=1)
    assert plain["speculate"] == 0 and plain["drafted"] == 0 and plain["tokens_per_step"] == pytest.approx(1)
    assert "draft_step_ms" not in plain


def _load_script(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_side_by_side_tables_speculation_and_restore_puts_it_back(tmp_path):
    """bench/h100.sh speculate's records: their own table (each N beside N = 0), and restore_results.py
    puts them back under the names the step skips."""
    import json
    sbs = _load_script(ROOT / "bench" / "side_by_side.py")
    base = {"file": "bench-e2b-Q4_K.gguf", "backend": "native", "prompt_tokens": 512, "generated_tokens": 128,
            "prompt": "repeat", "speculate": 0, "decode_tok_s": 100.0, "drafted": 0, "accepted": 0,
            "acceptance": None, "tokens_per_step": 1.0}
    spec = dict(base, speculate=8, decode_tok_s=250.0, drafted=300, accepted=240, acceptance=0.8,
                tokens_per_step=3.5, one_token_step_ms=6.0, draft_step_ms=9.0, draft_step_tiles_ms=30.0,
                break_even_tokens_per_step=1.5)
    browser = dict(spec, runtime="pyodide+dawn (node)", decode_tok_s=200.0)
    src = tmp_path / "out"
    src.mkdir()
    (src / "speculate.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (base, spec, browser)))
    table = sbs.speculation_table(sbs.load_records([str(src / "speculate.jsonl")]))
    rows = [line for line in table.splitlines() if line.startswith("| bench-e2b")]
    assert rows == [
        "| bench-e2b-Q4_K.gguf | browser | repeat | 8 | 200.0 | - | 300 | 240 | 0.800 | 3.50 | 6.00 | 9.00 | 30.00 "
        "| 1.50 |",
        "| bench-e2b-Q4_K.gguf | native | repeat | 0 | 100.0 | 1.00 | 0 | 0 | - | 1.00 | - | - | - | - |",
        "| bench-e2b-Q4_K.gguf | native | repeat | 8 | 250.0 | 2.50 | 300 | 240 | 0.800 | 3.50 | 6.00 | 9.00 | 30.00 "
        "| 1.50 |"]
    res = tmp_path / "results"
    _load_script(ROOT / "bench" / "restore_results.py").main(str(src), str(res))
    assert sorted(p.name for p in (res / "speculate").iterdir()) == [
        "browser-bench-e2b-Q4_K-repeat-8.jsonl", "native-bench-e2b-Q4_K-repeat-0.jsonl",
        "native-bench-e2b-Q4_K-repeat-8.jsonl"]
