"""Parity of the prefill matmul kernels (pyapp.gpu.kernels' matmul: shaders/matmul*.wgsl) against numpy on odd
sizes: the tiles of every shape bench/matmul_sweep.py tries and the fallback within WebGPU's default limits, the
f16 tiles, the int8 path (activations to int8, the int8 matmul against exact integer sums), and the encoders'
clippable linears (the bounds applied inside the matmul)."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp import ggml
from pyapp.gpu import kernels as K

from support.gpu import (assert_close_dot, assert_rounded_q8, dequantize, f32, q8_sentinels, random_tensor, read_f32,
                         read_q8, step_buffer, weight_buffer)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("qtype", ["f32", "f16", "q8_0", "q4_0", "q5_1", "q4_k", "q6_k"])
@pytest.mark.parametrize("rows,t", [(45, 19), (150, 70)], ids=["one-tile", "tiles"])
def test_matmul(dev, qtype, rows, t):
    rng = np.random.default_rng(100 + ggml.lookup(qtype).id)
    qk = ggml.lookup(qtype).block
    k = 256 if qk == 256 else 4 * 29 if qk == 1 else 32 * 5
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal((t, k))
    y = dev.buffer(4 * rows * t)
    plan = K.matmul(dev, qtype, k, rows, weight_buffer(dev, raw), f32(dev, x), y, step_buffer(dev, t), n_tokens=t)
    dev.submit(plan)
    got = read_f32(dev, y, rows * t).reshape(t, rows)
    assert_close_dot(got, x, w, x @ w.T)


@pytest.mark.parametrize("qtype", ["f32", "f16"])
@pytest.mark.parametrize("bounds", [(-1.5, 2.5, -0.7, 0.9), (-np.inf, np.inf, -3.0, np.inf), (-np.inf, np.inf) * 2],
                         ids=["both", "out-low", "unbounded"])
def test_matmul_clamps_a_clippable_linear(dev, qtype, bounds):
    """matmul(clamp=...): Y = clip(clip(X, in_min, in_max) @ W^T, out_min, out_max), the bounds read from a 256-byte
    slot of a bounds buffer as the encoders keep them; X past the bounds on both sides, rows and tokens past a tile;
    tokens past the step left alone."""
    rng = np.random.default_rng(11)
    rows, t, k = 75, 37, 4 * 23
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = (rng.standard_normal((t + 5, k)) * 3).astype(np.float32)
    slots = np.zeros(2 * 64, np.float32)         # the second linear's slot: bytes 256..271
    slots[64:68] = bounds
    y = dev.buffer(4 * rows * (t + 5))
    dev.write(y, np.full(rows * (t + 5), 7.0, np.float32).tobytes())
    dev.submit(K.matmul(dev, qtype, k, rows, weight_buffer(dev, raw), f32(dev, x), y, step_buffer(dev, t),
                        n_tokens=t + 5, clamp=(f32(dev, slots), 256, 16)))
    got = read_f32(dev, y, rows * (t + 5)).reshape(t + 5, rows)
    xc = np.clip(x[:t], bounds[0], bounds[1]).astype(np.float64)
    assert_close_dot(got[:t], xc, w, np.clip(xc @ w.T, bounds[2], bounds[3]))
    if np.isfinite(bounds[2]):
        assert got[:t].min() == np.float32(bounds[2]) and (np.clip(xc @ w.T, None, bounds[3]) < bounds[2]).any()
    assert (got[t:] == 7.0).all()


def test_matmul_tile_fits_the_device(dev):
    """The engine's tiles, or a fallback within the device's limits (WebGPU's defaults: 256 threads,
    16 KiB of workgroup storage)."""
    for tile in (K.MATMUL, K.MOE_MATMUL):
        assert K.fit_tile(dev, tile).fits(dev)

    class Small:
        limits = {"max_compute_invocations_per_workgroup": 256, "max_compute_workgroup_size_x": 256,
                  "max_compute_workgroup_storage_size": 16384}
    assert K.fit_tile(Small, K.MATMUL) == K.MatmulTile(64, 64, 16)
    assert K.fit_tile(Small, K.MOE_MATMUL) == K.MatmulTile(64, 64, 16)


def test_matmul_tile_by_the_workgroups_it_makes():
    """The engine's tile where it makes enough workgroups; the smallest for few rows of W (the PLE gate's 256
    at a 512-token step: 16 workgroups of the engine's tile, 128 of the small one); the short one for few tokens."""
    assert K.matmul_tile_for(2048, 512) == K.MATMUL
    assert K.matmul_tile_for(1536, 512) == K.MATMUL              # 96 workgroups
    assert K.matmul_tile_for(256, 512) == K.MATMUL_FEW_ROWS
    assert K.matmul_tile_for(256, 64) == K.MATMUL_SHORT


