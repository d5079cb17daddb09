"""Prompt steps: how a prompt is cut into steps, the long step a long context takes where the memory plan has
room for it, and prompts read in long steps giving the logits of the usual ones."""

from __future__ import annotations

import numpy as np
import pytest

from support.paths import ROOT

FIX = ROOT / "tests" / "fixtures"
LIMITS = {"max_storage_buffer_binding_size": 128 << 20, "max_buffer_size": 256 << 20}


def steps(n, chunk, sizes, runs=(), whole=False):
    from pyapp.runtime.soft_tokens import step_bounds
    return [end - start for start, end in step_bounds(n, chunk, 0, runs, whole, sizes)]


def test_a_long_prompt_takes_the_widest_step_it_fills_and_its_tail_the_usual_ones():
    assert steps(16000, 2048, (2048, 512)) == [2048] * 7 + [512] * 3 + [128]
    assert steps(2048, 2048, (2048, 512)) == [2048]
    assert steps(2047, 2048, (2048, 512)) == [512] * 3 + [511]
    assert steps(600, 2048, (2048, 512)) == [512, 88]
    assert steps(30, 2048, (2048, 512)) == [30]                  # fewer than any: one step (the 64-token plan)
    assert steps(4000, 4096, (4096, 2048, 512)) == [2048, 512, 512, 512, 416]   # a step chosen over 2048
    assert steps(1300, 512, (512,)) == [512, 512, 276]          # one size: steps of up to chunk, as before
    assert steps(100, 64, (64,)) == [64, 36]


def test_an_image_seen_both_ways_keeps_to_the_widest_step():
    from pyapp.runtime.soft_tokens import SoftRun
    image = SoftRun(at=300, rows=None, n=1000, key="image")
    assert steps(1400, 2048, (2048, 512), [image], whole=True) == [1400]
    assert steps(3000, 2048, (2048, 512), [image], whole=True) == [2048, 952]


def _plan(path, context, limits=LIMITS, **kw):
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    return Engine.plan(read_gguf(path), limits, context, **kw)


def test_a_long_context_takes_long_steps_where_the_budget_has_room():
    from pyapp.engine import DEFAULT_CHUNK, LONG_STEP
    dense = FIX / "gemma4-dense-q4_k.gguf"
    wide = _plan(dense, 4096)
    narrow = _plan(dense, 4096, chunk=DEFAULT_CHUNK)
    assert (wide.prompt_step, narrow.prompt_step) == (LONG_STEP, DEFAULT_CHUNK)
    assert wide.state > narrow.state and wide.weights == narrow.weights
    assert "prompt steps of up to 2048 tokens" in "\n".join(wide.describe())
    assert _plan(dense, LONG_STEP).prompt_step == DEFAULT_CHUNK            # no prompt that long fits
    assert _plan(dense, 4096, chunk=1024).prompt_step == 1024              # the user's step, as chosen
    mib = 1 / 2**20
    assert _plan(dense, 4096, gpu_memory_mib=wide.total * mib).prompt_step == LONG_STEP
    between = (narrow.total + wide.total) / 2 * mib
    assert _plan(dense, 4096, gpu_memory_mib=between).prompt_step == DEFAULT_CHUNK


def test_long_steps_need_no_buffer_past_what_the_device_allows():
    """Where the long step's largest activation buffer would exceed the device's largest buffer, or the most it
    binds at once, the usual step stays (the plan does not fail)."""
    from pyapp.engine import DEFAULT_CHUNK, LONG_STEP
    dense = FIX / "gemma4-dense-q4_k.gguf"
    wide, narrow = _plan(dense, 4096), _plan(dense, 4096, chunk=DEFAULT_CHUNK)
    assert wide.prompt_step == LONG_STEP and wide.largest_state_buffer > narrow.largest_state_buffer
    between = (wide.largest_state_buffer + narrow.largest_state_buffer) // 2
    for limit in ("max_buffer_size", "max_storage_buffer_binding_size"):
        limits = dict(LIMITS, **{limit: between})
        assert _plan(dense, 4096, limits=limits).prompt_step == DEFAULT_CHUNK, limit


def test_long_steps_move_nothing_else_off_the_gpu():
    """Where the long step's activations would push experts out of their cache, the usual step stays."""
    from pyapp.engine import LONG_STEP
    moe = FIX / "gemma4-moe-q8_0.gguf"
    usual = _plan(moe, LONG_STEP).prompt_step                   # 1120: a 26B-A4B-like model's whole image
    wide = _plan(moe, 4096, chunk=LONG_STEP)
    narrow = _plan(moe, 4096, chunk=usual)
    assert wide.state - narrow.state > wide.expert_each        # the difference would take a cached expert
    budget = (wide.total - wide.expert_each / 2) / 2**20         # room for the usual step, every expert resident
    plan = _plan(moe, 4096, gpu_memory_mib=budget)
    assert plan.prompt_step == usual < LONG_STEP and not plan.streams
    assert _plan(moe, 4096, chunk=LONG_STEP, gpu_memory_mib=budget).slots == plan.n_experts - 1


@pytest.mark.gpu
def test_a_prompt_read_in_long_steps_gives_the_usual_steps_logits():
    """A 1,100-token prompt: one step of 1024 and one of 76 in a plan whose long step is 1024 (the steps of
    LONG_STEP = 2048 are made the same way, for twice the test's time), three steps of up to 512 in the usual one;
    the last token's logits agree within float rounding (int8 activations in both: rounded by token). Progress
    after each step but the last, also for a prompt of 600 tokens (steps of 512 under a 1024 chunk)."""
    from pyapp.engine import DEFAULT_CHUNK, Engine
    from pyapp.engine.decode import prefill
    from pyapp.gguf import read_gguf
    prompt = [2] + np.random.default_rng(7).integers(3, 250, 1099).tolist()
    last = {}
    for chunk in (1024, DEFAULT_CHUNK):
        eng = Engine.open(read_gguf(FIX / "gemma4-dense-q4_k.gguf"), context_length=2048, chunk=chunk)
        assert eng.runner.prompt_steps == ((1024, 512) if chunk == 1024 else (512,))
        fed = []
        run_layers = eng.runner.run_layers
        eng.runner.run_layers = lambda n, **kw: fed.append(n) or run_layers(n, **kw)
        seen = []
        row = eng.drive(prefill(eng, prompt, 0, on_prefill=lambda done, total: seen.append(done)))
        last[chunk] = np.frombuffer(eng.drive(eng.runner.logits(row)), np.float32)
        assert fed == ([1024, 76] if chunk == 1024 else [512, 512, 76])
        assert seen == ([1024] if chunk == 1024 else [512, 1024])    # after each step but the last
        if chunk == 1024:            # a prompt within the long step but past the usual one: its steps reported
            fed.clear()
            seen.clear()
            eng.reset()
            eng.drive(prefill(eng, prompt[:600], 0, on_prefill=lambda done, total: seen.append(done)))
            assert fed == [512, 88] and seen == [512]
        eng.close()
    assert np.isfinite(last[1024]).all() and np.abs(last[1024]).max() > 1
    np.testing.assert_allclose(last[1024], last[DEFAULT_CHUNK], atol=2e-4)
