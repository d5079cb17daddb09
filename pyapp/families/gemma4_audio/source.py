"""Where a chosen model's audio encoder is, decided once for the CLI and the page alike.

Gemma 4 E2B's and E4B's audio encoder reaches people as its image encoder does
(pyapp.families.gemma4_vision.source):

- inline in the model file: Ollama's original library tags (`a.*`, `mm.a.*` tensors, `gemma4.audio.*` keys);
- a projector file the user names: llama.cpp's `mmproj-*.gguf` (the CLI's `--mmproj FILE`, the page's
  projector box), which holds the image and the audio encoder (`clip.has_audio_encoder`,
  `clip.audio.projector_type` gemma4a);
- an Ollama manifest's projector layer, the same mmproj format.

The 12B's audio input (llama.cpp's projector type `gemma4ua`: raw waveform frames projected, no encoder;
`mm.a.input_projection.weight` alone) comes only in a projector file, beside its image patch projection
(`gemma4uv`): llama.cpp's mmproj of the 12B, which the 12B's Ollama tags ship as their projector layer.

A projector the user gave that holds an audio encoder wins (they chose it); one that holds only an image
encoder leaves the model file's own audio encoder in place. An encoder whose soft tokens are not the
text model's width is another model's, refused by name before anything is uploaded; a projector of another
audio type is refused by its type.

    where = find_audio_encoder(model_gguf, projector=mmproj_gguf, projector_name="mmproj-e2b.gguf")
    where.gguf        # the parsed GGUF whose a.* / mm.a.* tensors the encoder reads

Standard library only (runs in Pyodide).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...model.forms import text_hidden
from .config import FRAME_PROJECTION, AudioError
from .weights import CONV0, PROJECTION

INLINE = "inline"                 # the model file's own a.* / mm.a.* tensors
GIVEN = "projector"               # a projector file the user gave (--mmproj, the page's file box)
OLLAMA_LAYER = "ollama projector"  # an Ollama manifest's projector layer

GEMMA4_AUDIO = "gemma4a"          # llama.cpp's projector type of Gemma 4's audio encoder (E2B, E4B)
AUDIO_TYPES = (GEMMA4_AUDIO, FRAME_PROJECTION)     # and the 12B's frames projection (config.is_frame_projection)


class NoAudioEncoder(AudioError):
    """The chosen model has no audio encoder: none inline, none in a projector given or in its Ollama manifest."""
    hint = ("Gemma 4 E2B, E4B and the 12B hear audio; a text-only GGUF (llama.cpp's conversion) needs its projector "
            "file: add the model's mmproj-*.gguf (the CLI's --mmproj FILE, the page's projector box)")


@dataclass(frozen=True)
class AudioSource:
    kind: str                      # INLINE, GIVEN or OLLAMA_LAYER
    gguf: object                   # the parsed GGUF holding the encoder's tensors
    name: str                      # how messages name it


def _projection_width(g) -> int | None:
    t = g.tensors.get(PROJECTION)
    return t.shape[1] if t is not None and len(t.shape) == 2 else None


def holds_audio(g) -> bool:
    """Whether a parsed GGUF (a model file or a projector) holds Gemma 4's audio encoder or the 12B's frames
    projection."""
    if g.metadata.get("general.architecture") != "clip":
        return CONV0 in g.tensors
    atype = g.metadata.get("clip.audio.projector_type")
    return atype == GEMMA4_AUDIO and CONV0 in g.tensors or atype == FRAME_PROJECTION


def serves_audio(g, width: int | None, name: str) -> bool:
    """Whether g holds an audio encoder, checked against the text model's width (AudioError if it cannot serve)."""
    atype = g.metadata.get("clip.audio.projector_type")
    if atype is not None and atype not in AUDIO_TYPES:
        raise AudioError(f"{name} holds an audio projector of type {str(atype)[:40]!r}, not Gemma 4's "
                         f"({GEMMA4_AUDIO!r}, or the 12B's {FRAME_PROJECTION!r})")
    if not holds_audio(g):
        return False
    if PROJECTION not in g.tensors:
        raise AudioError(f"{name} has audio encoder tensors but no {PROJECTION}: an incomplete encoder")
    out = _projection_width(g)
    if width is not None and out != width:
        raise AudioError(f"{name}'s audio encoder belongs to another model: its soft tokens are {out} wide, this "
                         f"model's hidden size is {width}")
    return True


def find_audio_encoder(model, projector=None, ollama_projector=None, *, projector_name: str | None = None,
                       ollama_name: str | None = None) -> AudioSource:
    """Where the chosen model's audio encoder is (see the module's docstring). Each argument is a parsed GGUF
    header (pyapp.gguf) or None. Raises AudioError for an encoder that cannot serve this model,
    NoAudioEncoder when there is none."""
    width = text_hidden(model)
    candidates = ((GIVEN, projector, projector_name or "the projector file"),
                  (INLINE, model, "the model file"),
                  (OLLAMA_LAYER, ollama_projector, ollama_name or "the model's Ollama projector layer"))
    for kind, g, name in candidates:
        if g is not None and serves_audio(g, width, name):
            return AudioSource(kind, g, name)
    given = " (the projector file given holds no audio encoder)" if projector is not None else ""
    raise NoAudioEncoder(f"this model has no audio encoder{given}")
