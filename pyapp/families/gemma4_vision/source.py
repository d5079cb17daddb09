"""Where a chosen model's image encoder is, decided once for the CLI and the page alike.

A Gemma 4 model's image encoder reaches people three ways (README, "Supported files"):

- inline in the model file: Ollama's original library tags (`v.*`, `mm.*` tensors, `gemma4.vision.*` keys);
- a projector file the user names: llama.cpp's `mmproj-*.gguf` beside an hf.co GGUF (the CLI's
  `--mmproj FILE`, the page's file box);
- the `application/vnd.ollama.image.projector` layer of an Ollama manifest (newer tags), the same
  mmproj format (`clip.*` keys), which pyapp.ollama reports as the model's `projector`.

`find_image_encoder` takes the headers already parsed (reading is the caller's: sync on the CLI, async
in the browser) and answers which file holds the encoder, or says why none can serve: a projector
file must be a Gemma 4 image projector (`clip.vision.projector_type` gemma4v, or the 12B's patch projection
gemma4uv; an image encoder in it) whose soft tokens are as wide as the text model's hidden size, so that
a projector of another model (or an audio-only one) is refused by name before anything is uploaded.

    where = find_image_encoder(model_gguf, projector=mmproj_gguf, projector_name="mmproj-e2b.gguf")
    where.gguf        # the parsed GGUF whose v.* / mm.* tensors the encoder reads
    where.kind        # INLINE, GIVEN or OLLAMA_LAYER

Standard library only (runs in Pyodide).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...model.forms import text_hidden
from .config import VisionError, is_patch_projection
from .weights import PATCH_EMBD, PATCH_NORM, PROJECTION

INLINE = "inline"                 # the model file's own v.* / mm.* tensors
GIVEN = "projector"               # a projector file the user gave (--mmproj, the page's file box)
OLLAMA_LAYER = "ollama projector"  # an Ollama manifest's application/vnd.ollama.image.projector layer

GEMMA4_VISION = "gemma4v"         # llama.cpp's projector type of Gemma 4's image encoder
GEMMA4_PATCH_PROJECTION = "gemma4uv"    # the 12B's: no encoder, its 48-px patches projected (encoder_class says)
IMAGE_TYPES = (GEMMA4_VISION, GEMMA4_PATCH_PROJECTION)
OTHER_TYPES = {"gemma4a": "Gemma 4's audio encoder only", "gemma4ua": "the 12B's audio encoder only",
               "gemma3": "Gemma 3's image encoder", "gemma3n": "Gemma 3n's encoders"}


class ProjectorError(VisionError):
    """A projector file that cannot serve as this model's image encoder (another kind of projector,
    another model's, not a projector at all)."""
    hint = "use the projector published with this model (for Gemma 4: mmproj-*.gguf of the same model)"


class NoImageEncoder(VisionError):
    """The chosen model has no image encoder: none inline, none given, none in its Ollama manifest."""
    hint = ("a text-only GGUF (llama.cpp's conversion) needs its projector file: add the model's "
            "mmproj-*.gguf (the CLI's --mmproj FILE, the page's projector box)")


@dataclass(frozen=True)
class EncoderSource:
    kind: str                      # INLINE, GIVEN or OLLAMA_LAYER
    gguf: object                   # the parsed GGUF holding the encoder's tensors
    name: str                      # how messages name it
    text_hidden: int               # the width of its soft tokens: the text model's hidden size
    parts: tuple[str, ...]         # what the file encodes: ("vision",) or ("vision", "audio")


def _projection_width(g) -> int | None:
    t = g.tensors.get(PROJECTION)
    return t.shape[1] if t is not None and len(t.shape) == 2 else None     # ggml order: [in, out]


