"""DiffusionGemma on the GPU (issue 12, item 2): the engine loads the GGUF converted from the committed tiny
checkpoint and one decoder step's logits match transformers' (tests/fixtures/diffusion-tiny.golden.npz, made by
tools/make_diffusion_golden.py) in all four cases: step 0, self-conditioned on given previous logits, a prompt
longer than the sliding window, a committed block; resident and with streamed experts. The encoder's KV cache
matches the numpy reference's, sliding layers' ring included."""

from __future__ import annotations

import numpy as np
import pytest

from support.diffusion import decoder_step
from support.paths import ROOT
from pyapp.gguf import read_gguf

pytestmark = pytest.mark.gpu

GOLDEN = np.load(ROOT / "tests" / "fixtures" / "diffusion-tiny.golden.npz")
N_CASES = 4
ATOL = 1e-3        # f32 against transformers: the bound (measured: <= 8e-5)


def case(i):
    prev, block = GOLDEN[f"prev_{i}"], GOLDEN[f"block_{i}"]
    return (GOLDEN[f"prompt_{i}"].tolist(), GOLDEN[f"canvas_{i}"].tolist(), prev if len(prev) else None,
            [block.tolist()] if len(block) else [], GOLDEN[f"logits_{i}"])


@pytest.fixture(scope="module")
def gguf_files(diffusion_gguf):
    """outtype -> the converted fixture."""
    return {outtype: diffusion_gguf(outtype) for outtype in ("f32", "q8_0")}


def step_logits(eng, i):
    return decoder_step(eng, case(i))       # the engine fixture: tests/diffusion/conftest.py


@pytest.mark.parametrize("i", range(N_CASES))
def test_decoder_step_matches_transformers(engine, i):
    from pyapp.families.diffusion_gemma import DiffusionEngine
    assert isinstance(engine, DiffusionEngine)
    got, want = step_logits(engine, i)
    assert got.dtype == np.float32 and got.shape == want.shape == (16, 512)
    assert np.abs(got - want).max() <= ATOL
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_encoder_cache_matches_the_reference(engine, gguf_files):
    """After the long prompt and a committed block (36 positions; sliding layers' rings of window + chunk - 1
    = 23 slots), every cached K and V the decoder reads equals the numpy reference's cache."""
    from pyapp.families.diffusion_gemma.reference import DiffusionReference
    prompt, canvas, prev, blocks, _ = case(3)
    engine.decoder_logits(prompt, canvas, prev.tobytes(), blocks)
    ref = DiffusionReference(read_gguf(gguf_files["f32"]))
    cache = ref.encode(prompt)
    for b in blocks:
        ref.encode(b, cache)
    n = cache.length
    assert engine.cached == prompt + blocks[0] and n == 36
    state, cfg = engine.runner.state, engine.config
    for lc in cfg.layers:
        kv, slots = state.kv[lc.index], state.kv_slots(lc)
        shape = (lc.n_kv_heads, slots, lc.head_dim)
        k = np.frombuffer(engine.dev.read(kv.k, 0, 4 * np.prod(shape)), np.float32).reshape(shape)
        v = np.frombuffer(engine.dev.read(kv.v, 0, 4 * np.prod(shape)), np.float32).reshape(shape)
        first = n - (cfg.sliding_window - 1) if lc.sliding else 0      # what the decoder reads
        assert slots == (23 if lc.sliding else 96)
        for j in range(first, n):
            np.testing.assert_allclose(k[:, j % slots], cache.k[lc.index][:, j], atol=1e-4, err_msg=f"k {lc.index} {j}")
            np.testing.assert_allclose(v[:, j % slots], cache.v[lc.index][:, j], atol=1e-4, err_msg=f"v {lc.index} {j}")


def test_q8_0_file_matches_the_reference_on_the_same_weights(gguf_files, dev):
    """Q8_0 moves this random model's logits by up to ~2 from transformers' f32 ones (the reference on the
    same file measures the same); the GPU agrees with the reference dequantizing the same blocks."""
    from pyapp.engine import Engine
    from pyapp.families.diffusion_gemma.reference import DiffusionReference
    g = read_gguf(gguf_files["q8_0"])
    eng = Engine.open(g, device=dev, context_length=64, chunk=16)
    ref = DiffusionReference(g)
    for i in (1, 3):
        prompt, canvas, prev, blocks, _ = case(i)
        got, _ = step_logits(eng, i)
        want = ref.decoder_step(prompt, canvas, prev, blocks)
        assert np.abs(got - want).max() <= 1e-3
        np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_streamed_experts_give_the_same_step(gguf_files, dev):
    """A cache of 2 of the 4 experts per layer: the canvas's 16 positions route to all of them, served in
    rounds (pyapp.runtime.experts) inside the canvas program."""
    from pyapp.engine import Engine
    from pyapp.runtime.memory import MIB
    g = read_gguf(gguf_files["f32"])
    each = Engine.plan(g, dev.limits, 64, chunk=16).expert_each
    eng = Engine.open(g, device=dev, context_length=64, chunk=16, expert_cache_mib=(2 * each + 64) / MIB)
    assert eng.runner.experts.slots == 2
    got, want = step_logits(eng, 1)
    assert np.abs(got - want).max() <= ATOL
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
    assert eng.runner.experts.stats()["expert_misses"] > 2 * eng.config.n_layers


def test_bad_input_is_refused(engine):
    from pyapp.engine import EngineError
    prompt, canvas, _, _, _ = case(0)
    with pytest.raises(EngineError, match="a canvas of 17 tokens: this model's holds 1..16"):
        engine.decoder_logits(prompt, canvas + [5])
    with pytest.raises(EngineError, match=r"token id 512 is outside the vocabulary \(0..511\)"):
        engine.decoder_logits(prompt, canvas[:-1] + [512])
    with pytest.raises(EngineError, match="previous logits of 512 floats; a canvas of 16 needs 16 x 512"):
        engine.decoder_logits(prompt, canvas, np.zeros(512, np.float32).tobytes())
    with pytest.raises(EngineError, match="do not fit the context of 96"):
        engine.decoder_logits(list(range(2, 100)), canvas)
    # a shorter canvas runs the same plan with its own count
    got = np.asarray(engine.decoder_logits(prompt, canvas[:5]))
    assert got.shape == (5, 512) and np.isfinite(got).all()
