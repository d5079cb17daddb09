"""Parity of shaders/lora.wgsl (the LoRA delta y += scale * B (A x)) against numpy, on odd sizes."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def f32(dev, a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = dev.buffer(max(a.nbytes, 16))
    dev.write(b, a.tobytes())
    return b


@pytest.mark.parametrize("k, n, r, t", [(37, 300, 3, 1), (259, 17, 5, 3), (64, 513, 1, 2), (130, 70, 16, 5)])
def test_lora_delta_matches_numpy(dev, k, n, r, t):
    """Every output column of every token within the step gets scale * B (A x); tokens past the step's
    count and the columns outside [col0, col0 + n) of a wider row are left alone."""
    from pyapp.gpu import kernels as K
    rng = np.random.default_rng(k + n)
    a, b = rng.standard_normal((r, k)), rng.standard_normal((n, r))
    x = rng.standard_normal((t + 1, k))            # one token more than the step has
    ldy, col0 = n + 9, 5                           # y rows wider than this projection's outputs
    y0 = rng.standard_normal((t + 1, ldy)).astype(np.float32)
    yb = f32(dev, y0)
    scales = f32(dev, np.zeros(K.LORA_SCALE_STRIDE // 4))
    dev.write(scales, np.float32(-1.75).tobytes(), 0)
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, t, 0)
    dev.submit(K.lora(dev, k, n, r, f32(dev, a), f32(dev, b), f32(dev, x), yb, (scales, 0, 4), step, t + 1,
                      ldy=ldy, col0=col0))
    got = np.frombuffer(dev.read(yb, 0, 4 * y0.size), np.float32).reshape(y0.shape)
    want = y0.copy()
    want[:t, col0:col0 + n] += -1.75 * (x[:t] @ a.T) @ b.T
    scale = 1.75 * (np.abs(x[:t]) @ np.abs(a).T) @ np.abs(b).T + np.abs(y0[:t, col0:col0 + n])
    assert (np.abs(got[:t, col0:col0 + n] - want[:t, col0:col0 + n]) / scale).max() < 1e-5
    assert np.array_equal(got[t], y0[t])                       # past the step: untouched
    assert np.array_equal(got[:, :col0], y0[:, :col0]) and np.array_equal(got[:, col0 + n:], y0[:, col0 + n:])


def test_lora_scale_slot_is_read_at_run_time(dev):
    """The scale lives in a buffer: rewriting it changes the next submit of the same plan (scale 0: no change)."""
    from pyapp.gpu import kernels as K
    rng = np.random.default_rng(0)
    k, n, r = 45, 33, 2
    a, b, x = rng.standard_normal((r, k)), rng.standard_normal((n, r)), rng.standard_normal((1, k))
    scales = f32(dev, np.zeros(2 * K.LORA_SCALE_STRIDE // 4))
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, 1, 0)
    yb = f32(dev, np.zeros(n))
    plan = K.lora(dev, k, n, r, f32(dev, a), f32(dev, b), f32(dev, x), yb, (scales, K.LORA_SCALE_STRIDE, 4),
                  step, 1)
    dev.submit(plan)
    assert not np.frombuffer(dev.read(yb, 0, 4 * n), np.float32).any()
    dev.write(scales, np.float32(2.0).tobytes(), K.LORA_SCALE_STRIDE)
    dev.submit(plan)
    got = np.frombuffer(dev.read(yb, 0, 4 * n), np.float32)
    np.testing.assert_allclose(got, 2.0 * (b @ (a @ x[0])), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k, widths, r, t", [(37, (300, 17), 3, 2), (259, (64, 33, 70), 5, 1), (130, (9, 1, 40), 16, 3)])
def test_grouped_lora_deltas_match_numpy(dev, k, widths, r, t):
    """Two or three projections sharing x and sitting side by side in y (a fused q|k|v or gate|up
    output) in one dispatch: A's stacked [segs * r, k], B's [sum of widths, r]; output i takes its own
    projection's r values of A x."""
    from pyapp.gpu import kernels as K
    rng = np.random.default_rng(k + sum(widths))
    a = [rng.standard_normal((r, k)) for _ in widths]
    b = [rng.standard_normal((n, r)) for n in widths]
    x = rng.standard_normal((t, k))
    n, col0 = sum(widths), 3
    ldy = n + col0 + 4
    y0 = rng.standard_normal((t, ldy)).astype(np.float32)
    yb = f32(dev, y0)
    scales = f32(dev, np.zeros(K.LORA_SCALE_STRIDE // 4))
    dev.write(scales, np.float32(0.6).tobytes(), 0)
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, t, 0)
    bounds = tuple(np.cumsum(widths)[:-1].tolist())
    dev.submit(K.lora(dev, k, n, r, f32(dev, np.concatenate(a)), f32(dev, np.concatenate(b)), f32(dev, x), yb,
                      (scales, 0, 4), step, t, ldy=ldy, col0=col0, bounds=bounds))
    got = np.frombuffer(dev.read(yb, 0, 4 * y0.size), np.float32).reshape(y0.shape)
    delta = np.concatenate([0.6 * (x @ ai.T) @ bi.T for ai, bi in zip(a, b)], axis=1)
    scale = np.concatenate([0.6 * (np.abs(x) @ np.abs(ai).T) @ np.abs(bi).T for ai, bi in zip(a, b)], axis=1)
    err = np.abs(got[:, col0:col0 + n] - (y0[:, col0:col0 + n] + delta)) / (scale + np.abs(y0[:, col0:col0 + n]))
    assert err.max() < 1e-5
    assert np.array_equal(got[:, :col0], y0[:, :col0]) and np.array_equal(got[:, col0 + n:], y0[:, col0 + n:])
