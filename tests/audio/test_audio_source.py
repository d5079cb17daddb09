"""Where a model's audio encoder is (pyapp.families.gemma4_audio.source): inline in Ollama's blob of the
E2B-like fixture, in llama.cpp's mmproj given beside its text GGUF (or as an Ollama projector layer); a
projector that holds only an image encoder leaves the model's own; another model's refused by its width;
the 12B's frames projection (gemma4ua) in its projector file, another audio projector type refused by its
type; a model with none told so, with what to add."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp.families.gemma4_audio.config import AudioError
from pyapp.families.gemma4_audio.source import GIVEN, INLINE, OLLAMA_LAYER, NoAudioEncoder, find_audio_encoder
from pyapp.gguf import read_gguf
from support.paths import FIXTURES

FORMS = FIXTURES / "forms"


@pytest.fixture(scope="module")
def files():
    names = ("ollama-dense", "ollama-moe", "llamacpp-dense-fused-qkv", "mmproj-dense", "mmproj-moe")
    return {n: read_gguf(FORMS / f"{n}.gguf") for n in names}


def test_inline_and_given(files):
    assert find_audio_encoder(files["ollama-dense"]).kind == INLINE
    where = find_audio_encoder(files["llamacpp-dense-fused-qkv"], projector=files["mmproj-dense"],
                               projector_name="mmproj-dense.gguf")
    assert (where.kind, where.gguf, where.name) == (GIVEN, files["mmproj-dense"], "mmproj-dense.gguf")
    where = find_audio_encoder(files["llamacpp-dense-fused-qkv"], ollama_projector=files["mmproj-dense"])
    assert where.kind == OLLAMA_LAYER
    # a given projector that holds an audio encoder wins over the model's own; one without leaves it
    assert find_audio_encoder(files["ollama-dense"], projector=files["mmproj-dense"]).kind == GIVEN
    assert find_audio_encoder(files["ollama-dense"], projector=files["mmproj-moe"]).kind == INLINE


def test_none_is_said_with_what_to_add(files):
    with pytest.raises(NoAudioEncoder, match="this model has no audio encoder$") as e:
        find_audio_encoder(files["llamacpp-dense-fused-qkv"])
    assert "--mmproj" in e.value.hint and isinstance(e.value, AudioError)
    with pytest.raises(NoAudioEncoder, match="the projector file given holds no audio encoder"):
        find_audio_encoder(files["llamacpp-dense-fused-qkv"], projector=files["mmproj-moe"])
    with pytest.raises(NoAudioEncoder):
        find_audio_encoder(files["ollama-moe"])


def test_another_models_encoder_is_refused(files):
    with pytest.raises(AudioError, match="belongs to another model: its soft tokens are 256 wide, this model's "
                                         "hidden size is 128"):
        find_audio_encoder(files["ollama-moe"], projector=files["mmproj-dense"], projector_name="mmproj-dense.gguf")


def test_the_12b_hears_through_its_projector():
    """llama.cpp's mmproj of the 12B holds its image patch projection and its audio frames projection; the
    12B's text GGUF has no audio of its own."""
    from pyapp.families.gemma4_audio.config import is_frame_projection
    unified, projector = read_gguf(FORMS / "gemma4-12b.gguf"), read_gguf(FORMS / "mmproj-12b.gguf")
    where = find_audio_encoder(unified, projector=projector, projector_name="mmproj-12b.gguf")
    assert (where.kind, where.gguf, where.name) == (GIVEN, projector, "mmproj-12b.gguf")
    assert is_frame_projection(projector)
    assert find_audio_encoder(unified, ollama_projector=projector).kind == OLLAMA_LAYER
    with pytest.raises(NoAudioEncoder):
        find_audio_encoder(unified)


def test_another_audio_projector_type_is_refused(tmp_path):
    import gguf
    w = gguf.GGUFWriter(str(tmp_path / "whisper.gguf"), arch="clip")
    w.add_bool("clip.has_audio_encoder", True)
    w.add_string("clip.audio.projector_type", "ultravox")
    w.add_tensor("mm.a.input_projection.weight", np.zeros((128, 640), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model = read_gguf(FORMS / "llamacpp-dense-fused-qkv.gguf")
    with pytest.raises(AudioError, match="holds an audio projector of type 'ultravox', not Gemma 4's"):
        find_audio_encoder(model, projector=read_gguf(tmp_path / "whisper.gguf"))
