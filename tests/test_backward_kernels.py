"""Parity of the training backward kernels against the numpy gradient oracle (pyapp.reference.backward), on
odd sizes. Tolerances are relative to the scale of the rounding in each sum (sum of |terms|), in float32."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp.gpu import kernels as K
from pyapp.reference import backward as B
from test_kernels import dequantize, f32, random_tensor, read_f32, step_buffer, weight_buffer

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
