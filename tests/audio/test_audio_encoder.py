"""Gemma 4's audio encoder on the GPU (pyapp.families.gemma4_audio.encoder) against transformers'
get_audio_features (tools/make_audio_golden.py) and the numpy oracle (reference.py), from Ollama's blob
(both forms) and llama.cpp's mmproj; and its soft tokens in the text engine (SoftRun) against
transformers' logits with one clip and with two."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp.app.audio import EncodedClip
from pyapp.gguf import read_gguf
from pyapp.runtime.requests import handler
from pyapp.steps import drive

from support.paths import FIXTURES

pytestmark = pytest.mark.gpu
FORMS = FIXTURES / "forms"
TOLERANCE = 5e-5          # float32 on the GPU against transformers' float32: 3.5e-6 measured


@pytest.fixture(scope="module")
def golden():
    return np.load(FORMS / "ollama-dense.audio.npz")


def load(dev, stem: str, max_frames: int = 200):
    from pyapp.families.gemma4_audio.encoder import AudioEncoder
    g = read_gguf(FORMS / f"{stem}.gguf")
    return drive(AudioEncoder.load(dev, g, max_frames), handler(dev, g.source))


def soft_tokens(dev, enc, mel: np.ndarray) -> np.ndarray:
    mel = np.ascontiguousarray(mel, np.float32)
    out = enc.encode(mel.tobytes(), len(mel))
    n = (len(mel) + 3) // 4
    return np.frombuffer(dev.read(out, 0, 4 * n * enc.cfg.text_hidden), np.float32).reshape(n, -1)


@pytest.mark.parametrize("stem", ["ollama-dense", "ollama-dense-published", "mmproj-dense"])
def test_soft_tokens_match_transformers(dev, golden, stem):
    enc = load(dev, stem)                        # one plan, both clips (35 and 16 soft tokens)
    for i in range(2):
        got = soft_tokens(dev, enc, golden[f"mel_{i}"])
        want = golden[f"features_{i}"]
        assert got.shape == want.shape
        assert np.abs(got - want).max() < TOLERANCE


def test_a_longer_clip_matches_the_reference(dev):
    """Six seconds (150 soft tokens, 13 attention chunks) of a tone and noise, through the standard-library
    features: the GPU against the numpy oracle on the same rows."""
    from pyapp.families.gemma4_audio import features as F
    from pyapp.families.gemma4_audio.reference import AudioEncoder
    rng = np.random.default_rng(4)
    t = np.arange(6 * F.SAMPLE_RATE) / F.SAMPLE_RATE
    clip = 0.3 * np.sin(2 * np.pi * 220 * t * (1 + 0.2 * t)) + 0.05 * rng.standard_normal(len(t))
    mel = np.frombuffer(F.log_mel(clip.tolist()), np.float32).reshape(-1, F.MEL_BINS)
    enc = load(dev, "ollama-dense", max_frames=len(mel))
    got = soft_tokens(dev, enc, mel)
    want = AudioEncoder(read_gguf(FORMS / "ollama-dense.gguf")).features(mel)
    assert got.shape == want.shape == (F.soft_tokens(len(clip)), 256)
    assert np.abs(got - want).max() < TOLERANCE


def test_a_clip_the_plan_cannot_hold_is_refused(dev):
    from pyapp.families.gemma4_audio.config import AudioError
    enc = load(dev, "ollama-dense", max_frames=40)
    with pytest.raises(AudioError, match="does not fit"):
        enc.encode(bytes(4 * 41 * 128), 41)
    with pytest.raises(AudioError, match="bytes of features for 10 frames"):
        enc.encode(bytes(4 * 9 * 128), 10)


def test_a_file_without_an_audio_encoder(dev):
    from pyapp.families.gemma4_audio.config import AudioError
    with pytest.raises(AudioError, match="no audio encoder"):
        load(dev, "llamacpp-dense-fused-qkv")


@pytest.mark.parametrize("stem", ["ollama-dense", "mmproj-dense"])
def test_logits_with_audio_match_transformers(dev, golden, stem):
    """The text engine with the encoder's soft tokens at the clips' placeholder runs (their per-layer
    inputs from the pad id) gives transformers' logits, for one clip and for two; without them it does not."""
    from pyapp.engine import Engine
    from pyapp.runtime.soft_tokens import SoftRun
    enc = load(dev, stem)
    eng = Engine.open(FORMS / "ollama-dense.gguf", device=dev, context_length=128, chunk=64, int8=False)
    audio_token = eng.gguf.metadata["tokenizer.ggml.tokens"].index("<|audio|>")
    for name in ("audio", "two_audio"):
        tokens, want = [int(t) for t in golden[f"{name}_tokens"]], golden[f"{name}_logits"]
        starts = [i for i, t in enumerate(tokens) if t == audio_token and tokens[i - 1] != audio_token]
        runs = []
        for i, at in enumerate(starts):
            mel = np.ascontiguousarray(golden[f"mel_{i}"], np.float32)
            n = len(golden[f"features_{i}"])
            runs.append(SoftRun(at=at, rows=enc.encode(mel.tobytes(), len(mel)), n=n, key=f"clip {i}"))
        assert all(t == audio_token for r in runs for t in tokens[r.at:r.end])
        got = np.asarray(eng.forward(tokens, soft=runs))
        assert np.abs(got - want).max() < 2e-3 and (got.argmax(-1) == want.argmax(-1)).all()
        assert np.abs(np.asarray(eng.forward(tokens)) - want).max() > 0.1


