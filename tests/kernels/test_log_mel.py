"""Gemma 4's log-mel features on the GPU (shaders/log_mel.wgsl) against pyapp.families.gemma4_audio.features
(float64 FFT, itself held to transformers' extractor by tests/audio/test_features.py) and against transformers'
Gemma4AudioFeatureExtractor directly: clips of one frame, odd lengths, silence (every bin at the floor), a loud
clip with runs of exact zeros, a buffer sized for more frames than the clip has (what lies past its frames is
left alone)."""

from __future__ import annotations


import numpy as np
import pytest

from pyapp.families.gemma4_audio import features as F
from pyapp.gpu import kernels as K

from support.gpu import f32, read_f32
from support.paths import FIXTURES

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


def gpu_log_mel(dev, clip: np.ndarray, max_frames: int) -> np.ndarray:
    """The kernel's rows [max_frames, 128] for a clip (past its frames: 7.0, the buffer's fill)."""
    roots = f32(dev, np.array(F.dft_roots()).reshape(-1))
    window = f32(dev, np.frombuffer(F.hann_window().tobytes(), np.float32))
    filters = f32(dev, np.array(F.filter_matrix()))
    mel = dev.buffer(4 * max_frames * F.MEL_BINS)
    dev.write(mel, np.full(max_frames * F.MEL_BINS, 7.0, np.float32).tobytes())
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, F.frames(len(clip)), len(clip))
    dev.submit(K.log_mel(dev, f32(dev, clip), roots, window, filters, mel, step, max_frames, floor=F.MEL_FLOOR))
    return read_f32(dev, mel, max_frames * F.MEL_BINS).reshape(max_frames, F.MEL_BINS)


@pytest.mark.parametrize("n", [1_003, 24_007])
def test_log_mel_matches_transformers(dev, n):
    """The kernel's rows against transformers' extractor (its float32 FFT) on the frames it keeps (measured on
    lavapipe: 3.8e-6 at 1003 samples, 1.4e-5 at 24,007, 1.9e-5 on 10 s)."""
    fe = pytest.importorskip("transformers.models.gemma4.feature_extraction_gemma4")
    clip = clip_of("tone+noise", n, np.random.default_rng(n))
    out = fe.Gemma4AudioFeatureExtractor()([clip], return_tensors="np")
    want = out["input_features"][0][out["input_features_mask"][0].astype(bool)]
    got = gpu_log_mel(dev, clip, F.frames(n))
    assert got.shape == want.shape
    err = np.abs(got - want).max()
    assert err < MARGIN, f"max abs diff {err:.3g}"


@pytest.mark.parametrize("i", [0, 1])
def test_log_mel_matches_the_committed_transformers_rows(dev, i):
    """The kernel's rows against the log-mel rows transformers computed for the audio golden's clips
    (tests/fixtures/forms/ollama-dense.audio.npz, tools/make_audio_golden.py): no transformers needed."""
    golden = np.load(FIXTURES / "forms" / "ollama-dense.audio.npz")
    clip, want = golden[f"clip_{i}"].astype(np.float32), golden[f"mel_{i}"]
    got = gpu_log_mel(dev, clip, F.frames(len(clip)))
    assert got.shape == want.shape
    err = np.abs(got - want).max()
    assert err < MARGIN, f"max abs diff {err:.3g}"


@pytest.mark.parametrize("kind,n", [("tone+noise", 161), ("tone+noise", 1601), ("silence", 3203),
                                    ("loud", 16_037), ("tone+noise", 48_000)])
def test_log_mel_matches_the_python_features(dev, kind, n):
    rng = np.random.default_rng(n)
    clip = clip_of(kind, n, rng)
    frames = F.frames(n)
    got = gpu_log_mel(dev, clip, frames + 5).reshape(-1)
    want = np.frombuffer(F.log_mel(clip.tolist()).tobytes(), np.float32)
    assert want.size == frames * F.MEL_BINS
    err = np.abs(got[:want.size] - want).max()
    assert err < MARGIN, f"max abs diff {err:.3g}"
    assert (got[want.size:] == 7.0).all()
    if kind == "silence":
        assert np.allclose(got[:want.size], np.log(F.MEL_FLOOR), atol=1e-7)
