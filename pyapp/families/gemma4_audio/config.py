"""Gemma 4's audio encoder: its hyperparameters, read from the file that holds it.

Ollama's original blobs keep them in the model file under `gemma4.audio.*` (and name five tensors their
own way: pyapp.families.gemma4_audio.weights); llama.cpp's projector files (mmproj, Ollama's projector
layers) under `clip.audio.*`. Neither states the attention's chunking, its logit cap, the residual
weight of the half-step feed-forwards or the norms' epsilon: every Gemma 4 audio encoder has
transformers' Gemma4AudioConfig defaults (llama.cpp's gemma4a graph fixes them too, and its loader
overrides the epsilon the files state: "a mistake in the original conversion code"). Widths the
metadata does not state (the subsampling convs' channels, the output projection's width, the text
model's width, the depthwise kernel) come from the tensors' shapes, so the two forms read alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import Gemma4Error

PREFIXES = ("gemma4.audio.", "clip.audio.")
N_MELS = 128                   # the feature extractor's mel bins (clip.audio.num_mel_bins)
CHUNK = 12                     # attention_chunk_size: queries a block
PAST = 12                      # attention_context_left - 1: the keys before a block's first query it may see
WINDOW = 12                    # a query sees itself and the 11 frames before it (the sliding mask, left 12)
LOGIT_CAP = 50.0               # attention_logit_cap: scores = 50 tanh(scores / 50)
RESIDUAL_WEIGHT = 0.5          # a half-step feed-forward adds half its output
EPS = 1e-6                     # every norm's epsilon (rms_norm_eps; the subsampling LayerNorms' too)
INVALID_LOGIT = -1e9           # attention_invalid_logits_value: a key a query may not see


def relative_positions(hidden: int) -> list[float]:
    """The relative positions' sinusoids, [PAST + 1, hidden] row-major: row d that of distance d,
    [sin..., cos...] of d over hidden / 2 timescales from 1 to 1/10000 (Gemma4AudioRelPositionalEncoding,
    whose rows run from distance 12 down to 0)."""
    n = hidden // 2
    step = math.log(10000.0) / max(n - 1, 1)
    rows = []
    for d in range(PAST + 1):
        angles = [d * math.exp(-i * step) for i in range(n)]
        rows += [math.sin(a) for a in angles] + [math.cos(a) for a in angles]
    return rows


class AudioError(Gemma4Error, ValueError):
    """A clip, an audio file or an audio encoder this app cannot turn into soft tokens."""


def _key(meta: dict, name: str):
    for prefix in PREFIXES:
        if prefix + name in meta:
            return meta[prefix + name]
    raise AudioError(f"the audio encoder's metadata lacks gemma4.audio.{name} (or clip.audio.{name})")


def _int(meta: dict, name: str, low: int = 1, high: int = 1 << 20) -> int:
    v = _key(meta, name)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise AudioError(f"the audio encoder's {name} is {v!r}, expected a whole number in {low}..{high}")
    return v


@dataclass(frozen=True)
class AudioConfig:
    n_layers: int
    hidden: int
    n_heads: int
    head_dim: int
    ffn_dim: int                 # the feed-forwards' inner width (4 x hidden)
    channels: tuple[int, int]    # the two subsampling convs' output channels
    conv_kernel: int             # the light convolution's depthwise kernel
    out_dim: int                 # the output projection's width (the embedder's input)
    text_hidden: int             # the embedder's output: the text model's width
    ollama: bool                 # Ollama's inline form (its tensor names), else llama.cpp's projector's
    n_mels: int = N_MELS

    @classmethod
    def from_gguf(cls, gguf) -> "AudioConfig":
        from .weights import CONV0, file_names
        meta = gguf.metadata
        ollama = meta.get("general.architecture") != "clip"
        tensors = file_names(gguf.tensors, ollama)
        if CONV0 not in tensors:
            raise AudioError(f"this file holds no audio encoder (no {CONV0})")
        needed = ("a.conv1d.1.weight", "a.blk.0.conv_dw.weight", "a.pre_encode.out.weight", "mm.a.input_projection.weight")
        missing = [n for n in needed if n not in tensors]
        if missing:
            raise AudioError(f"the audio encoder lacks {', '.join(missing)}")
        hidden = _int(meta, "embedding_length")
        heads = _int(meta, "attention.head_count", high=4096)
        conv1, dw = tensors["a.conv1d.1.weight"], tensors["a.blk.0.conv_dw.weight"]
        cfg = cls(n_layers=_int(meta, "block_count", high=1024), hidden=hidden, n_heads=heads,
                  head_dim=hidden // heads, ffn_dim=_int(meta, "feed_forward_length"),
                  channels=(conv1.shape[2], conv1.shape[3]) if len(conv1.shape) == 4 else (0, 0),
                  conv_kernel=dw.shape[0], out_dim=tensors["a.pre_encode.out.weight"].shape[-1],
                  text_hidden=tensors["mm.a.input_projection.weight"].shape[-1], ollama=ollama)
        if hidden % heads or cfg.head_dim % 2 or min(cfg.channels) < 1 or cfg.conv_kernel < 1:
            raise AudioError(f"the audio encoder's shape is not one this app runs: {cfg}")
        return cfg

    @property
    def frequencies(self) -> int:
        """Mel bins after the two stride-2 convs: the input projection reads frequencies x channels[1]."""
        return self.n_mels // 4


FRAME_PROJECTION = "gemma4ua"   # llama.cpp's projector type of the 12B's audio input


@dataclass(frozen=True)
class FrameProjectionConfig:
    """The 12B's audio input (transformers' Gemma4UnifiedMultimodalEmbedder over raw waveform frames,
    llama.cpp's projector type gemma4ua): no encoder. The clip cut into frames of `frame` samples (640, 40 ms
    at 16 kHz), the last one zero-padded, each frame a soft token: an RMSNorm without a scale over its
    samples, then the projector's linear into the text width. The frame is the projection's input width
    (llama.cpp's loader fixes it at 640 whatever clip.audio.num_mel_bins says; the converter writes 128
    there), checked against clip.audio.embedding_length (transformers' audio_embed_dim); the epsilon is
    transformers' rms_norm_eps, 1e-6 (which the converter does not write: llama.cpp fixes it too)."""
    frame: int                 # samples a soft token
    text_hidden: int           # the projection's output: the text model's width
    eps: float = EPS

    @classmethod
    def from_gguf(cls, gguf) -> "FrameProjectionConfig":
        from .weights import PROJECTION
        projection = gguf.tensors.get(PROJECTION)
        if projection is None or len(projection.shape) != 2:
            raise AudioError(f"the audio frames projection lacks a matrix {PROJECTION}")
        frame, text_hidden = projection.shape
        stated = gguf.metadata.get("clip.audio.embedding_length", frame)
        if stated != frame:
            raise AudioError(f"the audio frames projection reads {frame} samples a frame, its "
                             f"clip.audio.embedding_length says {stated}")
        return cls(frame=frame, text_hidden=text_hidden)


def is_frame_projection(gguf) -> bool:
    """Whether the file's audio input is the 12B's frames projection (llama.cpp's gemma4ua)."""
    return gguf.metadata.get("clip.audio.projector_type") == FRAME_PROJECTION
