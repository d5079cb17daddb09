"""Gemma 4's image encoder: its hyperparameters, read from the file that holds it.

Ollama's original blobs keep them in the model file under `gemma4.vision.*`; llama.cpp's projector
files (mmproj) under `clip.vision.*`. Widths the metadata does not state (heads' size, the position
table's length, the text model's width) come from the tensors' shapes, so the two forms read alike.

Two kinds: VisionConfig, the encoder of E2B, E4B, 26B-A4B and 31B (llama.cpp's projector type gemma4v),
and PatchProjectionConfig, the 12B's encoder-free patch projection (gemma4uv). `encoder_config(gguf)`
reads whichever the file holds; both say how images are cut (`patch`, `pool`, `max_patches`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import Gemma4Error
from ...model.config import IMAGE_TOKENS_MAX
from .weights import PATCH_EMBD, PATCH_NORM, POSITIONS, PROJECTION, STD_BIAS, layer_tensor

PREFIXES = ("gemma4.vision.", "clip.vision.")
ROPE_THETA = 100.0                        # transformers' Gemma4VisionConfig default; Ollama's runtime too
LAYER_NORM_EPS = 1e-5                     # the 12B's LayerNorms: PyTorch's default (llama.cpp's gemma4uv too)
BUDGETS = (70, 140, 280, 560, IMAGE_TOKENS_MAX)   # soft tokens an image may take (the processor's choices)
DEFAULT_BUDGET = 280


class VisionError(Gemma4Error, ValueError):
    """The file holds no Gemma 4 image encoder this app can run, or an image it cannot take."""


def _key(meta: dict, name: str, default=None):
    for prefix in PREFIXES:
        if prefix + name in meta:
            return meta[prefix + name]
    if default is None:
        raise VisionError(f"the image encoder's metadata lacks gemma4.vision.{name} (or clip.vision.{name})")
    return default


def _int(meta: dict, name: str, default=None, low: int = 1, high: int = 1 << 20) -> int:
    v = _key(meta, name, default)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise VisionError(f"the image encoder's {name} is {v!r}, expected a whole number in {low}..{high}")
    return v


@dataclass(frozen=True)
class VisionConfig:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    eps: float
    patch: int                 # pixels a patch side
    pool: int                  # patches a pooled square's side: a soft token per pool^2 patches
    n_positions: int           # rows of each axis of the 2-D position table
    text_hidden: int           # the projector's output: the text model's width
    channel_first: bool        # the patch embedding is a conv weight [n, 3, p, p] (else [n, p * p * 3])
    has_std: bool              # v.std_bias / v.std_scale after pooling (the larger encoders)
    theta: float = ROPE_THETA

    @classmethod
    def from_gguf(cls, gguf) -> "VisionConfig":
        meta, tensors = gguf.metadata, gguf.tensors
        if PATCH_EMBD not in tensors:
            raise VisionError(f"this file holds no image encoder (no {PATCH_EMBD})")
        hidden = _int(meta, "embedding_length")
        heads = _int(meta, "attention.head_count", high=4096)
        q_norm = tensors.get(layer_tensor(0, "attn_q_norm"))
        head_dim = q_norm.shape[0] if q_norm is not None else hidden // heads
        k = tensors.get(layer_tensor(0, "attn_k"))
        kv_heads = k.shape[1] // head_dim if k is not None and head_dim else heads
        embd, positions, projection = tensors[PATCH_EMBD], tensors.get(POSITIONS), tensors.get(PROJECTION)
        if positions is None or projection is None:
            raise VisionError(f"the image encoder lacks {POSITIONS if positions is None else PROJECTION}")
        patch = _int(meta, "patch_size", 16, high=256)
        cfg = cls(n_layers=_int(meta, "block_count", high=1024), hidden=hidden, n_heads=heads, n_kv_heads=kv_heads,
                  head_dim=head_dim, ffn_dim=_int(meta, "feed_forward_length"),
                  eps=float(_key(meta, "attention.layer_norm_epsilon", 1e-6)), patch=patch,
                  pool=int(meta.get("gemma4.vision.projector.scale_factor", meta.get("clip.vision.projector.scale_factor", 3))),
                  n_positions=positions.shape[1] if len(positions.shape) == 3 else 0,
                  text_hidden=projection.shape[1], channel_first=len(embd.shape) == 4,
                  has_std=STD_BIAS in tensors)
        if not math.isfinite(cfg.eps) or cfg.eps <= 0 or heads % max(kv_heads, 1) or head_dim * heads != hidden \
                or head_dim % 4 or cfg.n_positions < 1 or not 1 <= cfg.pool <= 8:
            raise VisionError(f"the image encoder's shape is not one this app runs: {cfg}")
        return cfg

    def max_patches(self, budget: int) -> int:
        """Patches of an image of `budget` soft tokens at most."""
        return budget * self.pool * self.pool


@dataclass(frozen=True)
class PatchProjectionConfig:
    """The 12B's image input (transformers' Gemma4UnifiedVisionEmbedder, llama.cpp's gemma4uv): no encoder.
    The processor's 16-pixel patches merged 3 x 3 make one 48 x 48 patch per soft token, projected alone:
    LayerNorm, Dense, LayerNorm, + the 2-D position table, LayerNorm; then the projector's RMSNorm and
    linear into the text width. The patch side comes from the patch embedding's shape (its rows are
    3 * side^2 values), checked against clip.vision.patch_size times the 3 x 3 merge."""
    hidden: int                # the patch embedding's width (transformers' mm_embed_dim)
    patch: int                 # pixels a patch side: 48
    n_positions: int           # rows of each axis of the 2-D position table
    text_hidden: int           # the projector's output: the text model's width
    eps: float                 # the projector's RMSNorm
    norm_eps: float = LAYER_NORM_EPS
    pool: int = 1              # a soft token per patch: the 3 x 3 merge is in the patch
    channel_first: bool = True  # the patch values as (c, y, x): llama.cpp's converter orders them for its im2col

    @classmethod
    def from_gguf(cls, gguf) -> "PatchProjectionConfig":
        meta, tensors = gguf.metadata, gguf.tensors
        embd, positions, projection = tensors[PATCH_EMBD], tensors.get(POSITIONS), tensors.get(PROJECTION)
        if positions is None or projection is None:
            raise VisionError(f"the image patch projection lacks {POSITIONS if positions is None else PROJECTION}")
        values, hidden = embd.shape[0], embd.shape[-1]
        side = math.isqrt(values // 3)
        merged = _int(meta, "patch_size", 16, high=256) * _int(meta, "projector.scale_factor", 3, high=8)
        if len(embd.shape) != 2 or 3 * side * side != values or side != merged:
            raise VisionError(f"the image patch projection's {PATCH_EMBD} has shape {list(embd.shape)}: not "
                              f"[3 x {merged} x {merged}, width] for its {merged}-pixel patches")
        stated = _int(meta, "embedding_length", hidden)
        cfg = cls(hidden=hidden, patch=side, n_positions=positions.shape[1] if len(positions.shape) == 3 else 0,
                  text_hidden=projection.shape[1], eps=float(_key(meta, "attention.layer_norm_epsilon", 1e-6)))
        if stated != hidden or hidden % 4 or cfg.n_positions < 1 or not math.isfinite(cfg.eps) or cfg.eps <= 0:
            raise VisionError(f"the image patch projection's shape is not one this app runs: {cfg}")
        return cfg

    def max_patches(self, budget: int) -> int:
        """Patches of an image of `budget` soft tokens at most."""
        return budget


def is_patch_projection(gguf) -> bool:
    """Whether the file's image encoder is the 12B's patch projection (its first LayerNorm over the patch)."""
    return PATCH_NORM in gguf.tensors


def encoder_config(gguf) -> VisionConfig | PatchProjectionConfig:
    """The config of the image encoder the file holds (VisionError where it holds none this app runs)."""
    if PATCH_EMBD not in gguf.tensors:
        raise VisionError(f"this file holds no image encoder (no {PATCH_EMBD})")
    if is_patch_projection(gguf):
        return PatchProjectionConfig.from_gguf(gguf)
    return VisionConfig.from_gguf(gguf)
