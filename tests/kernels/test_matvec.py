"""Parity of the WGSL kernels (native wgpu backend) against numpy, on odd sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from pyapp import ggml

try:
    from pyapp.gpu import GPUError, get_device
    from pyapp.gpu import kernels as K
    _DEV = get_device("native")
    _SKIP = None
except Exception as e:  # no wgpu, no driver, no adapter
    _DEV, _SKIP = None, f"no WebGPU adapter for the native backend ({e}); apt-get install mesa-vulkan-drivers"


@pytest.fixture(scope="module")
def dev():
    if _DEV is None:
        pytest.skip(_SKIP)
    return _DEV


def f32(dev, a) -> "K.Buffer":
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = dev.buffer(a.nbytes)
    dev.write(b, a.tobytes())
    return b


def read_f32(dev, buf, n) -> np.ndarray:
    return np.frombuffer(dev.read(buf, 0, 4 * n), dtype=np.float32).copy()


# ---- random GGUF blocks --------------------------------------------------------

# byte offsets of the f16 scale fields in each block type (the rest is random bits)
F16_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2),
              "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}


def random_tensor(qtype: str, rows: int, k: int, rng) -> bytes:
    """Raw GGUF bytes of a random [rows, k] tensor of type qtype (valid, finite scales)."""
    if qtype == "f32":
        return rng.standard_normal((rows, k)).astype(np.float32).tobytes()
    if qtype == "f16":
        return rng.standard_normal((rows, k)).astype(np.float16).tobytes()
    if qtype == "bf16":
        return (rng.standard_normal((rows, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    gt = ggml.lookup(qtype)
    blocks = rng.integers(0, 256, size=(rows * k // gt.block, gt.block_bytes), dtype=np.uint8)
    if qtype == "mxfp4":
        blocks[:, 0] = rng.integers(120, 132, size=len(blocks))
    for off in F16_FIELDS.get(qtype, ()):
        d = (rng.uniform(0.5, 1.5, len(blocks)) * rng.choice([-1, 1], len(blocks)) / 64).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.tobytes()


def dequantize(qtype: str, raw: bytes, rows: int, k: int) -> np.ndarray:
    """float64 [rows, k] reference dequantization (gguf-py's numpy code)."""
    if qtype == "f32":
        return np.frombuffer(raw, np.float32).reshape(rows, k).astype(np.float64)
    if qtype == "f16":
        return np.frombuffer(raw, np.float16).reshape(rows, k).astype(np.float64)
    if qtype == "bf16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(rows, k).astype(np.float64)
    import gguf
    t = gguf.GGMLQuantizationType[qtype.upper()]
    data = np.frombuffer(raw, np.uint8).reshape(rows, -1)
    return gguf.quants.dequantize(data, t).reshape(rows, k).astype(np.float64)


def weight_buffer(dev, raw: bytes):
    b = dev.buffer(len(raw) + 4)           # +4: rd32 may touch the word after the last byte
    dev.write(b, raw)
    return b


QTYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "mxfp4"]


def assert_close_dot(got, w, x, ref, tol=2e-5):
    """|got - ref| within tol * sum |w||x| per output (the scale of rounding in a dot product)."""
    scale = np.abs(w) @ np.abs(x).T if x.ndim > 1 else np.abs(w) @ np.abs(x)
    err = np.abs(got - ref) / (scale + 1e-30)
    assert err.max() < tol, f"max relative error {err.max():.3g}"


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
@pytest.mark.parametrize("long", [False, True], ids=["groups", "units"])
def test_matvec(dev, qtype, subgroups, long):
    """The 4-weight-group loop, and on long rows (>= 128 units of 32) the dot32 units (forced: the
    engine picks them only for the types where they are faster)."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(ggml.lookup(qtype).id)
    qk = ggml.lookup(qtype).block
    rows = 37
    if long:
        k = qk * (17 if qk == 256 else 131) if qk > 1 else 4 * 1096
    else:
        k = qk * (3 if qk == 256 else 13) if qk > 1 else 4 * 97      # never a multiple of the workgroup
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal(k)
    y = dev.buffer(4 * rows)
    plan = K.matvec(dev, qtype, k, rows, weight_buffer(dev, raw), f32(dev, x), y, subgroups=subgroups,
                    units=long and k % 32 == 0, chunks=False)
    dev.submit(plan)
    assert_close_dot(read_f32(dev, y, rows), w, x, w @ x)


@pytest.mark.parametrize("blocks,tpr,wg", [(3, None, None), (17, 32, 64), (1, 4, 64), (6, 64, 128), (11, 8, 256),
                                           (50, 32, 64)])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_q4k_chunks(dev, blocks, tpr, wg, subgroups):
    """The Q4_K 16-byte-chunk matvec: rows of 1-50 blocks (50: longer than E2B's 12288-long down rows),
    row splits narrower and wider than a subgroup (its butterfly falls back to the tree below the
    subgroup width), all three epilogues."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(blocks)
    n, k = 37, 256 * blocks
    raw = random_tensor("q4_k", 2 * n, k, rng)
    w = dequantize("q4_k", raw, 2 * n, k)
    x, b = rng.standard_normal(k), rng.standard_normal(n)
    wb, xb = weight_buffer(dev, raw), f32(dev, x)
    y = dev.buffer(4 * 2 * n)
    opts = dict(subgroups=subgroups, tpr=tpr, wg=wg, chunks=True)
    dev.submit(K.matvec(dev, "q4_k", k, 2 * n, wb, xb, y, **opts))
    assert_close_dot(read_f32(dev, y, 2 * n), w, x, w @ x)
    gate, up = w[:n] @ x, w[n:] @ x
    dev.submit(K.matvec(dev, "q4_k", k, n, wb, xb, y, geglu=True, **opts))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * up, rtol=1e-4, atol=1e-4 * np.abs(up).max())
    dev.submit(K.matvec(dev, "q4_k", k, n, wb, xb, y, gelu_times=f32(dev, b), **opts))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


def int8_reference(raw, rows, x, qtype="q4_k"):
    """Rows . x with x rounded to int8 per 32 as the int8 kernels round it (float64 sums)."""
    from pyapp.reference.quants import matmul_int8, quantize_activations_q8
    q, d, sums = quantize_activations_q8(np.asarray(x, np.float32)[None])
    return matmul_int8(raw, qtype, rows, q, d, sums)[0]


