"""The GPU engine (native backend) against the numpy reference and the golden fixtures.

Random-weight toy models with the real structure (tools/make_bench_model.py:
E2B-like with PLE + KV sharing, 26B-A4B-like with experts) check every code
path; the committed fixtures (tools/make_fixtures.py) check against transformers.

Tolerances: the toy models are chaotic (1e-6 relative noise on their weights
moves the reference's logits by ~1e-2), so there the GPU must agree within
2e-2 absolute and pick the same argmax wherever the top two logits are 0.05
apart; greedy generation must match token for token.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from support.paths import ROOT, load_tool

pytestmark = pytest.mark.gpu

FIXTURES = ROOT / "tests" / "fixtures"
GOLDEN = sorted(p for p in FIXTURES.glob("*.gguf") if p.with_suffix(".golden.npz").exists())
TOKENS = [2, 17, 500, 33, 999, 4, 5, 6, 7, 8, 9, 10, 11, 300, 301, 302, 12, 13, 14, 15]


def engine_logits(engine, tokens) -> np.ndarray:
    return np.asarray(engine.forward(tokens))


def assert_logits_agree(got, want, atol):
    assert got.shape == want.shape
    diff = np.abs(got - want).max()
    assert diff < atol, f"max |gpu - reference| = {diff:.3g}"
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.05
    assert clear.sum() >= len(want) // 2
    assert (got.argmax(-1) == want.argmax(-1))[clear].all()


def assert_within_rounding(got, want, mean: tuple, median_max: float, gap: float, clear_rows: int):
    """got within a rounding's reach of want: the mean difference in (mean[0], mean[1]) (a floor above 0: the
    rounding ran), the rows' largest differences' median under median_max, and the same pick in every row
    (at least clear_rows of them) whose top two logits are `gap` apart."""
    diff = np.abs(got - want)
    assert mean[0] < diff.mean() < mean[1] and np.median(diff.max(-1)) < median_max, (diff.mean(),
                                                                                       np.median(diff.max(-1)))
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > gap
    assert clear.sum() >= clear_rows and (got.argmax(-1) == want.argmax(-1))[clear].all()


def one_layer_toy(tmp_path, shape: str, quant: str):
    """A one-layer toy of tools/make_bench_model.py (deeper random-weight toys are chaotic: the module's
    docstring), written under tmp_path."""
    tool = load_tool("make_bench_model")
    path = tmp_path / f"{shape}-{quant}.gguf"
    tool.write(shape, tool.T[quant], str(path), seed=1, layers=1)
    return path


TOY_CASES = [("tiny", "Q8_0"), ("tiny", "Q4_K"), ("tiny", "Q6_K"), ("tiny", "Q4_0"), ("tiny-moe", "Q8_0"),
             ("tiny-moe", "Q5_K")]


@pytest.mark.parametrize("shape,quant", TOY_CASES, ids=lambda v: v)
@pytest.mark.parametrize("chunk", [1, 7], ids=["decode-path", "prefill-chunks"])
def test_toy_logits_and_greedy_match_reference(dev, toy, shape, quant, chunk):
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    g = read_gguf(toy(shape, quant))
    ref = ReferenceModel(g)
    eng = Engine.open(g, device=dev, context_length=64, chunk=chunk, int8=False)     # f32: float rounding only
    assert_logits_agree(engine_logits(eng, TOKENS), np.asarray(ref.forward(TOKENS)), atol=2e-2)
    res = eng.generate(TOKENS[:6], SamplingParams(temperature=0, max_tokens=16), stop_ids=())
    assert res.tokens == ref.generate_greedy(TOKENS[:6], 16)
    assert res.stop_reason == "length" and res.prompt_tokens == 6


@pytest.mark.parametrize("shape", ["tiny", "tiny-moe"])
def test_decode_fuses_residual_adds_into_their_consumers(dev, toy, shape, monkeypatch):
    """A one-token plan builds the post-norms' residual adds into the matvecs that read them
    (K.ResidualInput): fewer dispatches, logits as the plan with an add_normed dispatch each
    (float rounding apart: 2e-3 here), and without the storage buffers for it, that plan."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf

    def decode(fuse: bool):
        eng = Engine.open(read_gguf(toy(shape, "Q4_K")), device=dev, context_length=64, chunk=1, int8=False)
        eng.runner.fuse_residual = fuse
        eng.runner._plans.clear()
        plan = eng.runner.layers_plan(1)
        families = [op[1].key[:2] for op in plan.ops if op[0] == "d"]
        return engine_logits(eng, TOKENS[:9]), families, eng.config

    fused, fused_ops, cfg = decode(True)
    plain, plain_ops, _ = decode(False)
    adds_into_residual = cfg.n_layers * (3 if cfg.has_ple else 2)
    assert plain_ops.count(("norm", "add_normed")) >= adds_into_residual
    # every add into the residual stream but the last layer's (nothing follows it in the plan)
    assert plain_ops.count(("norm", "add_normed")) - fused_ops.count(("norm", "add_normed")) == adds_into_residual - 1
    assert_logits_agree(fused, plain, atol=2e-2)      # the toy models are chaotic (module docstring)
    monkeypatch.setitem(dev.limits, "max_storage_buffers_per_shader_stage", 8)
    _, limited_ops, _ = decode(True)
    # the routing rides on a plain matvec either way (7 buffers), the attention's combine on the o projection
    either = (("moe_route", "route"), ("attention_decode", "attend_combine"))
    assert [f for f in limited_ops if f not in either] == [f for f in plain_ops if f not in either]