def check_projector(g, width: int | None, name: str = "the projector file") -> tuple[str, ...]:
    """Refuse (ProjectorError) a projector GGUF that is not a Gemma 4 image projector whose soft tokens
    are `width` wide; its parts ("vision", and "audio" when it holds that encoder too) when it is."""
    meta = g.metadata
    arch = meta.get("general.architecture")
    vtype = meta.get("clip.vision.projector_type", meta.get("clip.projector_type"))
    has_vision = meta.get("clip.has_vision_encoder") is True or isinstance(vtype, str)
    has_audio = meta.get("clip.has_audio_encoder") is True or "clip.audio.projector_type" in meta
    if arch != "clip" and not has_vision and not has_audio:
        what = f"a {arch!r} model" if isinstance(arch, str) else "not a projector"
        raise ProjectorError(f"{name} is {what}, not an image projector (llama.cpp's mmproj: general.architecture "
                             "'clip')")
    if not has_vision:
        raise ProjectorError(f"{name} holds no image encoder (clip.has_vision_encoder is not set)"
                             + (": an audio projector" if has_audio else ""))
    if vtype not in IMAGE_TYPES:
        shown = OTHER_TYPES.get(vtype, f"projector type {str(vtype)[:40]!r}" if vtype is not None else
                                "a projector of no stated type")
        raise ProjectorError(f"{name} is {shown}, not Gemma 4's image encoder (clip.vision.projector_type "
                             f"{GEMMA4_VISION!r}, or the 12B's {GEMMA4_PATCH_PROJECTION!r})")
    missing = [t for t in (PATCH_EMBD, PROJECTION) if t not in g.tensors]
    if missing:
        raise ProjectorError(f"{name} says it holds Gemma 4's image encoder but lacks {', '.join(missing)}")
    if (vtype == GEMMA4_PATCH_PROJECTION) != is_patch_projection(g):
        raise ProjectorError(f"{name} says its projector type is {vtype!r} but its tensors are "
                             f"{'not ' if vtype == GEMMA4_PATCH_PROJECTION else ''}the 12B's patch projection "
                             f"({PATCH_NORM})")
    out = _projection_width(g)
    stated = meta.get("clip.vision.projection_dim")
    if isinstance(stated, int) and out is not None and stated != out:
        raise ProjectorError(f"{name}: its projection is {out} wide but clip.vision.projection_dim says {stated}")
    if width is not None and out != width:
        raise ProjectorError(f"{name} belongs to another model: its soft tokens are {out} wide, this model's "
                             f"hidden size is {width}")
    return ("vision", "audio") if has_audio else ("vision",)


def find_image_encoder(model, projector=None, ollama_projector=None, *, projector_name: str | None = None,
                       ollama_name: str | None = None) -> EncoderSource:
    """Where the chosen model's image encoder is: a projector the user gave (it wins: they chose it),
    else the model file's own encoder, else its Ollama manifest's projector layer. Each argument is a
    parsed GGUF header (pyapp.gguf) or None. Raises ProjectorError for a projector that cannot serve
    this model, NoImageEncoder when there is none."""
    width = text_hidden(model)
    if projector is not None:
        name = projector_name or "the projector file"
        return EncoderSource(GIVEN, projector, name, *_checked(projector, width, name))
    if PATCH_EMBD in model.tensors:
        if PROJECTION not in model.tensors:
            raise NoImageEncoder(f"the model file has image encoder tensors but no {PROJECTION}: an incomplete "
                                 "encoder this app cannot use")
        out = _projection_width(model)
        if width is not None and out != width:
            raise VisionError(f"the model file's image encoder writes soft tokens {out} wide; its text model is "
                              f"{width} wide")
        parts = ("vision", "audio") if any(n.startswith("a.") for n in model.tensors) else ("vision",)
        return EncoderSource(INLINE, model, "the model file", out, parts)
    if ollama_projector is not None:
        name = ollama_name or "the model's Ollama projector layer"
        return EncoderSource(OLLAMA_LAYER, ollama_projector, name, *_checked(ollama_projector, width, name))
    raise NoImageEncoder("this model has no image encoder: none in its file, and no projector file given")


def _checked(g, width, name) -> tuple[int, tuple[str, ...]]:
    parts = check_projector(g, width, name)
    return _projection_width(g), parts
