"""Parity of DiffusionGemma's kernels (native wgpu backend) against numpy, on odd sizes:
the self-conditioning input softmax(L) @ E (shaders/soft_embed.wgsl) and the decoder's unmasked attention
over the cached prefix and the canvas (shaders/attention_canvas.wgsl)."""

from __future__ import annotations

import numpy as np
import pytest

from support.gpu import dequantize, f32, random_tensor, read_f32, step_buffer, weight_buffer

pytestmark = pytest.mark.gpu

from pyapp.gpu import kernels as K  # noqa: E402


@pytest.mark.parametrize("qtype,v,d,t,split", [
    ("f32", 517, 36, 5, None),          # d not a multiple of 64, vocabulary not of 16
    ("f32", 301, 68, 67, [0, 128, 301]),  # more rows than one tile; the table in two row blocks
    ("q8_0", 263, 96, 19, [0, 64, 200, 263]),
    ("q4_k", 45, 256, 3, None),
])
def test_soft_embed(dev, qtype, v, d, t, split):
    rng = np.random.default_rng(21)
    logits = (rng.standard_normal((t, v)) * 4).astype(np.float32)
    logits[0, 7] = 40.0                                  # a peaked row: the max matters
    raw = random_tensor(qtype, v, d, rng)
    table = dequantize(qtype, raw, v, d)
    rb = len(raw) // v
    bounds = split or [0, v]
    parts = [(weight_buffer(dev, raw[a * rb:b * rb]), a, b - a) for a, b in zip(bounds, bounds[1:])]
    out = dev.buffer(4 * t * d)
    stats = dev.buffer(8 * t)
    scale = 7.5
    dev.submit(K.soft_embed(dev, qtype, v, d, f32(dev, logits), stats, parts, out, step_buffer(dev, t), t,
                            scale=scale))
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = p @ table * scale
    got = read_f32(dev, out, t * d).reshape(t, d)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * scale * np.abs(table).max())
    st = np.frombuffer(dev.read(stats, 0, 8 * t), np.float32).reshape(t, 2)
    np.testing.assert_allclose(st[:, 0], logits.max(-1))
    np.testing.assert_allclose(1 / st[:, 1], np.exp(z - z.max(-1, keepdims=True)).sum(-1), rtol=1e-5)