@pytest.mark.parametrize("shape", ["tiny", "tiny-moe"])
def test_decode_combines_the_attention_in_the_o_projection(dev, toy, shape, monkeypatch):
    """A one-token plan leaves each attention's split partials to the o projection, whose workgroups combine
    them into their x (K.CombineInput): one dispatch fewer a layer, and the logits of the plan with an
    attend_combine dispatch each within float rounding. An attention of more splits than
    K.COMBINE_INPUT_MAX_VEC4 allows (here: every one) keeps its combine."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    import importlib
    attention = importlib.import_module("pyapp.gpu.kernels.attention")   # (K.attention is the kernel)

    def decode():
        eng = Engine.open(read_gguf(toy(shape, "Q4_K")), device=dev, context_length=64, chunk=1, int8=False)
        families = [op[1].key[:2] for op in eng.runner.layers_plan(1).ops if op[0] == "d"]
        return engine_logits(eng, TOKENS[:9]), families, eng.config

    fused, fused_ops, cfg = decode()
    monkeypatch.setattr(attention, "COMBINE_INPUT_MAX_VEC4", 0)
    plain, plain_ops, _ = decode()
    combine = ("attention_decode", "attend_combine")
    assert plain_ops.count(combine) == cfg.n_layers and combine not in fused_ops
    assert [f for f in fused_ops if f != combine] == [f for f in plain_ops if f != combine]
    diff = np.abs(fused - plain).max()
    assert 0 < diff < 1e-3, diff              # the same sums in another order
    assert (fused.argmax(-1) == plain.argmax(-1)).all()


def test_decode_router_and_routing_ride_on_other_dispatches(dev, toy):
    """A one-token plan's MoE router matvec norms its input itself (K.NormInput: no norm_pair
    dispatch) and the top-k is one workgroup more in the dense down projection's dispatch
    (K.RouteTail: no route dispatch), with the logits of the chunk path (norm_pair, matmul, route),
    which prefill takes, and of the one-token plan without fusion (a route dispatch a layer)."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf

    def open_engine(chunk: int, fuse: bool = True):
        eng = Engine.open(read_gguf(toy("tiny-moe", "Q4_K")), device=dev, context_length=64, chunk=chunk,
                          int8=False)
        eng.runner.fuse_residual = fuse
        eng.runner._plans.clear()
        return eng

    eng = open_engine(1)
    ops = [op[1].key[:2] for op in eng.runner.layers_plan(1).ops if op[0] == "d"]
    moe_layers = sum(lc.has_moe for lc in eng.config.layers)
    assert moe_layers > 0 and ("norm", "norm_pair") not in ops and ("moe_route", "route") not in ops
    plain = open_engine(1, fuse=False)
    plain_ops = [op[1].key[:2] for op in plain.runner.layers_plan(1).ops if op[0] == "d"]
    assert plain_ops.count(("moe_route", "route")) == moe_layers
    decode = engine_logits(eng, TOKENS[:9])
    assert_logits_agree(decode, engine_logits(open_engine(9), TOKENS[:9]), atol=2e-2)
    assert_logits_agree(decode, engine_logits(plain, TOKENS[:9]), atol=2e-2)


def test_tensors_split_over_the_binding_limit(dev, toy, monkeypatch):
    """A 80 KiB binding limit splits token_embd (the tied head) and the FFN into row blocks."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    g = read_gguf(toy("tiny", "Q8_0"))
    whole = engine_logits(Engine.open(g, device=dev, context_length=32), TOKENS[:5])
    monkeypatch.setitem(dev.limits, "max_storage_buffer_binding_size", 80 << 10)
    eng = Engine.open(g, device=dev, context_length=32)
    layout = eng.runner.layout
    assert len(layout.token_embd.parts) > 3 and len(layout.layers[7].ffn_down.parts) > 1
    got = engine_logits(eng, TOKENS[:5])
    np.testing.assert_allclose(got, whole, atol=1e-5)
    assert_logits_agree(got, np.asarray(ReferenceModel(g).forward(TOKENS[:5])), atol=2e-2)


@pytest.mark.parametrize("shape,ple_in_file", [("tiny", True), ("tiny", False), ("tiny-moe", False)],
                         ids=["read-back-first", "decodes-ahead", "moe-decodes-ahead"])
def test_kv_cache_reuse_across_turns(dev, toy, shape, ple_in_file):
    """With the PLE table in the file each token is read back before its step; otherwise the GPU
    decodes ahead from its own sampled id. f32 throughout (int8=False): a reused cache runs the new
    tokens in other steps than a fresh prefill (one-token steps on int8 x vs chunks in f32), and the
    chaotic toys' greedy tokens would tell the roundings apart, not the caches."""
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    g = read_gguf(toy(shape, "Q8_0"))
    greedy = SamplingParams(temperature=0, max_tokens=6)
    eng = Engine.open(g, device=dev, context_length=64, chunk=4, ple_in_file=ple_in_file, int8=False)
    first = eng.generate(TOKENS[:5], greedy, stop_ids=())
    turn2 = TOKENS[:5] + first.tokens + [40, 41, 42]
    second = eng.generate(turn2, greedy, stop_ids=())
    assert second.cached_tokens == 5 + len(first.tokens) - 1   # the last sampled token was never fed
    assert second.prompt_tokens == len(turn2) - second.cached_tokens
    fresh = Engine.open(g, device=dev, context_length=64, chunk=4, int8=False).generate(turn2, greedy, stop_ids=())
    assert second.tokens == fresh.tokens
    # an edited history (diverging early) recomputes from the divergence, same result as fresh
    edited = TOKENS[:3] + [77, 78]
    assert eng.generate(edited, greedy, stop_ids=()).tokens == \
        Engine.open(g, device=dev, context_length=64, int8=False).generate(edited, greedy, stop_ids=()).tokens