@pytest.mark.parametrize("qtype", ["f32", "f16", "q4_k"])
@pytest.mark.parametrize("tile", [K.MatmulTile(64, 64, 16), K.MatmulTile(64, 64, 64), K.MatmulTile(32, 64, 32),
                                  K.MatmulTile(64, 32, 32), K.MatmulTile(32, 32, 32),
                                  K.MatmulTile(128, 32, 32), K.MatmulTile(64, 128, 32, 8), K.MatmulTile(32, 64, 16, 8)],
                         ids=lambda t: f"{t.rows}x{t.tokens}k{t.k}t{t.thread_tokens}")
def test_matmul_tile_shapes(dev, qtype, tile):
    """Tile shapes bench/matmul_sweep.py tries: rows and tokens past a tile, K past a step."""
    if not tile.fits(dev):
        pytest.skip("tile beyond this device's workgroup limits")
    rng = np.random.default_rng(7)
    rows, t = 150, 70
    k = 512 if qtype == "q4_k" else 4 * 29
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal((t, k))
    y = dev.buffer(4 * rows * t)
    dev.submit(K.matmul(dev, qtype, k, rows, weight_buffer(dev, raw), f32(dev, x), y, step_buffer(dev, t),
                        n_tokens=t, tile=tile))
    got = read_f32(dev, y, rows * t).reshape(t, rows)
    assert_close_dot(got, x, w, x @ w.T)


@pytest.mark.parametrize("qtype", ["f32", "f16", "q8_0", "q5_1", "q4_k", "q6_k"])
@pytest.mark.parametrize("math", [False, True], ids=["f16-tiles", "f16-math"])
@pytest.mark.parametrize("tile", [K.MATMUL_SHORT, K.MatmulTile(64, 128, 32, 8)], ids=lambda t: f"{t.rows}x{t.tokens}t{t.thread_tokens}")
def test_matmul_f16_tiles(dev, qtype, math, tile):
    """The tile in f16 (shader-f16): weights and activations rounded to f16 in shared memory, then
    multiplied in f32, or (f16 math) in f16 a step of BK at a time, folded into f32 sums. Against the
    reference on the f16-rounded operands: f32 rounding for f16 tiles, f16's for f16 math; both differ
    from the f32 tile. Rows and tokens past a tile, K past a step."""
    if not dev.has_f16:
        pytest.skip("device has no shader-f16")
    tile = K.MatmulTile(tile.rows, tile.tokens, tile.k, tile.thread_tokens, f16=True, f16_math=math)
    rng = np.random.default_rng(11 + ggml.lookup(qtype).id)
    rows, t = 150, 70
    qk = ggml.lookup(qtype).block
    k = 512 if qk == 256 else 4 * 29 if qk == 1 else 32 * 7
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal((t, k)) * 3
    w16, x16 = (a.astype(np.float16).astype(np.float64) for a in (w, x))
    wb, xb = weight_buffer(dev, raw), f32(dev, x)

    def run(tl):
        y = dev.buffer(4 * rows * t)
        dev.submit(K.matmul(dev, qtype, k, rows, wb, xb, y, step_buffer(dev, t), n_tokens=t, tile=tl))
        return read_f32(dev, y, rows * t).reshape(t, rows)
    got = run(tile)
    assert_close_dot(got, x16, w16, x16 @ w16.T, tol=2e-3 if math else 2e-5)
    full = run(K.MatmulTile(tile.rows, tile.tokens, tile.k, tile.thread_tokens))
    assert np.abs(got - full).max() > 0                  # the f16 path ran


