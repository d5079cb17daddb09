"""Experts streamed from the file (issue 10): the memory plan, the expert cache, and logits that do
not change when experts stream.

The MoE fixtures (4 experts, 2 used per token) run with every expert resident and with a cache of
2 or 3 experts per layer, so decode evicts and a prefill chunk needs more experts than the cache
holds (rounds): both must give transformers' logits and the same greedy tokens.
"""

from __future__ import annotations


import numpy as np
import pytest

from support.paths import ROOT

MOE = [ROOT / "tests" / "fixtures" / f"gemma4-moe-{q}.gguf" for q in ("f32", "q8_0")]
GOLDEN_ATOL = 2e-3          # as tests/test_engine.py: transformers' f32 logits vs our kernels
LIMITS = {"max_storage_buffer_binding_size": 128 << 20, "max_buffer_size": 256 << 20}


def _bound(path):
    from pyapp.gguf import read_gguf
    from pyapp.model.config import Gemma4Config
    from pyapp.model.weights import bind
    g = read_gguf(path)
    cfg = Gemma4Config.from_gguf(g)
    return g, cfg, bind(cfg, g.tensors)


# -- the plan (no GPU) ---------------------------------------------------------------------

def test_plan_without_a_budget_keeps_everything_resident():
    from pyapp.runtime.memory import plan_memory
    g, cfg, bound = _bound(MOE[1])
    plan = plan_memory(LIMITS, cfg, bound, 64, 16)
    experts = sum(t.nbytes for n, t in g.tensors.items() if "_exps." in n and n.endswith(".weight"))
    assert not plan.streams and plan.experts == experts and plan.read_per_token == 0
    assert plan.expert_each * cfg.n_experts == experts
    assert plan.total == plan.weights + plan.state + experts


def test_plan_counts_the_buffers_of_the_runner_it_plans_for(monkeypatch):
    """--no-int8: the plan counts the state a runner without int8 activations allocates (the slices' partial
    sums follow the f32 tiles' split then), from Engine.plan (the CLI's `info`) down to the state class."""
    from pyapp.engine import Engine, loading
    from pyapp.gguf import read_gguf
    from pyapp.runtime.memory import plan_memory
    from pyapp.runtime.state import State
    path = ROOT / "tests" / "fixtures" / "gemma4-dense-q8_0.gguf"
    _, cfg, bound = _bound(path)
    seen = []

    class Spy(State):
        def __init__(self, *args, int8=True, **kw):
            seen.append(int8)
            super().__init__(*args, int8=int8, **kw)

    plan_memory(LIMITS, cfg, bound, 256, 128, state_class=Spy, int8=False)
    plan_memory(LIMITS, cfg, bound, 256, 128, state_class=Spy)
    assert seen == [False, True]
    asked = []
    real = loading.plan_memory
    monkeypatch.setattr(loading, "plan_memory", lambda *a, **kw: asked.append(kw["int8"]) or real(*a, **kw))
    Engine.plan(read_gguf(path), LIMITS, 256, chunk=128, int8=False)
    Engine.plan(read_gguf(path), LIMITS, 256, chunk=128)
    assert asked == [False, True]


def test_plan_streams_experts_within_a_budget():
    from pyapp.runtime.memory import plan_memory
    _, cfg, bound = _bound(MOE[1])
    whole = plan_memory(LIMITS, cfg, bound, 64, 16)
    budget = whole.minimum + whole.expert_each          # room for 3 of 4 experts per layer
    plan = plan_memory(LIMITS, cfg, bound, 64, 16, gpu_memory=budget)
    assert plan.slots == 3 and plan.total <= budget
    assert plan.read_per_token == pytest.approx(2 * plan.expert_each * (1 - 3 / 4))
    text = "\n".join(plan.describe())
    assert "3 of 4 per layer cached" in text and "tokens/s" in text
    assert plan_memory(LIMITS, cfg, bound, 64, 16, gpu_memory=whole.total).slots is None


