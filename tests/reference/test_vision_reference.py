"""The numpy image encoder (pyapp/families/gemma4_vision/reference.py, issue 28's oracle) against transformers'
Gemma4Model.get_image_features on the Ollama-form fixtures' tiny vision towers
(tools/make_vision_golden.py): a wide and a tall image, the encoder's pooled output and the
projected soft tokens, from the per-linear clamp scalars (today's converter) and from the packed
v.clamp_data (the original library tags), and from llama.cpp's projector files of the same
checkpoints (mmproj-*.gguf, tools/make_mmproj_fixtures.py: `clip.vision.*` keys, no text model)."""

from __future__ import annotations


import numpy as np
import pytest

from support.paths import FIXTURES

FORMS = FIXTURES / "forms"


def golden_of(stem: str):
    """The vision golden of a fixture: its checkpoint's (the projector files hold the same values)."""
    return np.load(FORMS / f"ollama-{stem.removeprefix('ollama-').removeprefix('mmproj-').removesuffix('-published')}"
                           ".vision.npz")


@pytest.mark.parametrize("stem", ["ollama-dense", "ollama-dense-published", "ollama-moe", "ollama-moe-published",
                                  "mmproj-dense", "mmproj-moe"])
def test_image_features_match_transformers(stem):
    from pyapp.gguf import read_gguf
    from pyapp.families.gemma4_vision.reference import VisionEncoder
    golden = golden_of(stem)
    enc = VisionEncoder(read_gguf(FORMS / f"{stem}.gguf"))
    for i in range(2):
        patches, positions = golden[f"patches_{i}"], golden[f"positions_{i}"]
        encoded = enc.encode(patches, positions)
        assert encoded.shape == golden[f"encoded_{i}"].shape == (len(patches) // 9, enc.hidden)
        assert np.abs(encoded - golden[f"encoded_{i}"]).max() < 1e-4 * np.abs(golden[f"encoded_{i}"]).max()
        features = enc.features(patches, positions)
        assert np.abs(features - golden[f"features_{i}"]).max() < 1e-4 * np.abs(golden[f"features_{i}"]).max()


def test_the_clamps_and_the_positions_matter():
    """The fixture's clamp bounds (|2..4|) and 2-D positions change the output: the test above would
    see either dropped."""
    from pyapp.gguf import read_gguf
    from pyapp.families.gemma4_vision.reference import VisionEncoder
    golden = np.load(FORMS / "ollama-dense.vision.npz")
    enc = VisionEncoder(read_gguf(FORMS / "ollama-dense-published.gguf"))
    patches, positions, want = golden["patches_1"], golden["positions_1"], golden["features_1"]
    for layer in enc.layers:
        layer["clamps"] = {k: (-np.inf, np.inf, -np.inf, np.inf) for k in layer["clamps"]}
    assert np.abs(enc.features(patches, positions) - want).max() > 1e-2
    enc = VisionEncoder(read_gguf(FORMS / "ollama-dense.gguf"))
    assert np.abs(enc.features(patches, positions[:, ::-1].copy()) - want).max() > 1e-2


def test_a_text_only_file_says_so():
    from pyapp.gguf import read_gguf
    from pyapp.families.gemma4_vision.reference import VisionEncoder, VisionError
    with pytest.raises(VisionError, match="no image encoder"):
        VisionEncoder(read_gguf(FORMS / "llamacpp-dense-fused-qkv.gguf"))


@pytest.mark.parametrize("stem", ["ollama-dense", "ollama-moe-published"])
def test_logits_with_an_image_match_transformers(stem):
    """A prompt holding the image's placeholder run (<|image>, a soft token per pooled square, <image|>):
    the reference with the encoder's features in those positions gives transformers' logits (the
    E2B-like fixture's per-layer inputs included: the pad id's embedding, the projection of the
    feature); without them it does not."""
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    from pyapp.families.gemma4_vision.reference import VisionEncoder
    golden = np.load(FORMS / f"{stem.removesuffix('-published')}.vision.npz")
    g = read_gguf(FORMS / f"{stem}.gguf")
    image_token = g.metadata["tokenizer.ggml.tokens"].index("<|image|>")
    features = VisionEncoder(g).features(golden["patches_1"], golden["positions_1"])
    model = ReferenceModel(g)
    for name, images in (("image", 1), ("two_image", 2)):     # the MoE fixture's images attend both ways
        tokens, want = golden[f"{name}_tokens"], golden[f"{name}_logits"]
        at = np.nonzero(tokens == image_token)[0]
        assert len(at) == images * len(features) == images * 3
        got = np.asarray(model.forward(tokens, soft=(at, np.concatenate([features] * images))))
        assert np.abs(got - want).max() < 1e-3 and (got.argmax(-1) == want.argmax(-1)).all()
        assert np.abs(np.asarray(model.forward(tokens)) - want).max() > 0.1


@pytest.mark.parametrize("stem", ["dense", "moe"])
def test_projector_files_are_llama_cpps(stem):
    """What llama.cpp's converter writes, and the reader takes: a clip file (no text model), the
    encoder's hyperparameters under clip.vision.* (no pooling key: 3 x 3 is the default), the
    projection into the text width, clamp bounds as per-linear F32 scalars, F16 matrices."""
    from pyapp.gguf import read_gguf
    from pyapp.families.gemma4_vision.reference import VisionEncoder
    g = read_gguf(FORMS / f"mmproj-{stem}.gguf")
    text_hidden = read_gguf(FORMS / f"ollama-{stem}.gguf").metadata["gemma4.embedding_length"]
    meta = g.metadata
    assert meta["general.architecture"] == "clip" and meta["clip.vision.projector_type"] == "gemma4v"
    assert meta["clip.has_vision_encoder"] is True and meta["clip.vision.projection_dim"] == text_hidden
    assert meta.get("clip.has_audio_encoder", False) is (stem == "dense")
    assert not any(n.startswith(("blk.", "token_embd")) for n in g.tensors)
    assert g.tensors["v.blk.1.ffn_down.output_max"].shape == (1,) and "v.clamp_data" not in g.tensors
    assert g.tensors["v.blk.0.attn_q.weight"].type_name == "F16"
    assert g.tensors["v.position_embd.weight"].type_name == "F32"
    enc = VisionEncoder(g)
    assert (enc.n_layers, enc.hidden, enc.n_heads, enc.patch, enc.pool) == (2, 64, 2, 16, 3)
    assert enc.projection.shape == (text_hidden, 64) and text_hidden == {"dense": 256, "moe": 128}[stem]
    assert all(np.isfinite(b).all() and b[0] < 0 < b[1] for layer in enc.layers for b in layer["clamps"].values())