def test_a_reply_that_retokenizes_differently_keeps_its_cache(dev):
    """The demo model's greedy reply re-tokenizes to other ids. Built from its text, the next prompt
    diverges at the reply, and rolling back that far overruns the sliding-window ring (chunk 4: 3
    slots to spare), so the whole conversation is computed again; built from the ids the reply was
    generated as (chat.reply_ids, what the page keeps), only the new turn is."""
    from pyapp.chat import render_ids, reply_ids
    from pyapp.engine import Engine, SamplingParams
    eng = Engine.open(str(FIXTURES / "demo.gguf"), device=dev, context_length=256, chunk=4)
    tok, greedy = eng.tokenizer, SamplingParams(temperature=0, max_tokens=24)
    conv, turn2 = [{"role": "user", "content": "Hi"}], [{"role": "user", "content": "more"}]
    prompt = render_ids(tok, conv)
    first = eng.generate(prompt, greedy)
    by_text = render_ids(tok, conv + [{"role": "assistant", "content": first.text}] + turn2)
    by_ids = render_ids(tok, conv + [{"role": "assistant", "content": first.text,
                                      **reply_ids(tok, prompt, first.tokens)}] + turn2)
    assert by_text != by_ids                                  # the reply re-tokenizes differently
    fed = len(prompt) + len(first.tokens) - 1                 # the last token (max_tokens) was never fed
    second = eng.generate(by_ids, greedy)
    assert second.cached_tokens == fed and second.prompt_tokens == len(by_ids) - fed
    eng.reset()
    eng.generate(prompt, greedy)
    assert eng.generate(by_text, greedy).cached_tokens == 0   # what re-tokenizing the text cost
    assert second.tokens == Engine.open(str(FIXTURES / "demo.gguf"), device=dev, context_length=256).generate(
        by_ids, greedy).tokens                                # and the kept cache computes the same reply


def test_stop_cancel_and_context_limits(dev, toy):
    from pyapp.engine import Engine, EngineError, SamplingParams
    from pyapp.gguf import read_gguf
    g = read_gguf(toy("tiny", "Q8_0"))
    eng = Engine.open(g, device=dev, context_length=16, chunk=4)
    greedy = SamplingParams(temperature=0, max_tokens=50)
    with pytest.raises(EngineError, match="does not fit the context of 16"):
        eng.generate(list(range(2, 20)), greedy)
    res = eng.generate(TOKENS[:4], greedy, stop_ids=())
    assert res.stop_reason == "context" and 4 + len(res.tokens) == 16
    free_run = eng.generate(TOKENS[:4], greedy, stop_ids=()).tokens
    res = eng.generate(TOKENS[:4], greedy, stop_ids={free_run[3]})
    assert res.stop_reason == "stop" and res.tokens == free_run[:free_run.index(free_run[3])]
    calls = []
    res = eng.generate(TOKENS[:4], greedy, stop_ids=(), should_stop=lambda: calls.append(1) or len(calls) >= 2)
    assert res.stop_reason == "cancelled" and len(res.tokens) == 2
    with pytest.raises(EngineError, match="outside the vocabulary"):
        eng.generate([2, 5000], greedy)
    with pytest.raises(EngineError, match="token id -1 is outside the vocabulary"):
        eng.forward([2, -1])


def test_prefill_reports_the_tokens_read_after_each_chunk(dev, toy):
    """on_prefill(done, total) once a chunk's GPU work is done (read one chunk late), for every chunk but
    the last; a prompt of one chunk reports nothing; the tokens are those of a generation without it.
    9 tokens: chunks of 4, 4 and 1, both mark buffers used (a chunk's step costs seconds on lavapipe)."""
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    eng = Engine.open(read_gguf(toy("tiny", "Q8_0")), device=dev, context_length=64, chunk=4)
    greedy = SamplingParams(temperature=0, max_tokens=3)
    prompt = TOKENS[:9]
    quiet = eng.generate(prompt, greedy, stop_ids=()).tokens
    eng.reset()
    seen = []
    res = eng.generate(prompt, greedy, stop_ids=(), on_prefill=lambda done, total: seen.append((done, total)))
    assert seen == [(4, 9), (8, 9)] and res.tokens == quiet
    eng.reset()
    seen.clear()
    assert eng.generate(prompt[:4], greedy, stop_ids=(), on_prefill=lambda *a: seen.append(a)).tokens and not seen
    # again, twice: the two mark buffers are used in turn, each unmapped after its read
    eng.reset()
    for _ in range(2):
        eng.generate(prompt, greedy, stop_ids=(), on_prefill=lambda *a: seen.append(a))
        eng.reset()
    assert seen == [(4, 9), (8, 9)] * 2


def test_seeded_sampling_is_reproducible(dev, toy):
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    eng = Engine.open(read_gguf(toy("tiny", "Q8_0")), device=dev, context_length=64)
    p = dict(temperature=1.0, top_k=40, top_p=0.95, max_tokens=12)
    a = eng.generate(TOKENS[:4], SamplingParams(seed=7, **p), stop_ids=()).tokens
    b = eng.generate(TOKENS[:4], SamplingParams(seed=7, **p), stop_ids=()).tokens
    c = eng.generate(TOKENS[:4], SamplingParams(seed=8, **p), stop_ids=()).tokens
    greedy = eng.generate(TOKENS[:4], SamplingParams(temperature=0, max_tokens=12), stop_ids=()).tokens
    assert a == b and len(a) == 12
    assert a != c or a != greedy


