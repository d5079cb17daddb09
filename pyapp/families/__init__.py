"""Model families, each declared once and found from its files' architecture.

    family = family_for(gguf)                 # the Family of the file (pyapp.families.family)
    cfg = model_config(gguf)                  # = family.config.from_gguf(gguf)

    gemma4.py          Gemma 4 text: the base stack (pyapp.model, pyapp.runtime, pyapp.reference)
    diffusion_gemma/   DiffusionGemma: text by denoising a canvas, on Gemma 4's stack

A new family (the vision and audio encoders, draft models) is a package with its config, GPU
forward, runner, reference (and engine, when it does not generate token by token) declaring a
FAMILY, and one line in FAMILIES below; the engine finds it here and names none.
"""

from __future__ import annotations

from .diffusion_gemma import FAMILY as DIFFUSION_GEMMA
from .family import Family
from .gemma4 import FAMILY as GEMMA4

FAMILIES: tuple[Family, ...] = (GEMMA4, DIFFUSION_GEMMA)
BY_ARCHITECTURE = {f.architecture: f for f in FAMILIES}


def family_for(gguf) -> Family:
    """The family of a GGUF (a parsed file, or its metadata dict). A file of no family here is read as
    Gemma 4's, whose config refuses it naming the architecture it has."""
    meta = gguf if isinstance(gguf, dict) else gguf.metadata
    return BY_ARCHITECTURE.get(meta.get("general.architecture"), GEMMA4)


def model_config(gguf):
    """The config of a model the engine runs: its family's, read from the file."""
    return family_for(gguf).config.from_gguf(gguf)


__all__ = ["BY_ARCHITECTURE", "DIFFUSION_GEMMA", "FAMILIES", "Family", "GEMMA4", "family_for", "model_config"]