def test_plan_refuses_a_budget_below_the_minimum_with_the_numbers():
    from pyapp.runtime.memory import PlanError, plan_memory
    _, cfg, bound = _bound(MOE[1])
    need = plan_memory(LIMITS, cfg, bound, 64, 16).minimum
    with pytest.raises(PlanError, match=r"needs at least .* MiB of GPU memory .*2 experts per layer.* budget is"):
        plan_memory(LIMITS, cfg, bound, 64, 16, gpu_memory=need - 1)
    with pytest.raises(PlanError, match="holds 1 experts per layer; a token needs 2"):
        plan_memory(LIMITS, cfg, bound, 64, 16, expert_cache=plan_memory(LIMITS, cfg, bound, 64, 16).expert_each)


def test_plan_moves_the_ple_table_to_the_file_when_the_budget_needs_it():
    from pyapp.runtime.memory import PlanError, plan_memory
    _, cfg, bound = _bound(ROOT / "tests" / "fixtures" / "gemma4-dense-q8_0.gguf")
    whole = plan_memory(LIMITS, cfg, bound, 64, 16)
    assert whole.ple_table > 0 and not whole.ple_in_file
    assert not plan_memory(LIMITS, cfg, bound, 64, 16, gpu_memory=whole.total).ple_in_file
    tight = plan_memory(LIMITS, cfg, bound, 64, 16, gpu_memory=whole.total - 1)
    assert tight.ple_in_file and tight.total == whole.total - whole.ple_table
    with pytest.raises(PlanError, match="needs at least"):
        plan_memory(LIMITS, cfg, bound, 64, 16, gpu_memory=tight.total - 1)


def test_cache_rounds_evict_least_recently_used_and_cover_every_expert_once():
    from pyapp.runtime.experts import ExpertCache
    from collections import OrderedDict
    cache = ExpertCache.__new__(ExpertCache)         # the policy alone, without a GPU
    cache.slots, cache.resident, cache.hits, cache.misses = 3, {0: OrderedDict()}, 0, 0
    assert list(cache.rounds(0, [5, 1, 5, 2])) == [({5: 0, 1: 1, 2: 2}, [(5, 0), (1, 1), (2, 2)])]
    # 1 and 2 are cached: they come first; 7 takes the slot of the least recently used (5)
    (slot_of, copies), = cache.rounds(0, [7, 2, 1])
    assert slot_of == {2: 2, 1: 1, 7: 0} and copies == [(7, 0)]
    # five distinct experts, three slots: two rounds, each expert in exactly one
    rounds = list(cache.rounds(0, [9, 1, 8, 7, 2, 9]))
    assert [len(s) for s, _ in rounds] == [3, 2]
    assert sorted(e for s, _ in rounds for e in s) == [1, 2, 7, 8, 9]
    assert rounds[0][1] == [] and len(rounds[1][1]) == 2     # the cached 1, 7, 2 first, without reads
    assert cache.hits == 0 + 2 + 3 and cache.misses == 3 + 1 + 2


# -- on the GPU -----------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("path", MOE, ids=lambda p: p.stem)
@pytest.mark.parametrize("slots", [2, 3])
def test_streamed_experts_give_the_golden_logits_and_tokens(dev, path, slots):
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    from pyapp.runtime.memory import MIB, plan_memory
    golden = np.load(path.with_suffix(".golden.npz"))
    g, cfg, bound = _bound(path)
    each = plan_memory(dev.limits, cfg, bound, 128, 16).expert_each
    eng = Engine.open(read_gguf(path), device=dev, context_length=128, chunk=16,
                      expert_cache_mib=(slots * each + 64) / MIB)
    assert eng.memory_plan.slots == slots and eng.runner.experts.slots == slots
    for i in range(2):
        tokens = golden[f"tokens_{i}"].tolist()
        got = np.asarray(eng.forward(tokens))
        diff = np.abs(got - golden[f"logits_{i}"]).max()
        assert diff < GOLDEN_ATOL, f"sequence {i}: max |streamed - transformers| = {diff:.2e}"
        assert (got.argmax(-1) == golden[f"logits_{i}"].argmax(-1)).all()
    want = golden["generate_0"].tolist()
    res = eng.generate(golden["tokens_0"].tolist(), SamplingParams(temperature=0, max_tokens=len(want)), stop_ids=())
    assert res.tokens == want
    stats = eng.runner.experts.stats()
    per_layer = each // sum(lc.has_moe for lc in cfg.layers)       # one expert of one layer
    assert stats["expert_misses"] > 0 and stats["expert_bytes_read"] == stats["expert_misses"] * per_layer


