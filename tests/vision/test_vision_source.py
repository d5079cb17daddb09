"""Where a model's image encoder is (pyapp.families.gemma4_vision.source): inline in Ollama's blobs,
a projector file given (llama.cpp's mmproj; the 12B's gemma4uv too), or an Ollama manifest's projector
layer; projectors of another kind or another model refused by name, a text-only model told it has none."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp.errors import Gemma4Error
from pyapp.families.gemma4_vision.config import VisionError
from pyapp.families.gemma4_vision.source import (GIVEN, INLINE, OLLAMA_LAYER, NoImageEncoder, ProjectorError,
                                                 check_projector, find_image_encoder)
from pyapp.gguf import read_gguf
from support.paths import FIXTURES

FORMS = FIXTURES / "forms"


@pytest.fixture(scope="module")
def files():
    names = ("ollama-dense", "ollama-moe", "llamacpp-dense-fused-qkv", "mmproj-dense", "mmproj-moe", "gemma4-12b",
             "mmproj-12b")
    return {n: read_gguf(FORMS / f"{n}.gguf") for n in names}


def fake_projector(path, **keys):
    """A projector header of llama.cpp's format with the given clip.* keys (and a projection 64 -> 256)."""
    import gguf
    w = gguf.GGUFWriter(str(path), arch=keys.pop("arch", "clip"))
    for k, v in keys.items():
        (w.add_bool if isinstance(v, bool) else w.add_string if isinstance(v, str) else w.add_uint32)(k, v)
    w.add_tensor("v.patch_embd.weight", np.zeros((64, 768), np.float16))
    w.add_tensor("mm.input_projection.weight", np.zeros((256, 64), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return read_gguf(path)


def test_inline_encoders(files):
    where = find_image_encoder(files["ollama-dense"])
    assert (where.kind, where.gguf, where.text_hidden, where.parts) == (INLINE, files["ollama-dense"], 256,
                                                                       ("vision", "audio"))
    where = find_image_encoder(files["ollama-moe"])
    assert (where.kind, where.text_hidden, where.parts) == (INLINE, 128, ("vision",))


def test_a_text_only_model_has_none(files):
    with pytest.raises(NoImageEncoder, match="this model has no image encoder") as e:
        find_image_encoder(files["llamacpp-dense-fused-qkv"])
    assert "--mmproj" in e.value.hint and isinstance(e.value, VisionError) and isinstance(e.value, Gemma4Error)


def test_a_projector_given(files):
    """llama.cpp's text GGUF and its mmproj (both from the same checkpoint): the projector serves, and
    the numpy encoder run from it gives transformers' features."""
    from pyapp.families.gemma4_vision.reference import VisionEncoder
    where = find_image_encoder(files["llamacpp-dense-fused-qkv"], projector=files["mmproj-dense"],
                               projector_name="mmproj-dense.gguf")
    assert (where.kind, where.gguf, where.name, where.text_hidden, where.parts) == (
        GIVEN, files["mmproj-dense"], "mmproj-dense.gguf", 256, ("vision", "audio"))
    golden = np.load(FORMS / "ollama-dense.vision.npz")
    got = VisionEncoder(where.gguf).features(golden["patches_0"], golden["positions_0"])
    assert np.abs(got - golden["features_0"]).max() < 1e-4 * np.abs(golden["features_0"]).max()
    # one given wins over the file's own encoder: the user chose it
    assert find_image_encoder(files["ollama-dense"], projector=files["mmproj-dense"]).kind == GIVEN
    assert find_image_encoder(files["ollama-moe"], ollama_projector=files["mmproj-moe"]).kind == INLINE
    assert find_image_encoder(files["llamacpp-dense-fused-qkv"], ollama_projector=files["mmproj-dense"]).kind \
        == OLLAMA_LAYER


def test_the_12bs_projector(files):
    """llama.cpp's projector of the 12B (gemma4uv: its patch projection, the audio's gemma4ua beside it)
    serves its text GGUF, given or as an Ollama tag's projector layer; another model's width is refused
    both ways; a file that says gemma4v but holds the 12B's tensors is refused by name."""
    where = find_image_encoder(files["gemma4-12b"], projector=files["mmproj-12b"], projector_name="mmproj-12b.gguf")
    assert (where.kind, where.gguf, where.text_hidden, where.parts) == (GIVEN, files["mmproj-12b"], 128,
                                                                       ("vision", "audio"))
    assert find_image_encoder(files["gemma4-12b"], ollama_projector=files["mmproj-12b"]).kind == OLLAMA_LAYER
    with pytest.raises(ProjectorError, match="belongs to another model: its soft tokens are 128 wide"):
        find_image_encoder(files["llamacpp-dense-fused-qkv"], projector=files["mmproj-12b"])
    with pytest.raises(ProjectorError, match="belongs to another model: its soft tokens are 256 wide"):
        find_image_encoder(files["gemma4-12b"], projector=files["mmproj-dense"])
    with pytest.raises(NoImageEncoder):
        find_image_encoder(files["gemma4-12b"])
    files["mmproj-12b"].metadata["clip.vision.projector_type"] = "gemma4v"
    try:
        with pytest.raises(ProjectorError, match="type is 'gemma4v' but its tensors are the 12B's patch projection"):
            check_projector(files["mmproj-12b"], 128)
    finally:
        files["mmproj-12b"].metadata["clip.vision.projector_type"] = "gemma4uv"


def test_another_models_projector_is_refused(files):
    with pytest.raises(ProjectorError, match="mmproj-moe.gguf belongs to another model: its soft tokens are 128 "
                                             "wide, this model's hidden size is 256"):
        find_image_encoder(files["llamacpp-dense-fused-qkv"], projector=files["mmproj-moe"],
                           projector_name="mmproj-moe.gguf")
    with pytest.raises(ProjectorError, match="another model"):
        find_image_encoder(files["llamacpp-dense-fused-qkv"], ollama_projector=files["mmproj-moe"])


@pytest.mark.parametrize("keys, words", [
    ({"clip.has_vision_encoder": True, "clip.vision.projector_type": "gemma4uv"},
     "projector type is 'gemma4uv' but its tensors are not the 12B's patch projection"),
    ({"clip.has_vision_encoder": True, "clip.vision.projector_type": "gemma4ua"}, "the 12B's audio encoder only"),
    ({"clip.has_vision_encoder": True, "clip.vision.projector_type": "gemma3"}, "Gemma 3's image encoder"),
    ({"clip.has_vision_encoder": True, "clip.vision.projector_type": "qwen2vl_merger"}, "projector type 'qwen2vl_merger'"),
    ({"clip.has_vision_encoder": True}, "a projector of no stated type"),
    ({"clip.has_audio_encoder": True, "clip.audio.projector_type": "gemma4a"}, "holds no image encoder.*audio projector"),
    ({"arch": "llama"}, "is a 'llama' model, not an image projector"),
    ({"clip.has_vision_encoder": True, "clip.vision.projector_type": "gemma4v", "clip.vision.projection_dim": 512},
     "clip.vision.projection_dim says 512"),
])
def test_other_projectors_are_refused(files, tmp_path, keys, words):
    g = fake_projector(tmp_path / "p.gguf", **keys)
    with pytest.raises(ProjectorError, match=words) as e:
        find_image_encoder(files["llamacpp-dense-fused-qkv"], projector=g, projector_name="p.gguf")
    assert str(e.value).startswith("p.gguf") and e.value.hint


def test_a_model_file_is_no_projector(files):
    with pytest.raises(ProjectorError, match="is a 'gemma4' model, not an image projector"):
        find_image_encoder(files["llamacpp-dense-fused-qkv"], projector=files["llamacpp-dense-fused-qkv"])
    assert check_projector(files["mmproj-moe"], None) == ("vision",)       # width unknown: not compared
    assert check_projector(files["mmproj-dense"], 256) == ("vision", "audio")
