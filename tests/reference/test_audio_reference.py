"""The numpy audio encoder (pyapp/families/gemma4_audio/reference.py, issue 30's oracle) against
transformers' Gemma4Model.get_audio_features on the dense fixture's tiny audio tower
(tools/make_audio_golden.py: two clips of synthetic speech, 35 and 16 soft tokens, three and two
attention chunks), from Ollama's inline form (`a.*`, `mm.a.*`, gemma4.audio.* keys: its own names) and
from llama.cpp's projector file of the same checkpoint (mmproj-dense.gguf: `clip.audio.*`, llama.cpp's
names); the config and the weights' binding of both forms."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from support.paths import FIXTURES

FORMS = FIXTURES / "forms"
STEMS = ["ollama-dense", "ollama-dense-published", "mmproj-dense"]
TOLERANCE = 1e-5          # float64 against transformers' float32: 2.8e-6 measured


@pytest.fixture(scope="module")
def golden():
    return np.load(FORMS / "ollama-dense.audio.npz")


def read(stem: str):
    from pyapp.gguf import read_gguf
    return read_gguf(FORMS / f"{stem}.gguf")


@pytest.mark.parametrize("stem", STEMS)
def test_audio_features_match_transformers(golden, stem):
    from pyapp.families.gemma4_audio.reference import AudioEncoder
    enc = AudioEncoder(read(stem))
    for i in range(2):
        mel = golden[f"mel_{i}"]
        encoded = enc.encode(mel)
        assert encoded.shape == golden[f"encoded_{i}"].shape == ((len(mel) + 3) // 4, enc.cfg.out_dim)
        assert np.abs(encoded - golden[f"encoded_{i}"]).max() < TOLERANCE
        features = enc.features(mel)
        assert features.shape == golden[f"features_{i}"].shape
        assert np.abs(features - golden[f"features_{i}"]).max() < TOLERANCE


def test_from_the_clip_through_our_features(golden):
    """The clip itself, through the standard-library log-mel and the oracle: transformers' soft tokens."""
    from pyapp.families.gemma4_audio import features as F
    from pyapp.families.gemma4_audio.reference import AudioEncoder
    enc = AudioEncoder(read("ollama-dense"))
    for i in range(2):
        clip = golden[f"clip_{i}"]
        mel = np.frombuffer(F.log_mel(clip.tolist()), np.float32).reshape(-1, F.MEL_BINS)
        assert np.abs(mel - golden[f"mel_{i}"]).max() < 5e-5
        assert len(enc.features(mel)) == F.soft_tokens(len(clip))
        assert np.abs(enc.features(mel) - golden[f"features_{i}"]).max() < 1e-4


def test_both_forms_read_alike():
    from pyapp.families.gemma4_audio.config import AudioConfig
    inline, projector = AudioConfig.from_gguf(read("ollama-dense")), AudioConfig.from_gguf(read("mmproj-dense"))
    assert inline.ollama and not projector.ollama
    assert dataclasses.replace(inline, ollama=False) == projector
    assert (inline.n_layers, inline.hidden, inline.n_heads, inline.head_dim, inline.ffn_dim, inline.channels,
            inline.conv_kernel, inline.out_dim, inline.text_hidden) == (2, 64, 2, 32, 256, (128, 8), 5, 48, 256)


def test_ollama_names_are_llama_cpps_after_the_renames():
    from pyapp.families.gemma4_audio.weights import file_names
    inline = file_names(read("ollama-dense").tensors, ollama=True)
    projector = file_names(read("mmproj-dense").tensors, ollama=False)
    assert set(inline) == set(projector)
    for name, t in inline.items():
        assert t.shape == projector[name].shape, name
    # the two names each form uses for another tensor: by shape, they are not confused
    assert inline["a.input_projection.weight"].name == "a.pre_encode.out.weight"
    assert inline["a.pre_encode.out.weight"].name == "mm.a.fc.weight"
    assert inline["a.blk.1.ln2.weight"].name == "a.blk.1.layer_pre_norm.weight"
    assert inline["a.blk.1.attn_post_norm.weight"].name == "a.blk.1.ln2.weight"


def test_a_file_without_audio_says_so():
    from pyapp.families.gemma4_audio.config import AudioConfig, AudioError
    with pytest.raises(AudioError, match="holds no audio encoder"):
        AudioConfig.from_gguf(read("ollama-moe"))


def _bind(tensors: dict, stem: str = "ollama-dense"):
    from pyapp.families.gemma4_audio.config import AudioConfig
    from pyapp.families.gemma4_audio.weights import bind
    cfg = AudioConfig.from_gguf(read(stem))
    return bind(cfg, tensors)


def test_unknown_missing_and_misshapen_tensors_are_refused_by_name():
    from pyapp.model.weights import WeightsError
    tensors = dict(read("ollama-dense").tensors)
    extra = dataclasses.replace(tensors["a.blk.0.ln1.weight"], name="a.blk.0.mystery.weight")
    with pytest.raises(WeightsError, match=r"a\.blk\.0\.mystery\.weight"):
        _bind({**tensors, extra.name: extra})
    without = {k: v for k, v in tensors.items() if k != "a.blk.1.conv_dw.weight"}
    with pytest.raises(WeightsError, match=r"lacks a\.blk\.1\.conv_dw\.weight"):
        _bind(without)
    wrong = {**tensors, "a.blk.0.per_dim_scale.weight": dataclasses.replace(tensors["a.blk.0.ln1.weight"],
                                                                           name="a.blk.0.per_dim_scale.weight")}
    with pytest.raises(WeightsError, match=r"per_dim_scale\.weight has shape \[64\], expected \[hd=32\]"):
        _bind(wrong)
    half = {k: v for k, v in tensors.items() if k != "a.blk.0.attn_q.output_max"}
    with pytest.raises(WeightsError, match=r"attn_q: its clamp bounds are not four scalars"):
        _bind(half)


# -- the 12B's frames projection (gemma4ua in llama.cpp's mmproj-12b*.gguf) ----------------------------------

@pytest.mark.parametrize("stem", ["mmproj-12b", "mmproj-12b-bf16"])
def test_the_12b_frames_projection_matches_transformers(stem):
    """FrameProjection against Gemma4UnifiedModel.get_audio_features (tools/make_unified_audio_golden.py) on
    the processor's frames and from the clip through our framing; without its RMSNorm it is far off."""
    from pyapp.families.gemma4_audio.reference import FrameProjection, reference_encoder
    gold = np.load(FORMS / f"{stem}.audio.npz")
    enc = reference_encoder(read(stem))
    assert isinstance(enc, FrameProjection) and (enc.cfg.frame, enc.cfg.text_hidden) == (32, 128)
    for i in range(2):
        want = gold[f"features_{i}"]
        assert np.abs(enc.features(gold[f"frames_{i}"]) - want).max() < TOLERANCE
        assert np.abs(enc.clip_features(gold[f"clip_{i}"]) - want).max() < TOLERANCE
        assert enc.soft_tokens(len(gold[f"clip_{i}"])) == int(gold[f"tokens_{i}"])
        assert np.abs(gold[f"frames_{i}"] @ enc.projection.T - want).max() > 0.1


def test_the_12b_frames_projection_is_refused_when_misshapen():
    from pyapp.families.gemma4_audio.config import AudioError, FrameProjectionConfig
    g = read("mmproj-12b")
    g.metadata["clip.audio.embedding_length"] = 640
    with pytest.raises(AudioError, match="reads 32 samples a frame, its clip.audio.embedding_length says 640"):
        FrameProjectionConfig.from_gguf(g)
