"""Gemma 4's log-mel features on the GPU (shaders/log_mel.wgsl) against pyapp.families.gemma4_audio.features
(float64 FFT, itself held to transformers' extractor by tests/audio/test_features.py): clips of one frame,
odd lengths, silence (every bin at the floor), a loud clip with runs of exact zeros, a buffer sized for
more frames than the clip has (what lies past its frames is left alone)."""

from __future__ import annotations


import numpy as np
import pytest

from pyapp.families.gemma4_audio import features as F
from pyapp.gpu import kernels as K

from support.gpu import f32, read_f32

pytestmark = pytest.mark.gpu

# float32 direct DFT (8 partial sums a bin) against float64 FFT: the log-mel values within this (measured on
# lavapipe: 8.3e-7 at 161 samples, 1.0e-5 at 1601, 2.9e-6 loud, 2.8e-5 on 3 s of tone and noise; transformers'
# own float32 FFT is 2e-5 from the float64 one on 30 s)
MARGIN = 5e-5


def clip_of(kind: str, n: int, rng) -> np.ndarray:
    t = np.arange(n) / F.SAMPLE_RATE
    if kind == "silence":
        return np.zeros(n, np.float32)
    if kind == "tone+noise":
        return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(n)).astype(np.float32)
    x = (0.9 * np.sign(np.sin(2 * np.pi * 97 * t)) * rng.random(n)).astype(np.float32)     # loud, with holes
    x[n // 3: n // 3 + 700] = 0.0
    return x


@pytest.mark.parametrize("kind,n", [("tone+noise", 161), ("tone+noise", 1601), ("silence", 3203),
                                    ("loud", 16_037), ("tone+noise", 48_000)])
def test_log_mel_matches_the_python_features(dev, kind, n):
    rng = np.random.default_rng(n)
    clip = clip_of(kind, n, rng)
    frames = F.frames(n)
    max_frames = frames + 5
    roots = f32(dev, np.array(F.dft_roots()).reshape(-1))
    window = f32(dev, np.frombuffer(F.hann_window().tobytes(), np.float32))
    filters = f32(dev, np.array(F.filter_matrix()))
    mel = dev.buffer(4 * max_frames * F.MEL_BINS)
    dev.write(mel, np.full(max_frames * F.MEL_BINS, 7.0, np.float32).tobytes())
    step = dev.buffer(K.STEP_BYTES, "uniform")
    dev.write(step, K.pack_step(frames, n))
    dev.submit(K.log_mel(dev, f32(dev, clip), roots, window, filters, mel, step, max_frames, floor=F.MEL_FLOOR))
    got = read_f32(dev, mel, max_frames * F.MEL_BINS)
    want = np.frombuffer(F.log_mel(clip.tolist()).tobytes(), np.float32)
    assert want.size == frames * F.MEL_BINS
    err = np.abs(got[:want.size] - want).max()
    assert err < MARGIN, f"max abs diff {err:.3g}"
    assert (got[want.size:] == 7.0).all()
    if kind == "silence":
        assert np.allclose(got[:want.size], np.log(F.MEL_FLOOR), atol=1e-7)
