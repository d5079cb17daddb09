"""Parity of the training backward kernels against the numpy gradient oracle (pyapp.reference.backward), on
odd sizes. Tolerances are relative to the scale of the rounding in each sum (sum of |terms|), in float32."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp.gpu import kernels as K
from pyapp.reference import backward as B

from support.gpu import dequantize, f32, random_tensor, read_f32, step_buffer, weight_buffer

pytestmark = pytest.mark.gpu


def rel_err(got, want, scale):
    return float((np.abs(got - want) / (scale + 1e-30)).max())


# ---- dX = dY W through a frozen quantized W -----------------------------------------------------------

@pytest.mark.parametrize("qtype", ["f32", "f16", "q8_0", "q4_0", "q4_k", "q6_k", "mxfp4"])
@pytest.mark.parametrize("n,t", [(37, 19), (131, 70)], ids=["one-tile", "tiles"])
def test_matmul_dx(dev, qtype, n, t):
    """dX = linear_backward(W, dY) for W [n, k] of every kind of block (k not a multiple of the 64-wide
    tile; n not a multiple of the 16-row step), tokens past the step untouched."""
    from pyapp import ggml
    rng = np.random.default_rng(300 + ggml.lookup(qtype).id + n)
    qk = ggml.lookup(qtype).block
    k = 256 * 3 if qk == 256 else 4 * 29 if qk == 1 else 32 * 5
    raw = random_tensor(qtype, n, k, rng)
    w = dequantize(qtype, raw, n, k)
    dy = rng.standard_normal((t + 1, n))
    dx = f32(dev, np.full((t + 1, k), 7.0))
    dev.submit(K.matmul_dx(dev, qtype, k, n, weight_buffer(dev, raw), f32(dev, dy), dx, step_buffer(dev, t), t + 1))
    got = read_f32(dev, dx, (t + 1) * k).reshape(t + 1, k)
    assert rel_err(got[:t], B.linear_backward(w, dy[:t]), np.abs(dy[:t]) @ np.abs(w)) < 2e-5
    assert np.all(got[t] == 7.0)


def test_matmul_dx_row_blocks_accumulate(dev):
    """A W split into two row blocks, read from the columns of a wider dY (a fused q|k|v output), the
    second block and a pre-filled dX accumulated: dX0 + dY[:, c:c+n] W."""
    rng = np.random.default_rng(7)
    k, t, n1, n2, col0, ldd = 96, 5, 21, 18, 3, 50
    raws = [random_tensor("q8_0", m, k, rng) for m in (n1, n2)]
    w = np.concatenate([dequantize("q8_0", r, m, k) for r, m in zip(raws, (n1, n2))])
    dy = rng.standard_normal((t, ldd))
    dx0 = rng.standard_normal((t, k))
    dxb, dyb, step = f32(dev, dx0), f32(dev, dy), step_buffer(dev, t)
    plan = K.matmul_dx(dev, "q8_0", k, n1, weight_buffer(dev, raws[0]), dyb, dxb, step, t, ldd=ldd, col0=col0,
                       accumulate=True)
    K.matmul_dx(dev, "q8_0", k, n2, weight_buffer(dev, raws[1]), dyb, dxb, step, t, ldd=ldd, col0=col0 + n1,
                accumulate=True, plan=plan)
    dev.submit(plan)
    part = dy[:, col0:col0 + n1 + n2]
    want = dx0 + B.linear_backward(w, part)
    assert rel_err(read_f32(dev, dxb, t * k).reshape(t, k), want, np.abs(part) @ np.abs(w) + np.abs(dx0)) < 2e-5


# ---- LoRA backward --------------------------------------------------------------------------------------

@pytest.mark.parametrize("k,n,r,t", [(37, 300, 3, 1), (259, 17, 5, 3), (64, 513, 1, 2), (130, 70, 16, 67)])
def test_lora_backward(dev, k, n, r, t):
    """dX, dA, dB of lora_backward (rank 1-16, odd sizes), each added to what the buffers held; dY read from
    columns col0.. of wider rows; the token past the step contributes nothing."""
    rng = np.random.default_rng(k * n + r)
    s = -1.75
    a, b = rng.standard_normal((r, k)), rng.standard_normal((n, r))
    x = rng.standard_normal((t + 1, k))
    ldd, col0 = n + 9, 5
    dy_rows = rng.standard_normal((t + 1, ldd))
    dx0, da0, db0 = rng.standard_normal((t + 1, k)), rng.standard_normal((r, k)), rng.standard_normal((n, r))
    dxb, dab, dbb = f32(dev, dx0), f32(dev, da0), f32(dev, db0)
    scales = f32(dev, np.zeros(K.LORA_SCALE_STRIDE // 4))
    dev.write(scales, np.float32(s).tobytes(), 0)
    ud = dev.buffer(4 * K.lora_ud_floats(r, t + 1))
    dev.submit(K.lora_backward(dev, k, n, r, f32(dev, a), f32(dev, b), f32(dev, x), f32(dev, dy_rows), dxb, dab,
                               dbb, ud, (scales, 0, 4), step_buffer(dev, t), t + 1, ldd=ldd, col0=col0))
    dy = dy_rows[:t, col0:col0 + n]
    dx, da, db = B.lora_backward(x[:t], a, b, s, dy)
    ady, ax, aa, ab = np.abs(dy), np.abs(x[:t]), np.abs(a), np.abs(b)
    got_dx = read_f32(dev, dxb, dx0.size).reshape(dx0.shape)
    assert rel_err(got_dx[:t], dx0[:t] + dx, 1.75 * (ady @ ab) @ aa + np.abs(dx0[:t])) < 2e-5
    assert np.array_equal(got_dx[t], dx0[t].astype(np.float32))
    assert rel_err(read_f32(dev, dab, da0.size).reshape(da0.shape), da0 + da,
                   1.75 * (ady @ ab).T @ ax + np.abs(da0)) < 2e-5
    assert rel_err(read_f32(dev, dbb, db0.size).reshape(db0.shape), db0 + db,
                   1.75 * ady.T @ (ax @ aa.T) + np.abs(db0)) < 2e-5


def test_lora_backward_after_matmul_dx(dev):
    """A whole adapted projection's input gradient: matmul_dx writes dY W, lora_backward adds s (dY B) A."""
    rng = np.random.default_rng(11)
    k, n, r, t, s = 64, 45, 8, 9, 0.5
    raw = random_tensor("q4_0", n, k, rng)
    w = dequantize("q4_0", raw, n, k)
    a, b, x, dy = (rng.standard_normal(shape) for shape in ((r, k), (n, r), (t, k), (t, n)))
    scales = f32(dev, np.zeros(K.LORA_SCALE_STRIDE // 4))
    dev.write(scales, np.float32(s).tobytes(), 0)
    dxb, dyb, step = dev.buffer(4 * t * k), f32(dev, dy), step_buffer(dev, t)
    plan = K.matmul_dx(dev, "q4_0", k, n, weight_buffer(dev, raw), dyb, dxb, step, t)
    K.lora_backward(dev, k, n, r, f32(dev, a), f32(dev, b), f32(dev, x), dyb, dxb, f32(dev, np.zeros((r, k))),
                    f32(dev, np.zeros((n, r))), dev.buffer(4 * K.lora_ud_floats(r, t)), (scales, 0, 4), step, t,
                    plan=plan)
    dev.submit(plan)
    want = B.linear_backward(w, dy) + B.lora_backward(x, a, b, s, dy)[0]
    scale = np.abs(dy) @ np.abs(w) + s * (np.abs(dy) @ np.abs(b)) @ np.abs(a)
    assert rel_err(read_f32(dev, dxb, t * k).reshape(t, k), want, scale) < 2e-5


# ---- RMSNorm and RoPE ---------------------------------------------------------------------------------

@pytest.mark.parametrize("weighted,rpt,d,accumulate", [(True, 1, 333, False), (False, 1, 1001, True),
                                                       (True, 3, 37, True), (False, 5, 64, False)],
                         ids=["weighted", "unweighted-acc", "per-head-weighted", "per-head-unweighted"])
def test_rms_norm_backward(dev, weighted, rpt, d, accumulate):
    """rms_norm_backward over rows of hidden states (rpt 1) and per-head rows (the q/k/v norms), written or
    added to what dX held; the token past the step untouched."""
    rng = np.random.default_rng(d + rpt)
    t, eps = 7, 1e-6
    x = rng.standard_normal((t + 1, rpt, d)) * 3
    dy = rng.standard_normal((t + 1, rpt, d))
    w = rng.standard_normal(d) if weighted else None
    dx0 = rng.standard_normal((t + 1, rpt, d))
    dxb = f32(dev, dx0)
    dev.submit(K.rms_norm_backward(dev, d, f32(dev, x), f32(dev, dy), dxb, f32(dev, w) if weighted else None,
                                   step_buffer(dev, t), t + 1, rows_per_token=rpt, eps=eps, accumulate=accumulate))
    got = read_f32(dev, dxb, dx0.size).reshape(dx0.shape)
    want = B.rms_norm_backward(x[:t], w, eps, dy[:t]) + (dx0[:t] if accumulate else 0)
    # terms of dx are g / rms and x_hat mean(g x_hat) / rms: their size bounds the rounding
    inv = 1 / np.sqrt(np.mean(x[:t] ** 2, axis=-1, keepdims=True) + eps)
    g = np.abs(dy[:t] * (w if weighted else 1))
    scale = inv * (g + np.abs(x[:t]) * inv * np.mean(g * np.abs(x[:t]) * inv, axis=-1, keepdims=True))
    assert rel_err(got[:t], want, scale + (np.abs(dx0[:t]) if accumulate else 0)) < 1e-5
    assert np.array_equal(got[t], dx0[t].astype(np.float32))


@pytest.mark.parametrize("hd,rot,ff", [(38, 38, False), (64, 16, True), (50, 26, True)],
                         ids=["full", "partial-ff", "partial-odd"])
def test_rope_backward(dev, hd, rot, ff):
    """rope_neox_backward in place: full and partial rotation, with freq factors, from a nonzero first position."""
    rng = np.random.default_rng(hd + rot)
    t, heads, base, pos0 = 5, 3, 10000.0, 11
    dy = rng.standard_normal((t, heads, hd))
    factors = rng.uniform(1.0, 8.0, rot // 2) if ff else None
    dxb = f32(dev, dy)
    dev.submit(K.rope_backward(dev, dxb, step_buffer(dev, t, pos0), heads, hd, rot, base, t,
                               freq_factors=f32(dev, factors) if ff else None))
    want = B.rope_neox_backward(dy, pos0 + np.arange(t), rot, base, factors)
    np.testing.assert_allclose(read_f32(dev, dxb, dy.size).reshape(dy.shape), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("hd,rot,ff", [(38, 38, False), (64, 16, True)], ids=["full", "partial-ff"])
def test_norm_rope_backward(dev, hd, rot, ff):
    """The q/k norm's backward with RoPE fused: rms_norm_backward(x, w, rope_neox_backward(dy)) per head row."""
    rng = np.random.default_rng(3 * hd + rot)
    t, heads, base, eps, pos0 = 6, 3, 1e6, 1e-6, 4
    x, dy = rng.standard_normal((t, heads, hd)) * 2, rng.standard_normal((t, heads, hd))
    w = rng.standard_normal(hd)
    factors = rng.uniform(1.0, 8.0, rot // 2) if ff else None
    dxb = dev.buffer(4 * x.size)
    dev.submit(K.rms_norm_backward(dev, hd, f32(dev, x), f32(dev, dy), dxb, f32(dev, w), step_buffer(dev, t, pos0),
                                   t, rows_per_token=heads, eps=eps, rope=(rot, base),
                                   freq_factors=f32(dev, factors) if ff else None))
    want = B.rms_norm_backward(x, w, eps, B.rope_neox_backward(dy, pos0 + np.arange(t), rot, base, factors))
    got = read_f32(dev, dxb, x.size).reshape(x.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_norm_rope_backward_cache_layout(dev):
    """dy in the KV cache's layout [heads, ctx, hd] (attention_backward's dK), x and dx token-major: the k norm's
    backward reads each row's gradient where the cache keeps it; rows past the step untouched."""
    rng = np.random.default_rng(41)
    t, ctx, heads, hd, rot, base, eps = 5, 9, 3, 38, 38, 1e4, 1e-6
    x = rng.standard_normal((t, heads, hd)) * 2
    dy_cache = rng.standard_normal((heads, ctx, hd))
    w = rng.standard_normal(hd)
    dxb = f32(dev, np.full((t + 1, heads, hd), 5.0))
    dev.submit(K.rms_norm_backward(dev, hd, f32(dev, x), f32(dev, dy_cache), dxb, f32(dev, w), step_buffer(dev, t),
                                   t + 1, rows_per_token=heads, eps=eps, rope=(rot, base), dy_ctx=ctx))
    dy = dy_cache[:, :t].transpose(1, 0, 2)
    want = B.rms_norm_backward(x, w, eps, B.rope_neox_backward(dy, np.arange(t), rot, base))
    got = read_f32(dev, dxb, (t + 1) * heads * hd).reshape(t + 1, heads, hd)
    np.testing.assert_allclose(got[:t], want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert np.all(got[t] == 5.0)


# ---- GeGLU ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ff,rpt", [(333, 1), (37, 3)])
def test_geglu_backward(dev, ff, rpt):
    """geglu_backward on fused [gate | up] rows (one a token, or several: experts), gates spanning gelu's
    curved range and its tails (|g| up to 20, where tanh saturates)."""
    rng = np.random.default_rng(ff)
    t = 5
    gate = rng.standard_normal((t * rpt, ff)) * 3
    gate[:, :4] = [-20.0, -6.0, 6.0, 20.0]
    up, dy = rng.standard_normal((t * rpt, ff)), rng.standard_normal((t * rpt, ff))
    out = dev.buffer(4 * 2 * gate.size)
    dev.submit(K.geglu_backward(dev, ff, f32(dev, np.concatenate([gate, up], axis=1)), f32(dev, dy), out,
                                step_buffer(dev, t), t, rows_per_token=rpt))
    got = read_f32(dev, out, 2 * gate.size).reshape(t * rpt, 2 * ff)
    dgate, dup = B.geglu_backward(gate, up, dy)
    np.testing.assert_allclose(got[:, :ff], dgate, rtol=1e-5, atol=1e-6 * np.abs(dgate).max())
    np.testing.assert_allclose(got[:, ff:], dup, rtol=1e-5, atol=1e-6 * np.abs(dup).max())


def test_gelu_times_backward(dev):
    """The PLE gate's backward: d gate = gelu_tanh_backward(gate, dy * other)."""
    rng = np.random.default_rng(2)
    t, d = 7, 129
    gate, other, dy = rng.standard_normal((t, d)) * 3, rng.standard_normal((t, d)), rng.standard_normal((t, d))
    out = dev.buffer(4 * gate.size)
    dev.submit(K.gelu_times_backward(dev, d, f32(dev, gate), f32(dev, other), f32(dev, dy), out, step_buffer(dev, t), t))
    want = B.gelu_tanh_backward(gate, dy * other)
    np.testing.assert_allclose(read_f32(dev, out, gate.size).reshape(t, d), want, rtol=1e-5,
                               atol=1e-6 * np.abs(want).max())


# ---- softcap + cross-entropy over a chunked vocabulary ------------------------------------------------------

def run_cross_entropy(dev, z, tokens, mask, chunks, cap):
    """The trainer's sequence: stats over every chunk, the loss, then each chunk's dz in place."""
    t, v = z.shape
    tgt, wt = K.cross_entropy_targets(tokens, mask)
    tgtb, wtb = dev.buffer(len(tgt)), dev.buffer(len(wt))
    dev.write(tgtb, tgt)
    dev.write(wtb, wt)
    stats, loss, step = dev.buffer(4 * K.CE_STAT_FLOATS * t), dev.buffer(16), step_buffer(dev, t)
    edges = np.cumsum([0] + list(chunks))
    assert edges[-1] == v
    bufs = [f32(dev, z[:, a:b]) for a, b in zip(edges[:-1], edges[1:])]
    plan = dev.plan()
    for i, (buf, v0, c) in enumerate(zip(bufs, edges, chunks)):
        K.cross_entropy_stats(dev, int(c), int(v0), buf, tgtb, wtb, stats, step, t, cap=cap, first=i == 0, plan=plan)
    K.cross_entropy_loss(dev, stats, wtb, loss, step, plan=plan)
    for buf, v0, c in zip(bufs, edges, chunks):
        K.cross_entropy_grad(dev, int(c), int(v0), buf, tgtb, wtb, stats, step, t, cap=cap, plan=plan)
    dev.submit(plan)
    dz = np.concatenate([read_f32(dev, buf, t * c).reshape(t, c) for buf, c in zip(bufs, chunks)], axis=1)
    return read_f32(dev, loss, 1)[0], dz


def oracle_cross_entropy(z, tokens, mask, cap):
    from pyapp.reference.forward import softcap
    logits = softcap(z, cap) if cap > 0 else z
    loss = B.cross_entropy(logits, tokens, mask)
    return loss, B.softcap_backward(z, cap, B.cross_entropy_backward(logits, tokens, mask))


@pytest.mark.parametrize("chunks,cap", [((1001,), 30.0), ((333, 333, 335), 30.0), ((500, 501), 0.0)],
                         ids=["one-chunk", "three-chunks", "no-softcap"])
def test_cross_entropy(dev, chunks, cap):
    """Loss and dz against the oracle, masked rows (and the last row) giving zeros; targets in every chunk;
    logits large enough that the softcap bends them."""
    rng = np.random.default_rng(sum(chunks) + len(chunks))
    t, v = 9, sum(chunks)
    z = rng.standard_normal((t, v)) * 12
    tokens = rng.integers(0, v, t)
    tokens[1:4] = [0, 340, v - 1]
    mask = np.array([0, 1, 1, 1, 0, 1, 0, 1, 1], bool)
    loss, dz = run_cross_entropy(dev, z, tokens, mask, chunks, cap)
    want_loss, want_dz = oracle_cross_entropy(z, tokens, mask, cap)
    assert abs(loss - want_loss) < 1e-5 * abs(want_loss)
    np.testing.assert_allclose(dz, want_dz, rtol=1e-4, atol=1e-6 / mask[1:].sum())
    assert np.all(dz[[3, 5, 8]] == 0)       # rows whose next token is masked out, and the last row


def test_cross_entropy_full_vocab(dev):
    """Gemma's 262144-entry vocabulary in two chunks of 131072, softcap 30."""
    rng = np.random.default_rng(262144)
    t, v = 3, 262144
    z = (rng.standard_normal((t, v)) * 8).astype(np.float32)
    tokens, mask = np.array([5, 200000, 131071]), np.array([0, 1, 1], bool)
    loss, dz = run_cross_entropy(dev, z, tokens, mask, (v // 2, v // 2), 30.0)
    want_loss, want_dz = oracle_cross_entropy(z.astype(np.float64), tokens, mask, 30.0)
    assert abs(loss - want_loss) < 1e-5 * abs(want_loss)
    np.testing.assert_allclose(dz, want_dz, rtol=1e-4, atol=1e-9)


# ---- attention --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("t,heads,kv_heads,hd,window,accumulate", [
    (7, 2, 1, 38, 0, False), (70, 4, 2, 16, 0, True), (69, 3, 3, 40, 5, False), (9, 2, 2, 136, 4, True)],
    ids=["gqa", "gqa-multi-block", "window-long", "window-wide-head"])
def test_attention_backward(dev, t, heads, kv_heads, hd, window, accumulate):
    """attention_backward's dq, dk, dv (dk/dv summed over the GQA group; added into with accumulate) on
    causal and sliding-window masks, sequences longer than a 64-key block, head dims over 64."""
    rng = np.random.default_rng(t * hd + window)
    ctx = t + 3
    q, dout = rng.standard_normal((t, heads, hd)) * 0.5, rng.standard_normal((t, heads, hd))
    keys, values = rng.standard_normal((kv_heads, t, hd)) * 0.5, rng.standard_normal((kv_heads, t, hd))
    pos = np.arange(t)
    allowed = pos[None, :] <= pos[:, None]
    if window:
        allowed &= pos[:, None] - pos[None, :] < window
    pad = lambda a: np.concatenate([a, np.zeros((kv_heads, ctx - t, hd))], axis=1)     # noqa: E731
    dk0, dv0 = rng.standard_normal((kv_heads, ctx, hd)), rng.standard_normal((kv_heads, ctx, hd))
    dqb, dkb, dvb = dev.buffer(4 * q.size), f32(dev, dk0), f32(dev, dv0)
    dev.submit(K.attention_backward(dev, f32(dev, q), f32(dev, pad(keys)), f32(dev, pad(values)), f32(dev, dout),
                                    dev.buffer(8 * heads * t), dqb, dkb, dvb, step_buffer(dev, t), heads, kv_heads,
                                    hd, ctx, t, dev.buffer(4 * K.attention_backward_scratch_floats(heads, hd, ctx)),
                                    window=window, accumulate=accumulate))
    dq, dk, dv = B.attention_backward(q, keys, values, allowed, dout)
    got_dk = read_f32(dev, dkb, dk0.size).reshape(dk0.shape)
    got_dv = read_f32(dev, dvb, dv0.size).reshape(dv0.shape)
    if accumulate:
        dk, dv = dk + dk0[:, :t], dv + dv0[:, :t]
    tol = dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(read_f32(dev, dqb, q.size).reshape(q.shape), dq, **tol)
    np.testing.assert_allclose(got_dk[:, :t], dk, **tol)
    np.testing.assert_allclose(got_dv[:, :t], dv, **tol)
    assert np.array_equal(got_dk[:, t:], dk0[:, t:].astype(np.float32))      # cache rows past the step


# ---- mixture of experts -------------------------------------------------------------------------------------

def test_rms_norm_backward_scaled(dev):
    """The router input's norm: y = rms_norm(h) * router_scale * s (s = 1/sqrt(hidden)), its gradient into dh."""
    rng = np.random.default_rng(5)
    t, d, eps = 6, 131, 1e-6
    h, dy, w = rng.standard_normal((t, d)) * 2, rng.standard_normal((t, d)), rng.standard_normal(d)
    dh0 = rng.standard_normal((t, d))
    dhb = f32(dev, dh0)
    dev.submit(K.rms_norm_backward(dev, d, f32(dev, h), f32(dev, dy), dhb, f32(dev, w), step_buffer(dev, t), t,
                                   eps=eps, accumulate=True, scale=d ** -0.5))
    want = dh0 + B.rms_norm_backward(h, None, eps, dy * w * d ** -0.5)
    np.testing.assert_allclose(read_f32(dev, dhb, t * d).reshape(t, d), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def route(rng, t, e, ksel):
    """Router logits and the oracle's choice: (logits [t, e], probs, top [t, ksel], weights [t, ksel])."""
    logits = rng.standard_normal((t, e)) * 2
    return (logits, *B.router_weights(logits, ksel))


def u32_buffer(dev, a):
    a = np.ascontiguousarray(a, dtype=np.uint32)
    b = dev.buffer(a.nbytes)
    dev.write(b, a.tobytes())
    return b


@pytest.mark.parametrize("t,e,ksel,d,scaled", [(5, 11, 3, 37, True), (3, 128, 8, 300, False), (4, 4, 2, 128, True)],
                         ids=["odd", "26b-a4b", "fixture"])
def test_moe_router_backward(dev, t, e, ksel, d, scaled):
    """dlogits = router_weights_backward(probs, top, dweights), dweights[t, j] = dout[t] . (the expert's output
    times its down scale), as experts_backward computes them; the token past the step untouched."""
    rng = np.random.default_rng(t * e + d)
    logits, probs, top, _ = route(rng, t, e, ksel)
    dout, ye = rng.standard_normal((t, d)), rng.standard_normal((t * ksel, d))
    scale = rng.uniform(0.5, 2.0, e) if scaled else None
    s = scale[top] if scaled else np.ones((t, ksel))
    dweights = np.einsum("td,tjd->tj", dout, ye.reshape(t, ksel, d)) * s
    want = B.router_weights_backward(probs, top, dweights)
    dlog = f32(dev, np.full((t + 1, e), 7.0))
    dev.submit(K.moe_router_backward(dev, e, ksel, d, f32(dev, logits), u32_buffer(dev, top), f32(dev, dout),
                                     f32(dev, ye), dlog, step_buffer(dev, t), t + 1,
                                     down_scale=f32(dev, scale) if scaled else None))
    got = read_f32(dev, dlog, (t + 1) * e).reshape(t + 1, e)
    bound = probs * (np.abs(np.einsum("td,tjd->tj", np.abs(dout), np.abs(ye).reshape(t, ksel, d)) * s)).sum(1)[:, None]
    assert rel_err(got[:t], want, bound) < 2e-5
    assert np.all(got[t] == 7.0)


@pytest.mark.parametrize("qtype", ["f32", "q8_0", "q4_k", "q6_k"])
@pytest.mark.parametrize("t,e,ksel,per_slot", [(70, 11, 4, True), (37, 128, 8, False), (5, 3, 2, True)],
                         ids=["tiles-over-64", "26b-a4b-down", "few"])
def test_moe_experts_dx(dev, qtype, t, e, ksel, per_slot):
    """dx[s] = c(s) dy[t or s, col0:col0+n] @ W[ids[s]] per slot, slots grouped by expert, W split into two
    buffers of experts; c(s) = weights * down scale for the down projection's (per-token dy) case, 1 with a
    per-slot dy (read from columns col0.. of wider rows, added into what dx held)."""
    from pyapp import ggml
    rng = np.random.default_rng(t * e + ggml.lookup(qtype).id)
    qk = ggml.lookup(qtype).block
    k, n = (256, 67) if qk == 256 else (160, 67) if qk == 32 else (116, 67)
    raw = random_tensor(qtype, e * n, k, rng)
    w = dequantize(qtype, raw, e * n, k).reshape(e, n, k)
    _, _, ids, weights = route(rng, t, e, ksel)
    slots = t * ksel
    ldd, col0 = (n + 6, 4) if per_slot else (0, 0)
    dy = rng.standard_normal((slots if per_slot else t, ldd or n))
    scale = None if per_slot else rng.uniform(0.5, 2.0, e)
    dx0 = rng.standard_normal((slots, k))
    dxb, dyb, step = f32(dev, dx0), f32(dev, dy), step_buffer(dev, t)
    grp = dev.buffer(4 * K.moe_group_rows(e, ksel, t))
    ids_buf = u32_buffer(dev, ids)
    plan = K.moe_group(dev, e, ksel, ids_buf, grp, step, tile=K.MOE_DX_GROUPS)
    split = e // 2 + 1
    rb = len(raw) // (e * n)
    for first, here in ((0, split), (split, e - split)):
        part = weight_buffer(dev, raw[first * n * rb:(first + here) * n * rb])
        K.moe_experts_dx(dev, qtype, k, n, e, ksel, part, dyb, dxb, grp, t, per_slot_dy=per_slot,
                         weights=None if per_slot else f32(dev, weights),
                         down_scale=None if per_slot else f32(dev, scale), ldd=ldd, col0=col0,
                         accumulate=per_slot, first_expert=first, experts_here=here, plan=plan)
    dev.submit(plan)
    got = read_f32(dev, dxb, slots * k).reshape(slots, k)
    flat = ids.reshape(-1)
    for s, ex in enumerate(flat):
        row = dy[s, col0:col0 + n] if per_slot else dy[s // ksel] * weights.reshape(-1)[s] * scale[ex]
        want = B.linear_backward(w[ex], row) + (dx0[s] if per_slot else 0)
        bound = np.abs(row) @ np.abs(w[ex]) + (np.abs(dx0[s]) if per_slot else 0)
        assert rel_err(got[s], want, bound) < 2e-5, f"slot {s}"


@pytest.mark.parametrize("qtype,fused", [("f32", True), ("f32", False), ("q8_0", True), ("q4_k", False)])
def test_experts_input_gradient(dev, qtype, fused):
    """The experts' input gradient as pyapp.train.backward records it: dmid = down^T (w s dout) per slot
    (moe_experts_dx), [dgate | dup] (geglu_backward on the forward's kept pre-activations), the per-slot
    gate/up products (fused gate|up rows, or gate then up accumulated), their sum per token: experts_backward's dx."""
    from pyapp import ggml
    from pyapp.reference.forward import gelu_tanh
    rng = np.random.default_rng(ggml.lookup(qtype).id + fused)
    qk = ggml.lookup(qtype).block
    d, ff = (256, 256) if qk == 256 else (96, 64) if qk == 32 else (36, 20)
    t, e, ksel = 9, 5, 2
    slots = t * ksel
    raw_gu = random_tensor(qtype, e * 2 * ff, d, rng)
    raw_dn = random_tensor(qtype, e * d, ff, rng)
    gu = dequantize(qtype, raw_gu, e * 2 * ff, d).reshape(e, 2 * ff, d)
    down = dequantize(qtype, raw_dn, e * d, ff).reshape(e, d, ff)
    gate_w, up_w = gu[:, :ff], gu[:, ff:]
    scale = rng.uniform(0.5, 2.0, e)
    x = rng.standard_normal((t, d)) * 0.5
    _, _, ids, weights = route(rng, t, e, ksel)
    dout = rng.standard_normal((t, d))
    pre = np.stack([np.concatenate([gate_w[ex] @ x[s // ksel], up_w[ex] @ x[s // ksel]])
                    for s, ex in enumerate(ids.reshape(-1))])            # the forward's [gate | up] per slot
    want, _ = B.experts_backward(x, ids, weights, gate_w, up_w, down, scale, dout)

    step, grp, ids_buf = step_buffer(dev, t), dev.buffer(4 * K.moe_group_rows(e, ksel, t)), u32_buffer(dev, ids)
    dmid, dgu, dxs, dx = (dev.buffer(4 * n) for n in (slots * ff, slots * 2 * ff, slots * d, t * d))
    plan = K.moe_group(dev, e, ksel, ids_buf, grp, step, tile=K.MOE_DX_GROUPS)
    K.moe_experts_dx(dev, qtype, ff, d, e, ksel, weight_buffer(dev, raw_dn), f32(dev, dout), dmid, grp, t,
                     weights=f32(dev, weights), down_scale=f32(dev, scale), plan=plan)
    rb = len(raw_gu) // (e * 2 * ff)
    if fused:
        K.geglu_backward(dev, ff, f32(dev, pre), dmid, dgu, step, t, rows_per_token=ksel, plan=plan)
        K.moe_experts_dx(dev, qtype, d, 2 * ff, e, ksel, weight_buffer(dev, raw_gu), dgu, dxs, grp, t,
                         per_slot_dy=True, plan=plan)
    else:      # gate and up as two tensors [E, ff, d], their pre-activations and gradients apart
        per_expert = lambda lo: b"".join(raw_gu[(ex * 2 * ff + lo) * rb:(ex * 2 * ff + lo + ff) * rb]    # noqa: E731
                                         for ex in range(e))
        gate_b, up_b = f32(dev, pre[:, :ff]), f32(dev, pre[:, ff:])
        dgate, dup = dev.buffer(4 * slots * ff), dev.buffer(4 * slots * ff)
        K.gelu_times_backward(dev, ksel * ff, gate_b, up_b, dmid, dgate, step, t, plan=plan)
        K.elementwise(dev, "geglu", ksel * ff, gate_b, step, t, b=dmid, out=dup, plan=plan)
        K.moe_experts_dx(dev, qtype, d, ff, e, ksel, weight_buffer(dev, per_expert(0)), dgate, dxs, grp, t,
                         per_slot_dy=True, plan=plan)
        K.moe_experts_dx(dev, qtype, d, ff, e, ksel, weight_buffer(dev, per_expert(ff)), dup, dxs, grp, t,
                         per_slot_dy=True, accumulate=True, plan=plan)
    K.moe_slot_sum(dev, d, ksel, dxs, dx, step, t, plan=plan)
    dev.submit(plan)
    got = read_f32(dev, dx, t * d).reshape(t, d)
    # the rounding's scale: the same products over absolute values
    absd = np.zeros_like(want)
    for s, ex in enumerate(ids.reshape(-1)):
        ti = s // ksel
        dm = np.abs(down[ex]).T @ np.abs(weights[ti, s % ksel] * scale[ex] * dout[ti])
        g, u = pre[s, :ff], pre[s, ff:]
        absd[ti] += np.abs(gate_w[ex]).T @ np.abs(B.gelu_tanh_backward(g, dm * np.abs(u))) + \
            np.abs(up_w[ex]).T @ (dm * np.abs(gelu_tanh(g)))
    assert rel_err(got, want, absd) < 5e-5
