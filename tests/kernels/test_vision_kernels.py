"""Parity of the image encoder's own kernels (pyapp.gpu.kernels.vision: shaders/vision.wgsl) and of
attention over every key (attention(all_keys=True)) against pyapp/families/gemma4_vision/reference.py, on odd grids."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyapp.gpu import kernels as K
from pyapp.families.gemma4_vision import reference as ref

from support.gpu import f32, read_f32, step_buffer

pytestmark = pytest.mark.gpu


def grid(dev, across: int, down: int):
    g = dev.buffer(K.GRID_BYTES, kind="uniform")
    dev.write(g, K.pack_grid(across, down))
    return g


def positions(across: int, down: int) -> np.ndarray:
    """(x, y) of each patch, row by row (the order of the processor and the GPU's grid)."""
    return np.array([(t % across, t // across) for t in range(across * down)], np.int64)


def rgba(rng, width: int, height: int) -> np.ndarray:
    return rng.integers(0, 256, (height, width, 4), dtype=np.uint8)


def ref_patches(image: np.ndarray, patch: int, channel_first: bool, signed: bool = True) -> np.ndarray:
    """The encoder's input rows: 2 * (pixel / 255 - 0.5) (signed; else pixel / 255, the 12B's), patch by
    patch, in the weight's order."""
    h, w = image.shape[0] // patch, image.shape[1] // patch
    px = image[..., :3].astype(np.float64) / 255.0
    blocks = px.reshape(h, patch, w, patch, 3).transpose(0, 2, 1, 3, 4)     # [py, px, y, x, c]
    if channel_first:
        blocks = blocks.transpose(0, 1, 4, 2, 3)                              # [py, px, c, y, x]
    rows = blocks.reshape(h * w, -1)
    return 2.0 * (rows - 0.5) if signed else rows


@pytest.mark.parametrize("channel_first,signed", [(True, True), (False, True), (True, False)])
def test_patchify(dev, channel_first, signed):
    rng = np.random.default_rng(1)
    patch, across, down = 5, 3, 7
    image = rgba(rng, across * patch, down * patch)
    x = dev.buffer(4 * across * down * 3 * patch * patch)
    dev.submit(K.patchify(dev, patch, channel_first, grid(dev, across, down),
                          f32(dev, image.view(np.float32)), x, max_patches=across * down + 5, signed=signed))
    want = ref_patches(image, patch, channel_first, signed)
    np.testing.assert_allclose(read_f32(dev, x, want.size).reshape(want.shape), want, atol=1e-6)


@pytest.mark.parametrize("qtype", [K.ggml.F32, K.ggml.F16])
def test_add_positions(dev, qtype):
    rng = np.random.default_rng(2)
    across, down, d, n_pos = 5, 3, 12, 9
    table = rng.standard_normal((2, n_pos, d)).astype(np.float32)
    stored = table.astype(np.float16) if qtype == K.ggml.F16 else table
    x0 = rng.standard_normal((across * down, d)).astype(np.float32)
    x = f32(dev, x0)
    w = dev.buffer(stored.nbytes + 4)
    dev.write(w, stored.tobytes())
    dev.submit(K.add_positions(dev, qtype, d, n_pos, w, grid(dev, across, down), x, max_patches=across * down + 3))
    pos = positions(across, down)
    t = stored.astype(np.float32)
    want = x0 + t[0][pos[:, 0]] + t[1][pos[:, 1]]
    np.testing.assert_allclose(read_f32(dev, x, x0.size).reshape(x0.shape), want, rtol=1e-6, atol=1e-6)


def test_rope_2d(dev):
    rng = np.random.default_rng(3)
    across, down, heads, hd = 7, 5, 3, 12
    x0 = rng.standard_normal((across * down, heads, hd)).astype(np.float32)
    x = f32(dev, x0)
    dev.submit(K.rope_2d(dev, heads, hd, 100.0, grid(dev, across, down), x, max_patches=across * down))
    want = ref.rope_2d(x0.astype(np.float64), positions(across, down), 100.0)
    np.testing.assert_allclose(read_f32(dev, x, x0.size).reshape(x0.shape), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("std", [False, True])
def test_pool(dev, std):
    rng = np.random.default_rng(5)
    across, down, d, k = 6, 9, 7, 3
    x0 = rng.standard_normal((across * down, d)).astype(np.float32)
    n = across * down // (k * k)
    out = dev.buffer(4 * n * d)
    sb, ss = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    dev.submit(K.pool(dev, d, k, math.sqrt(d), grid(dev, across, down), f32(dev, x0), out, max_squares=n + 2,
                      std=(f32(dev, sb), f32(dev, ss)) if std else None))
    enc = ref.VisionEncoder.__new__(ref.VisionEncoder)
    enc.pool = k
    want = enc.pool_patches(x0.astype(np.float64), positions(across, down)) * math.sqrt(d)
    if std:
        want = (want - sb) * ss
    np.testing.assert_allclose(read_f32(dev, out, n * d).reshape(n, d), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tiled,hd", [(True, 16), (False, 16), ("wide", 128)])
def test_attention_over_every_key(dev, tiled, hd):
    """Bidirectional attention: every query sees every key of the step, its own position or not."""
    rng = np.random.default_rng(6)
    T, heads, ctx = 45, 2, 80
    q = rng.standard_normal((T, heads, hd)).astype(np.float32)
    k = rng.standard_normal((T, heads, hd)).astype(np.float32)
    v = rng.standard_normal((T, heads, hd)).astype(np.float32)
    kc, vc = (np.zeros((heads, ctx, hd), np.float32) for _ in range(2))
    kc[:, :T], vc[:, :T] = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
    out = dev.buffer(q.nbytes)
    dev.submit(K.attention(dev, f32(dev, q), f32(dev, kc), f32(dev, vc), out, step_buffer(dev, T), heads, heads, hd,
                           ctx, max_tokens=T, tiled=bool(tiled), all_keys=True, wide=tiled == "wide"))
    s = np.einsum("thd,shd->hts", q.astype(np.float64), k)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("hts,shd->thd", p, v)
    np.testing.assert_allclose(read_f32(dev, out, q.size).reshape(q.shape), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tiled,hd", [(True, 16), (False, 16), ("wide", 256)])
def test_attention_sees_an_image_block_both_ways(dev, tiled, hd):
    """keys_ahead: a query inside an image's block also sees the block's later keys; the sliding window
    bounds only the keys before it (transformers' AND(window, OR(causal, block)) on 26B-A4B's sliding layers)."""
    rng = np.random.default_rng(7)
    T, pos0, heads, kv_heads, ctx, window = 70, 5, 4, 2, 96, 6
    block = (pos0 + 12, pos0 + 21)          # positions 17..25 form an image
    q = rng.standard_normal((T, heads, hd)).astype(np.float32)
    kc = rng.standard_normal((kv_heads, ctx, hd)).astype(np.float32)
    vc = rng.standard_normal((kv_heads, ctx, hd)).astype(np.float32)
    positions = pos0 + np.arange(T)
    last = np.where((positions >= block[0]) & (positions < block[1]), block[1] - 1, positions)
    out = dev.buffer(q.nbytes)
    dev.submit(K.attention(dev, f32(dev, q), f32(dev, kc), f32(dev, vc), out, step_buffer(dev, T, pos0), heads,
                           kv_heads, hd, ctx, max_tokens=T, window=window, tiled=bool(tiled), wide=tiled == "wide",
                           keys_ahead=f32(dev, (last - positions).astype(np.uint32).view(np.float32))))
    j = np.arange(ctx)
    allowed = ((j[None] <= positions[:, None]) | (j[None] <= last[:, None])) \
        & ((j[None] > positions[:, None]) | (positions[:, None] - j[None] < window))
    k, v = np.repeat(kc, heads // kv_heads, 0), np.repeat(vc, heads // kv_heads, 0)
    s = np.einsum("thd,hjd->htj", q.astype(np.float64), k)
    s = np.where(allowed[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("htj,hjd->thd", p, v)
    atol = 1e-5 * (hd / 16) ** 0.5                    # f32 rounding grows with the dot products' length
    np.testing.assert_allclose(read_f32(dev, out, q.size).reshape(q.shape), want, rtol=1e-4, atol=atol)