def test_unsupported_quant_type_is_a_clear_error(dev, toy):
    from pyapp.engine import Engine, EngineError
    from pyapp.gguf import read_gguf
    g = read_gguf(toy("tiny", "Q8_0"))
    t = g.tensors["blk.0.attn_q.weight"]
    g.tensors[t.name] = dataclasses.replace(t, type=16, nbytes=t.nbytes * 66 // 272)   # IQ2_XXS
    with pytest.raises(EngineError, match="IQ2_XXS.*no GPU kernel"):
        Engine.open(g, device=dev, context_length=16)


@pytest.fixture(scope="module", params=GOLDEN, ids=lambda p: p.stem)
def golden_engine(request, dev):
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    # f32 throughout (int8=False): the goldens hold within float rounding; int8 has its own tests
    return Engine.open(read_gguf(request.param), device=dev, context_length=128, chunk=16, int8=False), \
        np.load(request.param.with_suffix(".golden.npz"))


def test_fixtures_present():
    assert len(GOLDEN) >= 2, f"expected fixture models with golden outputs in {FIXTURES}"


# transformers' float32 logits vs our kernels: different summation order only
GOLDEN_ATOL = 2e-3


def test_golden_logits(golden_engine):
    eng, golden = golden_engine
    i = 0
    while f"tokens_{i}" in golden:
        want = golden[f"logits_{i}"]
        got = engine_logits(eng, golden[f"tokens_{i}"].tolist())
        diff = np.abs(got - want).max()
        assert diff < GOLDEN_ATOL, f"sequence {i}: max |gpu - transformers| = {diff:.2e}"
        assert (got.argmax(-1) == want.argmax(-1)).all()
        i += 1
    assert i >= 2


def test_golden_greedy_generation(golden_engine):
    from pyapp.engine import SamplingParams
    eng, golden = golden_engine
    want = golden["generate_0"].tolist()
    res = eng.generate(golden["tokens_0"].tolist(), SamplingParams(temperature=0, max_tokens=len(want)), stop_ids=())
    assert res.tokens == want


def test_engine_and_reference_return_the_same_type(dev, toy):
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    g = read_gguf(toy("tiny", "Q8_0"))
    got = Engine.open(g, device=dev, context_length=16).forward(TOKENS[:3])
    want = ReferenceModel(g).forward(TOKENS[:3])
    assert type(got) is type(want) and got.shape == want.shape == (3, 1000)
    assert got.argmax_row(-1) == want.argmax_row(-1)


def test_ple_table_in_the_file_or_on_the_gpu(dev, toy):
    """The per-layer embedding table read by rows from the file gives what the uploaded table gives;
    only the resident table lets a decode step start from the GPU's sampled id."""
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    g = read_gguf(toy("tiny", "Q8_0"))
    on_gpu = Engine.open(g, device=dev, context_length=64, chunk=4)
    in_file = Engine.open(g, device=dev, context_length=64, chunk=4, ple_in_file=True)
    assert on_gpu.runner.decodes_ahead and not in_file.runner.decodes_ahead
    np.testing.assert_allclose(engine_logits(in_file, TOKENS[:9]), engine_logits(on_gpu, TOKENS[:9]), atol=1e-5)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    assert in_file.generate(TOKENS[:5], greedy, stop_ids=()).tokens == \
        on_gpu.generate(TOKENS[:5], greedy, stop_ids=()).tokens


def test_prefill_steps_of_several_sizes(dev, toy, monkeypatch):
    """A 128-token chunk makes plans of 1, 64 and 128 tokens; each step takes the smallest that fits,
    and the logits are those of 25-token steps (6 steps: each costs seconds on lavapipe)."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    import importlib
    g = read_gguf(toy("tiny-moe", "Q8_0"))
    wide = Engine.open(g, device=dev, context_length=256, chunk=128, int8=False)    # f32 as the 7-token steps
    # the few-row matmuls whole, as the 25-token steps': their slices of K add in another order (3.5e-4 here;
    # test_f32_prefill_over_slices_of_k checks them)
    monkeypatch.setattr(importlib.import_module("pyapp.gpu.kernels.matmul"), "MATMUL_SPLIT_MIN_WORKGROUPS", 0)
    whole = Engine.open(g, device=dev, context_length=256, chunk=128, int8=False)
    assert wide.runner.step_sizes == [1, 64, 128] and wide.runner.step_size(20) == 64
    tokens = [(7 * i + 3) % 1000 for i in range(150)]          # steps of 128 and 22 tokens
    short = engine_logits(Engine.open(g, device=dev, context_length=256, chunk=25), tokens)
    np.testing.assert_allclose(engine_logits(whole, tokens), short, atol=2e-4)
    np.testing.assert_allclose(engine_logits(wide, tokens), short, atol=5e-4)
    assert any(op[0] == "d" and op[1].label == "matmul:main" and op[5] > 1
               for plan in wide.runner._plans[("layers", 128, False, False)] if hasattr(plan, "ops") for op in plan.ops)


def test_expert_tensors_split_over_the_binding_limit(dev, toy, monkeypatch):
    """A 300 KiB binding limit splits the experts (whole experts per buffer); logits are unchanged."""
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    g = read_gguf(toy("tiny-moe", "Q8_0"))
    whole = Engine.open(g, device=dev, context_length=32, chunk=4)
    want, want_tokens = engine_logits(whole, TOKENS[:6]), \
        whole.generate(TOKENS[:4], SamplingParams(temperature=0, max_tokens=8), stop_ids=()).tokens
    monkeypatch.setitem(dev.limits, "max_storage_buffer_binding_size", 300 << 10)
    split = Engine.open(g, device=dev, context_length=32, chunk=4)
    layer = split.runner.layout.layers[0]
    assert len(layer.experts_gate_up.parts) == 4 and len(layer.experts_down.parts) == 2
    np.testing.assert_allclose(engine_logits(split, TOKENS[:6]), want, atol=1e-5)
    assert split.generate(TOKENS[:4], SamplingParams(temperature=0, max_tokens=8), stop_ids=()).tokens == want_tokens
    from pyapp.engine import EngineError
    monkeypatch.setitem(dev.limits, "max_storage_buffer_binding_size", 100 << 10)
    with pytest.raises(EngineError, match="ffn_gate_up_exps.weight: one expert .* exceeds the GPU's binding limit"):
        Engine.open(g, device=dev, context_length=32, chunk=4)


def _pipelines(engine) -> set[str]:
    """Labels of every pipeline the engine's recorded plans dispatch."""
    from pyapp.gpu import Plan
    return {op[1].label for program in engine.runner._plans.values() if isinstance(program, list)
            for plan in program if isinstance(plan, Plan) for op in plan.ops if op[0] == "d"}


@pytest.mark.parametrize("model", ["fixture-dense", "fixture-dense-q6_k", "fixture-wide", "toy-moe-1-layer"])
def test_int8_prefill_within_its_rounding(dev, tmp_path, model):
    """A 90-token prompt runs in the 128-token plan, whose Q4_K / Q6_K matmuls (the dense ones and the
    grouped experts) take int8 activations (K.INT8_MIN_TOKENS), the dense down projections' rounded by the
    GeGLU's kernel (quantize_q8's geglu), the pre-norms' and the stream's by the residual adds
    (add_normed_q8, add_q8): logits within int8's rounding of the f32 reference and the same pick wherever
    the top two are 0.5 apart; int8=False keeps f32 matmuls, within float rounding. The MoE toy has one layer: deeper random-weight toys are chaotic (see the
    module's docstring), so int8's rounding says nothing there. The wide fixture has Gemma 4's head widths
    (256, 512): its prompt attention takes the wide tiles."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    if model.startswith("fixture-dense"):
        quant = model.removeprefix("fixture-dense").lstrip("-") or "q4_k"
        path, kernels = FIXTURES / f"gemma4-dense-{quant}.gguf", {"matmul_q8:main"}
    elif model == "fixture-wide":
        path, kernels = FIXTURES / "gemma4-wide-q4_k.gguf", {"matmul_q8:main", "attention_prefill_wide:main"}
    else:
        path, kernels = one_layer_toy(tmp_path, "tiny-moe", "Q4_K"), {"matmul_q8:main", "moe_grouped_q8:matmul"}
    g = read_gguf(path)
    tokens = [2] + np.random.default_rng(3).integers(3, 250, 89).tolist()
    want = np.asarray(ReferenceModel(g).forward(tokens))
    int8 = Engine.open(g, device=dev, context_length=128, chunk=128)
    f32 = Engine.open(g, device=dev, context_length=128, chunk=128, int8=False)
    assert kernels <= _pipelines(int8) and not {k for k in _pipelines(f32) if "q8" in k}
    from pyapp.gpu import Plan

    def chunk_kernels(engine):
        return [op[1].label for plan in engine.runner._plans[("layers", 128, False, False)]
                if isinstance(plan, Plan) for op in plan.ops if op[0] == "d"]
    # the GeGLUs round the down projections' input (quantized_geglu): the dense MLP's, and the experts'
    layers = int8.config.n_layers
    geglus = layers * (2 if model.startswith("toy-moe") else 1)
    assert "elementwise:geglu_halves" not in chunk_kernels(int8)
    assert chunk_kernels(f32).count("elementwise:geglu_halves") == geglus
    if model.startswith("fixture-"):
        # q, k and v round their x once (shared_quantized_inputs); the residual adds round the next pre-norm
        # for gate|up and for the next layer's q, k, v, and the stream for the per-layer-input gate
        # (quantized_norms)
        kernels = chunk_kernels(int8)
        assert kernels.count("norm:add_normed_q8") == 2 * layers - 1 and kernels.count("norm:add_q8") == layers
        assert kernels.count("quantize_q8:main") <= kernels.count("matmul_q8:main") - layers - (3 * layers - 1)
    np.testing.assert_allclose(engine_logits(f32, tokens), want, atol=1e-4)
    assert_within_rounding(engine_logits(int8, tokens), want, mean=(0, 0.06), median_max=0.3, gap=0.5, clear_rows=10)


@pytest.mark.parametrize("model", ["fixture-dense", "fixture-dense-q6_k", "fixture-dense-q8_0", "toy-dense-q4_0",
                                   "toy-dense-q5_0", "toy-moe-1-layer", "toy-moe-q4_0"])
def test_int8_decode_within_its_rounding(dev, tmp_path, model, monkeypatch):
    """One-token steps (chunk 1) multiply Q4_K weights by x rounded to int8 per 32 (matvec_q4k_x8.wgsl;
    the expert matvec too where the device has subgroups; Q6_K's units on a head's rows, here every
    Q6_K matrix with the row threshold lowered): logits within int8's rounding of the f32 reference,
    visibly off the f32 path (int8 ran), and the same pick wherever the top two are 0.5 apart;
    int8=False within float rounding. The toys' layers as in the prefill test above."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    from pyapp.gpu import kernels as K
    if model == "fixture-dense":
        path = FIXTURES / "gemma4-dense-q4_k.gguf"
    elif model == "fixture-dense-q6_k":
        path = FIXTURES / "gemma4-dense-q6_k.gguf"
        monkeypatch.setitem(K.INT8_UNIT_MIN_ROWS, K.ggml.Q6_K, 0)
    elif model == "fixture-dense-q8_0":             # Q8_0's int8 units, every matrix (as the browser path runs them)
        path = FIXTURES / "gemma4-dense-q8_0.gguf"
        monkeypatch.setattr(dev, "int8_block_units", True)
        monkeypatch.setitem(K.INT8_UNIT_MIN_ROWS, K.ggml.Q8_0, 0)
    elif model == "toy-dense-q4_0":                 # Q4_0's (QAT files)
        monkeypatch.setattr(dev, "int8_block_units", True)
        path = one_layer_toy(tmp_path, "tiny", "Q4_0")
    elif model == "toy-dense-q5_0":                 # Q5_0's (26B-A4B Q4_K_M's dense downs), every matrix
        monkeypatch.setattr(dev, "int8_block_units", True)
        monkeypatch.setitem(K.INT8_UNIT_MIN_ROWS, K.ggml.Q5_0, 0)
        path = one_layer_toy(tmp_path, "tiny", "Q5_0")
    elif model == "toy-moe-q4_0":                   # the experts' gate|up GeGLU and down on moe_x8.wgsl
        path = one_layer_toy(tmp_path, "tiny-moe", "Q4_0")
    else:
        path = one_layer_toy(tmp_path, "tiny-moe", "Q4_K")
    g = read_gguf(path)
    if model == "toy-moe-q4_0":
        eng = Engine.open(g, device=dev, context_length=64, chunk=1)
        experts = [op[1].key for op in eng.runner.layers_plan(1).ops if op[0] == "d" and "moe_x8" in op[1].label]
        assert sorted(dict(key[3])["GEGLU"] for key in experts) == [False, True]      # gate|up, then down
    tokens = [2] + np.random.default_rng(4).integers(3, 250, 39).tolist()
    want = np.asarray(ReferenceModel(g).forward(tokens))
    f32 = engine_logits(Engine.open(g, device=dev, context_length=64, chunk=1, int8=False), tokens)
    np.testing.assert_allclose(f32, want, atol=1e-4)
    got = engine_logits(Engine.open(g, device=dev, context_length=64, chunk=1), tokens)
    assert_within_rounding(got, want, mean=(1e-3, 0.06), median_max=0.3, gap=0.5, clear_rows=5)


@pytest.mark.parametrize("model", ["fixture-dense", "fixture-dense-q8_0", "toy-moe-1-layer"])
def test_decode_down_projection_reads_the_geglu_output_rounded_once(dev, tmp_path, model, monkeypatch):
    """A one-token step's gate|up matvec writes the GeGLU output rounded to int8 as well
    (shaders/matvec_out_q8.wgsl) and the down projection reads those codes (x8_stored.wgsl) instead of
    rounding it in each workgroup: one rounding a layer, in every layer whose dense MLP down takes them
    (Q4_K; Q8_0 with the browser's int8 units, as the Q8_0 fixture runs here); the same codes, so the logits
    of the plan where down rounds x itself (its sums in another order: float rounding, which a later
    rounding to int8 can carry a code further) and within int8's rounding of the f32 reference
    (test_int8_decode_within_its_rounding's bounds)."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.gpu import kernels as K
    from pyapp.reference.forward import ReferenceModel
    import importlib
    monkeypatch.setattr(importlib.import_module("pyapp.gpu.kernels.matvec"), "ROUND_OUT_MIN_ROWS", 0)  # toy widths
    if model == "fixture-dense-q8_0":
        monkeypatch.setattr(dev, "int8_block_units", True)
        monkeypatch.setitem(K.INT8_UNIT_MIN_ROWS, K.ggml.Q8_0, 0)
        path = FIXTURES / "gemma4-dense-q8_0.gguf"
    else:
        path = FIXTURES / "gemma4-dense-q4_k.gguf" if model == "fixture-dense" else one_layer_toy(tmp_path, "tiny-moe", "Q4_K")
    g = read_gguf(path)
    tokens = [2] + np.random.default_rng(4).integers(3, 250, 39).tolist()

    def decode():
        eng = Engine.open(g, device=dev, context_length=64, chunk=1)
        keys = [op[1].key for op in eng.runner.layers_plan(1).ops if op[0] == "d"]
        return engine_logits(eng, tokens), keys, eng.config
    rounded, keys, cfg = decode()
    downs = [t.type for name, t in g.tensors.items() if name.endswith("ffn_down.weight")]
    rounded_downs = sum(K.int8_rounded_matvec(dev, t) for t in downs)
    assert rounded_downs >= 1          # (the Q4_K fixture's first two layers' are Q8_0: natively f32 x)
    if model == "fixture-dense-q8_0":
        assert rounded_downs == len(downs) and all(t == K.ggml.Q8_0 for t in downs)
    assert sum("matvec_out_q8" in key[2] for key in keys) == rounded_downs
    assert sum("x8_stored" in key[2] for key in keys) == rounded_downs
    monkeypatch.setattr(K, "int8_rounded_matvec", lambda dev, qtype: False)
    itself, plain_keys, _ = decode()
    assert not any("matvec_out_q8" in key[2] or "x8_stored" in key[2] for key in plain_keys)
    assert len(plain_keys) == len(keys)
    want = np.asarray(ReferenceModel(g).forward(tokens))
    for got in (rounded, itself):
        assert_within_rounding(got, want, mean=(1e-3, 0.06), median_max=0.3, gap=0.5, clear_rows=5)
    assert np.median(np.abs(rounded - itself).max(-1)) < 0.1


@pytest.mark.parametrize("model", ["fixture-dense-q6_k", "toy-moe-1-layer"])
def test_f16_tiles_within_their_rounding(dev, tmp_path, model):
    """f16=True where the device has shader-f16: a prefill in 16-token steps (the int8 path's minimum
    not reached) runs its matmuls (the dense ones and the grouped experts) in f16 tiles, and the logits
    stay within f16's rounding of the f32 reference, the same pick wherever the top two are 0.2 apart;
    the default (f16=False) keeps f32 tiles, within float rounding."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    if not dev.has_f16:
        pytest.skip("device has no shader-f16")
    if model == "fixture-dense-q6_k":
        path = FIXTURES / "gemma4-dense-q6_k.gguf"
    else:
        path = one_layer_toy(tmp_path, "tiny-moe", "Q5_K")
    g = read_gguf(path)
    tokens = [2] + np.random.default_rng(4).integers(3, 250, 47).tolist()
    want = np.asarray(ReferenceModel(g).forward(tokens))
    f16 = Engine.open(g, device=dev, context_length=64, chunk=16, f16=True)
    f32 = Engine.open(g, device=dev, context_length=64, chunk=16)
    halves = {op[1].label for program in f16.runner._plans.values() if isinstance(program, list)
              for plan in program if hasattr(plan, "ops") for op in plan.ops
              if op[0] == "d" and "alias MM_S = f16" in op[1].key[2]}
    assert halves >= ({"matmul:main", "moe_grouped:matmul"} if g.metadata.get("gemma4.expert_count") else {"matmul:main"})
    np.testing.assert_allclose(engine_logits(f32, tokens), want, atol=1e-4)
    assert_within_rounding(engine_logits(f16, tokens), want, mean=(1e-5, 0.02), median_max=0.1, gap=0.2, clear_rows=10)


@pytest.mark.parametrize("form,qtype", [("ollama-dense-published", "Q4_K"), ("ollama-dense-published", "Q4_0"),
                                        ("llamacpp-dense-fused-qkv", None)])
def test_int8_paths_on_the_files_people_have(dev, tmp_path, form, qtype, monkeypatch):
    """The int8 paths on the forms users' files come in, not only our generator's: Ollama's published
    blob form quantized as its library ships it (tools/make_fixtures.requantize: Q4_K with Q8_0 where a row
    is not whole 256-blocks, as llama.cpp's quantizer falls back; Q4_0, the QAT tags' form) and llama.cpp's
    converter's fused q|k|v in Q8_0. A 90-token prompt in the 128-token plan (int8 matmuls, the residual adds'
    and the GeGLU's roundings) and one-token steps on int8 x (the browser path's rule for 32-weight blocks,
    every matrix, the GeGLU's rows rounded for the down projection): logits within int8's rounding of the f32
    reference (test_int8_prefill_within_its_rounding's and test_int8_decode_within_its_rounding's bounds) and
    visibly off it (int8 ran); the f32 engine within float rounding."""
    import importlib
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.gpu import kernels as K
    from pyapp.reference.forward import ReferenceModel
    path = FIXTURES / "forms" / f"{form}.gguf"
    if qtype is not None:
        load_tool("make_fixtures").requantize(path, qtype, tmp_path / f"{form}-{qtype}.gguf")
        path = tmp_path / f"{form}-{qtype}.gguf"
    g = read_gguf(path)
    types = {t.type for t in g.tensors.values() if len(t.shape) == 2}
    assert types >= ({K.ggml.Q4_K, K.ggml.Q8_0} if qtype == "Q4_K" else {K.ggml.Q4_0} if qtype else {K.ggml.Q8_0})
    tokens = [2] + np.random.default_rng(3).integers(3, 250, 89).tolist()
    want = np.asarray(ReferenceModel(g).forward(tokens))
    f32 = Engine.open(g, device=dev, context_length=128, chunk=128, int8=False)
    np.testing.assert_allclose(engine_logits(f32, tokens), want, atol=1e-4)
    prefill = Engine.open(g, device=dev, context_length=128, chunk=128)
    assert "matmul_q8:main" in _pipelines(prefill) and "norm:add_normed_q8" in _pipelines(prefill)
    assert_within_rounding(engine_logits(prefill, tokens), want, mean=(1e-3, 0.06), median_max=0.3, gap=0.5,
                           clear_rows=10)
    monkeypatch.setattr(dev, "int8_block_units", True)
    monkeypatch.setitem(K.INT8_UNIT_MIN_ROWS, K.ggml.Q8_0, 0)
    monkeypatch.setattr(importlib.import_module("pyapp.gpu.kernels.matvec"), "ROUND_OUT_MIN_ROWS", 0)  # toy widths
    decode = Engine.open(g, device=dev, context_length=128, chunk=1)
    keys = [op[1].key for op in decode.runner.layers_plan(1).ops if op[0] == "d"]
    assert any("x8_stored" in key[2] for key in keys) and any("x8_round" in key[2] for key in keys)
    assert_within_rounding(engine_logits(decode, tokens), want, mean=(1e-3, 0.06), median_max=0.3, gap=0.5,
                           clear_rows=5)


def test_f32_prefill_over_slices_of_k(dev, monkeypatch):
    """A chunk's f32 matmuls on the few-rows tile over slices of K (K.matmul_split_for; the minimum slice
    lowered from E2B's sizes to the fixture's): the slices added (sum_slices, or the residual add after the
    projection: fusion.sums_in_norms), the state's buffer the largest
    split's, the logits those of the unsplit plan up to float rounding and the reference's."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.gpu import kernels as K
    from pyapp.reference.forward import ReferenceModel
    g = read_gguf(FIXTURES / "gemma4-dense-q4_k.gguf")
    tokens = [2] + np.random.default_rng(7).integers(3, 250, 89).tolist()
    whole = Engine.open(g, device=dev, context_length=128, chunk=128, int8=False)
    import importlib
    monkeypatch.setattr(importlib.import_module("pyapp.gpu.kernels.matmul"), "MATMUL_SLICE_MIN_K", 32)
    sliced = Engine.open(g, device=dev, context_length=128, chunk=128, int8=False)
    got = engine_logits(sliced, tokens)
    ops = [op for plan in sliced.runner._plans[("layers", 128, False, False)] if hasattr(plan, "ops")
           for op in plan.ops if op[0] == "d"]
    split = [op for op in ops if op[1].label == "matmul:main" and op[5] > 1]
    assert split and "sum_slices:main" in {op[1].label for op in ops}
    assert all(op[3] * op[4] < K.MATMUL_SPLIT_MIN_WORKGROUPS for op in split)     # the tile's few workgroups
    floats = max(op[5] * 128 * op[2].values[1] for op in split)      # the matmul's (K, N, LDY, SPLIT)
    assert sliced.runner.state.matmul_partials.size >= 4 * floats
    np.testing.assert_allclose(got, engine_logits(whole, tokens), atol=1e-4)
    np.testing.assert_allclose(got, np.asarray(ReferenceModel(g).forward(tokens)), atol=2e-3)


def test_int8_prefill_over_slices_of_k(dev, monkeypatch):
    """A chunk's int8 matmuls over slices of K (K.q8_tile_split; here every one the fixture's 256-wide rows
    allow, the minimum slice lowered from E2B's sizes to the fixture's): the slices added by sum_slices, or
    by the residual add right after the projection (the o and down projections: fusion.sums_in_norms), the
    same logits either way; the logits those of the unsplit plan up to float rounding (the slices' sums in
    another order; a later rounding to int8 can carry a code further) and within int8's rounding of the
    reference."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    g = read_gguf(FIXTURES / "gemma4-dense-q4_k.gguf")
    tokens = [2] + np.random.default_rng(5).integers(3, 250, 89).tolist()
    whole = Engine.open(g, device=dev, context_length=128, chunk=128)
    assert "sum_slices:main" not in _pipelines(whole)
    import importlib
    monkeypatch.setattr(importlib.import_module("pyapp.gpu.kernels.matmul"), "Q8_SLICE_MIN_K", 64)
    sliced = Engine.open(g, device=dev, context_length=128, chunk=128)
    got = engine_logits(sliced, tokens)
    ops = [op for plan in sliced.runner._plans[("layers", 128, False, False)] if hasattr(plan, "ops")
           for op in plan.ops if op[0] == "d"]
    split_floats = [op[5] * 128 * op[2].values[1] for op in ops            # the matmul's (K, N, LDY, SPLIT)
                    if op[1].label == "matmul_q8:main" and op[5] > 1]
    summed_in_adds = sum(op[1].label.startswith("norm:add") and dict(op[1].key[3])["XSPLIT"] > 1 for op in ops)
    assert summed_in_adds >= sliced.config.n_layers                        # the downs at least
    assert [op[1].label for op in ops].count("sum_slices:main") + summed_in_adds == len(split_floats)
    monkeypatch.setattr(importlib.import_module("pyapp.runtime.fusion"), "sums_in_norms", lambda ops: ops)
    by_sums = Engine.open(g, device=dev, context_length=128, chunk=128)
    np.testing.assert_allclose(got, engine_logits(by_sums, tokens), rtol=0, atol=1e-6)
    # the state holds the partial sums of the largest split matmul, and no more (none where none splits)
    assert sliced.runner.state.matmul_partials.size == 4 * max(split_floats) and whole.runner.state.matmul_partials is None
    want = np.asarray(ReferenceModel(g).forward(tokens))
    assert_within_rounding(got, want, mean=(0, 0.06), median_max=0.3, gap=0.5, clear_rows=10)
    assert np.median(np.abs(got - engine_logits(whole, tokens)).max(-1)) < 0.05


