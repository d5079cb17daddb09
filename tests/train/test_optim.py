"""pyapp/train/optim.py against torch, step for step (tests/fixtures/train/adamw.golden.npz, made by
tools/make_optim_golden.py: torch.optim.AdamW, clip_grad_norm_ and transformers'
get_cosine_schedule_with_warmup, float32). Tolerances: learning rates 1e-9 relative (seen: equal), gradient
norms 1e-6 relative (seen 7.6e-8: torch sums in float32), parameters 1e-6 absolute on values of size ~1
(seen 4.8e-7, a few float32 ulps: ours stores f32 and computes in f64).
"""

from __future__ import annotations

import math
from array import array

import numpy as np
import pytest

from pyapp.train.optim import AdamW, WarmupCosine, clip_grad_norm, global_norm

from support.paths import FIXTURES

GOLDEN = FIXTURES / "train" / "adamw.golden.npz"
# the settings tools/make_optim_golden.py used
STEPS, PEAK_LR, WARMUP, MAX_NORM, WEIGHT_DECAY, BETAS, EPS = 7, 0.05, 2, 1.0, 0.1, (0.9, 0.95), 1e-6


def flat(a: np.ndarray) -> array:
    return array("f", np.ascontiguousarray(a, np.float32).reshape(-1).tobytes())


def test_steps_match_torch():
    g = np.load(GOLDEN)
    n = sum(1 for k in g.files if k.startswith("start_"))
    params = {f"p{i}": flat(g[f"start_{i}"]) for i in range(n)}
    opt = AdamW(params, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    sched = WarmupCosine(PEAK_LR, WARMUP, STEPS)
    clipped = 0
    for step in range(STEPS):
        grads = {f"p{i}": flat(g[f"grad_{step}_{i}"]) for i in range(n)}
        norm = clip_grad_norm(grads, MAX_NORM)
        assert norm == pytest.approx(g["norm"][step], rel=1e-6)
        clipped += norm > MAX_NORM
        assert global_norm(grads) <= MAX_NORM + 1e-6
        lr = sched.lr(step)
        assert lr == pytest.approx(g["lr"][step], rel=1e-9, abs=1e-15)
        opt.step(grads, lr)
        for i in range(n):
            got = np.frombuffer(params[f"p{i}"], np.float32)
            want = g[f"after_{step}_{i}"].reshape(-1)
            assert np.abs(got - want).max() < 1e-6, (step, i, np.abs(got - want).max())
    assert clipped == 4 and opt.t == STEPS             # clipping acted on some steps, not all


def test_schedule_shape():
    s = WarmupCosine(1.0, 4, 14, min_ratio=0.1)
    assert [s.lr(i) for i in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert s.lr(9) == pytest.approx(0.1 + 0.9 * 0.5)            # half way down the cosine
    assert s.lr(14) == pytest.approx(0.1) and s.lr(100) == pytest.approx(0.1)
    assert WarmupCosine(2e-4, 0, 10).lr(0) == 2e-4
    with pytest.raises(ValueError):
        WarmupCosine(1e-3, 20, 10)


def test_clip_leaves_small_gradients_alone():
    grads = {"a": array("f", [0.3, 0.4])}
    assert clip_grad_norm(grads, 1.0) == pytest.approx(0.5)
    assert list(grads["a"]) == pytest.approx([0.3, 0.4])
    grads = {"a": array("f", [3.0, 0.0]), "b": array("f", [4.0])}
    assert clip_grad_norm(grads, 1.0) == pytest.approx(5.0)
    assert math.hypot(grads["a"][0], grads["b"][0]) == pytest.approx(1.0, rel=1e-6)


def test_weight_decay_alone_and_mismatches():
    """Zero gradient: m = v = 0, so only the decay acts: p *= 1 - lr * wd."""
    params = {"a": array("f", [2.0, -1.0])}
    opt = AdamW(params, weight_decay=0.5)
    opt.step({"a": array("f", [0.0, 0.0])}, 0.1)
    assert list(params["a"]) == pytest.approx([1.9, -0.95])
    with pytest.raises(ValueError, match="do not match"):
        opt.step({"b": array("f", [0.0, 0.0])}, 0.1)
    with pytest.raises(ValueError, match="has 1 values"):
        opt.step({"a": array("f", [0.0])}, 0.1)
