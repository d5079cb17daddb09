"""Gemma 4's audio features in the standard library (pyapp.families.gemma4_audio.features) against
transformers' Gemma4AudioFeatureExtractor, and the soft-token count against Gemma4Processor's own
arithmetic: odd lengths, silence, a 30 s clip, a longer one (the processor keeps its first 30 s); the
12B's raw frames (pyapp.families.gemma4_audio.frames) against Gemma4UnifiedAudioFeatureExtractor and
Gemma4UnifiedProcessor's count.

transformers computes the FFT in float32 (numpy 2), we in float64: the log-mel values agree within
MARGIN (measured: 5e-6 on a second of tone and noise, 2e-5 on 30 s, the largest where a bin's energy
is far below the frame's)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from pyapp.families.gemma4_audio import features as F

MARGIN = 5e-5


@pytest.fixture(scope="module")
def extractor():
    fe = pytest.importorskip("transformers.models.gemma4.feature_extraction_gemma4")
    return fe.Gemma4AudioFeatureExtractor()


def transformers_features(extractor, clip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = extractor([clip], return_tensors="np")
    return out["input_features"][0], out["input_features_mask"][0]


def processor_tokens(extractor, clip: np.ndarray) -> int:
    """The placeholder run Gemma4Processor writes for the clip (replace_audio_token on its mask)."""
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
    mask = transformers_features(extractor, clip)[1]
    fake = types.SimpleNamespace(boa_token="<", audio_token="a", eoa_token=">")
    run = Gemma4Processor.replace_audio_token(fake, {"input_features_mask": [mask]}, 0)
    return run.count("a")


def tone(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / F.SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 3100 * t)
            + 0.05 * rng.standard_normal(n)).astype(np.float32)


def ours(clip: np.ndarray) -> np.ndarray:
    return np.frombuffer(F.log_mel(clip.tolist()), np.float32).reshape(-1, F.MEL_BINS)


@pytest.mark.parametrize("n", [161, 320, 321, 1003, 16_000, 16_001, 24_007])
def test_log_mel_matches_transformers(extractor, n):
    clip = tone(n, seed=n)
    want, mask = transformers_features(extractor, clip)
    got = ours(clip)
    assert len(got) == F.frames(n) == mask.sum()
    assert mask[:len(got)].all()              # the frames we keep are the ones it keeps, first
    assert np.abs(got - want[:len(got)]).max() <= MARGIN


def test_silence_is_the_floor(extractor):
    clip = np.zeros(8_000, np.float32)
    got = ours(clip)
    assert np.array_equal(got, np.full_like(got, np.float32(np.log(F.MEL_FLOOR))))
    assert np.abs(got - transformers_features(extractor, clip)[0][:len(got)]).max() <= MARGIN


def test_thirty_seconds_and_the_cap(extractor):
    clip = tone(F.MAX_SAMPLES + 40_000)          # 32.5 s: the processor keeps the first 30
    want, mask = transformers_features(extractor, clip)
    got = ours(clip)
    assert got.shape == (2999, F.MEL_BINS) and mask.sum() == 2999
    assert np.abs(got - want[:len(got)]).max() <= MARGIN
    assert np.array_equal(got, ours(clip[:F.MAX_SAMPLES]))
    assert F.soft_tokens(len(clip)) == F.soft_tokens(F.MAX_SAMPLES) == F.MAX_TOKENS == processor_tokens(extractor, clip)


@pytest.mark.parametrize("n", [1, 160, 161, 320, 321, 480, 481, 640, 641, 1000, 16_000, 16_161, 123_457, 479_999])
def test_soft_tokens_match_the_processor(extractor, n):
    clip = np.zeros(n, np.float32)
    assert F.soft_tokens(n) == processor_tokens(extractor, clip)


def test_too_short_has_no_frames():
    assert F.frames(160) == 0 and F.soft_tokens(160) == 0 and len(F.log_mel([0.5] * 160)) == 0
    assert F.frames(161) == 1 and F.soft_tokens(161) == 1


def test_mel_filters_match_transformers(extractor):
    dense = np.zeros((F.BINS, F.MEL_BINS))
    for m, weights in enumerate(F.mel_filters()):
        for k, w in weights:
            dense[k, m] = w
    assert np.abs(dense - extractor.mel_filters).max() < 1e-12
    assert np.array_equal(np.array(F.hann_window(), np.float32), extractor.window)


# -- the 12B's features: raw frames (pyapp.families.gemma4_audio.frames) --------------------------------------

@pytest.mark.parametrize("n", [1, 639, 640, 641, 16_001, 479_999, 480_000, 480_641])
def test_the_12b_frames_match_transformers(n):
    """The clip cut into frames of 640 samples, the last one zero-padded, as Gemma4UnifiedAudioFeatureExtractor
    does, and as many as Gemma4UnifiedProcessor writes placeholders for (past 30 s: the first 30 s, 750)."""
    from pyapp.families.gemma4_audio import frames as W
    fe = pytest.importorskip("transformers.models.gemma4_unified.feature_extraction_gemma4_unified")
    from transformers.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedProcessor
    clip = tone(n, seed=n)
    heard = clip[:F.MAX_SAMPLES]
    want = fe.Gemma4UnifiedAudioFeatureExtractor()([heard], return_tensors="np")["input_features"][0]
    got = np.frombuffer(W.frames(clip.tolist(), 640), np.float32).reshape(-1, 640)
    assert np.array_equal(got, want)
    counter = types.SimpleNamespace(feature_extractor=fe.Gemma4UnifiedAudioFeatureExtractor())
    assert W.soft_tokens(n, 640) == len(got) == Gemma4UnifiedProcessor._compute_audio_num_tokens(counter, heard, 16_000)
    assert W.soft_tokens(n, 640) == min(-(-n // 640), F.MAX_TOKENS)
