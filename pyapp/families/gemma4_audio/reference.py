"""Gemma 4's audio encoder in numpy: the oracle the GPU encoder is checked against (issue 30).

Mirrors transformers' models/gemma4 (Gemma4AudioModel + Gemma4MultimodalEmbedder), one op per line, in
float64, reading the encoder's tensors where Ollama's original blobs keep them inline (`a.*`, `mm.a.*`,
`gemma4.audio.*` keys) and where llama.cpp's projector files keep them (`clip.audio.*`), through the
one declaration of their names (pyapp.families.gemma4_audio.weights).

    enc = AudioEncoder(gguf)
    soft = enc.features(mel)          # [soft tokens, text hidden] of a clip's log-mel rows [frames, 128]

The 12B's audio input (FrameProjection: transformers' Gemma4UnifiedMultimodalEmbedder over raw waveform
frames, llama.cpp's gemma4ua) has no encoder: each frame's samples normed and projected. Both classes
take a clip as the app has it (`clip_features(samples)`, `soft_tokens(n_samples)`); `reference_encoder`
gives the one a file holds.

`mel` holds only the clip's own frames (features.log_mel): transformers' padding frames are masked to
zero, and every op here that could see them (the subsampling convs, causal attention, the causal
depthwise conv) sees zeros or nothing in their place, so the soft tokens it keeps are these.

The attention, as transformers computes it blockwise (12 queries a block, each seeing its block and
the 12 frames before it, relative positions shifted Transformer-XL style), reduces to: query t sees
keys t - 11 .. t (the sliding mask of 12), with score q_t . (k_s + r_(t-s)), where r_d is the
relative-position key of distance d, then 50 tanh(score / 50).
"""

from __future__ import annotations

import math

import numpy as np

from . import features as mel_features
from . import frames as waveform_frames
from .config import (EPS, LOGIT_CAP, PAST, RESIDUAL_WEIGHT, WINDOW, AudioConfig, FrameProjectionConfig,
                     is_frame_projection, relative_positions)
from .weights import LINEARS, bind, bind_frame_projection
from ...reference.quants import load_tensor


