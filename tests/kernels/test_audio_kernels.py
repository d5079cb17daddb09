"""Parity of the audio encoder's own kernels (pyapp.gpu.kernels.audio: shaders/audio.wgsl) against
pyapp/families/gemma4_audio/reference.py, on odd sizes: frames, mel bins and channels that are no power
of two, clips shorter than the attention window and longer than two of them, buffers sized for more
than the step holds (what lies past the step is left alone)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyapp.gpu import kernels as K
from pyapp.families.gemma4_audio import reference as ref

from support.gpu import f32, read_f32, step_buffer

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("frames,freqs,ci,co", [(9, 7, 1, 5), (14, 12, 3, 33), (1, 4, 2, 3)])
def test_subsample(dev, frames, freqs, ci, co):
    rng = np.random.default_rng(frames + co)
    x = rng.standard_normal((frames, freqs, ci))
    w = rng.standard_normal((co, ci, 3, 3)) / 3
    norm = 1 + 0.1 * rng.standard_normal(co)
    rows, cols = (frames + 1) // 2, (freqs + 1) // 2
    y = dev.buffer(4 * (rows + 3) * cols * co)
    dev.write(y, np.full((rows + 3) * cols * co, 7.0, np.float32).tobytes())
    dev.submit(K.subsample(dev, freqs, ci, co, step_buffer(dev, frames), f32(dev, x), f32(dev, w), f32(dev, norm), y,
                           max_rows_in=frames + 6))
    conv = ref.conv2d_stride2(x.transpose(2, 0, 1), w)                      # [co, rows, cols]
    want = np.maximum(ref.layer_norm(conv.transpose(1, 2, 0), norm), 0.0)   # [rows, cols, co]
    got = read_f32(dev, y, (rows + 3) * cols * co)
    np.testing.assert_allclose(got[:want.size].reshape(want.shape), want, atol=2e-5)
    assert (got[want.size:] == 7.0).all()


@pytest.mark.parametrize("T,heads,hd", [(29, 3, 6), (5, 2, 8), (13, 1, 4)])
def test_local_attention(dev, T, heads, hd):
    rng = np.random.default_rng(T)
    q, k, v = (rng.standard_normal((T, heads, hd)) * 2 for _ in range(3))
    rel = rng.standard_normal((ref.PAST + 1, heads, hd))
    pds = 1 + 0.3 * rng.random(hd)
    out = dev.buffer(4 * (T + 2) * heads * hd)
    dev.submit(K.audio_attention(dev, heads, hd, ref.WINDOW, hd ** -0.5 / math.log(2),
                                 math.log(1 + math.e) / math.log(2), ref.LOGIT_CAP, f32(dev, q), f32(dev, k),
                                 f32(dev, v), f32(dev, rel), f32(dev, pds), out, step_buffer(dev, T), T + 2))
    want = ref.local_attention(q, k, v, rel, pds)
    np.testing.assert_allclose(read_f32(dev, out, want.size).reshape(want.shape), want, atol=2e-5)


def test_attention_logit_cap_bites(dev):
    """Scores far past the cap (keys 40x larger): the capped softmax, not the raw one."""
    rng = np.random.default_rng(3)
    T, heads, hd = 17, 2, 8
    q, v = rng.standard_normal((T, heads, hd)) * 6, rng.standard_normal((T, heads, hd))
    k = rng.standard_normal((T, heads, hd)) * 40
    rel = np.zeros((ref.PAST + 1, heads, hd))
    pds = np.ones(hd)
    out = dev.buffer(4 * T * heads * hd)
    dev.submit(K.audio_attention(dev, heads, hd, ref.WINDOW, hd ** -0.5 / math.log(2),
                                 math.log(1 + math.e) / math.log(2), ref.LOGIT_CAP, f32(dev, q), f32(dev, k),
                                 f32(dev, v), f32(dev, rel), f32(dev, pds), out, step_buffer(dev, T), T))
    want = ref.local_attention(q, k, v, rel, pds)
    np.testing.assert_allclose(read_f32(dev, out, want.size).reshape(want.shape), want, atol=5e-5)


@pytest.mark.parametrize("T,d,kernel", [(13, 7, 5), (3, 5, 5), (20, 16, 3)])
def test_glu_depthwise(dev, T, d, kernel):
    rng = np.random.default_rng(T * d)
    h = rng.standard_normal((T, 2 * d)) * 2
    w = rng.standard_normal((d, kernel))
    out = dev.buffer(4 * T * d)
    dev.submit(K.glu_depthwise(dev, d, kernel, f32(dev, h), f32(dev, w), out, step_buffer(dev, T), T))
    want = ref.glu_depthwise(h, w)
    np.testing.assert_allclose(read_f32(dev, out, want.size).reshape(want.shape), want, atol=2e-5)


def test_silu_and_bias(dev):
    rng = np.random.default_rng(5)
    T, d = 7, 11
    a = rng.standard_normal((T + 1, d)) * 4
    b = rng.standard_normal(d)
    buf = f32(dev, a)
    dev.submit(K.silu(dev, d, buf, step_buffer(dev, T), T + 1))
    got = read_f32(dev, buf, a.size).reshape(a.shape)
    np.testing.assert_allclose(got[:T], ref.silu(a[:T]), atol=2e-6)
    np.testing.assert_array_equal(got[T], a[T].astype(np.float32))      # past the step: untouched
    dev.submit(K.add_bias(dev, d, buf, f32(dev, b), step_buffer(dev, T), T + 1))
    got2 = read_f32(dev, buf, a.size).reshape(a.shape)
    np.testing.assert_allclose(got2[:T], got[:T] + b.astype(np.float32), atol=1e-6)
