"""What a Gemma 4 GGUF holds and which converter wrote it, as far as its metadata tells.

Ollama's converter (convert/convert_gemma4.go) and llama.cpp's (convert_hf_to_gguf.py)
write the same model differently (README, "Supported files"); pyapp reads both through
the spellings declared in `weights` and the token types in `tokenizer`. This module only
describes a file for `info`, the Ollama folder list and the page: the converter, the
parts (text, vision, audio) and the ways its layout differs from llama.cpp's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import weights

PARTS = ("text", "vision", "audio")
OLLAMA = "Ollama's converter (convert_gemma4.go)"
LLAMA_CPP = "llama.cpp's converter (convert_hf_to_gguf.py) or a tool writing its format"
DIFFUSION = "tools/convert_diffusion_gemma.py"


@dataclass(frozen=True)
class FileForm:
    converter: str
    parts: tuple[str, ...]          # what the file can take: "text", and "vision" / "audio" with encoders inline
    layout: tuple[str, ...]         # how its tensors and keys differ from llama.cpp's own files
    encoder_tensors: int            # v./a./mm. tensors (read by the image and audio encoders, not the text model)

    def describe(self) -> list[str]:
        lines = [f"written by:    {self.converter} (as far as the metadata tells)",
                 f"parts:         {', '.join(self.parts)}"
                 + (f" ({self.encoder_tensors} encoder tensors inline)"
                    if self.encoder_tensors else "")]
        lines += [f"layout:        {note}" for note in self.layout]
        return lines


def file_form(meta: dict, tensor_names) -> FileForm:
    names = set(tensor_names)
    arch = meta.get("general.architecture")
    model, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    layout = []
    if arch == "diffusion-gemma":
        converter = DIFFUSION
    elif model == "llama" and pre == "gemma4":
        converter = OLLAMA
        layout.append("tokenizer 'llama' with pre-tokenizer 'gemma4'; chat markup typed CONTROL, byte tokens "
                      "NORMAL (read as llama.cpp types them)")
    elif model == "gemma4":
        converter = LLAMA_CPP
    else:
        converter = "unknown"
    if weights.stores_split_experts(names):
        layout.append("experts' gate and up stored apart (as Ollama's original tags do)")
    for spelling, canonical in weights.other_spellings(names):
        layout.append(f"{spelling} where llama.cpp writes {canonical}")
    if "v.clamp_data" in names:
        layout.append("vision clamp bounds packed in v.clamp_data (Ollama's original tags)")
    if not isinstance(meta.get("tokenizer.chat_template"), str):
        layout.append("no chat template in the file: the app renders Gemma 4's format itself (README, "
                      "\"Chat format\")")
    if suppressed := meta.get("tokenizer.ggml.suppress_tokens"):
        layout.append(f"{len(suppressed)} token(s) never sampled (tokenizer.ggml.suppress_tokens)")
    encoder = [part for part in map(weights.encoder_part, names) if part is not None]
    found = set(encoder)
    for part, key in (("vision", "vision.block_count"), ("audio", "audio.block_count")):
        if f"{arch}.{key}" in meta:
            found.add(part)
    parts = tuple(p for p in PARTS if p == "text" or p in found)
    return FileForm(converter, parts, tuple(layout), len(encoder))


def projector_parts(meta: dict) -> tuple[str, ...]:
    """What a separate projector GGUF (llama.cpp's mmproj, Ollama's projector layer) encodes."""
    found = []
    if meta.get("clip.has_vision_encoder") or "clip.vision.projector_type" in meta:
        found.append("vision")
    if meta.get("clip.has_audio_encoder") or "clip.audio.projector_type" in meta:
        found.append("audio")
    return tuple(found)


def text_hidden(model) -> int | None:
    """The text model's hidden size (`<arch>.embedding_length`) of a parsed GGUF, or None when it does not
    say: the width an image or audio encoder's soft tokens must have to serve it."""
    meta = model.metadata
    v = meta.get(f"{meta.get('general.architecture')}.embedding_length")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