# -- the 12B's audio input: raw frames projected (gemma4ua, llama.cpp's mmproj-12b*.gguf) ------------------

def unified_golden(stem: str):
    return np.load(FORMS / f"{stem}.audio.npz")


@pytest.mark.parametrize("stem", ["mmproj-12b", "mmproj-12b-bf16"])
def test_the_12b_frames_projection_matches_transformers(dev, stem):
    """FrameProjectionEncoder's soft tokens of both clips (their frames cut in Python) against transformers'
    get_audio_features, in one plan; its count as the processor's."""
    from pyapp.families.gemma4_audio.encoder import encoder_class
    from pyapp.families.gemma4_audio.projection import FrameProjectionEncoder
    g = read_gguf(FORMS / f"{stem}.gguf")
    assert encoder_class(g) is FrameProjectionEncoder
    enc = FrameProjectionEncoder.open(dev, g)
    gold = unified_golden(stem)
    assert (enc.cfg.frame, enc.cfg.text_hidden, enc.max_frames) == (32, 128, 15000)
    for i in (0, 1):
        want = gold[f"features_{i}"]
        n = enc.soft_tokens(len(gold[f"clip_{i}"]))
        assert n == int(gold[f"tokens_{i}"]) == len(want)
        out = enc.encode_clip(gold[f"clip_{i}"].tolist())
        got = np.frombuffer(dev.read(out, 0, 4 * n * 128), np.float32).reshape(n, 128)
        assert np.abs(got - want).max() < TOLERANCE * np.abs(want).max()


def test_the_12b_frames_projection_refuses_a_clip_past_its_plan(dev):
    from pyapp.families.gemma4_audio.config import AudioError
    from pyapp.families.gemma4_audio.projection import FrameProjectionEncoder
    enc = FrameProjectionEncoder.open(dev, read_gguf(FORMS / "mmproj-12b.gguf"), 10)
    with pytest.raises(AudioError, match="a clip of 11 frames does not fit this projection \\(1 to 10\\)"):
        enc.encode_clip([0.5] * 321)


@pytest.mark.parametrize("stem", ["mmproj-12b", "mmproj-12b-bf16"])
def test_the_12b_logits_with_audio_match_transformers(dev, stem):
    """The 12B's engine with the clips' soft tokens at their placeholder runs, causal among themselves (as
    transformers' masks keep audio, unlike images), gives transformers' logits for one clip and for two; the
    same rows seeing each other both ways (as an image's do) or left out are far off."""
    from pyapp.app.audio import clip_runs
    from pyapp.engine import Engine
    from pyapp.families.gemma4_audio.projection import FrameProjectionEncoder
    from pyapp.runtime.soft_tokens import SoftRun
    gold = unified_golden(stem)
    enc = FrameProjectionEncoder.open(dev, read_gguf(FORMS / f"{stem}.gguf"))
    eng = Engine.open(FORMS / "gemma4-12b.gguf", device=dev, context_length=128, chunk=128, int8=False)
    audio_token = eng.gguf.metadata["tokenizer.ggml.tokens"].index("<|audio|>")
    for name in ("audio", "two_audio"):
        tokens, want = [int(t) for t in gold[f"{name}_tokens"]], gold[f"{name}_logits"]
        clips = [EncodedClip(f"clip {i}", enc.encode_clip(gold[f"clip_{i}"].tolist()), int(gold[f"tokens_{i}"]))
                 for i in range(2 if name == "two_audio" else 1)]
        runs = clip_runs(tokens, clips, audio_token)
        got = np.asarray(eng.forward(tokens, soft=runs))
        assert np.abs(got - want).max() < 2e-3 and (got.argmax(-1) == want.argmax(-1)).all()
        both_ways = [SoftRun(r.at, r.rows, r.n, r.key) for r in runs]
        assert np.abs(np.asarray(eng.forward(tokens, soft=both_ways)) - want).max() > 0.1
        assert np.abs(np.asarray(eng.forward(tokens)) - want).max() > 0.1
