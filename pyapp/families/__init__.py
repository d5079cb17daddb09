"""Model families: each declared once, in its own package.

    diffusion_gemma/   DiffusionGemma: text by denoising a canvas
"""

from ..model.config import DIFFUSION_ARCH, Gemma4Config


def model_config(gguf) -> Gemma4Config:
    """The config of a model the engine runs: a DiffusionGemmaConfig for a DiffusionGemma GGUF, else Gemma4Config."""
    if gguf.metadata.get("general.architecture") == DIFFUSION_ARCH:
        from .diffusion_gemma import DiffusionGemmaConfig
        return DiffusionGemmaConfig.from_gguf(gguf)
    return Gemma4Config.from_gguf(gguf)
