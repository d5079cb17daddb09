"""Gemma 4's image encoder in numpy: the oracle the GPU encoder will be checked against (issue 28).

Mirrors transformers' models/gemma4 (Gemma4VisionModel + Gemma4MultimodalEmbedder), one op per line,
reading the encoder's tensors where Ollama's original blobs keep them inline (`v.*`, `mm.*`,
`gemma4.vision.*` keys) and where llama.cpp's projector files (mmproj, `clip.vision.*`) keep them, through
the one declaration of their names (pyapp.families.gemma4_vision.weights: the same in both forms; the
clamp bounds per-linear scalars, or packed in `v.clamp_data` in Ollama's original tags).

    enc = VisionEncoder(gguf)
    feats = enc.features(patches, positions)    # [soft tokens, text hidden]

`patches` are the image's 16x16 patches as the processor writes them (rows of p * p * 3 values in
[0, 1], pixel (y, x) then channel), `positions` their (x, y) patch coordinates.

The 12B has no encoder: PatchProjection mirrors transformers' models/gemma4_unified
(Gemma4UnifiedVisionEmbedder + Gemma4UnifiedMultimodalEmbedder) on its 48x48 patches (the processor's
16-px patches merged 3 x 3, laid out the same way). `reference_encoder(gguf)` gives the file's kind.
"""

from __future__ import annotations

import math

import numpy as np

from .config import PatchProjectionConfig, VisionConfig, VisionError, is_patch_projection  # noqa: F401  (VisionError: raised here)
from .weights import bind, bind_patch_projection
from ...reference.quants import load_tensor

LINEARS = ("attn_q", "attn_k", "attn_v", "attn_out", "ffn_gate", "ffn_up", "ffn_down")   # v.clamp_data's order


def rms_norm(x: np.ndarray, eps: float, weight: np.ndarray | None = None) -> np.ndarray:
    y = x * (np.mean(x * x, axis=-1, keepdims=True) + eps) ** -0.5
    return y if weight is None else y * weight