def test_f16_tiles_only_where_the_device_has_shader_f16(dev):
    """fit_tile(f16=True): the same shape, in f16 where the device has shader-f16; the f32 tile elsewhere."""
    class NoF16:
        limits, has_f16 = dev.limits, False
    assert K.fit_tile(NoF16, K.MATMUL, f16=True) == K.fit_tile(NoF16, K.MATMUL)
    half = K.fit_tile(dev, K.MATMUL, f16=True)
    assert (half.rows, half.tokens, half.k) == (K.MATMUL.rows, K.MATMUL.tokens, K.MATMUL.k)
    assert half.f16 == dev.has_f16 and half.f16_math == (dev.has_f16 and K.F16_MATH)
    assert not K.fit_tile(dev, K.MATMUL).f16


def test_quantize_q8(dev):
    """Activations to int8 per 32 (an all-zero block and a block of one outlier included) against
    pyapp.reference.quants; the step's 37 tokens of a plan sized for 40: rows past them untouched."""
    from pyapp.reference.quants import quantize_activations_q8
    rng = np.random.default_rng(31)
    t, k = 37, 32 * 7
    x = (rng.standard_normal((40, k)) * rng.uniform(0.1, 10, (40, 1))).astype(np.float32)
    x[3, 64:96] = 0.0
    x[5, :32] = 0.0
    x[5, 7] = -50.0
    xq_bytes, xs_bytes = K.q8_bytes(40, k)
    xq, xs = f32(dev, np.full(xq_bytes // 4, 7.0)), f32(dev, np.full(xs_bytes // 4, 7.0))
    dev.submit(K.quantize_q8(dev, k, f32(dev, x), xq, xs, step_buffer(dev, t), n_tokens=40))
    q = np.frombuffer(dev.read(xq, 0, xq_bytes), np.int8).reshape(40, k)
    ds = read_f32(dev, xs, xs_bytes // 4).reshape(40, k // 32, 2)
    want_q, want_d, want_sum = quantize_activations_q8(x[:t])
    np.testing.assert_allclose(ds[:t, :, 0], want_d, rtol=1e-6)
    np.testing.assert_allclose(ds[:t, :, 1], want_sum, rtol=1e-5, atol=1e-4)
    ties = (q[:t].astype(int) != want_q).mean()      # x / d within an ulp of .5 may round either way
    assert np.abs(q[:t].astype(int) - want_q).max() <= 1 and ties < 1e-3
    assert (q[5, :32] == np.eye(32, dtype=np.int8)[7] * -127).all() and (q[3, 64:96] == 0).all()
    assert (ds[t:] == 7.0).all()


@pytest.mark.parametrize("rpt,keep", [(1, True), (1, False), (3, True)], ids=["keep", "codes-only", "3-rows-a-token"])
def test_quantize_q8_fuses_the_geglu(dev, rpt, keep):
    """The GeGLU of a fused [gate | up] output rounded as the down projection's int8 input in one kernel:
    the codes and (d, sum) of gelu_tanh(gate) * up by quantize_activations_q8's rule, the f32 values too
    where kept (a LoRA on the down projection reads them); rows past the step's tokens untouched."""
    from pyapp.reference.forward import gelu_tanh
    rng = np.random.default_rng(33)
    t, plan_t, k = 11, 13, 32 * 5
    rows, plan_rows = t * rpt, plan_t * rpt
    gate_up = (rng.standard_normal((plan_rows, 2 * k)) * rng.uniform(0.2, 4, (plan_rows, 1))).astype(np.float32)
    want = (gelu_tanh(gate_up[:rows, :k].astype(np.float64)) * gate_up[:rows, k:]).astype(np.float32)
    xq, xs = q8_sentinels(dev, plan_rows, k)
    out = f32(dev, np.full((plan_rows, k), 7.0)) if keep else None
    dev.submit(K.quantize_q8(dev, k, f32(dev, gate_up), xq, xs, step_buffer(dev, t), n_tokens=plan_t,
                             rows_per_token=rpt, geglu=True, out=out))
    assert_rounded_q8(*read_q8(dev, xq, xs, plan_rows, k), want)
    if keep:
        got = read_f32(dev, out, plan_rows * k).reshape(plan_rows, k)
        np.testing.assert_allclose(got[:rows], want, rtol=1e-5, atol=1e-5)     # tanh near -1: ~1e-6 absolute
        assert (got[rows:] == 7.0).all()


Q8_CASES = [("q4_k", 45, 19, None), ("q4_k", 150, 70, None), ("q4_k", 64, 130, None),
            ("q4_k", 150, 70, K.Q8Tile(64, 32)), ("q4_k", 150, 70, K.Q8Tile(128, 64, 8)),
            ("q4_k", 64, 130, K.Q8Tile(128, 128, 8)), ("q5_0", 150, 70, None), ("q5_0", 45, 19, K.Q8Tile(128, 64, 8)),
            ("q4_0", 150, 70, None), ("q8_0", 150, 70, None), ("q8_0", 64, 130, K.Q8Tile(128, 64, 8)),
            ("q6_k", 45, 19, None), ("q6_k", 150, 70, K.Q8Tile(128, 64, 8)), ("q6_k", 64, 130, K.Q8Tile(64, 32)),
            # eight tokens a thread: two W load jobs a thread (128 x 64), one (128 x 128; X: one, or none)
            ("q4_k", 150, 70, K.Q8Tile(128, 64, 8, 8)), ("q4_k", 64, 130, K.Q8Tile(128, 128, 8, 8)),
            ("q4_0", 150, 70, K.Q8Tile(128, 64, 8, 8)), ("q8_0", 45, 19, K.Q8Tile(64, 64, 4, 8)),
            ("q6_k", 150, 70, K.Q8Tile(128, 64, 8, 8)), ("q5_0", 64, 130, K.Q8Tile(128, 128, 8, 8))]


@pytest.mark.parametrize("qtype,rows,t,tile", Q8_CASES,
                         ids=lambda v: f"{v.rows}x{v.tokens}t{v.thread_rows}x{v.thread_tokens}" if isinstance(v, K.Q8Tile)
                         else str(v))
def test_matmul_q8(dev, qtype, rows, t, tile):
    """The int8 matmul on the codes quantize_q8 made (each weight type whose codes are int8: Q4_K's
    sub-blocks, Q6_K's signed codes with a scale per 16, Q4_0's and Q5_0's offset codes, Q8_0's signed bytes; rows and tokens past a tile, K of
    several steps and, for the 32-blocks, not a multiple of 256): against pyapp.reference.quants' exact
    integer sums (float32 rounding only), and against the f32 product within int8's rounding; also as
    two row blocks writing their columns of a wider Y (ldy)."""
    if tile and tile.threads > dev.limits.get("max_compute_invocations_per_workgroup", 256):
        pytest.skip("tile beyond this device's workgroup limits")
    from pyapp.reference.quants import matmul_int8, quantize_activations_q8
    rng = np.random.default_rng(41 + t + ggml.lookup(qtype).id)
    k = 512 if qtype in ("q4_k", "q6_k") else 64 * 11
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal((t, k)).astype(np.float32)
    xq_bytes, xs_bytes = K.q8_bytes(t, k)
    xq, xs, step = dev.buffer(xq_bytes), dev.buffer(xs_bytes), step_buffer(dev, t)
    y = dev.buffer(4 * rows * t)
    plan = K.quantize_q8(dev, k, f32(dev, x), xq, xs, step, n_tokens=t)
    K.matmul_q8(dev, qtype, k, rows, weight_buffer(dev, raw), xq, xs, y, step, n_tokens=t, plan=plan, tile=tile)
    dev.submit(plan)
    got = read_f32(dev, y, rows * t).reshape(t, rows)
    q = np.frombuffer(dev.read(xq, 0, xq_bytes), np.int8).reshape(t, k)
    ds = read_f32(dev, xs, xs_bytes // 4).reshape(t, k // 32, 2)
    assert_close_dot(got, x, w, matmul_int8(raw, qtype, rows, q, ds[..., 0], ds[..., 1]))
    assert_close_dot(got, x, w, x @ w.T, tol=1e-2)              # int8 activations: ~0.4% of a block's max
    xq_ref = quantize_activations_q8(x)[0]
    assert np.abs(q.astype(int) - xq_ref).max() <= 1
    split = 64 if rows > 64 else 32                              # a row block boundary at a bindable column
    if rows % 32 == 0 or rows > 64:
        rb = len(raw) // rows
        y2 = f32(dev, np.full((t, rows), 7.0))
        plan = dev.plan()
        for a, b in ((0, split), (split, rows)):
            K.matmul_q8(dev, qtype, k, b - a, weight_buffer(dev, raw[a * rb:b * rb]), xq, xs, (y2, 4 * a, y2.size - 4 * a),
                        step, n_tokens=t, plan=plan, ldy=rows, tile=tile)
        dev.submit(plan)
        np.testing.assert_array_equal(read_f32(dev, y2, rows * t).reshape(t, rows), got)


def sliced_as_whole(dev, plan, whole, sliced, split: int, rows: int, t: int, plan_t: int) -> np.ndarray:
    """Run a plan whose last two dispatches are a matmul over `split` slices of K into `sliced` and their sum
    (after the same matmul whole into `whole`, both prefilled with 7.0): the slices' sum is the whole product
    up to float rounding for the step's t tokens and leaves the plan's later rows alone. Returns it [t, rows]."""
    assert plan.ops[-1][1].key[0] == "sum_slices" and plan.ops[-2][5] == split      # z: the slices
    dev.submit(plan)
    want = read_f32(dev, whole, plan_t * rows).reshape(plan_t, rows)
    got = read_f32(dev, sliced, plan_t * rows).reshape(plan_t, rows)
    assert (got[t:] == 7.0).all() and (want[t:] == 7.0).all()            # past the step's tokens: untouched
    np.testing.assert_allclose(got[:t], want[:t], rtol=1e-5, atol=1e-5 * np.abs(want[:t]).max())
    return got[:t]


@pytest.mark.parametrize("qtype,k,split,tile", [("f16", 32 * 12, 4, "few"), ("f32", 32 * 9, 3, "few"),
                                                ("q4_k", 768, 3, "few"), ("q4_k", 512, 2, "engine"),
                                                ("q6_k", 512, 2, "few"), ("q8_0", 64 * 5, 2, "short")])
def test_matmul_slices_of_k(dev, qtype, k, split, tile):
    """The f32 tile over slices of K (matmul.wgsl SPLIT, sum_slices.wgsl; every format's 4-weight units, three
    tile shapes): the sum of the slices' partial sums is the whole product up to
    float rounding and close to numpy's, for a step shorter than its plan (70 of 100 tokens), rows past the
    tile, two row blocks writing their columns of a wider Y; refused where the slices are not whole tile steps,
    without room, or with a clippable linear's bounds (the sums would clamp nothing)."""
    tile = {"few": K.MATMUL_FEW_ROWS, "engine": K.MATMUL, "short": K.MATMUL_SHORT}[tile]
    rng = np.random.default_rng(21 + split)
    rows, t, plan_t = 76, 70, 100
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal((plan_t, k)).astype(np.float32)
    step, xb, wb = step_buffer(dev, t), f32(dev, x), weight_buffer(dev, raw)
    partials = f32(dev, np.full(split * plan_t * rows, 5.0))
    whole, sliced = f32(dev, np.full((plan_t, rows), 7.0)), f32(dev, np.full((plan_t, rows), 7.0))
    plan = K.matmul(dev, qtype, k, rows, wb, xb, whole, step, n_tokens=plan_t, tile=tile, split=1)
    K.matmul(dev, qtype, k, rows, wb, xb, sliced, step, n_tokens=plan_t, plan=plan, tile=tile, partials=partials,
             split=split)
    got = sliced_as_whole(dev, plan, whole, sliced, split, rows, t, plan_t)
    assert_close_dot(got, x[:t], w, x[:t].astype(np.float64) @ w.T)
    rb = len(raw) // rows                                                # two row blocks (32 | 44 rows)
    y2 = f32(dev, np.full((plan_t, rows), 7.0))
    plan = dev.plan()
    for a, b in ((0, 32), (32, rows)):
        K.matmul(dev, qtype, k, b - a, weight_buffer(dev, raw[a * rb:b * rb]), xb, (y2, 4 * a, y2.size - 4 * a),
                 step, n_tokens=plan_t, plan=plan, ldy=rows, tile=tile, partials=partials, split=split)
    dev.submit(plan)
    np.testing.assert_array_equal(read_f32(dev, y2, plan_t * rows).reshape(plan_t, rows)[:t], got)
    uneven = next(s for s in range(split + 1, 16) if k % (tile.k * s))       # slices not whole tile steps
    roomy = dev.buffer(4 * uneven * plan_t * rows)
    with pytest.raises(ValueError, match="slices"):
        K.matmul(dev, qtype, k, rows, wb, xb, sliced, step, n_tokens=plan_t, tile=tile, partials=roomy, split=uneven)
    with pytest.raises(ValueError, match="slices"):
        K.matmul(dev, qtype, k, rows, wb, xb, sliced, step, n_tokens=plan_t, tile=tile, split=split)   # no room
    with pytest.raises(ValueError, match="slices"):
        K.matmul(dev, qtype, k, rows, wb, xb, sliced, step, n_tokens=plan_t, tile=tile, partials=partials,
                 split=split, clamp=(f32(dev, np.zeros(4)), 0, 16))


def test_matmul_split_rule():
    """Slices of K for the f32 tile where it makes few workgroups: E2B's and E4B's per-layer-input gates (256
    rows: 128 workgroups of the 32 x 32 tile at 512 tokens) in 4, slices at least MATMUL_SLICE_MIN_K long and
    whole in the tile's steps; not where the tile makes enough workgroups, nor beyond the caller's room."""
    few, room = K.MATMUL_FEW_ROWS, 1 << 30
    assert K.matmul_tile_for(256, 512) == few
    assert K.matmul_split_for(few, 256, 1536, 512, room) == 4 and K.matmul_split_for(few, 256, 2560, 512, room) == 4
    assert K.matmul_split_for(few, 256, 768, 512, room) == 3         # 768 / 4 = 192: under the minimum slice
    assert K.matmul_split_for(few, 256, 1536, 512, 0) == 1
    assert K.matmul_split_for(few, 2048, 1536, 512, room) == 1       # 1,024 workgroups
    assert K.matmul_split_for(few, 256, 1536, 512, 2 * 512 * 256) == 2
    assert K.matmul_split_for(K.MATMUL_SHORT, 256, 1536, 64, room) == 1   # short steps: not measured split


@pytest.mark.parametrize("tile", ["large", "small"])
@pytest.mark.parametrize("qtype,k,split", [("q4_k", 768, 3), ("q6_k", 512, 2), ("q4_0", 64 * 12, 4),
                                           ("q5_0", 64 * 6, 3), ("q8_0", 64 * 10, 2)])
def test_matmul_q8_slices_of_k(dev, qtype, k, split, tile):
    """The int8 matmul over slices of K (matmul_q8.wgsl SPLIT, sum_slices.wgsl): the sum of the slices'
    partial sums is the whole product up to float rounding (the same integer sums, added in another
    order), for a step shorter than its plan (70 of 100 tokens: the partials laid out by the step's
    tokens), rows past the tile, two row blocks writing their columns of a wider Y; refused where the
    slices are not whole 64-weight steps, the rows not a multiple of 4 (sum_slices adds four floats a
    thread) or the partial sums do not fit. Both tiles: the large one (a forced count's) and the small one
    (q8_tile_split's for the fewest rows)."""
    sliced_tile = K.Q8_MATMUL if tile == "large" else K.Q8_SMALL
    from pyapp.reference.quants import matmul_int8
    rng = np.random.default_rng(5 + split)
    rows, t, plan_t = 152, 70, 100
    raw = random_tensor(qtype, rows, k, rng)
    x = rng.standard_normal((plan_t, k)).astype(np.float32)
    xq_bytes, xs_bytes = K.q8_bytes(plan_t, k)
    xq, xs, step = dev.buffer(xq_bytes), dev.buffer(xs_bytes), step_buffer(dev, t)
    partials = f32(dev, np.full(split * plan_t * rows, 5.0))
    whole, sliced = f32(dev, np.full((plan_t, rows), 7.0)), f32(dev, np.full((plan_t, rows), 7.0))
    plan = K.quantize_q8(dev, k, f32(dev, x), xq, xs, step, n_tokens=plan_t)
    w = weight_buffer(dev, raw)
    K.matmul_q8(dev, qtype, k, rows, w, xq, xs, whole, step, n_tokens=plan_t, plan=plan, tile=K.Q8_MATMUL)
    K.matmul_q8(dev, qtype, k, rows, w, xq, xs, sliced, step, n_tokens=plan_t, plan=plan, partials=partials,
                split=split, tile=None if tile == "large" else sliced_tile)
    assert plan.ops[-2][1].key[2].endswith(sliced_tile.prelude(qtype, k))          # the tile asked for
    got = sliced_as_whole(dev, plan, whole, sliced, split, rows, t, plan_t)
    q = np.frombuffer(dev.read(xq, 0, xq_bytes), np.int8).reshape(plan_t, k)[:t]
    ds = read_f32(dev, xs, xs_bytes // 4).reshape(plan_t, k // 32, 2)[:t]
    exact = matmul_int8(raw, qtype, rows, q, ds[..., 0], ds[..., 1])
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())
    # two row blocks (64 | 88 rows) over slices, each its columns of the wider Y
    rb = len(raw) // rows
    y2 = f32(dev, np.full((plan_t, rows), 7.0))
    plan = dev.plan()
    for a, b in ((0, 64), (64, rows)):
        K.matmul_q8(dev, qtype, k, b - a, weight_buffer(dev, raw[a * rb:b * rb]), xq, xs, (y2, 4 * a, y2.size - 4 * a),
                    step, n_tokens=plan_t, plan=plan, ldy=rows, partials=partials, split=split, tile=sliced_tile)
    dev.submit(plan)
    np.testing.assert_array_equal(read_f32(dev, y2, plan_t * rows).reshape(plan_t, rows)[:t], got)
    uneven = next(s for s in range(split + 1, 16) if k % (64 * s))         # slices not whole 64-weight steps
    roomy = dev.buffer(4 * uneven * plan_t * rows)
    with pytest.raises(ValueError, match="slices"):
        K.matmul_q8(dev, qtype, k, rows, w, xq, xs, sliced, step, n_tokens=plan_t, partials=roomy, split=uneven)
    with pytest.raises(ValueError, match="slices"):
        K.matmul_q8(dev, qtype, k, rows, w, xq, xs, sliced, step, n_tokens=plan_t, split=split)     # no room
    with pytest.raises(ValueError, match="slices"):
        K.matmul_q8(dev, qtype, k, rows - 2, w, xq, xs, sliced, step, n_tokens=plan_t, partials=partials, split=split)


def test_q8_split_rule():
    """Slices of K where the large tile alone leaves the GPU idle: the most of them (up to 4) whole in 64-weight
    steps and 512 weights or more: E2B's downs and o projection at 512 tokens (96 workgroups of 128 x 64) in
    4, its 2048-row q in 3 (1536 / 4 is under the minimum), E4B's down in 4; not E2B's gate|up (enough
    workgroups), rows the large tile does not divide, or beyond the caller's room for partial sums. Rows so
    few that the large tile's slices make under 128 workgroups (the per-layer-input gates' 256) take the small
    tile over slices."""
    room = K.Q8_SPLIT_MAX * 512 * 2560
    big, small = K.Q8_MATMUL, K.Q8_SMALL
    assert K.q8_tile_split(1536, 12288, 512, room) == (big, 4) and K.q8_tile_split(1536, 6144, 512, room) == (big, 4)
    assert K.q8_tile_split(2560, 10240, 512, room) == (big, 4) and K.q8_tile_split(1536, 2048, 512, room) == (big, 4)
    assert K.q8_tile_split(2048, 1536, 512, room) == (big, 3)
    assert K.q8_tile_split(24576, 1536, 512, room) == (big, 1) and K.q8_tile_split(1500, 12288, 512, room) == (small, 1)
    assert K.q8_tile_split(1536, 12288, 512, 0) == (small, 1)              # no room: the small tile alone
    assert K.q8_tile_split(1536, 12288, 512, 2 * 512 * 1536) == (big, 2)  # room for 2 slices only
    assert K.q8_tile_split(256, 1536, 512, room) == (small, 3)             # E2B's gate: 192 workgroups
    assert K.q8_tile_split(256, 2560, 512, room) == (small, 4)             # E4B's: 256
    assert K.q8_tile_split(1536, 256, 512, room) == (small, 1)             # the PLE projection: K too short


def _workgroup_bytes(source: str, consts: dict[str, int]) -> int:
    """Bytes of the var<workgroup> declarations in source, array lengths evaluated with consts."""
    import re
    size = {"u32": 4, "i32": 4, "f32": 4}
    total = 0
    for ty, n in re.findall(r"var<workgroup>\s+\w+\s*:\s*(?:array<\s*([\w<>]+)\s*,\s*([^;]+)>|(?:[\w<>]+))\s*;", source):
        if not ty:                               # a scalar
            total += 4
            continue
        m = re.fullmatch(r"vec(\d)<(\w+)>", ty)
        elem = int(m[1]) * size[m[2]] if m else size[ty]
        total += elem * eval(re.sub(r"(\d+)u\b", r"\1", n), {}, dict(consts))
    return total


def test_q8_tile_storage_is_what_its_shaders_declare():
    """Q8Tile.storage, by which fit_q8_tile keeps the tile within a device's workgroup storage, is the bytes the
    int8 tile and the grouped MoE kernel's slot list declare (the large tile within WebGPU's default 16 KiB);
    a device with less takes the small tile."""
    from support.paths import ROOT
    src = (ROOT / "shaders" / "matmul_q8_tile.wgsl").read_text() + (ROOT / "shaders" / "moe_tiles.wgsl").read_text()
    for tile in (K.Q8_MATMUL, K.Q8_SMALL, K.Q8Tile(128, 128, 8, 8), K.Q8Tile(64, 64, 4, 8)):
        consts = {"BM": tile.rows, "BN": tile.tokens, "GN": tile.tokens // 4, "Q8_SUBS": 2}
        assert _workgroup_bytes(src, consts) == tile.storage
    assert K.Q8_MATMUL.storage <= 16384

    class Device:
        limits = {"max_compute_invocations_per_workgroup": 256, "max_compute_workgroup_size_x": 256,
                  "max_compute_workgroup_storage_size": 16384}
    assert K.fit_q8_tile(Device, K.Q8_MATMUL) == K.Q8_MATMUL
    Device.limits = dict(Device.limits, max_compute_workgroup_storage_size=12288)
    assert K.fit_q8_tile(Device, K.Q8_MATMUL) == K.Q8_SMALL
