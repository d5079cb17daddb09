"""Parity of the attention kernels (pyapp.gpu.kernels' kv_store, attention, attention_decode) against numpy:
prefill per token, tiled and in wide register-blocked tiles (GQA groups of 1-8, head dims 20-512, a second chunk
over a ring), the split-K decode
kernel for one query and a few, and the query and cache preparation it does itself."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp.gpu import kernels as K
from pyapp.reference.forward import rms_norm, rope_neox

from support.gpu import (assert_close_dot, dequantize, f32, int8_reference, random_tensor, read_f32, step_buffer,
                         weight_buffer)

pytestmark = pytest.mark.gpu


def attention_ref(q, keys, values, positions, window):
    """numpy mirror of reference.forward attention; keys/values [kv_heads, total, hd]."""
    total = keys.shape[1]
    allowed = np.arange(total)[None, :] <= positions[:, None]
    if window:
        allowed &= positions[:, None] - np.arange(total)[None, :] < window
    g = q.shape[1] // keys.shape[0]
    kq, vq = np.repeat(keys, g, axis=0), np.repeat(values, g, axis=0)
    s = np.einsum("nhd,htd->hnt", q, kq)
    s = np.where(allowed[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hnt,htd->nhd", p, vq)


@pytest.mark.parametrize("tiled", [False, True, 16, "wide"], ids=["per-token", "tiled", "tiled-16-rows", "wide"])
@pytest.mark.parametrize("window,hd,h,gh", [(0, 36, 4, None), (13, 136, 4, None), (0, 36, 16, 8), (13, 20, 16, 4),
                                             (0, 512, 8, 4), (5, 72, 16, 1), (40, 256, 16, None), (0, 300, 4, None),
                                             (7, 384, 16, None), (0, 128, 2, None), (70, 512, 16, None),
                                             (0, 256, 16, None)])
def test_attention_prefill_then_decode(dev, window, hd, h, gh, tiled):
    """Prefill attention: per token with 1-8 query heads of a KV head per workgroup (GQA groups of 2
    and 8), tiled (32 or 16 query rows a workgroup, several tokens each, keys in tiles of 32), and in wide
    tiles (32 rows, keys in tiles of 128, several outputs a thread: heads of 128-512 in 128s, groups 1-8)."""
    rows = K.attention_tile_rows(dev, h // 2, hd)
    if tiled == "wide" and not K.wide_tile_fits(dev, h // 2, hd):
        pytest.skip("no wide tile for this shape")
    if tiled in (True, 16) and (rows == 0 or tiled == 16 and (hd > 256 or h // 2 > 16)):
        pytest.skip("no tile for this shape on this device")
    rng = np.random.default_rng(10)
    hkv, ctx, t = 2, 300, 150                             # 150 keys: more than one 128-key chunk
    ks = rng.standard_normal((t + 1, hkv, hd)).astype(np.float32)
    vs = rng.standard_normal((t + 1, hkv, hd)).astype(np.float32)
    q = rng.standard_normal((t + 1, h, hd)).astype(np.float32) * 0.3
    kc, vc = dev.buffer(4 * hkv * ctx * hd), dev.buffer(4 * hkv * ctx * hd)
    out = dev.buffer(4 * (t + 1) * h * hd)

    # prefill: T tokens at positions 0..T-1
    step = step_buffer(dev, t, 0)
    plan = K.kv_store(dev, f32(dev, ks[:t]), f32(dev, vs[:t]), kc, vc, step, hkv, hd, ctx, max_tokens=t)
    K.attention(dev, f32(dev, q[:t]), kc, vc, out, step, h, hkv, hd, ctx, max_tokens=t, window=window, plan=plan,
                heads_per_group=gh, tiled=bool(tiled), tile_rows=16 if tiled == 16 else None,
                wide=tiled == "wide")
    dev.submit(plan)
    keys, values = ks.transpose(1, 0, 2), vs.transpose(1, 0, 2)
    ref = attention_ref(q[:t], keys[:, :t], values[:, :t], np.arange(t), window)
    atol = 2e-5 * max(1.0, (hd / 128) ** 0.5)             # f32 rounding grows with the dot products' length
    np.testing.assert_allclose(read_f32(dev, out, t * h * hd).reshape(t, h, hd), ref, atol=atol)

    # decode: one more token at position T
    step1 = step_buffer(dev, 1, t)
    plan = K.kv_store(dev, f32(dev, ks[t:]), f32(dev, vs[t:]), kc, vc, step1, hkv, hd, ctx, max_tokens=1)
    K.attention(dev, f32(dev, q[t:]), kc, vc, out, step1, h, hkv, hd, ctx, max_tokens=1, window=window, plan=plan)
    dev.submit(plan)
    ref = attention_ref(q[t:], keys, values, np.array([t]), window)
    np.testing.assert_allclose(read_f32(dev, out, h * hd).reshape(1, h, hd), ref, atol=atol)


@pytest.mark.parametrize("tiled", [False, True, "wide"], ids=["per-token", "tiled", "wide"])
@pytest.mark.parametrize("hd,h,window,t1,t2", [(64, 8, 40, 70, 80), (136, 4, 40, 70, 80), (256, 8, 40, 70, 80),
                                               (256, 8, 200, 280, 90)])
def test_attention_second_chunk_over_a_ring(dev, hd, h, window, t1, t2, tiled):
    """A prefill chunk after an earlier one (pos0 > 0) on a sliding layer whose cache is a ring of
    window + chunk - 1 slots: the chunk's own stores overwrite the oldest keys, none a query still sees
    (the wide tiles: a tile's keys wrap around the ring's end; with a window of 200, in a later key tile).
    Each store holds at most the ring's slots, as the engine's steps do: two tokens of one store landing in
    one slot would be written in no defined order."""
    if tiled == "wide" and not K.wide_tile_fits(dev, h // 2, hd):
        pytest.skip("no wide tile for this shape")
    rng = np.random.default_rng(12)
    hkv = 2
    ctx = window + t2 - 1
    n = t1 + t2
    assert t1 <= ctx and t2 <= ctx
    ks = rng.standard_normal((n, hkv, hd)).astype(np.float32)
    vs = rng.standard_normal((n, hkv, hd)).astype(np.float32)
    q = rng.standard_normal((n, h, hd)).astype(np.float32) * 0.3
    kc, vc = dev.buffer(4 * hkv * ctx * hd), dev.buffer(4 * hkv * ctx * hd)
    out = dev.buffer(4 * t2 * h * hd)
    plan = dev.plan()
    for a, b in ((0, t1), (t1, n)):
        step = step_buffer(dev, b - a, a)
        K.kv_store(dev, f32(dev, ks[a:b]), f32(dev, vs[a:b]), kc, vc, step, hkv, hd, ctx, max_tokens=b - a, plan=plan)
        if a:
            K.attention(dev, f32(dev, q[a:b]), kc, vc, out, step, h, hkv, hd, ctx, max_tokens=b - a, window=window,
                        plan=plan, tiled=bool(tiled), wide=tiled == "wide")
    dev.submit(plan)
    ref = attention_ref(q[t1:], ks.transpose(1, 0, 2), vs.transpose(1, 0, 2), np.arange(t1, n), window)
    np.testing.assert_allclose(read_f32(dev, out, t2 * h * hd).reshape(t2, h, hd), ref, atol=3e-5)


@pytest.mark.parametrize("hd,h,kernel", [(512, 8, "attention_prefill_wide"), (384, 16, "attention_prefill_wide"),
                                          (256, 8, "attention_prefill_wide"), (128, 8, "attention_prefill"),
                                          (512, 128, "attention")])
def test_wide_heads_take_the_wide_tiles(dev, hd, h, kernel):
    """A prompt's attention picks the wide tiles for heads of 256 and wider (all of Gemma 4's layers) where
    they fit (32 rows take a GQA group of up to 32); narrower heads keep the 32-row tiles, and a group of 64
    query heads a KV head fits no tile (one token a workgroup)."""
    if not K.wide_tile_fits(dev, 8, 512):
        pytest.skip("this device's workgroup storage takes no wide tile")
    hkv, ctx, t = 2, 64, 40
    q, out = dev.buffer(4 * t * h * hd), dev.buffer(4 * t * h * hd)
    kc, vc = dev.buffer(4 * hkv * ctx * hd), dev.buffer(4 * hkv * ctx * hd)
    plan = K.attention(dev, q, kc, vc, out, step_buffer(dev, t, 0), h, hkv, hd, ctx, max_tokens=t)
    assert [op[1].key[0] for op in plan.ops if op[0] == "d"] == [kernel]


def decode_attention_ref(q, keys, vals, pos, window):
    """softmax(q k^T) v for one query [heads, hd] at pos over keys/vals [kv_heads, pos + 1, hd] (GQA, window)."""
    h, hkv = q.shape[0], keys.shape[0]
    lo = max(0, pos + 1 - window) if window else 0
    want = np.zeros(q.shape)
    for i in range(h):
        kk, vv = keys[i // (h // hkv), lo:], vals[i // (h // hkv), lo:]
        sc = kk @ q[i]
        p = np.exp(sc - sc.max())
        want[i] = (p / p.sum()) @ vv
    return want


@pytest.mark.parametrize("hd,window,pos", [(64, 0, 0), (256, 0, 77), (512, 0, 40), (128, 8, 70), (256, 40, 100), (20, 0, 33)])
def test_attention_decode_split_matches_single_pass(dev, hd, window, pos):
    """The split-K decode kernel equals the reference attention for one query at `pos`."""
    rng = np.random.default_rng(hd + pos)
    h, hkv, ctx = 4, 2, 128
    keys = rng.standard_normal((hkv, pos + 1, hd)).astype(np.float32)
    vals = rng.standard_normal((hkv, pos + 1, hd)).astype(np.float32)
    q = rng.standard_normal((h, hd)).astype(np.float32) * 0.3
    kc, vc = np.zeros((hkv, ctx, hd), np.float32), np.zeros((hkv, ctx, hd), np.float32)
    for j in range(pos + 1):
        kc[:, j % ctx], vc[:, j % ctx] = keys[:, j], vals[:, j]
    max_keys = window or ctx
    part = dev.buffer(4 * K.decode_partials(h, hd, max_keys))
    out = dev.buffer(4 * h * hd)
    dev.submit(K.attention_decode(dev, f32(dev, q), f32(dev, kc), f32(dev, vc), out, part, step_buffer(dev, 1, pos),
                                  h, hkv, hd, ctx, max_keys, window=window))
    want = decode_attention_ref(q, keys, vals, pos, window)
    np.testing.assert_allclose(read_f32(dev, out, h * hd).reshape(h, hd), want, atol=2e-5)


@pytest.mark.parametrize("h,hkv,hd,window,pos,keys_before,qtype,int8", [
    (8, 1, 256, 512, 700, 0, "q4_k", False),     # E2B's sliding layer deep in a context: 16 splits, all used
    (8, 1, 256, 512, 700, 0, "q4_k", True),      # ... x rounded to int8 by each workgroup after the combine
    (8, 1, 256, 512, 5, 0, "q6_k", False),       # early: 1 split of 16 holds keys (the others NaN)
    (4, 2, 64, 40, 100, 0, "q8_0", False),
    (3, 3, 20, 0, 33, 0, "f16", False),          # odd: a head of 20, 3 heads, no window
    (4, 1, 32, 96, 200, 1, "f32", False),        # a drafter's query: the keys before its position
    (8, 1, 32, 64, 100, 0, "q8_0", False),       # 1536 rows: 192 workgroups, each combining
])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_a_matvec_combines_the_decode_splits_into_its_input(dev, h, hkv, hd, window, pos, keys_before, qtype, int8,
                                                           subgroups):
    """attention_decode(combine=False) leaves its partials; the matvec reading the attention output combines
    them in each workgroup (K.CombineInput, shaders/matvec_input_combine.wgsl): y = W attention(q) as the
    reference computes it. The splits past the query's keys hold NaN (an earlier step's states): never read."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(hd + pos + h)
    ctx = 1024
    keys = rng.standard_normal((hkv, pos + 1, hd)).astype(np.float32)
    vals = rng.standard_normal((hkv, pos + 1, hd)).astype(np.float32)
    q = rng.standard_normal((h, hd)).astype(np.float32) * 0.3
    kc, vc = np.zeros((hkv, ctx, hd), np.float32), np.zeros((hkv, ctx, hd), np.float32)
    kc[:, :pos + 1], vc[:, :pos + 1] = keys, vals
    max_keys = window or ctx
    assert K.combines_in_matvec(h, hd, max_keys) == (window > 0 or hd < 64)
    part = f32(dev, np.full(K.decode_partials(h, hd, max_keys), np.nan, np.float32))
    step = step_buffer(dev, 1, pos)
    k, n = h * hd, 1536 if qtype == "q8_0" else 37
    raw = random_tensor(qtype, n, k, rng)
    y = dev.buffer(4 * n)
    plan = K.attention_decode(dev, f32(dev, q), f32(dev, kc), f32(dev, vc), dev.dummy_out, part, step, h, hkv, hd,
                              ctx, max_keys, window=window, keys_before=keys_before, combine=False)
    combined = K.combine_input(part, step, h, hd, max_keys, window=window, keys_before=keys_before)
    dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), None, y, plan=plan, subgroups=subgroups,
                        residual=combined, int8=int8))
    last = pos - keys_before                      # the query sees keys 0..last (in its window)
    x = decode_attention_ref(q, keys[:, :last + 1], vals[:, :last + 1], last, window).reshape(-1)
    w = dequantize(qtype, raw, n, k)
    if int8:                                      # x within float rounding of a rounding tie may round either way
        np.testing.assert_allclose(read_f32(dev, y, n), int8_reference(raw, n, x), rtol=1e-3,
                                   atol=1e-3 * np.abs(w @ x).max())
    else:
        assert_close_dot(read_f32(dev, y, n), w, x, w @ x, tol=1e-4)


