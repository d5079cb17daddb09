"""Parity of the norm and RoPE kernels (pyapp.gpu.kernels' rms_norm, rms_norm_pair, add_normed and its int8
rounding, norm_rope, rope, ple_combine, layer_norm: shaders/norm.wgsl, rope.wgsl, sincos.wgsl, ple.wgsl) against
numpy on odd sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyapp.gpu import kernels as K
from pyapp.reference.forward import rms_norm, rope_neox

from support.gpu import assert_rounded_q8, f32, q8_sentinels, read_f32, read_q8, step_buffer

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("weighted,rpt", [(True, 1), (False, 3)])
def test_rms_norm(dev, weighted, rpt):
    rng = np.random.default_rng(5)
    t, d = 7, 333
    x = rng.standard_normal((t * rpt, d)).astype(np.float32) * 3
    w = rng.standard_normal(d).astype(np.float32) if weighted else None
    y = dev.buffer(x.nbytes)
    dev.submit(K.rms_norm(dev, d, f32(dev, x), y, f32(dev, w) if weighted else None, step_buffer(dev, t),
                          max_tokens=t, rows_per_token=rpt, eps=1e-6))
    np.testing.assert_allclose(read_f32(dev, y, x.size).reshape(x.shape), rms_norm(x, w, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_scale(dev, weighted):
    """A constant factor applied in the kernel (the MoE router's 1/sqrt(hidden)), not folded into the weight."""
    rng = np.random.default_rng(12)
    t, d, scale = 3, 257, 257 ** -0.5
    x = rng.standard_normal((t, d)).astype(np.float32) * 3
    w = rng.standard_normal(d).astype(np.float32) if weighted else None
    y = dev.buffer(x.nbytes)
    dev.submit(K.rms_norm(dev, d, f32(dev, x), y, f32(dev, w) if weighted else None, step_buffer(dev, t),
                          max_tokens=t, scale=scale))
    np.testing.assert_allclose(read_f32(dev, y, x.size).reshape(x.shape), rms_norm(x, w, 1e-6) * scale,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("t,d", [(7, 333), (3, 6915)])
def test_layer_norm(dev, t, d):
    """PyTorch's LayerNorm (the 12B's patch projection, pyapp/families/gemma4_vision/reference.py layer_norm):
    rows far from zero mean (the centering matters), a row wider than the workgroup many times over, only the
    step's tokens written."""
    from pyapp.families.gemma4_vision.reference import layer_norm
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((t + 2, d)) * 3 + 5).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    b = rng.standard_normal(d).astype(np.float32)
    y = f32(dev, np.full((t + 2, d), 7.0))
    dev.submit(K.layer_norm(dev, d, f32(dev, x), y, f32(dev, w), f32(dev, b), step_buffer(dev, t), max_tokens=t + 2,
                            eps=1e-5))
    got = read_f32(dev, y, x.size).reshape(x.shape)
    np.testing.assert_allclose(got[:t], layer_norm(x[:t].astype(np.float64), 1e-5, w, b), rtol=1e-4, atol=1e-4)
    assert (got[t:] == 7.0).all()


@pytest.mark.parametrize("hd,nrot,ff", [(68, 68, False), (68, 36, True)])
def test_rope(dev, hd, nrot, ff):
    rng = np.random.default_rng(6)
    t, h, pos0 = 5, 3, 41
    x = rng.standard_normal((t, h, hd)).astype(np.float32)
    f = np.where(np.arange(nrot // 2) < nrot // 4, 1.0, 1e30).astype(np.float32) if ff else None
    buf = f32(dev, x)
    dev.submit(K.rope(dev, buf, step_buffer(dev, t, pos0), h, hd, nrot, 10000.0, max_tokens=t,
                      freq_factors=f32(dev, f) if ff else None))
    ref = rope_neox(x, np.arange(pos0, pos0 + t), nrot, 10000.0, f)
    np.testing.assert_allclose(read_f32(dev, buf, x.size).reshape(x.shape), ref, atol=2e-5)


@pytest.mark.parametrize("pos0", [0, 5000])
def test_rope_sin_cos_to_f32_precision(dev, pos0):
    """RoPE's sin/cos (shaders/sincos.wgsl) are exact to ~1e-7 up to angles of thousands of radians. Base 256 over 16
    rotated dims makes every frequency a power of two, so the f32 angle pos * 2^-j is exact and float64 trig of it
    is the truth; the built-in sin/cos (2^-11 by the spec; SwiftShader's are 1.9e-4 off) fail this bound."""
    rng = np.random.default_rng(61)
    t, h, hd = 67, 3, 18                                   # 2 dims past the 16 rotated ones stay as they are
    x = rng.standard_normal((t, h, hd)).astype(np.float32)
    buf = f32(dev, x)
    dev.submit(K.rope(dev, buf, step_buffer(dev, t, pos0), h, hd, 16, 256.0, max_tokens=t))
    ref = rope_neox(x.astype(np.float64), np.arange(pos0, pos0 + t), 16, 256.0)
    np.testing.assert_allclose(read_f32(dev, buf, x.size).reshape(x.shape), ref, rtol=0, atol=1.5e-6)


def test_no_kernel_calls_the_builtin_sin_or_cos():
    """WGSL promises only 2^-11 absolute error for sin/cos, and SwiftShader comes close to that (1.9e-4): RoPE
    through them put DiffusionGemma's logits 3e-2 off in Chromium (issue 12). Kernels call sincos.wgsl's sin_cos."""
    import re
    from pathlib import Path

    from pyapp.gpu import SHADER_DIR
    for path in sorted(Path(SHADER_DIR).glob("*.wgsl")):
        code = re.sub(r"//.*", "", path.read_text())
        assert not re.search(r"(?<![\w.])(sin|cos|tan)\s*\(", code), f"{path.name} calls a built-in sin/cos/tan"


@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_pair(dev, weighted):
    """Two norms of one row: weighted and scaled (the MoE router's input), and by a second weight."""
    rng = np.random.default_rng(31)
    t, d = 3, 137
    x = rng.standard_normal((t, d)).astype(np.float32) * 2
    w1, w2 = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    y, y2 = dev.buffer(4 * t * d), dev.buffer(4 * t * d)
    dev.submit(K.rms_norm_pair(dev, d, f32(dev, x), y, f32(dev, w1) if weighted else None, y2, f32(dev, w2),
                               step_buffer(dev, t), t, scale=0.25))
    np.testing.assert_allclose(read_f32(dev, y, t * d).reshape(t, d), rms_norm(x, w1 if weighted else None, 1e-6) * 0.25,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(read_f32(dev, y2, t * d).reshape(t, d), rms_norm(x, w2, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fused_next", [False, True])
def test_add_normed_with_scale(dev, fused_next):
    rng = np.random.default_rng(23)
    t, d = 5, 300
    x, a = rng.standard_normal((t, d)).astype(np.float32), rng.standard_normal((t, d)).astype(np.float32)
    w, w2, sc = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32), np.float32(0.7)
    ab, nxt = f32(dev, a), dev.buffer(4 * t * d)
    kw = dict(next_out=nxt, next_weight=f32(dev, w2)) if fused_next else {}
    dev.submit(K.add_normed(dev, d, f32(dev, x), ab, f32(dev, w), step_buffer(dev, t), t, scale=f32(dev, [sc]), **kw))
    want = (a + rms_norm(x, w, 1e-6)) * sc
    np.testing.assert_allclose(read_f32(dev, ab, t * d).reshape(t, d), want, atol=1e-5)
    if fused_next:
        np.testing.assert_allclose(read_f32(dev, nxt, t * d).reshape(t, d), rms_norm(want, w2, 1e-6), atol=1e-5)


@pytest.mark.parametrize("d,nxt,keep,scaled", [(32 * 13, True, True, True), (32 * 35, True, False, False),
                                               (32 * 35, False, False, True)],
                         ids=["104-words-kept", "280-words-codes-only", "the-sum-rounded"])
def test_add_normed_rounds_what_the_next_matmul_reads(dev, d, nxt, keep, scaled):
    """add_normed_q8: the residual add as add_normed, and the next pre-norm's rows rounded to int8 by
    quantize_activations_q8's rule (the codes and (d, sum) of each block of 32), the f32 rows too where
    kept; add_q8 (no next pre-norm): the sum's rows rounded so. Rows under 256 words and over (a
    workgroup's threads loop); rows past the step's tokens untouched."""
    rng = np.random.default_rng(29)
    t, plan_t = 6, 9
    x = (rng.standard_normal((plan_t, d)) * rng.uniform(0.3, 3, (plan_t, 1))).astype(np.float32)
    a = (rng.standard_normal((plan_t, d)) * rng.uniform(0.3, 3, (plan_t, 1))).astype(np.float32)
    w, w2 = (rng.standard_normal((2, d)) * rng.uniform(0.2, 2, (2, d))).astype(np.float32)
    w2[96:128] = 0.0                                     # a block of zeros in every normed row: codes 0, d 0
    a[:, 96:128], x[:, 96:128] = 0.0, 0.0                # and in every sum
    sc = np.float32(0.7)
    ab, out = f32(dev, a), f32(dev, np.full((plan_t, d), 7.0))
    xq, xs = q8_sentinels(dev, plan_t, d)
    dev.submit(K.add_normed(dev, d, f32(dev, x), ab, f32(dev, w), step_buffer(dev, t), plan_t,
                            scale=f32(dev, [sc]) if scaled else None, next_out=out if nxt else None,
                            next_weight=f32(dev, w2) if nxt else None, rounded=(xq, xs), keep=keep))
    added = (a[:t] + rms_norm(x[:t], w, 1e-6)) * (sc if scaled else 1)
    got_sum = read_f32(dev, ab, plan_t * d).reshape(plan_t, d)
    np.testing.assert_allclose(got_sum[:t], added, atol=1e-5)
    assert (got_sum[t:] == a[t:]).all()
    rounded = rms_norm(added, w2, 1e-6) if nxt else added
    got_out = read_f32(dev, out, plan_t * d).reshape(plan_t, d)
    if keep:
        np.testing.assert_allclose(got_out[:t], rounded, atol=1e-5)
    assert (got_out[t:] == 7.0).all() and (keep or (got_out == 7.0).all())
    q, ds = read_q8(dev, xq, xs, plan_t, d)
    assert_rounded_q8(q, ds, rounded)
    assert (q[:t, 96:128] == 0).all() and (ds[:t, 3] == 0).all()


@pytest.mark.parametrize("slices,rounded", [(3, False), (4, True)], ids=["3-slices", "4-slices-rounded"])
def test_add_normed_adds_a_matmuls_slices(dev, slices, rounded):
    """x as a matmul's slices of K left unsummed (f32 [slices, T, d], T the step's tokens, fewer than the plan's
    the buffer is sized for): the add and the next pre-norm read their sum (add_normed, add_normed_q8)."""
    rng = np.random.default_rng(37)
    t, plan_t, d = 5, 8, 32 * 11
    parts = (rng.standard_normal((slices, t, d)) * rng.uniform(0.3, 3, (slices, t, 1))).astype(np.float32)
    a = rng.standard_normal((plan_t, d)).astype(np.float32)
    w, w2 = (rng.standard_normal((2, d)) * rng.uniform(0.2, 2, (2, d))).astype(np.float32)
    room = np.zeros(slices * plan_t * d, np.float32)
    room[:parts.size] = parts.ravel()
    ab, out = f32(dev, a), f32(dev, np.full((plan_t, d), 7.0))
    xq, xs = q8_sentinels(dev, plan_t, d)
    dev.submit(K.add_normed(dev, d, f32(dev, room), ab, f32(dev, w), step_buffer(dev, t), plan_t, next_out=out,
                            next_weight=f32(dev, w2), rounded=(xq, xs) if rounded else None, x_slices=slices))
    x = parts[0]
    for z in range(1, slices):
        x = x + parts[z]
    added = a[:t] + rms_norm(x, w, 1e-6)
    got_sum = read_f32(dev, ab, plan_t * d).reshape(plan_t, d)
    np.testing.assert_allclose(got_sum[:t], added, atol=1e-5)
    assert (got_sum[t:] == a[t:]).all()
    got_out = read_f32(dev, out, plan_t * d).reshape(plan_t, d)
    np.testing.assert_allclose(got_out[:t], rms_norm(added, w2, 1e-6), atol=1e-5)
    if rounded:
        q, ds = read_q8(dev, xq, xs, plan_t, d)
        assert_rounded_q8(q, ds, rms_norm(added, w2, 1e-6))


@pytest.mark.parametrize("hd,nrot,ff", [(64, 64, False), (128, 32, True)])
def test_norm_rope(dev, hd, nrot, ff):
    rng = np.random.default_rng(24)
    t, h, pos0 = 3, 4, 17
    x = rng.standard_normal((t, h, hd)).astype(np.float32)
    w = rng.standard_normal(hd).astype(np.float32)
    ffv = np.where(np.arange(hd // 2) < nrot // 4, 1.0, 1e30).astype(np.float32) if ff else None
    y = dev.buffer(x.nbytes)
    dev.submit(K.norm_rope(dev, f32(dev, x), y, f32(dev, w), step_buffer(dev, t, pos0), h, hd, nrot, 10000.0, t,
                           freq_factors=f32(dev, ffv) if ff else None))
    want = rope_neox(rms_norm(x, w, 1e-6), pos0 + np.arange(t), nrot, 10000.0, ffv)
    np.testing.assert_allclose(read_f32(dev, y, x.size).reshape(x.shape), want, atol=3e-5)


def test_ple_combine(dev):
    rng = np.random.default_rng(22)
    t, tmax, n_layers, pd, hidden = 3, 5, 4, 64, 96
    proj = rng.standard_normal((t, n_layers, pd)).astype(np.float32) * 5
    emb = rng.standard_normal((t, n_layers, pd)).astype(np.float32)
    nw = rng.standard_normal(pd).astype(np.float32)
    out = dev.buffer(4 * n_layers * tmax * pd)
    dev.submit(K.ple_combine(dev, n_layers, pd, tmax, f32(dev, proj), f32(dev, emb), f32(dev, nw), out,
                             step_buffer(dev, t), hidden, 1e-6))
    got = read_f32(dev, out, n_layers * tmax * pd).reshape(n_layers, tmax, pd)[:, :t]
    want = (rms_norm(proj / math.sqrt(hidden), nw, 1e-6) + emb) / math.sqrt(2)
    np.testing.assert_allclose(got, want.transpose(1, 0, 2), atol=1e-5)