def rms_norm(x: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    y = x * (np.mean(x * x, axis=-1, keepdims=True) + EPS) ** -0.5
    return y if weight is None else y * weight


def layer_norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """nn.LayerNorm over the last axis, without a bias."""
    centered = x - x.mean(-1, keepdims=True)
    return centered / np.sqrt((centered * centered).mean(-1, keepdims=True) + EPS) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def conv2d_stride2(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [in, T, F], w [out, in, 3, 3] -> [out, ceil(T / 2), ceil(F / 2)]: stride 2, one zero each side."""
    channels, T, F = x.shape
    padded = np.zeros((channels, T + 3, F + 3))
    padded[:, 1:T + 1, 1:F + 1] = x
    rows, cols = (T + 1) // 2, (F + 1) // 2
    out = np.zeros((w.shape[0], rows, cols))
    for dt in range(3):
        for df in range(3):
            window = padded[:, dt:dt + 2 * rows:2, df:df + 2 * cols:2]        # [in, rows, cols]
            out += np.einsum("oi,itf->otf", w[:, :, dt, df], window)
    return out


def local_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, rel: np.ndarray, per_dim_scale: np.ndarray,
                    window: int = WINDOW) -> np.ndarray:
    """[T, heads, hd]: query t over keys t - window + 1 .. t, score (q_t * qs * per_dim_scale) .
    (k_s * ks + rel[t - s]) capped, softmax, the values' weighted sum (rel [window + 1, heads, hd])."""
    T, heads, hd = q.shape
    q = q * (hd ** -0.5 / math.log(2)) * per_dim_scale
    k = k * (math.log(1 + math.e) / math.log(2))
    scores = np.full((T, heads, window), -np.inf)
    for d in range(min(window, T)):                          # the key d frames back
        scores[d:, :, d] = np.einsum("thd,thd->th", q[d:], k[:T - d] + rel[d])
    seen = np.isfinite(scores)
    scores[seen] = LOGIT_CAP * np.tanh(scores[seen] / LOGIT_CAP)
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    out = np.zeros((T, heads, hd))
    for d in range(min(window, T)):
        out[d:] += p[d:, :, d, None] * v[:T - d]
    return out


def glu_depthwise(h: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """The causal depthwise conv (kernel [d, K]: tap K - 1 the current frame) of glu(h), h [T, 2d]."""
    d, K = kernel.shape
    g = h[:, :d] * sigmoid(h[:, d:])
    padded = np.concatenate([np.zeros((K - 1, d)), g])
    return sum(kernel[:, j] * padded[j:j + len(g)] for j in range(K))


class AudioEncoder:
    def __init__(self, gguf):
        self.g = gguf
        self.cfg = cfg = AudioConfig.from_gguf(gguf)     # "holds no audio encoder" where it has none
        w = bind(cfg, gguf.tensors)
        t = self.tensor
        self.conv = [(t(w.conv0), t(w.conv0_norm)), (t(w.conv1), t(w.conv1_norm))]
        self.input_proj = t(w.input_proj)                 # [hidden, frequencies * channels]
        self.output_proj, self.output_bias = t(w.output_proj), t(w.output_bias)
        self.projection = t(w.projection)                 # [text hidden, out]
        self.layers = []
        for lw in w.layers:
            layer = {name: t(value) for name, value in vars(lw).items() if name != "bounds"}
            layer["bounds"] = {lin: self._bounds(lw.bounds.get(lin)) for lin in LINEARS}
            self.layers.append(layer)

    def tensor(self, info) -> np.ndarray:
        return load_tensor(self.g, info).astype(np.float64)

    def _bounds(self, scalars) -> tuple[float, float, float, float]:
        if scalars is None:
            return (-np.inf, np.inf, -np.inf, np.inf)
        return tuple(float(self.tensor(x).reshape(-1)[0]) for x in scalars)

    def linear(self, layer: dict, name: str, x: np.ndarray) -> np.ndarray:
        """Gemma4ClippableLinear: input clamped, x @ W^T, output clamped."""
        lo, hi, out_lo, out_hi = layer["bounds"][name]
        return np.clip(np.clip(x, lo, hi) @ layer[name].T, out_lo, out_hi)

    # -- the subsampling front end ---------------------------------------------------
    def subsample(self, mel: np.ndarray) -> np.ndarray:
        """[frames, 128] log-mel -> [ceil(ceil(frames / 2) / 2), hidden]."""
        x = np.asarray(mel, np.float64)[None]                     # [1 channel, T, mels]
        for weight, norm in self.conv:
            x = conv2d_stride2(x, weight)                          # [channels, T / 2, mels / 2]
            x = layer_norm(x.transpose(1, 2, 0), norm).transpose(2, 0, 1)
            x = np.maximum(x, 0.0)
        channels, T, F = x.shape
        flat = x.transpose(1, 2, 0).reshape(T, F * channels)       # frequency-major, channel-minor
        return flat @ self.input_proj.T

    # -- a conformer layer ------------------------------------------------------------
    def feed_forward(self, layer: dict, x: np.ndarray, suffix: str = "") -> np.ndarray:
        """A half-step feed-forward: x + 0.5 post_norm(down(silu(up(norm(x)))))."""
        h = rms_norm(x, layer["ffn_norm" + suffix])
        h = self.linear(layer, "ffn_up" + suffix, h)
        h = silu(h)
        h = self.linear(layer, "ffn_down" + suffix, h)
        h = rms_norm(h, layer["ffn_post_norm" + suffix])
        return x + RESIDUAL_WEIGHT * h

    def attention(self, layer: dict, x: np.ndarray) -> np.ndarray:
        cfg = self.cfg
        N, heads, hd = len(x), cfg.n_heads, cfg.head_dim
        h = rms_norm(x, layer["attn_pre_norm"])
        q = self.linear(layer, "attn_q", h).reshape(N, heads, hd)
        k = self.linear(layer, "attn_k", h).reshape(N, heads, hd)
        v = self.linear(layer, "attn_v", h).reshape(N, heads, hd)
        positions = np.reshape(relative_positions(cfg.hidden), (PAST + 1, -1))
        rel = (positions @ layer["attn_k_rel"].T).reshape(PAST + 1, heads, hd)
        out = local_attention(q, k, v, rel, layer["per_dim_scale"])
        out = self.linear(layer, "attn_out", out.reshape(N, heads * hd))
        return x + rms_norm(out, layer["attn_post_norm"])

    def light_conv(self, layer: dict, x: np.ndarray) -> np.ndarray:
        """x + pw2(silu(norm(causal_depthwise(glu(pw1(norm(x)))))))."""
        h = rms_norm(x, layer["conv_norm"])
        h = self.linear(layer, "conv_pw1", h)
        h = glu_depthwise(h, layer["conv_dw"])
        h = rms_norm(h, layer["norm_conv"])
        h = silu(h)
        h = self.linear(layer, "conv_pw2", h)
        return x + h

    def layer(self, layer: dict, x: np.ndarray) -> np.ndarray:
        x = self.feed_forward(layer, x)
        x = self.attention(layer, x)
        x = self.light_conv(layer, x)
        x = self.feed_forward(layer, x, "_1")
        return rms_norm(x, layer["out_norm"])

    # -- the whole encoder -------------------------------------------------------------
    def encode(self, mel: np.ndarray) -> np.ndarray:
        """The encoder's output (after its output projection): [soft tokens, out]."""
        x = self.subsample(mel)
        for layer in self.layers:
            x = self.layer(layer, x)
        return x @ self.output_proj.T + self.output_bias

    def features(self, mel: np.ndarray) -> np.ndarray:
        """Soft tokens in the text model's width: the embedder's unscaled RMSNorm, then its projection."""
        return rms_norm(self.encode(mel)) @ self.projection.T


    def soft_tokens(self, n_samples: int) -> int:
        return mel_features.soft_tokens(n_samples)

    def clip_features(self, samples) -> np.ndarray:
        """Soft tokens of a clip of 16 kHz samples (its first 30 s): its log-mel rows (features.py) encoded."""
        mel = np.frombuffer(mel_features.log_mel(samples[:mel_features.MAX_SAMPLES]), np.float32)
        return self.features(mel.reshape(-1, mel_features.MEL_BINS))


class FrameProjection:
    """The 12B's audio input: each frame of raw samples alone, in numpy (float64)."""

    def __init__(self, gguf):
        self.cfg = cfg = FrameProjectionConfig.from_gguf(gguf)
        w = bind_frame_projection(cfg, gguf.tensors)
        self.projection = load_tensor(gguf, w.projection).astype(np.float64)     # [text hidden, frame]

    def features(self, frames: np.ndarray) -> np.ndarray:
        """Soft tokens in the text model's width of frames [n, frame]: the unscaled RMSNorm, then the linear."""
        return rms_norm(frames.astype(np.float64)) @ self.projection.T

    def soft_tokens(self, n_samples: int) -> int:
        return waveform_frames.soft_tokens(n_samples, self.cfg.frame)

    def clip_features(self, samples) -> np.ndarray:
        """Soft tokens of a clip of 16 kHz samples (its first 30 s): its frames (frames.py) projected."""
        rows = np.frombuffer(waveform_frames.frames(samples, self.cfg.frame), np.float32)
        return self.features(rows.reshape(-1, self.cfg.frame))


def reference_encoder(gguf) -> AudioEncoder | FrameProjection:
    """The numpy oracle of the audio input the file holds."""
    return FrameProjection(gguf) if is_frame_projection(gguf) else AudioEncoder(gguf)