def layer_norm(x: np.ndarray, eps: float, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """PyTorch's nn.LayerNorm: the row centered, over the root of its variance (biased) plus eps."""
    centered = x - np.mean(x, axis=-1, keepdims=True)
    variance = np.mean(centered * centered, axis=-1, keepdims=True)
    return centered / np.sqrt(variance + eps) * weight + bias


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope_2d(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """x [T, heads, hd]: the first half of each head rotated by the x coordinate, the second by y, each
    half as NeoX pairs (i, i + hd / 4) at frequencies theta^(-2j / (hd / 2))."""
    hd = x.shape[-1]
    half = hd // 2
    inv_freq = 1.0 / theta ** (np.arange(0, half, 2, dtype=np.float64) / half)
    out = np.empty_like(x)
    for axis in range(2):
        part = x[..., axis * half:(axis + 1) * half]
        angles = positions[:, axis, None] * inv_freq[None, :]           # [T, hd / 4]
        cos = np.concatenate([np.cos(angles)] * 2, -1)[:, None, :]
        sin = np.concatenate([np.sin(angles)] * 2, -1)[:, None, :]
        rotated = np.concatenate([-part[..., half // 2:], part[..., :half // 2]], -1)
        out[..., axis * half:(axis + 1) * half] = part * cos + rotated * sin
    return out


# the oracle's names for a layer's weights -> their fields (pyapp.families.gemma4_vision.weights)
LAYER_FIELDS = {"ln1": "attn_norm", "attn_q": "attn_q", "attn_k": "attn_k", "attn_v": "attn_v",
                "attn_q_norm": "attn_q_norm", "attn_k_norm": "attn_k_norm", "attn_out": "attn_output",
                "attn_post_norm": "post_attention_norm", "ln2": "ffn_norm", "ffn_gate": "ffn_gate",
                "ffn_up": "ffn_up", "ffn_down": "ffn_down", "ffn_post_norm": "post_ffw_norm"}


class VisionEncoder:
    def __init__(self, gguf):
        self.g = gguf
        cfg = VisionConfig.from_gguf(gguf)       # "holds no image encoder" where it has none
        w = bind(cfg, gguf.tensors)              # the tensors, by the one declaration of their names
        self.n_layers, self.hidden, self.n_heads, self.eps = cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.eps
        self.patch, self.pool, self.theta = cfg.patch, cfg.pool, cfg.theta
        t = self.tensor
        embd = t(w.patch_embd)                               # [n, 3, p, p] (c, h, w) or [n, p * p * 3]
        if embd.ndim == 4:                                   # back to the processor's (h, w, c) order
            embd = embd.transpose(0, 2, 3, 1).reshape(embd.shape[0], -1)
        self.patch_embd = embd
        self.position_embd = t(w.position_embd)              # [2, positions, n]
        self.std_bias = t(w.std_bias) if w.std_bias is not None else None
        self.std_scale = t(w.std_scale) if w.std_scale is not None else None
        self.projection = t(w.projection)                    # [text hidden, n]
        packed = t(w.clamp_data).reshape(-1, 4) if w.clamp_data is not None else None
        self.layers = []
        for i, lw in enumerate(w.layers):
            layer = {k: t(getattr(lw, f)) for k, f in LAYER_FIELDS.items()}
            layer["clamps"] = {lin: self._bounds(lw.bounds.get(LAYER_FIELDS[lin]), packed, i * len(LINEARS) + j)
                               for j, lin in enumerate(LINEARS)}
            self.layers.append(layer)

    def tensor(self, info) -> np.ndarray:
        return load_tensor(self.g, info).astype(np.float64)

    def _bounds(self, scalars, packed, row: int) -> tuple[float, float, float, float]:
        """A clippable linear's (in_min, in_max, out_min, out_max): its scalars, else its v.clamp_data row."""
        if scalars is not None:
            return tuple(float(self.tensor(x).reshape(-1)[0]) for x in scalars)
        if packed is not None:
            return tuple(float(v) for v in packed[row])
        return (-np.inf, np.inf, -np.inf, np.inf)

    @staticmethod
    def linear(x: np.ndarray, w: np.ndarray, bounds) -> np.ndarray:
        """Gemma4ClippableLinear: input clamped, x @ W^T, output clamped."""
        lo, hi, out_lo, out_hi = bounds
        return np.clip(np.clip(x, lo, hi) @ w.T, out_lo, out_hi)

    def embed(self, patches: np.ndarray, positions: np.ndarray) -> np.ndarray:
        x = (2.0 * (patches.astype(np.float64) - 0.5)) @ self.patch_embd.T
        return x + self.position_embd[0][positions[:, 0]] + self.position_embd[1][positions[:, 1]]

    def attention(self, layer: dict, h: np.ndarray, positions: np.ndarray) -> np.ndarray:
        T, heads = h.shape[0], self.n_heads
        c = layer["clamps"]
        q = self.linear(h, layer["attn_q"], c["attn_q"]).reshape(T, heads, -1)
        k = self.linear(h, layer["attn_k"], c["attn_k"]).reshape(T, -1, q.shape[-1])
        v = self.linear(h, layer["attn_v"], c["attn_v"]).reshape(T, k.shape[1], -1)
        q = rope_2d(rms_norm(q, self.eps, layer["attn_q_norm"]), positions, self.theta)
        k = rope_2d(rms_norm(k, self.eps, layer["attn_k_norm"]), positions, self.theta)
        v = rms_norm(v, self.eps)                                        # no scale
        group = heads // k.shape[1]
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k)                        # scaling 1.0, every patch sees every patch
        scores -= scores.max(-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(-1, keepdims=True)
        out = np.einsum("hts,shd->thd", p, v).reshape(T, -1)
        return self.linear(out, layer["attn_out"], c["attn_out"])

    def mlp(self, layer: dict, h: np.ndarray) -> np.ndarray:
        c = layer["clamps"]
        gate = self.linear(h, layer["ffn_gate"], c["ffn_gate"])
        up = self.linear(h, layer["ffn_up"], c["ffn_up"])
        return self.linear(gelu_tanh(gate) * up, layer["ffn_down"], c["ffn_down"])

    def encode(self, patches: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The encoder's pooled output: [patches / pool^2, hidden] (before the projector)."""
        positions = np.asarray(positions, np.int64)
        x = self.embed(patches, positions)
        for layer in self.layers:
            h = rms_norm(x, self.eps, layer["ln1"])
            x = x + rms_norm(self.attention(layer, h, positions), self.eps, layer["attn_post_norm"])
            h = rms_norm(x, self.eps, layer["ln2"])
            x = x + rms_norm(self.mlp(layer, h), self.eps, layer["ffn_post_norm"])
        pooled = self.pool_patches(x, positions) * math.sqrt(self.hidden)
        if self.std_bias is not None:
            pooled = (pooled - self.std_bias) * self.std_scale
        return pooled

    def pool_patches(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Average over pool x pool squares of patches, in row-major order of the squares."""
        k = self.pool
        columns = (positions[:, 0].max() + 1) // k
        square = positions[:, 0] // k + columns * (positions[:, 1] // k)
        n = len(x) // (k * k)
        out = np.zeros((n, x.shape[1]))
        np.add.at(out, square, x)
        return out / (k * k)

    def features(self, patches: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Soft tokens in the text model's width: the projector's unscaled RMSNorm, then its linear."""
        return rms_norm(self.encode(patches, positions), self.eps) @ self.projection.T


class PatchProjection:
    """The 12B's image input: each 48x48 patch alone, in numpy (float64)."""

    def __init__(self, gguf):
        self.g = gguf
        cfg = PatchProjectionConfig.from_gguf(gguf)
        w = bind_patch_projection(cfg, gguf.tensors)
        self.patch, self.pool, self.hidden = cfg.patch, cfg.pool, cfg.hidden
        self.eps, self.norm_eps = cfg.eps, cfg.norm_eps
        t = self.tensor
        # the file's patch values are (c, y, x) (llama.cpp's im2col order): back to the processor's (y, x, c)
        order = _channel_first_order(cfg.patch) if cfg.channel_first else np.arange(3 * cfg.patch ** 2)
        self.patch_norm = (t(w.patch_norm)[order], t(w.patch_norm_bias)[order])
        self.patch_embd = t(w.patch_embd)[:, order]                  # [hidden, values]
        self.patch_embd_bias = t(w.patch_embd_bias)
        self.embd_norm = (t(w.embd_norm), t(w.embd_norm_bias))
        self.position_embd = t(w.position_embd)                      # [2, positions, hidden]
        self.position_norm = (t(w.position_norm), t(w.position_norm_bias))
        self.projection = t(w.projection)                            # [text hidden, hidden]

    def tensor(self, info) -> np.ndarray:
        return load_tensor(self.g, info).astype(np.float64)

    def encode(self, patches: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The embedder's output before the projector: [patches, hidden]."""
        positions = np.asarray(positions, np.int64)
        x = layer_norm(patches.astype(np.float64), self.norm_eps, *self.patch_norm)
        x = x @ self.patch_embd.T + self.patch_embd_bias
        x = layer_norm(x, self.norm_eps, *self.embd_norm)
        x = x + self.position_embd[0][positions[:, 0]] + self.position_embd[1][positions[:, 1]]
        return layer_norm(x, self.norm_eps, *self.position_norm)

    def features(self, patches: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Soft tokens in the text model's width: the projector's unscaled RMSNorm, then its linear."""
        return rms_norm(self.encode(patches, positions), self.eps) @ self.projection.T


def _channel_first_order(patch: int) -> np.ndarray:
    """order[j] = the (c, y, x) index of the (y, x, c) value j of a patch."""
    j = np.arange(3 * patch * patch)
    pixel, channel = j // 3, j % 3
    return channel * patch * patch + pixel


def reference_encoder(gguf) -> VisionEncoder | PatchProjection:
    """The numpy oracle of the image encoder the file holds."""
    return PatchProjection(gguf) if is_patch_projection(gguf) else VisionEncoder(gguf)
