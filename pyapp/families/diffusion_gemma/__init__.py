"""DiffusionGemma: text diffusion on the Gemma 4 26B-A4B stack (issue 12; shared/notes/diffusion_gemma.md).

One text stack run as a causal encoder over the prompt and as a bidirectional decoder that refines a
canvas of C tokens step by step; a block is committed once its argmax is stable and confident.

    config.py      DiffusionGemmaConfig: the Gemma 4 keys under `diffusion-gemma.*`, the canvas and the
                   generation defaults
    weights.py     its tensors beyond Gemma 4's (the self-conditioning MLP, the encoder's layer scales)
    model.py       the GPU forward, op by op: DiffusionEncoder, DiffusionDecoder (Gemma 4's, pieces replaced)
    runner.py      CanvasState (the decoder's buffers), DiffusionRunner (the canvas and sampler plans)
    denoising.py   DenoiseParams, the random draws, DenoiseResult: shared by the engine and the reference
    engine.py      DiffusionEngine: decoder_logits, denoise, generate (by denoising)
    reference.py   the numpy oracle (CPython only): DiffusionReference (one step), generate, step_decisions

Its WGSL: shaders/soft_embed.wgsl, attention_canvas.wgsl, denoise.wgsl (pyapp.gpu.kernels binds them).
"""

from __future__ import annotations

from ..family import Family
from .config import ARCH, DiffusionGemmaConfig, diffusion_summary
from .denoising import DenoiseError, DenoiseParams, DenoiseResult, ReplayDraws, SeededDraws
from .engine import DiffusionEngine
from .runner import DiffusionRunner


def reference() -> type:
    from .reference import DiffusionReference
    return DiffusionReference


FAMILY = Family(name="DiffusionGemma", architecture=ARCH, config=DiffusionGemmaConfig, runner=DiffusionRunner,
                reference=reference, engine=DiffusionEngine, trains=False)

__all__ = ["ARCH", "FAMILY", "DenoiseError", "DenoiseParams", "DenoiseResult", "DiffusionEngine",
           "DiffusionGemmaConfig", "DiffusionRunner", "ReplayDraws", "SeededDraws", "diffusion_summary"]