@pytest.mark.gpu
def test_the_browser_driver_asks_for_a_rounds_copies_at_once_and_gives_the_same_tokens(dev, monkeypatch):
    """drive_async (the page's driver) gets every copy of a round in one FilesToGpu request, which the
    browser's device reads all at once; the greedy tokens are transformers' and the counts say what
    decoding waited for and copied."""
    import asyncio
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.runtime.memory import MIB, plan_memory
    from pyapp.sampling import SamplingParams
    path = MOE[1]
    golden = np.load(path.with_suffix(".golden.npz"))
    g, cfg, bound = _bound(path)
    each = plan_memory(dev.limits, cfg, bound, 128, 16).expert_each
    upload_many = dev.upload_many_async
    asked = []

    async def upload_many_counted(source, copies):
        asked.append(len(copies))
        return await upload_many(source, copies)

    async def run():
        eng = await Engine.open_async(read_gguf(path), dev, context_length=128, chunk=16,
                                      expert_cache_mib=(2 * each + 64) / MIB)
        monkeypatch.setattr(dev, "upload_many_async", upload_many_counted)
        before = eng.expert_counts()
        res = await eng.generate_async(golden["tokens_0"].tolist(),
                                       SamplingParams(temperature=0, max_tokens=len(golden["generate_0"])),
                                       stop_ids=())
        return eng, res, eng.expert_counts().since(before)

    eng, res, counts = asyncio.run(run())
    assert res.tokens == golden["generate_0"].tolist()
    tensors = len(next(iter(eng.runner.experts.tensors.values())))     # an expert's tensors: a copy each
    assert all(n % tensors == 0 for n in asked) and sum(asked) == counts.misses * tensors
    assert max(asked) == 2 * tensors                # the prompt's rounds copy both slots' experts at once
    assert counts.bytes_read == counts.misses * each // sum(lc.has_moe for lc in cfg.layers)
    assert counts.wait_s > 0 and counts.copy_s > 0


@pytest.mark.gpu
def test_a_prefill_chunk_reads_each_expert_at_most_once(dev):
    """16 tokens route to all 4 experts; a cache of 2 serves them in two rounds, 4 reads per layer."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.runtime.memory import MIB, plan_memory
    g, cfg, bound = _bound(MOE[1])
    each = plan_memory(dev.limits, cfg, bound, 64, 16).expert_each
    eng = Engine.open(read_gguf(MOE[1]), device=dev, context_length=64, chunk=16, expert_cache_mib=2 * each / MIB)
    assert eng.runner.experts.slots == 2
    eng.forward(list(range(2, 18)))              # one chunk of 16 tokens
    moe_layers = sum(lc.has_moe for lc in cfg.layers)
    stats = eng.runner.experts.stats()
    assert stats["expert_hits"] == 0           # a cold cache
    assert 3 * moe_layers <= stats["expert_misses"] <= cfg.n_experts * moe_layers   # > slots, each at most once


@pytest.mark.gpu
def test_engine_refuses_a_budget_below_the_minimum_before_uploading(dev):
    from pyapp.engine import Engine, EngineError
    from pyapp.gguf import read_gguf
    with pytest.raises(EngineError, match=r"needs at least .* of GPU memory"):
        Engine.open(read_gguf(MOE[1]), device=dev, context_length=64, gpu_memory_mib=1)


def test_cli_shows_the_plan_and_refuses_a_small_budget(capsys):
    from pyapp.__main__ import main
    assert main(["info", str(MOE[1]), "--expert-cache", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "2 of 4 per layer cached on the GPU" in out
    assert main(["info", str(MOE[1]), "--gpu-memory", "1"]) == 0
    assert "needs at least" in capsys.readouterr().out