def test_int8_prefill_on_split_tensors(dev, monkeypatch):
    """Row blocks of a tensor over the binding limit share one quantization of their input and write their
    columns of the output: the same logits as the unsplit tensors on the int8 path."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    g = read_gguf(FIXTURES / "gemma4-dense-q4_k.gguf")
    tokens = [2] + np.random.default_rng(5).integers(3, 250, 89).tolist()
    whole = engine_logits(Engine.open(g, device=dev, context_length=128, chunk=128), tokens)
    monkeypatch.setitem(dev.limits, "max_storage_buffer_binding_size", 32 << 10)    # the FFN's 36 KiB split
    split = Engine.open(g, device=dev, context_length=128, chunk=128)
    assert any(len(lw.ffn_up.parts) > 1 for lw in split.runner.layout.layers if lw.ffn_up is not None)
    assert "matmul_q8:main" in _pipelines(split)
    np.testing.assert_allclose(engine_logits(split, tokens), whole, atol=1e-5)


def test_a_load_waits_for_its_gpu_programs(dev, monkeypatch):
    """A load's last step waits for every GPU program its plans made (the browser's GPU process compiles them
    after the calls that made them return: the load, not the first reply, waits), reporting compiling(done,
    made) as the device does; a load cancelled during that wait ends as cancelled."""
    from pyapp.engine import Engine, EngineError, SamplingParams
    from pyapp.gguf import read_gguf
    g = read_gguf(FIXTURES / "gemma4-dense-q8_0.gguf")
    waits, seen = [], []

    def ready(progress=None, cancelled=None):
        waits.append(len(dev._pipelines))            # the programs made by then
        progress(len(dev._pipelines) - 1, len(dev._pipelines))
    monkeypatch.setattr(dev, "programs_ready", ready)
    eng = Engine.open(g, device=dev, context_length=96, compiling=lambda done, made: seen.append((done, made)))
    assert waits == [len(dev._pipelines)] and len(waits) == 1 and waits[0] > 10     # after the plans, once
    assert seen == [(waits[0] - 1, waits[0])]
    assert len(eng.generate([2, 10, 11], SamplingParams(temperature=0, max_tokens=2), stop_ids=()).tokens) == 2

    cancel = []
    monkeypatch.setattr(dev, "programs_ready", lambda progress=None, cancelled=None: cancel.append(True))
    with pytest.raises(EngineError, match="loading cancelled"):
        Engine.open(g, device=dev, context_length=96, cancelled=lambda: bool(cancel))