@pytest.mark.parametrize("blocks,tpr,wg", [(3, None, None), (17, 32, 64), (1, 4, 64), (6, 64, 128), (11, 8, 256)])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_q4k_int8(dev, blocks, tpr, wg, subgroups):
    """The Q4_K chunk matvec on x rounded to int8 per 32 in workgroup memory (matvec_q4k_x8.wgsl): the
    reference's integer sums on the same codes (float rounding only), and within int8's rounding of the
    f32 product; an all-zero block of x and one of a single outlier included; all three epilogues."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(100 + blocks)
    n, k = 37, 256 * blocks
    raw = random_tensor("q4_k", 2 * n, k, rng)
    w = dequantize("q4_k", raw, 2 * n, k)
    x, b = rng.standard_normal(k).astype(np.float32), rng.standard_normal(n)
    x[32:64] = 0.0
    x[64:96] = 0.0
    x[70] = -40.0
    wb, xb = weight_buffer(dev, raw), f32(dev, x)
    y = dev.buffer(4 * 2 * n)
    opts = dict(subgroups=subgroups, tpr=tpr, wg=wg, chunks=True, int8=True)
    dev.submit(K.matvec(dev, "q4_k", k, 2 * n, wb, xb, y, **opts))
    got, want = read_f32(dev, y, 2 * n), int8_reference(raw, 2 * n, x)
    assert_close_dot(got, w, x, want)
    assert_close_dot(got, w, x, w @ x, tol=1e-2)
    assert np.abs(got - w @ x).max() > 1e-4 * np.abs(w @ x).max()     # int8 rounding shows: not the f32 path
    gate, up = want[:n], want[n:]
    dev.submit(K.matvec(dev, "q4_k", k, n, wb, xb, y, geglu=True, **opts))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * up, rtol=1e-4, atol=1e-4 * np.abs(up).max())
    dev.submit(K.matvec(dev, "q4_k", k, n, wb, xb, y, gelu_times=f32(dev, b), **opts))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


@pytest.mark.parametrize("qtype,blocks,tpr", [("q6_k", 1, None), ("q6_k", 3, 8), ("q6_k", 11, None), ("q6_k", 11, 64),
                                               ("q4_0", 1, None), ("q4_0", 7, 16), ("q5_0", 3, None), ("q5_0", 11, 64),
                                               ("q8_0", 1, 4), ("q8_0", 7, None)])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_int8_units(dev, qtype, blocks, tpr, subgroups):
    """The 32-weight units on x rounded to int8 (quants_dot_x8.wgsl: Q6_K, and Q4_0 / Q5_0 / Q8_0 a block a
    unit): W dequantized times x as rounded to int8 (float rounding only: these types have no min term),
    within int8's rounding of the f32 product; GeGLU; and with the input built from a pending residual
    add (K.ResidualInput). Rows of 256 x blocks weights (odd counts of 32-weight blocks: 8 x blocks)."""
    from pyapp.reference.quants import quantize_activations_q8
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(300 + blocks)
    n, k = 37, 256 * blocks
    if qtype != "q6_k":
        k -= 32 * (blocks % 2)                  # an odd number of blocks of 32
    raw = random_tensor(qtype, 2 * n, k, rng)
    w = dequantize(qtype, raw, 2 * n, k)

    def rounded(v):
        q, d, _ = quantize_activations_q8(np.asarray(v, np.float32)[None])
        return (q.reshape(-1, 32).astype(np.float64) * d.reshape(-1, 1)).reshape(-1)
    x = rng.standard_normal(k).astype(np.float32)
    x[:32] = 0.0
    y = dev.buffer(4 * 2 * n)
    opts = dict(subgroups=subgroups, tpr=tpr, int8=True)
    dev.submit(K.matvec(dev, qtype, k, 2 * n, weight_buffer(dev, raw), f32(dev, x), y, **opts))
    got = read_f32(dev, y, 2 * n)
    assert_close_dot(got, w, x, w @ rounded(x))
    assert_close_dot(got, w, x, w @ x, tol=1e-2)
    assert np.abs(got - w @ x).max() > 1e-4 * np.abs(w @ x).max()
    want = w @ rounded(x)
    dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), f32(dev, x), y, geglu=True, **opts))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(want[:n]) * want[n:], rtol=1e-4,
                               atol=1e-4 * np.abs(want[n:]).max())
    if k <= 24 * 256:
        ysub, resid, pw = (rng.standard_normal(k).astype(np.float32) for _ in range(3))
        r = resid + rms_norm(ysub[None], pw, 1e-6)[0]
        res = K.ResidualInput(f32(dev, ysub), f32(dev, resid), dev.buffer(4 * k), f32(dev, pw))
        dev.submit(K.matvec(dev, qtype, k, 2 * n, weight_buffer(dev, raw), None, y, residual=res, **opts))
        assert_close_dot(read_f32(dev, y, 2 * n), w, r, w @ rounded(r), tol=1e-4)


def test_int8_matvec_where_it_exists(dev):
    """int8 x exists for the Q4_K chunk kernels and the expert matvec of 32-weight blocks without GeGLU:
    asking it of another kernel fails loudly, and K.int8_matvec says so beforehand."""
    raw = random_tensor("q5_k", 4, 256, np.random.default_rng(0))
    with pytest.raises(ValueError, match="int8"):
        K.matvec(dev, "q5_k", 256, 4, weight_buffer(dev, raw), f32(dev, np.ones(256)), dev.buffer(16), int8=True)
    assert not K.int8_matvec(dev, "q5_k") and not K.int8_matvec(dev, "f16")
    raw = random_tensor("q5_0", 8, 64, np.random.default_rng(0))
    with pytest.raises(ValueError, match="int8"):
        K.moe_experts(dev, "q5_0", 64, 2, 2, 1, weight_buffer(dev, raw), f32(dev, np.ones(64)), dev.buffer(16),
                      f32(dev, [0.0]), step_buffer(dev, 1), 1, geglu=True, int8=True)
    assert K.int8_matvec(dev, "q4_k") and not K.int8_matvec(dev, "q6_k")
    # the dense 32-weight blocks' units: where the backend's compiler runs them faster (the browser path)
    assert K.int8_matvec(dev, "q4_0") == dev.int8_block_units == (dev.backend == "browser")
    assert not K.int8_matvec(dev, "q5_0") and not K.int8_matvec(dev, "q8_0")     # units exist, not measured faster
    assert K.int8_matvec(dev, "q6_k", rows=262144) and not K.int8_matvec(dev, "q6_k", experts=True, rows=262144)
    assert K.int8_matvec(dev, "q5_0", experts=True) and not K.int8_matvec(dev, "q5_0", experts=True, geglu=True)


def u32(dev, *vals, kind="uniform"):
    a = np.array(vals + (0,) * (-len(vals) % 4), dtype=np.uint32)
    b = dev.buffer(a.nbytes, kind)
    dev.write(b, a.tobytes())
    return b


def step_buffer(dev, n_tokens, pos0=0):
    """The per-step uniform: n_tokens tokens, the first at position pos0."""
    b = dev.buffer(K.STEP_BYTES, "uniform")
    dev.write(b, K.pack_step(n_tokens, pos0))
    return b


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


@pytest.mark.parametrize("qtype", ["f32", "q4_k"])
@pytest.mark.parametrize("tile", [K.MatmulTile(64, 64, 16), K.MatmulTile(64, 64, 64), K.MatmulTile(32, 64, 32),
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


Q8_CASES = [("q4_k", 45, 19, None), ("q4_k", 150, 70, None), ("q4_k", 64, 130, None),
            ("q4_k", 150, 70, K.Q8Tile(64, 32)), ("q4_k", 150, 70, K.Q8Tile(128, 64, 8)),
            ("q4_k", 64, 130, K.Q8Tile(128, 128, 8)), ("q5_0", 150, 70, None), ("q5_0", 45, 19, K.Q8Tile(128, 64, 8)),
            ("q4_0", 150, 70, None), ("q8_0", 150, 70, None), ("q8_0", 64, 130, K.Q8Tile(128, 64, 8))]


@pytest.mark.parametrize("qtype,rows,t,tile", Q8_CASES,
                         ids=lambda v: f"{v.rows}x{v.tokens}t{v.thread_rows}" if isinstance(v, K.Q8Tile) else str(v))
def test_matmul_q8(dev, qtype, rows, t, tile):
    """The int8 matmul on the codes quantize_q8 made (each weight type whose codes are int8: Q4_K's
    sub-blocks, Q4_0's and Q5_0's offset codes, Q8_0's signed bytes; rows and tokens past a tile, K of
    several steps and, for the 32-blocks, not a multiple of 256): against pyapp.reference.quants' exact
    integer sums (float32 rounding only), and against the f32 product within int8's rounding; also as
    two row blocks writing their columns of a wider Y (ldy)."""
    if tile and tile.threads > dev.limits.get("max_compute_invocations_per_workgroup", 256):
        pytest.skip("tile beyond this device's workgroup limits")
    from pyapp.reference.quants import matmul_int8, quantize_activations_q8
    rng = np.random.default_rng(41 + t + ggml.lookup(qtype).id)
    k = 512 if qtype == "q4_k" else 64 * 11
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


@pytest.mark.parametrize("qtype", ["f32", "f16", "bf16", "q8_0", "q4_0", "q5_1", "q4_k", "q5_k", "q6_k", "mxfp4"])
@pytest.mark.parametrize("t", [1, 5, 17])
def test_matvec_tokens(dev, qtype, t):
    """A step of 1-17 tokens, each weight read once: 150 rows (not a whole number of workgroups), also
    as two row blocks writing their columns of the wider Y (ldy); Y's rows past the step's tokens and
    the columns outside a block are left alone."""
    rng = np.random.default_rng(200 + 3 * t + ggml.lookup(qtype).id)
    qk = ggml.lookup(qtype).block
    rows, k = 150, 256 if qk == 256 else 4 * 29 if qk == 1 else 32 * 5
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal((K.FEW_TOKENS, k))
    want = x[:t] @ w.T
    xb, step = f32(dev, x), step_buffer(dev, t)
    y = f32(dev, np.full((K.FEW_TOKENS, rows), 7.0))
    dev.submit(K.matvec_tokens(dev, qtype, k, rows, weight_buffer(dev, raw), xb, y, step))
    got = read_f32(dev, y, K.FEW_TOKENS * rows).reshape(K.FEW_TOKENS, rows)
    assert_close_dot(got[:t], x[:t], w, want)
    assert (got[t:] == 7.0).all()
    split = 64                                     # a row block boundary at a bindable column
    rb = len(raw) // rows
    y = f32(dev, np.full((K.FEW_TOKENS, rows), 7.0))
    plan = dev.plan()
    for a, b in ((0, split), (split, rows)):
        K.matvec_tokens(dev, qtype, k, b - a, weight_buffer(dev, raw[a * rb:b * rb]), xb, (y, 4 * a, y.size - 4 * a),
                        step, plan=plan, ldy=rows)
    dev.submit(plan)
    got2 = read_f32(dev, y, K.FEW_TOKENS * rows).reshape(K.FEW_TOKENS, rows)
    np.testing.assert_array_equal(got2, got)


# ---- per-token kernels ------------------------------------------------------------

from pyapp.reference.forward import gelu_tanh, rms_norm, rope_neox, softcap  # noqa: E402


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


@pytest.mark.parametrize("rpt", [1, 3])
def test_geglu_halves(dev, rpt):
    """gelu(gate) * up over rows of a fused [gate | up] output (odd width, several rows per token)."""
    rng = np.random.default_rng(rpt)
    t, ff = 5, 37
    gu = (rng.standard_normal((t * rpt, 2 * ff)) * 3).astype(np.float32)
    out = dev.buffer(4 * t * rpt * ff)
    dev.submit(K.geglu_halves(dev, ff, rpt, f32(dev, gu), out, step_buffer(dev, t), t))
    want = gelu_tanh(gu[:, :ff]) * gu[:, ff:]
    np.testing.assert_allclose(read_f32(dev, out, t * rpt * ff).reshape(t * rpt, ff), want, rtol=1e-5, atol=1e-5)


def test_elementwise(dev):
    rng = np.random.default_rng(7)
    t, d = 3, 101
    a = (rng.standard_normal((t, d)) * 4).astype(np.float32)
    b = rng.standard_normal((t, d)).astype(np.float32)
    a[0, :3] = [80.0, -80.0, 0.0]                          # tanh saturation must not give NaN
    step = step_buffer(dev, t)
    ab, bb, out = f32(dev, a), f32(dev, b), dev.buffer(a.nbytes)
    dev.submit(K.elementwise(dev, "geglu", d, ab, step, t, b=bb, out=out))
    np.testing.assert_allclose(read_f32(dev, out, a.size).reshape(t, d), gelu_tanh(a) * b, rtol=1e-5, atol=1e-5)

    plan = K.elementwise(dev, "add", d, ab, step, t, b=bb)
    K.elementwise(dev, "scale", d, ab, step, t, scale=0.5, b=f32(dev, [3.0]), plan=plan)
    K.elementwise(dev, "mul", d, ab, step, t, b=bb, plan=plan)
    K.elementwise(dev, "softcap", d, ab, step, t, cap=30.0, plan=plan)
    dev.submit(plan)                                         # four dependent dispatches, one submit
    ref = softcap((a + b) * 1.5 * b, 30.0)
    np.testing.assert_allclose(read_f32(dev, ab, a.size).reshape(t, d), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qtype", ["f32", "q8_0", "q4_k", "q6_k"])
def test_embed(dev, qtype):
    rng = np.random.default_rng(8)
    v = 23
    d = 256 * 2 if qtype in ("q4_k", "q6_k") else 32 * 7
    raw = random_tensor(qtype, v, d, rng)
    table = dequantize(qtype, raw, v, d)
    ids = np.array([5, 0, 22, 5, 17], np.uint32)
    out = dev.buffer(4 * len(ids) * d)
    dev.submit(K.embed(dev, qtype, d, weight_buffer(dev, raw), u32(dev, *ids, kind="storage"), out,
                       step_buffer(dev, len(ids)), max_tokens=len(ids), scale=math.sqrt(d)))
    got = read_f32(dev, out, len(ids) * d).reshape(len(ids), d)
    np.testing.assert_allclose(got, table[ids] * math.sqrt(d), rtol=1e-6, atol=1e-6)


def test_argmax(dev):
    rng = np.random.default_rng(9)
    v = 262_147
    logits = rng.standard_normal(v).astype(np.float32)
    logits[[1000, 200_000]] = 9.0                          # tie: lowest index wins
    logits[5] = np.nan
    out = dev.buffer(16)
    dev.submit(K.argmax(dev, v, f32(dev, logits), out))
    assert np.frombuffer(dev.read(out, 0, 4), np.uint32)[0] == 1000


@pytest.mark.parametrize("qtype,m,cap,splits,out0", [
    ("f32", 1, 0.0, (), 0), ("f32", 17, 30.0, (400, 733), 1), ("q8_0", 5, 30.0, (), 0),
    ("q4_k", 17, 0.0, (333,), 0), ("q6_k", 3, 30.0, (1, 502), 1), ("q5_0", 16, 0.0, (), 0)])
def test_head_argmax(dev, qtype, m, cap, splits, out0):
    """The greedy verification head: argmax_v softcap(x[i] . W[v]) per row i < step.n_tokens, over a
    vocabulary of 1003 (not a whole number of workgroups) in one or several row blocks; a duplicate of a
    row's winner at a higher id (in a later block) loses the tie; a NaN row is never chosen; ids past
    the step's rows are left alone."""
    rng = np.random.default_rng(31 + m)
    qk = ggml.lookup(qtype).block
    v, k = 1003, 256 if qk == 256 else 4 * 29 if qk == 1 else 32 * 5
    raw = bytearray(random_tensor(qtype, v, k, rng))
    rb = len(raw) // v
    x = rng.standard_normal((K.HEAD_ROWS, k)).astype(np.float32)
    w = dequantize(qtype, bytes(raw), v, k)
    x *= 20 / np.abs(x @ w.T).max()                    # logits within +-20: the softcap does not saturate
    win = int(np.argmax(w @ x[0]))
    dup = v - 2 if win < v - 2 else 0                  # a copy of row 0's winner, at a higher id if it can be
    raw[dup * rb:(dup + 1) * rb] = raw[win * rb:(win + 1) * rb]
    if qtype == "f32":
        raw[7 * rb:8 * rb] = np.full(k, np.nan, np.float32).tobytes()
    w = dequantize(qtype, bytes(raw), v, k)
    bounds = [0, *splits, v]
    parts = [(weight_buffer(dev, bytes(raw[a * rb:b * rb])), a, b - a) for a, b in zip(bounds, bounds[1:])]
    scratch = dev.buffer(K.head_argmax_scratch_bytes([n for _, _, n in parts]))
    out = u32(dev, *([0xDEAD] * (K.HEAD_ROWS + 1)), kind="storage")
    dev.submit(K.head_argmax(dev, qtype, k, parts, f32(dev, x), scratch, out, step_buffer(dev, m), cap=cap,
                             out0=out0))
    got = np.frombuffer(dev.read(out, 0, 4 * (K.HEAD_ROWS + 1)), np.uint32)
    logits = x[:m].astype(np.float64) @ np.nan_to_num(w).T
    if cap:
        logits = softcap(logits, cap)
    logits[:, np.isnan(w).any(1)] = -np.inf          # NaN logits count as the lowest
    assert (got[:out0] == 0xDEAD).all() and (got[out0 + m:] == 0xDEAD).all()
    ids = got[out0:out0 + m]
    best = logits.max(-1)
    top2 = np.sort(logits, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-3
    assert (ids[clear] == logits.argmax(-1)[clear]).all()
    assert (logits[np.arange(m), ids] >= best - 1e-3).all()
    if qtype == "f32":
        assert 7 not in ids
    assert ids[0] == min(win, dup)                     # the tie with its copy: the lower id


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


@pytest.mark.parametrize("tiled", [False, True, 16], ids=["per-token", "tiled", "tiled-16-rows"])
@pytest.mark.parametrize("window,hd,h,gh", [(0, 36, 4, None), (13, 136, 4, None), (0, 36, 16, 8), (13, 20, 16, 4),
                                             (0, 512, 8, 4), (5, 72, 16, 1), (40, 256, 16, None), (0, 300, 4, None)])
def test_attention_prefill_then_decode(dev, window, hd, h, gh, tiled):
    """Prefill attention: per token with 1-8 query heads of a KV head per workgroup (GQA groups of 2
    and 8), and tiled (32 or 16 query rows a workgroup, several tokens each, keys in tiles of 32)."""
    rows = K.attention_tile_rows(dev, h // 2, hd)
    if tiled and (rows == 0 or tiled == 16 and (hd > 256 or h // 2 > 16)):
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
                heads_per_group=gh, tiled=bool(tiled), tile_rows=16 if tiled == 16 else None)
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


@pytest.mark.parametrize("tiled", [False, True], ids=["per-token", "tiled"])
@pytest.mark.parametrize("hd,h", [(64, 8), (136, 4)])
def test_attention_second_chunk_over_a_ring(dev, hd, h, tiled):
    """A prefill chunk after an earlier one (pos0 > 0) on a sliding layer whose cache is a ring of
    window + chunk - 1 slots: the chunk's own stores overwrite the oldest keys, none a query still sees."""
    rng = np.random.default_rng(12)
    hkv, window, t1, t2 = 2, 40, 70, 80
    ctx = window + t2 - 1
    n = t1 + t2
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
                        plan=plan, tiled=tiled)
    dev.submit(plan)
    ref = attention_ref(q[t1:], ks.transpose(1, 0, 2), vs.transpose(1, 0, 2), np.arange(t1, n), window)
    np.testing.assert_allclose(read_f32(dev, out, t2 * h * hd).reshape(t2, h, hd), ref, atol=3e-5)


@pytest.mark.parametrize("tpr", [4, 32, 256])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_threads_per_row(dev, tpr, subgroups):
    """Row splits narrower and wider than a subgroup (the subgroup kernel falls back below its width)."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(11)
    rows, k = 70, 32 * 9
    raw = random_tensor("q5_0", rows, k, rng)
    w = dequantize("q5_0", raw, rows, k)
    x = rng.standard_normal(k)
    y = dev.buffer(4 * rows)
    dev.submit(K.matvec(dev, "q5_0", k, rows, weight_buffer(dev, raw), f32(dev, x), y, tpr=tpr, subgroups=subgroups))
    assert_close_dot(read_f32(dev, y, rows), w, x, w @ x)


def test_bindings_are_named_by_the_shader(dev):
    from pyapp.gpu import binding_numbers
    src = """// @group(0) @binding(7) var<storage, read> OLD: array<f32>;
    @group(0) @binding(2) var<storage, read_write> Y: array<f32>;
    @binding(3) @group(0)
    var<uniform> S: Step;
    @group(1) @binding(0) var<storage, read> OTHER: array<u32>;
    var<workgroup> red: array<f32, 64>;"""
    assert binding_numbers(src) == {"Y": 2, "S": 3}
    p = dev.pipeline("rope", prelude=K.SHARED_WGSL, constants={"H": 1, "HD": 4, "NROT": 4})
    assert p.bindings == {"X": 0, "FF": 1, "S": 2}
    with pytest.raises(GPUError, match=r"rope:main has no binding named 'Y' \(it declares FF, S, X\)"):
        dev.bind_group(p, {"X": dev.dummy, "Y": dev.dummy})


def test_native_device_reports_no_loss_or_error(dev):
    assert dev.lost_reason is None and dev.last_error is None
    dev.clear_error()


def test_shared_layouts_pack_as_the_shaders_read_them():
    import struct
    assert K.pack_step(7, 123) == struct.pack("<4I", 7, 123, 0, 0) and K.STEP_BYTES == 16
    assert "struct Step {\n    n_tokens: u32,\n    pos0: u32," in K.SHARED_WGSL
    got = K.pack_sample_params(0.7, 40, 0.9, 0.05, 1.1, range(100), 0.25)
    recent = list(range(100))[-K.MAX_RECENT:]
    assert got == struct.pack("<5f3I", 0.7, 0.9, 0.05, 0.25, 1.1, 40, K.MAX_RECENT, 0) + struct.pack("<64I", *recent)
    assert len(got) == K.SAMPLE_PARAMS_BYTES == 32 + 4 * K.MAX_RECENT


def test_upload_chunks_copy_and_limits(dev):
    from pyapp.source import BytesSource
    data = np.arange(1001, dtype=np.uint8).tobytes() * 3        # odd length: padded to 4 bytes
    a = dev.buffer(len(data))
    dev.upload(a, BytesSource(b"xx" + data), 2, len(data), chunk=100)
    assert dev.read(a, 0, len(data)) == data
    b = dev.buffer(64)
    dev.submit(dev.plan().copy(a, 8, b, 4, 32))
    assert dev.read(b, 4, 32) == data[8:40]
    with pytest.raises(GPUError, match="maxBufferSize"):
        dev.buffer(dev.limits["max_buffer_size"] + 1)


# ---- sampling, MoE, PLE ---------------------------------------------------------

SAMPLE_CASES = [  # (temperature, top_k, top_p, min_p, repeat_penalty)
    (0.0, 40, 0.9, 0.0, 1.0), (0.0, 40, 0.9, 0.0, 1.3), (1.0, 40, 0.95, 0.0, 1.0), (0.7, 5, 1.0, 0.0, 1.1),
    (1.3, 0, 0.5, 0.05, 1.0), (1.0, 300, 1.0, 0.0, 1.0), (0.8, 64, 0.95, 0.1, 1.2), (1.0, 40, 0.0, 0.0, 1.0),
    (1.0, 1, 0.9, 0.0, 1.2),       # top_k 1: the greedy scan (as temperature 0), no radix rounds
]


@pytest.mark.parametrize("v", [3001, 20011], ids=["one-stage", "two-stage"])
@pytest.mark.parametrize("case", SAMPLE_CASES, ids=lambda c: "t{}-k{}-p{}-m{}-r{}".format(*c))
def test_sample_matches_reference(dev, case, v):
    from pyapp.reference.sampling import sample as ref_sample
    temperature, top_k, top_p, min_p, rp = case
    rng = np.random.default_rng(hash(case) % 2**32)
    for trial in range(6):
        logits = (rng.standard_normal(v) * 3).astype(np.float32)
        recent = [int(i) for i in np.argsort(-logits)[:3]] + [int(i) for i in rng.integers(0, v, 10)]
        recent += recent[:2]                                          # duplicates count once
        u = float(rng.uniform())
        want = ref_sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=rp, recent=recent, u=u)
        lb, out = f32(dev, logits), dev.buffer(16)
        params = dev.buffer(K.SAMPLE_PARAMS_BYTES)
        dev.write(params, K.pack_sample_params(temperature, top_k, top_p, min_p, rp, recent, u))
        scratch = dev.buffer(max(16, K.sample_scratch_bytes(v)))
        dev.submit(K.sample(dev, v, lb, out, params, scratch))
        got = int(np.frombuffer(dev.read(out, 0, 4), np.uint32)[0])
        assert got == want, f"trial {trial}: gpu {got} vs reference {want}"


def test_sample_follows_the_distribution(dev):
    """Many draws with spread-out u land on each candidate in proportion to its probability."""
    logits = np.full(1000, -20.0, np.float32)
    logits[[7, 500, 999]] = [2.0, 1.0, 0.0]
    p = np.exp([2.0, 1.0, 0.0]) / np.exp([2.0, 1.0, 0.0]).sum()
    counts = {7: 0, 500: 0, 999: 0}
    lb, out, params = f32(dev, logits), dev.buffer(16), dev.buffer(K.SAMPLE_PARAMS_BYTES)
    n = 60
    for i in range(n):
        dev.write(params, K.pack_sample_params(1.0, 3, 1.0, 0.0, 1.0, [], (i + 0.5) / n))
        dev.submit(K.sample(dev, 1000, lb, out, params))
        counts[int(np.frombuffer(dev.read(out, 0, 4), np.uint32)[0])] += 1
    assert abs(counts[7] / n - p[0]) < 0.03 and abs(counts[999] / n - p[2]) < 0.03


def route_reference(logits: np.ndarray, ksel: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, weights): top-k of softmax(logits) per row, lowest id on ties, renormalized (reference moe)."""
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :ksel]
    want = np.take_along_axis(probs, top, -1)
    return top, want / want.sum(-1, keepdims=True)


@pytest.mark.parametrize("e,ksel,t", [(11, 4, 3), (128, 8, 5), (300, 8, 2)], ids=["small", "26b-a4b", "odd-wide"])
def test_moe_route(dev, e, ksel, t):
    """Top-k of softmax, renormalized; ties go to the lowest expert id (the reference's stable sort)."""
    rng = np.random.default_rng(e)
    logits = rng.standard_normal((t, e)).astype(np.float32)
    logits[0, [3, 7, 9]] = 5.0                              # a three-way tie at the top
    ids, wts = dev.buffer(4 * t * ksel), dev.buffer(4 * t * ksel)
    dev.submit(K.moe_route(dev, e, ksel, f32(dev, logits), ids, wts, step_buffer(dev, t), t))
    top, want = route_reference(logits, ksel)
    got_ids = np.frombuffer(dev.read(ids, 0, 4 * t * ksel), np.uint32).reshape(t, ksel)
    np.testing.assert_array_equal(got_ids, top)
    assert list(got_ids[0, :3]) == [3, 7, 9]
    np.testing.assert_allclose(read_f32(dev, wts, t * ksel).reshape(t, ksel), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("qtype", ["f32", "q8_0", "q4_k"])
def test_moe_route_experts_combine(dev, qtype):
    rng = np.random.default_rng(21)
    t, e, ksel, hidden, ff = 3, 11, 4, 256, 64 if qtype != "q4_k" else 256
    logits = rng.standard_normal((t, e)).astype(np.float32)
    step = step_buffer(dev, t)
    ids, wts = dev.buffer(4 * t * ksel), dev.buffer(4 * t * ksel)
    plan = K.moe_route(dev, e, ksel, f32(dev, logits), ids, wts, step, t)
    # fused gate_up [e, 2ff, hidden] on the shared input, then down [e, hidden, ff] per slot
    raw_gu = random_tensor(qtype, e * 2 * ff, hidden, rng)
    raw_dn = random_tensor(qtype, e * hidden, ff, rng)
    gu_w = dequantize(qtype, raw_gu, e * 2 * ff, hidden).reshape(e, 2 * ff, hidden)
    dn_w = dequantize(qtype, raw_dn, e * hidden, ff).reshape(e, hidden, ff)
    scale = rng.uniform(0.5, 2, e).astype(np.float32)
    x = rng.standard_normal((t, hidden)).astype(np.float32)
    gu, act = dev.buffer(4 * t * ksel * 2 * ff), dev.buffer(4 * t * ksel * ff)
    ye, out = dev.buffer(4 * t * ksel * hidden), dev.buffer(4 * t * hidden)
    K.moe_experts(dev, qtype, hidden, 2 * ff, e, ksel, weight_buffer(dev, raw_gu), f32(dev, x), gu, ids, step, t, plan=plan)
    K.geglu_halves(dev, ff, ksel, gu, act, step, t, plan=plan)
    K.moe_experts(dev, qtype, ff, hidden, e, ksel, weight_buffer(dev, raw_dn), act, ye, ids, step, t,
                  per_slot_input=True, plan=plan)
    K.moe_combine(dev, hidden, ksel, ye, ids, wts, out, step, t, down_scale=f32(dev, scale), plan=plan)
    dev.submit(plan)

    top, w = route_reference(logits, ksel)
    assert (np.frombuffer(dev.read(ids, 0, 4 * t * ksel), np.uint32).reshape(t, ksel) == top).all()
    np.testing.assert_allclose(read_f32(dev, wts, t * ksel).reshape(t, ksel), w, rtol=1e-5)
    want = np.zeros((t, hidden))
    for i in range(t):
        for j, ex in enumerate(top[i]):
            g, up = gu_w[ex, :ff] @ x[i], gu_w[ex, ff:] @ x[i]
            want[i] += w[i, j] * scale[ex] * (dn_w[ex] @ (gelu_tanh(g) * up))
    got = read_f32(dev, out, t * hidden).reshape(t, hidden)
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())


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


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k", "f16"])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_epilogues(dev, qtype, subgroups):
    """geglu: one matvec over [gate; up] rows; gelu_times: gelu(Wx) * b (the PLE gate)."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(25)
    n, k = 45, 512
    raw = random_tensor(qtype, 2 * n, k, rng)
    w = dequantize(qtype, raw, 2 * n, k)
    x, b = rng.standard_normal(k), rng.standard_normal(n)
    wb, xb = weight_buffer(dev, raw), f32(dev, x)
    y = dev.buffer(4 * n)
    dev.submit(K.matvec(dev, qtype, k, n, wb, xb, y, subgroups=subgroups, geglu=True))
    gate, up = w[:n] @ x, w[n:] @ x
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * up, rtol=1e-4, atol=1e-4 * np.abs(up).max())
    dev.submit(K.matvec(dev, qtype, k, n, wb, xb, y, subgroups=subgroups, gelu_times=f32(dev, b)))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


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


@pytest.mark.parametrize("qtype", ["f32", "q8_0", "q4_k"])
@pytest.mark.parametrize("t,e,ksel,per_slot", [(70, 11, 4, False), (37, 128, 8, True), (5, 3, 2, False)],
                         ids=["tiles-over-64", "26b-a4b-down", "few"])
@pytest.mark.parametrize("tile", [None, K.MatmulTile(64, 64, 32, 8)], ids=["default-tile", "64x64-t8"])
def test_moe_grouped_experts_match_slot_by_slot(dev, qtype, t, e, ksel, per_slot, tile):
    """The grouped matmul (slots sorted by expert, a tile per tile.tokens slots) against the reference
    products, with ids the cache leaves out (NOT_HERE) and W split into two buffers of experts."""
    tile = tile or K.fit_tile(dev, K.MOE_MATMUL)
    rng = np.random.default_rng(t * e)
    k, n = (256, 67) if qtype != "q4_k" else (256, 130)
    raw = random_tensor(qtype, e * n, k, rng)
    w = dequantize(qtype, raw, e * n, k).reshape(e, n, k)
    ids = rng.integers(0, e, (t, ksel)).astype(np.uint32)
    ids[0, 0] = 0xFFFFFFFF                   # a slot this round does not serve: left unwritten
    rows = t * ksel if per_slot else t
    x = rng.standard_normal((rows, k)).astype(np.float32)
    step = step_buffer(dev, t)
    grp = dev.buffer(4 * K.moe_group_rows(e, ksel, t))
    y = dev.buffer(4 * t * ksel * n)
    dev.write(y, np.full(t * ksel * n, 7.0, np.float32).tobytes())
    ids_buf = dev.buffer(ids.nbytes)
    dev.write(ids_buf, ids.tobytes())
    plan = K.moe_group(dev, e, ksel, ids_buf, grp, step, tile=tile)
    split = e // 2 + 1                       # experts 0..split-1 in one buffer, the rest in another
    rb = len(raw) // (e * n)
    for first, here in ((0, split), (split, e - split)):
        part = weight_buffer(dev, raw[first * n * rb:(first + here) * n * rb])
        K.moe_experts_grouped(dev, qtype, k, n, e, ksel, part, f32(dev, x), y, grp, t,
                              per_slot_input=per_slot, plan=plan, first_expert=first, experts_here=here, tile=tile)
    dev.submit(plan)
    got = read_f32(dev, y, t * ksel * n).reshape(t * ksel, n)
    flat = ids.reshape(-1)
    for s, ex in enumerate(flat):
        if ex == 0xFFFFFFFF:
            assert (got[s] == 7.0).all()
            continue
        want = w[ex] @ x[s if per_slot else s // ksel]
        np.testing.assert_allclose(got[s], want, atol=1e-3 * max(1.0, np.abs(want).max()), err_msg=f"slot {s}")
    g = np.frombuffer(dev.read(grp, 0, 4 * K.moe_group_rows(e, ksel, t)), np.uint32)
    counts = np.bincount(flat[flat < e], minlength=e)
    np.testing.assert_array_equal(g[:e + 1], np.concatenate([[0], np.cumsum(counts)]))
    assert g[2 * e + 1] == sum(-(-c // tile.tokens) for c in counts)


@pytest.mark.parametrize("qtype,t,e,ksel,per_slot", [("q4_k", 70, 11, 4, False), ("q4_k", 37, 128, 8, True),
                                                     ("q4_k", 5, 3, 2, False), ("q5_0", 37, 128, 8, True),
                                                     ("q8_0", 70, 11, 4, False)],
                         ids=["tiles-over-64", "26b-a4b-per-slot", "few", "q5_0-down", "q8_0"])
def test_moe_grouped_experts_q8(dev, qtype, t, e, ksel, per_slot):
    """The grouped int8 expert matmul (moe_grouped_q8, after moe_group with the device's MoE tile)
    against pyapp.reference.quants' exact integer sums for each slot's expert and input row, with ids
    the cache leaves out (NOT_HERE: unwritten) and W split into two buffers of experts."""
    from pyapp.reference.quants import matmul_int8
    rng = np.random.default_rng(5 * t + e)
    k, n = (512, 130) if qtype == "q4_k" else (704, 67)
    raw = random_tensor(qtype, e * n, k, rng)
    w = dequantize(qtype, raw, e * n, k).reshape(e, n, k)
    ids = rng.integers(0, e, (t, ksel)).astype(np.uint32)
    ids[0, 0] = 0xFFFFFFFF
    rows = t * ksel if per_slot else t
    x = rng.standard_normal((rows, k)).astype(np.float32)
    step = step_buffer(dev, t)
    grp = dev.buffer(4 * K.moe_group_rows(e, ksel, t))
    y = f32(dev, np.full(t * ksel * n, 7.0))
    ids_buf = dev.buffer(ids.nbytes)
    dev.write(ids_buf, ids.tobytes())
    xq_bytes, xs_bytes = K.q8_bytes(rows, k)
    xq, xs = dev.buffer(xq_bytes), dev.buffer(xs_bytes)
    plan = K.quantize_q8(dev, k, f32(dev, x), xq, xs, step, t, rows_per_token=ksel if per_slot else 1)
    K.moe_group(dev, e, ksel, ids_buf, grp, step, plan=plan)
    split = e // 2 + 1
    rb = len(raw) // (e * n)
    for first, here in ((0, split), (split, e - split)):
        part = weight_buffer(dev, raw[first * n * rb:(first + here) * n * rb])
        K.moe_experts_grouped_q8(dev, qtype, k, n, e, ksel, part, xq, xs, y, grp, t, per_slot_input=per_slot, plan=plan,
                                 first_expert=first, experts_here=here)
    dev.submit(plan)
    got = read_f32(dev, y, t * ksel * n).reshape(t * ksel, n)
    q = np.frombuffer(dev.read(xq, 0, xq_bytes), np.int8).reshape(rows, k)
    ds = read_f32(dev, xs, xs_bytes // 4).reshape(rows, k // 32, 2)
    blocks = len(raw) // e
    for slot, ex in enumerate(ids.reshape(-1)):
        if ex == 0xFFFFFFFF:
            assert (got[slot] == 7.0).all()
            continue
        r = slot if per_slot else slot // ksel
        want = matmul_int8(raw[ex * blocks:(ex + 1) * blocks], qtype, n, q[r:r + 1], ds[r:r + 1, :, 0], ds[r:r + 1, :, 1])
        assert_close_dot(got[slot:slot + 1], x[r:r + 1], w[ex], want, tol=2e-5)


@pytest.mark.parametrize("qtype,k,n,tpr", [("q5_0", 704, 75, None), ("q8_0", 704, 37, None), ("q4_0", 96, 130, None),
                                          ("q5_0", 704, 75, 8)])
@pytest.mark.parametrize("per_slot", [False, True], ids=["token-input", "slot-input"])
def test_moe_experts_int8_blocks(dev, qtype, k, n, tpr, per_slot):
    """The decode expert matvec for 32-weight blocks on x rounded to int8 (moe_x8.wgsl: the 26B-A4B's
    704-long down rows), W split into two buffers of experts: each slot against the reference's integer
    sums on its x (float rounding only) and within int8's rounding of the f32 product."""
    rng = np.random.default_rng(k + n + per_slot)
    t, e, ksel = 2, 5, 3
    raw = random_tensor(qtype, e * n, k, rng)
    w = dequantize(qtype, raw, e * n, k).reshape(e, n, k)
    ids = rng.integers(0, e, (t, ksel)).astype(np.uint32)
    x = rng.standard_normal((t * ksel if per_slot else t, k)).astype(np.float32)
    x[0, 32:64] = 0.0                                  # an all-zero block of x
    ids_buf = dev.buffer(ids.nbytes)
    dev.write(ids_buf, ids.tobytes())
    y = f32(dev, np.full((t * ksel, n), 7.0))
    step = step_buffer(dev, t)
    plan = dev.plan()
    rb = len(raw) // (e * n)
    for first, here in ((0, 2), (2, 3)):
        part = weight_buffer(dev, raw[first * n * rb:(first + here) * n * rb])
        K.moe_experts(dev, qtype, k, n, e, ksel, part, f32(dev, x), y, ids_buf, step, t, plan=plan,
                      per_slot_input=per_slot, first_expert=first, experts_here=here, int8=True, tpr=tpr)
    dev.submit(plan)
    got = read_f32(dev, y, t * ksel * n).reshape(t * ksel, n)
    for s, ex in enumerate(ids.reshape(-1)):
        xs = x[s if per_slot else s // ksel]
        want = int8_reference(raw[ex * n * rb:(ex + 1) * n * rb], n, xs, qtype)
        assert_close_dot(got[s], w[ex], xs, want)
        assert_close_dot(got[s], w[ex], xs, w[ex] @ xs, tol=1e-2)


@pytest.mark.parametrize("qtype,chunks,hidden,int8", [("f32", False, 256, False), ("q8_0", False, 256, False),
                                                      ("q4_k", False, 256, False), ("q4_k", True, 256, False),
                                                      ("q4_k", True, 2816, False), ("q4_k", True, 2816, True)])
def test_moe_experts_geglu_fused(dev, qtype, chunks, hidden, int8):
    """The decode expert matvec with the GeGLU fused (gate rows then up rows per expert), W split
    into two buffers of experts: gelu(gate x) * (up x) per slot; Q4_K also in 16-byte chunks
    (moe_q4k.wgsl, the default where the device has subgroups), there also with x rounded to int8
    (against the reference's integer sums)."""
    if chunks and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(33)
    t, e, ksel, ff = 2, 5, 3, 64 if qtype != "q4_k" else 256
    raw = random_tensor(qtype, e * 2 * ff, hidden, rng)
    w = dequantize(qtype, raw, e * 2 * ff, hidden).reshape(e, 2 * ff, hidden)
    ids = rng.integers(0, e, (t, ksel)).astype(np.uint32)
    x = rng.standard_normal((t, hidden)).astype(np.float32)
    ids_buf = dev.buffer(ids.nbytes)
    dev.write(ids_buf, ids.tobytes())
    act = dev.buffer(4 * t * ksel * ff)
    step = step_buffer(dev, t)
    plan = dev.plan()
    rb = len(raw) // (e * 2 * ff)
    for first, here in ((0, 2), (2, 3)):
        part = weight_buffer(dev, raw[first * 2 * ff * rb:(first + here) * 2 * ff * rb])
        K.moe_experts(dev, qtype, hidden, ff, e, ksel, part, f32(dev, x), act, ids_buf, step, t, plan=plan,
                      first_expert=first, experts_here=here, geglu=True, chunks=chunks, int8=int8)
    dev.submit(plan)
    got = read_f32(dev, act, t * ksel * ff).reshape(t * ksel, ff)
    for s, ex in enumerate(ids.reshape(-1)):
        xs = x[s // ksel]
        ref = int8_reference(raw[ex * 2 * ff * rb:(ex + 1) * 2 * ff * rb], 2 * ff, xs) if int8 else w[ex] @ xs
        want = gelu_tanh(ref[:ff]) * ref[ff:]
        np.testing.assert_allclose(got[s], want, atol=2e-3 * max(1.0, np.abs(want).max()), err_msg=f"slot {s}")


@pytest.mark.parametrize("qtype,k,chunks,int8", [("q4_k", 768, True, False), ("q4_k", 2816, True, False),
                                                 ("q4_k", 2816, True, True), ("q6_k", 512, False, False),
                                                 ("f16", 1100, False, False)])
@pytest.mark.parametrize("mode", ["next-norm", "raw", "geglu", "gelu-times"])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_residual_input(dev, qtype, k, chunks, int8, mode, subgroups):
    """A post-norm's residual add computed by every workgroup into the matvec's input
    (K.ResidualInput): r = (R + rms_norm(Y) * w) [* scale], x = r or rms_norm(r) * w2; workgroup 0
    writes r (the reference: norm.wgsl's add_normed, then the matvec). int8: the built x rounded to
    int8 (the reference's integer sums on numpy's x)."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(k + len(mode))
    n = 41
    raw = random_tensor(qtype, 2 * n, k, rng)
    w = dequantize(qtype, raw, 2 * n, k)
    ysub, resid, pw, nw, b = (rng.standard_normal(k) for _ in range(5))
    b = b[:n]
    scale = np.float32(0.7) if mode in ("raw", "geglu") else None
    r = (resid + rms_norm(ysub[None], pw, 1e-6)[0]) * (scale if scale is not None else 1.0)
    x = rms_norm(r[None], nw, 1e-6)[0] if mode != "raw" else r
    res = K.ResidualInput(f32(dev, ysub), f32(dev, resid), dev.buffer(4 * k), f32(dev, pw),
                          scale=f32(dev, [scale]) if scale is not None else None,
                          next_weight=f32(dev, nw) if mode != "raw" else None)
    y = dev.buffer(4 * 2 * n)
    opts = dict(subgroups=subgroups, chunks=chunks, residual=res, int8=int8)
    ref = int8_reference(raw, 2 * n, x) if int8 else w @ x
    tol = 1e-3 if int8 else 1e-4          # int8: an x within float rounding of a rounding tie may round either way
    gate, up = ref[:n], ref[n:]
    if mode == "geglu":
        dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), None, y, geglu=True, **opts))
        np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * up, rtol=tol, atol=tol * np.abs(up).max())
    elif mode == "gelu-times":
        dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), None, y, gelu_times=f32(dev, b), **opts))
        np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * b, rtol=tol, atol=tol * np.abs(b).max())
    else:
        dev.submit(K.matvec(dev, qtype, k, 2 * n, weight_buffer(dev, raw), None, y, **opts))
        assert_close_dot(read_f32(dev, y, 2 * n), w, x, ref, tol=1e-4 if int8 else 2e-5)
    np.testing.assert_allclose(read_f32(dev, res.resid_out, k), r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qtype,k,n,weighted", [("f16", 2816, 128, True), ("f32", 1100, 37, False),
                                                ("q8_0", 352, 11, True), ("q4_k", 768, 41, True)])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_norm_input(dev, qtype, k, n, weighted, subgroups):
    """A row normed by every workgroup into the matvec's input (K.NormInput, a MoE router): x =
    rms_norm(src) [* w] * scale; workgroup 0 writes x and rms_norm(src) * w2 (norm_pair's outputs)."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(k + n)
    raw = random_tensor(qtype, n, k, rng)
    w = dequantize(qtype, raw, n, k)
    src = rng.standard_normal(k) * 3
    nw, w2 = rng.uniform(0.5, 1.5, k), rng.standard_normal(k)
    scale = 1 / math.sqrt(k)
    x = rms_norm(src[None], nw if weighted else None, 1e-6)[0] * scale
    normed = K.NormInput(f32(dev, src), dev.buffer(4 * k), f32(dev, nw) if weighted else None, f32(dev, w2),
                         dev.buffer(4 * k), scale=scale)
    y = dev.buffer(4 * n)
    dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), None, y, subgroups=subgroups, residual=normed))
    assert_close_dot(read_f32(dev, y, n), w, x, w @ x)
    np.testing.assert_allclose(read_f32(dev, normed.x_out, k), x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(read_f32(dev, normed.out2, k), rms_norm(src[None], w2, 1e-6)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qtype,k,n,chunks,e,ksel", [("q5_0", 2112, 2816, False, 128, 8), ("q8_0", 96, 37, False, 11, 4),
                                                    ("q4_k", 768, 41, True, 300, 8), ("f16", 44, 5, False, 1, 1)])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_route_tail(dev, qtype, k, n, chunks, e, ksel, subgroups):
    """A one-token matvec with one workgroup more that routes a MoE token (K.RouteTail): y = W x as
    without it, and the top-k of softmax(logits), renormalized, ties to the lowest id."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(k + e)
    raw = random_tensor(qtype, n, k, rng)
    w = dequantize(qtype, raw, n, k)
    x = rng.standard_normal(k)
    logits = rng.standard_normal((1, e)).astype(np.float32)
    logits[0, [min(2, e - 1), e - 1]] = 4.0                # a tie at the top
    route = K.RouteTail(e, ksel, f32(dev, logits), dev.buffer(4 * ksel), dev.buffer(4 * ksel))
    y = dev.buffer(4 * n)
    dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), f32(dev, x), y, subgroups=subgroups,
                        chunks=chunks, route=route))
    assert_close_dot(read_f32(dev, y, n), w, x, w @ x)
    top, want = route_reference(logits, ksel)
    np.testing.assert_array_equal(np.frombuffer(dev.read(route.ids, 0, 4 * ksel), np.uint32), top[0])
    np.testing.assert_allclose(read_f32(dev, route.weights, ksel), want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("d,ksel,t,scaled", [(2816, 8, 1, True), (300, 3, 5, False), (36, 1, 2, True)])
def test_moe_tail(dev, d, ksel, t, scaled):
    """A MoE layer's output in one dispatch: rms_norm(dense) * w1 + rms_norm(sum_j weights_j y_j [* scale]) * w2."""
    rng = np.random.default_rng(d + ksel + t)
    e = 11
    ye = rng.standard_normal((t * ksel, d)).astype(np.float32)
    dense = rng.standard_normal((t, d)).astype(np.float32)
    ids = rng.integers(0, e, size=t * ksel).astype(np.uint32)
    wts = rng.uniform(0.1, 1.0, size=t * ksel).astype(np.float32)
    w1, w2 = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    sc = rng.uniform(0.5, 2.0, size=e).astype(np.float32)
    idsb = dev.buffer(ids.nbytes)
    dev.write(idsb, ids.tobytes())
    out = f32(dev, np.full((t + 1, d), 7.0, np.float32))
    dev.submit(K.moe_tail(dev, d, ksel, f32(dev, dense), f32(dev, w1), f32(dev, ye), idsb, f32(dev, wts), f32(dev, w2),
                          out, step_buffer(dev, t, 0), t + 1, down_scale=f32(dev, sc) if scaled else None))
    w = wts * (sc[ids] if scaled else 1.0)
    moe = (w.reshape(t, ksel, 1) * ye.reshape(t, ksel, d)).sum(1)
    want = rms_norm(dense, w1, 1e-6) + rms_norm(moe, w2, 1e-6)
    got = read_f32(dev, out, (t + 1) * d).reshape(t + 1, d)
    np.testing.assert_allclose(got[:t], want, rtol=1e-4, atol=1e-4)
    assert (got[t] == 7.0).all()                 # past the step's tokens: not written