def test_soft_embed_fewer_rows_than_planned(dev):
    """The plan sized for 40 rows, the step holding 9: rows past the step are left alone."""
    rng = np.random.default_rng(22)
    v, d, t = 77, 32, 9
    logits = rng.standard_normal((40, v)).astype(np.float32)
    table = rng.standard_normal((v, d)).astype(np.float32)
    out = f32(dev, np.full((40, d), 5.0))
    dev.submit(K.soft_embed(dev, "f32", v, d, f32(dev, logits), dev.buffer(8 * 40), [(f32(dev, table), 0, v)], out,
                            step_buffer(dev, t), 40))
    p = np.exp(logits[:t] - logits[:t].max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    got = read_f32(dev, out, 40 * d).reshape(40, d)
    np.testing.assert_allclose(got[:t], p @ table, atol=2e-5)
    assert (got[t:] == 5.0).all()


def canvas_attention_ref(q, kc, vc, k, v, P, keep):
    """softmax(q k^T) v over prefix positions [lo, P) of kc/vc [hkv, positions, hd] and the canvas k, v
    [T, hkv, hd], unmasked."""
    lo = max(P - keep, 0) if keep else 0
    keys = np.concatenate([kc[:, lo:P], k.transpose(1, 0, 2)], axis=1)
    values = np.concatenate([vc[:, lo:P], v.transpose(1, 0, 2)], axis=1)
    g = q.shape[1] // keys.shape[0]
    s = np.einsum("nhd,htd->hnt", q, np.repeat(keys, g, axis=0))
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hnt,htd->nhd", p, np.repeat(values, g, axis=0))


@pytest.mark.parametrize("P,keep,ctx,hd,t", [
    (0, 0, 40, 36, 7),        # no prefix: the canvas alone
    (150, 0, 300, 36, 23),    # a global layer: the whole prefix, more than one 128-key chunk with the canvas
    (150, 7, 30, 136, 19),    # a sliding layer: the last 7 positions of a ring of 30 slots
    (5, 7, 30, 20, 130),      # a prefix shorter than what a sliding layer keeps; 130 canvas keys
])
def test_attention_canvas(dev, P, keep, ctx, hd, t):
    rng = np.random.default_rng(23)
    h, hkv = 6, 2
    positions = max(P, 1)
    kc = rng.standard_normal((hkv, positions, hd)).astype(np.float32)
    vc = rng.standard_normal((hkv, positions, hd)).astype(np.float32)
    ring_k = np.zeros((hkv, ctx, hd), np.float32)
    ring_v = np.zeros((hkv, ctx, hd), np.float32)
    for j in range(max(P - ctx, 0), P):                  # what a ring of ctx slots holds after P positions
        ring_k[:, j % ctx], ring_v[:, j % ctx] = kc[:, j], vc[:, j]
    q = (rng.standard_normal((t, h, hd)) * 0.3).astype(np.float32)
    k = rng.standard_normal((t, hkv, hd)).astype(np.float32)
    v = rng.standard_normal((t, hkv, hd)).astype(np.float32)
    kcb, vcb = f32(dev, ring_k), f32(dev, ring_v)
    out = dev.buffer(4 * t * h * hd)
    dev.submit(K.attention_canvas(dev, f32(dev, q), kcb, vcb, f32(dev, k), f32(dev, v), out, step_buffer(dev, t, P),
                                  h, hkv, hd, ctx, max_tokens=t, keep=keep))
    ref = canvas_attention_ref(q, kc, vc, k, v, P, keep)
    np.testing.assert_allclose(read_f32(dev, out, t * h * hd).reshape(t, h, hd), ref, atol=2e-5)
    # the cache is only read
    np.testing.assert_array_equal(read_f32(dev, kcb, ring_k.size).reshape(ring_k.shape), ring_k)


@pytest.mark.parametrize("n,c,v,first,stab,forced", [
    (7, 7, 1037, True, 1, False),       # a block's first step: never stable unless the threshold is 0
    (13, 16, 4099, False, 1, False),    # a shorter canvas than the buffers; the argmax repeats: stable
    (5, 5, 300, False, 0, True),        # sampled ids given (a replayed trace); stability 0: always stable
])
def test_denoise_step(dev, n, c, v, first, stab, forced):
    """shaders/denoise.wgsl against reference.denoise.step_decisions: processed logits in place, entropies,
    argmax, inverse-CDF samples (or the given ids), the entropy-bound acceptance, the next canvas, the flags."""
    from pyapp.families.diffusion_gemma.reference import inverse_cdf, step_decisions
    rng = np.random.default_rng(24)
    raw = (rng.standard_normal((n, v)) * 3).astype(np.float32)
    raw[np.arange(n), rng.integers(0, v, n)] += rng.uniform(0, 25, n).astype(np.float32)   # varied entropies
    raw[1, [3, 9]] = 40.0                                                 # a tie: the first index wins
    temp, bound, conf = 0.7, 1.5, 2.0
    proc, probs, ent, am, accepted = step_decisions(raw, temp, bound)
    u = rng.uniform(0.02, 0.98, n)
    given = rng.integers(0, v, n)
    noise = rng.integers(0, v, n)
    logits = f32(dev, np.concatenate([raw.ravel(), np.zeros((c - n) * v, np.float32)]))
    params = dev.buffer(4 * K.denoise_param_words(c))
    dev.write(params, K.pack_denoise_step(c, temp, bound, conf, stab, first, noise.tolist(),
                                          uniforms=None if forced else u.tolist(),
                                          forced=given.tolist() if forced else None))
    prev = np.zeros(1 + c, np.uint32)
    prev[0] = 3                                                           # 3 steps in a row with this argmax
    prev[1:1 + n] = am
    bufs = {k: dev.buffer(4 * c) for k in ("ent", "am", "smp", "ids")}
    prev_b = dev.buffer(4 * (1 + c))
    dev.write(prev_b, prev.tobytes())
    out = dev.buffer(4 * (K.DENOISE_HEADER + 2 * c))
    dev.submit(K.denoise(dev, v, c, logits, params, bufs["ent"], bufs["am"], bufs["smp"], bufs["ids"], prev_b, out))

    def u32s(b, k):
        return np.frombuffer(dev.read(b, 0, 4 * k), np.uint32)

    np.testing.assert_array_equal(read_f32(dev, logits, n * v).reshape(n, v), proc)
    np.testing.assert_allclose(read_f32(dev, bufs["ent"], n), ent, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(u32s(bufs["am"], n), am)
    assert am[1] == 3
    sample = given if forced else inverse_cdf(probs, u)
    np.testing.assert_array_equal(u32s(bufs["smp"], n), sample)
    np.testing.assert_array_equal(u32s(bufs["ids"], n), np.where(accepted, sample, noise))
    assert 0 < accepted.sum() < n or n == 5
    o = u32s(out, K.DENOISE_HEADER + 2 * c)
    np.testing.assert_array_equal(o[8:8 + n], am)
    np.testing.assert_array_equal(o[8 + c:8 + c + n].astype(bool), accepted)
    stable = stab == 0 or not first                                       # the argmax equals PREV's
    confident = ent.astype(np.float64).mean() < conf
    assert (o[2], o[3], o[0], o[1]) == (stable, confident, stable and confident, accepted.sum())
    assert np.frombuffer(o[4:5].tobytes(), np.float32)[0] == pytest.approx(ent.mean(), rel=1e-5)
    np.testing.assert_array_equal(u32s(prev_b, 1 + n), np.concatenate([[1 if first else 4], am]))