@pytest.mark.parametrize("hd,pos,ctx", [(512, 2999, 4096), (256, 1000, 2048), (36, 700, 1024)])
def test_attention_decode_long_context(dev, hd, pos, ctx):
    """Deep in a long context (tens of splits, summed by several combine workgroups a head, each thread over
    several groups of four): the reference attention; the partials of the splits past the query's keys are
    never written nor read (the scratch starts as NaN, and a NaN read would show in every output)."""
    rng = np.random.default_rng(hd + pos)
    h, hkv = 8, 1
    keys = rng.standard_normal((hkv, pos + 1, hd)).astype(np.float32)
    vals = rng.standard_normal((hkv, pos + 1, hd)).astype(np.float32)
    q = rng.standard_normal((h, hd)).astype(np.float32) * 0.1
    kc, vc = np.zeros((hkv, ctx, hd), np.float32), np.zeros((hkv, ctx, hd), np.float32)
    kc[:, :pos + 1], vc[:, :pos + 1] = keys, vals
    part = f32(dev, np.full(K.decode_partials(h, hd, ctx), np.nan, np.float32))
    out = dev.buffer(4 * h * hd)
    dev.submit(K.attention_decode(dev, f32(dev, q), f32(dev, kc), f32(dev, vc), out, part, step_buffer(dev, 1, pos),
                                  h, hkv, hd, ctx, ctx))
    want = decode_attention_ref(q, keys, vals, pos, 0)
    got = read_f32(dev, out, h * hd).reshape(h, hd)
    assert np.abs(want).max() > 0.02          # the query is not so flat that every output is ~0
    np.testing.assert_allclose(got, want, atol=2e-5)
    empty = read_f32(dev, part, K.decode_partials(h, hd, ctx)).reshape(h, -1, hd + 4)[:, -(-(pos + 1) // 32):]
    assert np.isnan(empty).all()


@pytest.mark.parametrize("sized", [True, False], ids=["sized", "whole"])
@pytest.mark.parametrize("window,keys_before,rows", [(0, 0, 1), (600, 0, 1), (0, 1, 1), (0, 0, 3)])
def test_one_decode_plan_serves_every_position(dev, window, keys_before, rows, sized):
    """A plan recorded once for a 1,024-key context (32 splits) and replayed at positions from the first to the
    last, a step written before each: every output is the reference attention's, whether the plan dispatches
    every split (whole: a GPU's) or only those the step's keys fill (sized by the step: a CPU adapter's)."""
    rng = np.random.default_rng(window + keys_before + rows)
    h, hkv, hd, ctx = 4, 2, 64, 1024
    keys = rng.standard_normal((hkv, ctx, hd)).astype(np.float32)
    vals = rng.standard_normal((hkv, ctx, hd)).astype(np.float32)
    q = (rng.standard_normal((rows, h, hd)) * 0.3).astype(np.float32)
    max_keys = window or ctx
    part = dev.buffer(4 * rows * K.decode_partials(h, hd, max_keys))
    out = dev.buffer(4 * rows * h * hd)
    step = step_buffer(dev, rows, 5)
    plan = K.attention_decode(dev, f32(dev, q), f32(dev, keys), f32(dev, vals), out, part, step, h, hkv, hd, ctx,
                              max_keys, window=window, keys_before=keys_before, max_tokens=rows, sized=sized)
    assert (plan.ops[0][6] is not None) == sized         # attend_split: an indirect dispatch or not
    for pos0 in (1, 31, 32, 33, 500, 700, ctx - rows):
        K.write_step(dev, step, rows, pos0)
        dev.submit(plan)
        got = read_f32(dev, out, rows * h * hd).reshape(rows, h, hd)
        for i in range(rows):
            last = pos0 + i - keys_before              # the query's last key
            want = decode_attention_ref(q[i], keys[:, :last + 1], vals[:, :last + 1], last, window)
            np.testing.assert_allclose(got[i], want, atol=2e-5, err_msg=f"query at {pos0 + i}")


def test_decode_split_counts_cover_the_last_querys_keys():
    """The step's attend_split workgroups (heads, splits, tokens): the splits of 32 keys the step's last query
    fills, within the window and the plan's splits, and no more tokens than the plan's."""
    rule = K.decode_split_counts(8, 64, 0, 0, 1)
    assert [rule(1, p)[1] for p in (0, 30, 31, 32, 63, 64, 2047, 5000)] == [1, 1, 1, 2, 2, 3, 64, 64]
    assert rule(1, 40) == (8, 2, 1) and rule(7, 40) == (8, 2, 1)     # a prefill step: the one-token plan idle
    few = K.decode_split_counts(4, 40, 0, 0, 4)
    assert few(3, 61) == (4, 2, 3) and few(4, 61) == (4, 3, 4) and few(9, 61) == (4, 3, 4)
    windowed = K.decode_split_counts(4, 19, 600, 0, 1)
    assert [windowed(1, p)[1] for p in (100, 575, 576, 599, 10_000)] == [4, 18, 19, 19, 19]
    before = K.decode_split_counts(4, 32, 0, 1, 1)
    assert [before(1, p)[1] for p in (0, 1, 32, 33)] == [0, 1, 1, 2]     # pos 0 sees no key: nothing runs


@pytest.mark.parametrize("hd,window,pos0,t", [(64, 0, 40, 5), (36, 8, 70, 9), (128, 0, 0, 3)])
def test_attention_decode_few_tokens(dev, hd, window, pos0, t):
    """The split-K kernel over a few queries (speculative decoding's token and drafts): query i at pos0 + i
    sees the keys up to its own position (causal among the step's tokens, sliding window); queries past
    the step's count are not written."""
    rng = np.random.default_rng(hd + pos0 + t)
    h, hkv, ctx, rows = 4, 2, 128, t + 2
    last = pos0 + t - 1
    keys = rng.standard_normal((hkv, last + 1, hd)).astype(np.float32)
    vals = rng.standard_normal((hkv, last + 1, hd)).astype(np.float32)
    q = rng.standard_normal((rows, h, hd)).astype(np.float32) * 0.3
    kc, vc = np.zeros((hkv, ctx, hd), np.float32), np.zeros((hkv, ctx, hd), np.float32)
    for j in range(last + 1):
        kc[:, j % ctx], vc[:, j % ctx] = keys[:, j], vals[:, j]
    max_keys = window or ctx
    part = dev.buffer(4 * rows * K.decode_partials(h, hd, max_keys))
    out = f32(dev, np.full((rows, h, hd), 7.0, np.float32))
    dev.submit(K.attention_decode(dev, f32(dev, q), f32(dev, kc), f32(dev, vc), out, part, step_buffer(dev, t, pos0),
                                  h, hkv, hd, ctx, max_keys, window=window, max_tokens=rows))
    got = read_f32(dev, out, rows * h * hd).reshape(rows, h, hd)
    for i in range(t):
        want = decode_attention_ref(q[i], keys[:, :pos0 + i + 1], vals[:, :pos0 + i + 1], pos0 + i, window)
        np.testing.assert_allclose(got[i], want, atol=2e-5)
    assert (got[t:] == 7.0).all()


@pytest.mark.parametrize("mode,hd,nrot,ff,window,pos", [(2, 64, 64, False, 0, 0), (2, 128, 32, True, 0, 77),
                                                         (2, 36, 36, False, 8, 70), (1, 128, 32, True, 0, 40),
                                                         (2, 512, 128, True, 0, 33)])
def test_attention_decode_preps_query_and_cache(dev, mode, hd, nrot, ff, window, pos):
    """The split kernel norms and ropes the raw query itself (PREP 1) and, PREP 2, also norms, ropes and
    stores the raw key and value of the current position before attending."""
    rng = np.random.default_rng(hd + pos + mode)
    h, hkv, ctx = 4, 2, 128
    keys = rng.standard_normal((hkv, pos + 1, hd)).astype(np.float32)
    vals = rng.standard_normal((hkv, pos + 1, hd)).astype(np.float32)
    kc, vc = np.zeros((hkv, ctx, hd), np.float32), np.zeros((hkv, ctx, hd), np.float32)
    for j in range(pos + (mode == 1)):           # PREP 2 writes the current position itself
        kc[:, j % ctx], vc[:, j % ctx] = keys[:, j], vals[:, j]
    q_raw, k_raw, v_raw = (rng.standard_normal((n, hd)).astype(np.float32) for n in (h, hkv, hkv))
    qw, kw = rng.standard_normal(hd).astype(np.float32), rng.standard_normal(hd).astype(np.float32)
    ffv = np.where(np.arange(hd // 2) < nrot // 4, 1.0, 1e30).astype(np.float32) if ff else None
    raw = np.concatenate([q_raw.ravel(), k_raw.ravel(), v_raw.ravel()]) if mode == 2 else q_raw.ravel()
    q = rope_neox(rms_norm(q_raw[None], qw, 1e-6), np.array([pos]), nrot, 10000.0, ffv)[0]
    if mode == 2:
        keys[:, pos] = rope_neox(rms_norm(k_raw[None], kw, 1e-6), np.array([pos]), nrot, 10000.0, ffv)[0]
        vals[:, pos] = rms_norm(v_raw[None], None, 1e-6)[0]
    prep = K.QueryPrep(mode, 0, f32(dev, qw), nrot, 10000.0, freq_factors=f32(dev, ffv) if ff else None,
                       k_off=h * hd, v_off=(h + hkv) * hd, k_weight=f32(dev, kw) if mode == 2 else None)
    max_keys = window or ctx
    part = dev.buffer(4 * K.decode_partials(h, hd, max_keys))
    out = dev.buffer(4 * h * hd)
    kcb, vcb = f32(dev, kc), f32(dev, vc)
    dev.submit(K.attention_decode(dev, f32(dev, raw), kcb, vcb, out, part, step_buffer(dev, 1, pos), h, hkv, hd, ctx,
                                  max_keys, window=window, prep=prep))
    want = decode_attention_ref(q, keys, vals, pos, window)
    np.testing.assert_allclose(read_f32(dev, out, h * hd).reshape(h, hd), want, atol=3e-5)
    if mode == 2:
        got_k = read_f32(dev, kcb, kc.size).reshape(kc.shape)[:, pos % ctx]
        np.testing.assert_allclose(got_k, keys[:, pos], atol=2e-5)


@pytest.mark.parametrize("prep", [False, True])
@pytest.mark.parametrize("hd,window,pos,ctx", [(64, 0, 1, 128), (256, 0, 77, 128), (512, 0, 40, 128),
                                                (36, 9, 70, 128), (256, 9, 5, 128), (128, 33, 100, 40)])
def test_attention_decode_keys_before_the_query(dev, prep, hd, window, pos, ctx):
    """keys_before=1 (an assistant drafter's query over its target's cache): the query at pos sees the keys
    before it only, j <= pos - 1, and with a window the `window` keys that end there; its own position's
    slot holds a key it must not see, and a ring (ctx 40) holds the window. prep: the raw query normed and
    roped at pos by the kernel (mode 1)."""
    rng = np.random.default_rng(hd + pos + window)
    h, hkv = 4, 1
    keys = rng.standard_normal((hkv, pos + 1, hd)).astype(np.float32)
    vals = rng.standard_normal((hkv, pos + 1, hd)).astype(np.float32)
    kc, vc = np.zeros((hkv, ctx, hd), np.float32), np.zeros((hkv, ctx, hd), np.float32)
    for j in range(pos + 1):                     # the key at pos is there too: the target wrote it ahead
        kc[:, j % ctx], vc[:, j % ctx] = keys[:, j], vals[:, j]
    q_raw = rng.standard_normal((h, hd)).astype(np.float32)
    qw = (1 + 0.3 * rng.standard_normal(hd)).astype(np.float32)
    nrot = hd // 2
    q = rope_neox(rms_norm(q_raw[None], qw, 1e-6), np.array([pos]), nrot, 10000.0)[0] if prep else q_raw * 0.3
    max_keys = window or ctx
    part = dev.buffer(4 * K.decode_partials(h, hd, max_keys))
    out = dev.buffer(4 * h * hd)
    query_prep = K.QueryPrep(1, 0, f32(dev, qw), nrot, 10000.0) if prep else None
    dev.submit(K.attention_decode(dev, f32(dev, q_raw if prep else q), f32(dev, kc), f32(dev, vc), out, part,
                                  step_buffer(dev, 1, pos), h, hkv, hd, ctx, max_keys, window=window,
                                  prep=query_prep, keys_before=1))
    want = decode_attention_ref(q, keys[:, :pos], vals[:, :pos], pos - 1, window)
    np.testing.assert_allclose(read_f32(dev, out, h * hd).reshape(h, hd), want, atol=5e-5)   # f32 RoPE at pos 77
