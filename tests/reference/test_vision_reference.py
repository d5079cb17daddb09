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


# ---- the 12B: no encoder, its 48-px patches projected (gemma4uv) ---------------------------------------------

@pytest.mark.parametrize("stem", ["mmproj-12b", "mmproj-12b-bf16"])
def test_the_12bs_patch_projection_matches_transformers(stem):
    """The numpy patch projection on llama.cpp's projector files of the 12B (F16, BF16) against transformers'
    Gemma4UnifiedModel.get_image_features with the embedder set to the file's values: a wide and a tall image
    at budgets 70 and 140, cut by pyapp's preprocessing into the processor's very pixel_values and positions."""
    import hashlib
    from pyapp.gguf import read_gguf
    from pyapp.families.gemma4_vision.reference import PatchProjection, reference_encoder
    from support.unified_images import case_image, golden, patches_of
    gold = golden(stem)
    enc = reference_encoder(read_gguf(FORMS / f"{stem}.gguf"))
    assert isinstance(enc, PatchProjection) and (enc.patch, enc.pool, enc.hidden) == (48, 1, 16)
    for i in range(4):
        patches, positions = patches_of(*case_image(gold, i))
        as_bytes = np.round(patches * 255).astype(np.uint8).tobytes()
        assert hashlib.sha256(as_bytes).hexdigest() == str(gold[f"pixels_sha_{i}"])
        assert np.array_equal(positions, gold[f"positions_{i}"]) and len(positions) == gold[f"case_{i}"][3]
        encoded, features = enc.encode(patches, positions), enc.features(patches, positions)
        assert np.abs(encoded - gold[f"encoded_{i}"]).max() < 1e-5          # values about 1
        assert np.abs(features - gold[f"features_{i}"]).max() < 1e-5 * np.abs(gold[f"features_{i}"]).max()


def test_what_the_12bs_golden_would_catch():
    """The fixture's values make each part show: the patch values in the processor's (y, x, c) order instead
    of the file's (c, y, x), the positions swapped, a bias or the LayerNorm's centering dropped."""
    from pyapp.gguf import read_gguf
    from pyapp.families.gemma4_vision import reference as ref
    from support.unified_images import case_image, golden, patches_of
    gold = golden("mmproj-12b")
    patches, positions = patches_of(*case_image(gold, 0))
    want = gold["features_0"]

    def off(enc, patches=patches, positions=positions) -> float:
        return np.abs(enc.features(patches, positions) - want).max()
    enc = ref.PatchProjection(read_gguf(FORMS / "mmproj-12b.gguf"))
    assert off(enc) < 1e-4
    assert off(enc, positions=positions[:, ::-1].copy()) > 0.1
    chw = patches.reshape(-1, 48 * 48, 3).transpose(0, 2, 1).reshape(patches.shape)
    assert off(enc, patches=chw) > 0.1
    enc.patch_norm = (enc.patch_norm[0], 0 * enc.patch_norm[1])
    assert off(enc) > 0.1


@pytest.mark.parametrize("stem", ["mmproj-12b", "mmproj-12b-bf16"])
def test_the_12bs_logits_with_images_match_transformers(stem):
    """llama.cpp's text GGUF of the 12B with its projector's soft tokens at the placeholder runs: transformers'
    logits (generate's masks: an image's tokens see each other both ways on the sliding layers) for one image
    and for two; without the images far off."""
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    from pyapp.families.gemma4_vision.reference import PatchProjection
    from support.unified_images import SOFT, case_image, golden, patches_of, small_image
    gold = golden(stem)
    enc = PatchProjection(read_gguf(FORMS / f"{stem}.gguf"))
    model = ReferenceModel(read_gguf(FORMS / "gemma4-12b.gguf"))
    assert model.cfg.image_attention_both_ways
    images = {"image": [case_image(gold, 0)], "two_image": [small_image(gold, 0), small_image(gold, 1)]}
    for name, pictures in images.items():
        tokens, want = gold[f"{name}_tokens"], gold[f"{name}_logits"]
        features = np.concatenate([enc.features(*patches_of(*p)) for p in pictures])
        at = np.nonzero(tokens == SOFT)[0]
        assert len(at) == len(features)
        got = np.asarray(model.forward(tokens, soft=(at, features)))
        assert np.abs(got - want).max() < 1e-3 and (got.argmax(-1) == want.argmax(-1)).all()
        assert np.abs(np.asarray(model.forward(tokens)) - want).max() > 0.1


def test_the_12bs_projector_files_are_llama_cpps():
    """What llama.cpp's converter writes for the 12B (`--mmproj`): a clip file, projector type gemma4uv with the
    audio's gemma4ua, the 16-px patch size (its 3 x 3 merge implied), no layers; the patch embedding F16 in the
    F16 file and F32 in the BF16 one, the projection F16 / BF16, norms, biases and the position table F32."""
    from pyapp.gguf import read_gguf
    from pyapp.families.gemma4_vision.config import PatchProjectionConfig, encoder_config
    for stem, embd, projection in (("mmproj-12b", "F16", "F16"), ("mmproj-12b-bf16", "F32", "BF16")):
        g = read_gguf(FORMS / f"{stem}.gguf")
        meta = g.metadata
        assert meta["general.architecture"] == "clip" and meta["clip.vision.projector_type"] == "gemma4uv"
        assert meta["clip.audio.projector_type"] == "gemma4ua" and meta["clip.vision.patch_size"] == 16
        assert meta["clip.vision.block_count"] == 0 and "clip.vision.projector.scale_factor" not in meta
        assert g.tensors["v.patch_embd.weight"].type_name == embd
        assert g.tensors["mm.input_projection.weight"].type_name == projection
        assert all(g.tensors[n].type_name == "F32" for n in g.tensors if n.startswith("v.patch_norm."))
        assert g.tensors["v.position_embd.weight"].type_name == "F32"
        assert encoder_config(g) == PatchProjectionConfig(hidden=16, patch=48, n_positions=64, text_hidden=128,
                                                          eps=meta["clip.vision.attention.layer_norm_epsilon"])
