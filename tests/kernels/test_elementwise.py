"""Parity of the elementwise kernels and the embedding lookup (pyapp.gpu.kernels' elementwise, geglu_halves,
embed) against numpy on odd sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyapp.gpu import kernels as K
from pyapp.reference.forward import gelu_tanh, softcap

from support.gpu import dequantize, f32, random_tensor, read_f32, step_buffer, u32, weight_buffer

pytestmark = pytest.mark.gpu


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


def test_add_bias(dev):
    """a[t] += bias over the step's tokens (a linear's bias: the 12B's patch embedding), odd width."""
    rng = np.random.default_rng(9)
    t, d = 5, 37
    a = rng.standard_normal((t + 1, d)).astype(np.float32)
    bias = rng.standard_normal(d).astype(np.float32)
    ab = f32(dev, a)
    dev.submit(K.elementwise(dev, "add_bias", d, ab, step_buffer(dev, t), t + 1, b=f32(dev, bias)))
    got = read_f32(dev, ab, a.size).reshape(a.shape)
    np.testing.assert_allclose(got[:t], a[:t] + bias, rtol=1e-6, atol=1e-6)
    assert np.array_equal(got[t:], a[t:])


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
