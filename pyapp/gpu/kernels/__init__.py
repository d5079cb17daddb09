"""Kernel builders, one module per family: each returns what the engine records into a Plan (a pipeline
from shaders/<family>.wgsl, its bindings by the shaders' variable names, a dispatch); nothing here
touches a backend, so it runs the same in the browser and natively.

    shared.py       values Python and the shaders share (Step, SampleParams, sizes), pipeline(), the grid
    quants.py       weight formats: the ggml types with kernels, the dequantization preludes
    matvec.py       the decode matvec and what it fuses (residual add or norm into x, the router's tail)
    router.py       a MoE token's top-k experts, alone or as a matvec's last workgroup
    few_tokens.py   a token and its drafts: matvec_tokens, head_argmax (speculative decoding)
    matmul.py       the prefill matmul tiles: f32/f16 (MatmulTile) and int8 (Q8Tile, quantize_q8)
    attention.py    the KV cache store, prefill and decode attention
    moe.py          a MoE layer's experts: per slot, grouped into tiles, combined
    norm.py         RMS norms (and their fusions), LayerNorm, RoPE, the per-layer embeddings' combine
    elementwise.py  GeGLU, softcap, add / mul / scale, the embedding lookup
    sample.py       argmax and the sampler
    diffusion.py    DiffusionGemma: soft embedding, canvas attention, the denoising sampler
    vision.py       the image encoder's own ops: patches, 2-D positions and RoPE, clamps, pooling
    audio.py        the audio encoder's own ops: subsampling convs, chunked attention, light conv, SiLU
    lora.py         LoRA adapters: the forward delta and its backward
    backward.py     the training backward through the frozen model
    adamw.py        AdamW with global-norm clipping

Callers use the package as one namespace (`from pyapp.gpu import kernels as K; K.matvec(...)`): every
family's public names are re-exported here.
"""

from ... import ggml  # noqa: F401  (K.ggml: the type ids callers pass beside the kernels)
from .adamw import *  # noqa: F401,F403
from .adamw import _OPT_PRELUDE  # noqa: F401  (the generated OptParams struct, checked by the tests)
from .attention import *  # noqa: F401,F403
from .audio import *  # noqa: F401,F403
from .backward import *  # noqa: F401,F403
from .diffusion import *  # noqa: F401,F403
from .elementwise import *  # noqa: F401,F403
from .few_tokens import *  # noqa: F401,F403
from .lora import *  # noqa: F401,F403
from .matmul import *  # noqa: F401,F403
from .matvec import *  # noqa: F401,F403
from .moe import *  # noqa: F401,F403
from .norm import *  # noqa: F401,F403
from .quants import *  # noqa: F401,F403
from .router import *  # noqa: F401,F403
from .sample import *  # noqa: F401,F403
from .shared import *  # noqa: F401,F403
from .vision import *  # noqa: F401,F403
