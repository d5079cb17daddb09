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
