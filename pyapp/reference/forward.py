"""Numpy reference forward pass for Gemma 4: the CPU oracle for every GPU kernel.

Mirrors Ollama's model/models/gemma4/model_text.go step by step (and llama.cpp's
src/models/gemma4.cpp, which agrees), on weights dequantized to float32:

  x = embed(tokens) * sqrt(hidden)
  ple = per-layer inputs (PLE models)
  for each layer:
      h  = x + post_attn_norm(attention(attn_norm(x)))
      f  = mlp(ffn_norm(h))                                   dense layers
      f  = post_ffw_norm_1(mlp(..)) + post_ffw_norm_2(moe(..)) MoE layers
      x  = h + post_ffw_norm(f)
      x += post_norm(proj(gelu(inp_gate(x)) * ple[layer]))    PLE models
      x *= layer_output_scale                                 when present
  logits = softcap(output(output_norm(x)))

One deliberate difference from Ollama: the sliding window keeps the last
`sliding_window` positions including the current one (p - j < W), as
transformers and llama.cpp do; Ollama's causal cache keeps one more.
"""

from __future__ import annotations

import math

import numpy as np

from ..model.config import Gemma4Config, LayerConfig
from .quants import load_tensor


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """RMSNorm over the last axis; Gemma 4 stores the multiplier as is (no +1)."""
    x = x.astype(np.float32)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * weight if weight is not None else y


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return np.tanh(x / cap) * cap if cap > 0 else x


def rope_neox(x: np.ndarray, positions: np.ndarray, dims: int, base: float,
              freq_factors: np.ndarray | None = None) -> np.ndarray:
    """NeoX RoPE on x [n, heads, head_dim]: pairs (i, i + dims/2) for i < dims/2.

    Frequencies are base^(-2i/dims), divided by freq_factors[i] when given
    (Gemma 4 global layers: 1 for rotated pairs, 1e30 for ones left alone).
    """
    half = dims // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / dims)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors[:half].astype(np.float64)
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]     # [n, half]
    cos = np.cos(angles)[:, None, :].astype(np.float32)
    sin = np.sin(angles)[:, None, :].astype(np.float32)
    out = x.copy()
    a, b = x[..., :half], x[..., half:dims]
    out[..., :half] = a * cos - b * sin
    out[..., half:dims] = b * cos + a * sin
    return out


class Weights:
    """Dequantized float32 tensors by GGUF name, loaded on first use."""

    def __init__(self, gguf):
        self.gguf = gguf
        self._cache: dict[str, np.ndarray] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.gguf.tensors

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = load_tensor(self.gguf, name)
        return self._cache[name]

    def get(self, name: str) -> np.ndarray | None:
        return self[name] if name in self else None


class KVCache:
    """Per-layer K/V after norm and RoPE: [n_kv_heads, positions, head_dim]."""

    def __init__(self):
        self.k: dict[int, np.ndarray] = {}
        self.v: dict[int, np.ndarray] = {}
        self.length = 0

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k, v = k.transpose(1, 0, 2), v.transpose(1, 0, 2)      # [n, kvh, hd] -> [kvh, n, hd]
        if layer in self.k:
            k = np.concatenate([self.k[layer], k], axis=1)
            v = np.concatenate([self.v[layer], v], axis=1)
        self.k[layer], self.v[layer] = k, v
        return k, v


class ReferenceModel:
    def __init__(self, gguf, config: Gemma4Config | None = None):
        self.cfg = config or Gemma4Config.from_gguf(gguf)
        self.w = Weights(gguf)

    # -- pieces, each mirroring one Go type ------------------------------------

    def per_layer_inputs(self, tokens: np.ndarray, x: np.ndarray) -> np.ndarray:
        """PerLayerProjector: [n, n_layers, ple_dim]."""
        cfg, w, n = self.cfg, self.w, len(tokens)
        emb = w["per_layer_token_embd.weight"][tokens] * math.sqrt(cfg.ple_dim)
        emb = emb.reshape(n, cfg.n_layers, cfg.ple_dim)
        proj = (x @ w["per_layer_model_proj.weight"].T) / math.sqrt(cfg.hidden)
        proj = rms_norm(proj.reshape(n, cfg.n_layers, cfg.ple_dim), w["per_layer_proj_norm.weight"], cfg.eps)
        return (proj + emb) / math.sqrt(2.0)

    def attention(self, lc: LayerConfig, x: np.ndarray, positions: np.ndarray, cache: KVCache) -> np.ndarray:
        cfg, w, n = self.cfg, self.w, x.shape[0]
        p = f"blk.{lc.index}."
        hd = lc.head_dim
        freq_factors = None if lc.sliding else w.get("rope_freqs.weight")

        q = (x @ w[p + "attn_q.weight"].T).reshape(n, cfg.n_heads, hd)
        q = rms_norm(q, w[p + "attn_q_norm.weight"], cfg.eps)
        q = rope_neox(q, positions, lc.rope_dims, lc.rope_base, freq_factors)

        if lc.shares_kv:
            keys, values = cache.k[lc.kv_source], cache.v[lc.kv_source]
        else:
            k = (x @ w[p + "attn_k.weight"].T).reshape(n, lc.n_kv_heads, hd)
            # No V projection (attention_k_eq_v): V is the raw K projection.
            v = (x @ w[p + "attn_v.weight"].T).reshape(n, lc.n_kv_heads, hd) if p + "attn_v.weight" in w else k
            k = rms_norm(k, w[p + "attn_k_norm.weight"], cfg.eps)
            v = rms_norm(v, None, cfg.eps)
            k = rope_neox(k, positions, lc.rope_dims, lc.rope_base, freq_factors)
            keys, values = cache.append(lc.index, k, v)

        total = keys.shape[1]
        key_pos = np.arange(total)
        allowed = key_pos[None, :] <= positions[:, None]
        if lc.sliding and cfg.sliding_window > 0:
            allowed &= positions[:, None] - key_pos[None, :] < cfg.sliding_window

        group = cfg.n_heads // keys.shape[0]
        kq = np.repeat(keys, group, axis=0)                    # [heads, T, hd]
        vq = np.repeat(values, group, axis=0)
        scores = np.einsum("nhd,htd->hnt", q, kq)              # attention scale is 1.0 (q/k are normed)
        scores = np.where(allowed[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = np.einsum("hnt,htd->nhd", probs, vq).reshape(n, cfg.n_heads * hd)
        return out @ w[p + "attn_output.weight"].T

    def mlp(self, p: str, x: np.ndarray) -> np.ndarray:
        w = self.w
        return (gelu_tanh(x @ w[p + "ffn_gate.weight"].T) * (x @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T

    def moe(self, p: str, h: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Router on the raw residual h; experts on x (= pre_ffw_norm_2(h))."""
        cfg, w = self.cfg, self.w
        r = rms_norm(h, None, cfg.eps) / math.sqrt(cfg.hidden) * w[p + "ffn_gate_inp.scale"]
        logits = r @ w[p + "ffn_gate_inp.weight"].T                           # [n, E]
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)                           # softmax over all experts
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :cfg.n_experts_used]
        weights = np.take_along_axis(probs, top, axis=-1)
        weights /= weights.sum(axis=-1, keepdims=True)                       # renormalize the chosen

        if p + "ffn_gate_up_exps.weight" in w:
            gate_up = w[p + "ffn_gate_up_exps.weight"]                          # [E, 2*ff, hidden]
            ff = gate_up.shape[1] // 2
            gate_w, up_w = gate_up[:, :ff], gate_up[:, ff:]
        else:
            gate_w, up_w = w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"]
        down_w = w[p + "ffn_down_exps.weight"]                                  # [E, hidden, ff]
        down_scale = w.get(p + "ffn_down_exps.scale")

        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            for e, g in zip(top[t], weights[t]):
                y = (gelu_tanh(gate_w[e] @ x[t]) * (up_w[e] @ x[t])) @ down_w[e].T
                if down_scale is not None:
                    y = y * down_scale[e]
                out[t] += g * y
        return out

    def layer(self, lc: LayerConfig, x: np.ndarray, positions: np.ndarray, ple: np.ndarray | None,
              cache: KVCache) -> np.ndarray:
        cfg, w = self.cfg, self.w
        p = f"blk.{lc.index}."
        eps = cfg.eps

        a = self.attention(lc, rms_norm(x, w[p + "attn_norm.weight"], eps), positions, cache)
        h = x + rms_norm(a, w[p + "post_attention_norm.weight"], eps)

        if p + "ffn_gate_inp.weight" in w:
            dense = rms_norm(self.mlp(p, rms_norm(h, w[p + "ffn_norm.weight"], eps)), w[p + "post_ffw_norm_1.weight"], eps)
            sparse = self.moe(p, h, rms_norm(h, w[p + "pre_ffw_norm_2.weight"], eps))
            f = dense + rms_norm(sparse, w[p + "post_ffw_norm_2.weight"], eps)
        else:
            f = self.mlp(p, rms_norm(h, w[p + "ffn_norm.weight"], eps))
        x = h + rms_norm(f, w[p + "post_ffw_norm.weight"], eps)

        if ple is not None:
            g = gelu_tanh(x @ w[p + "inp_gate.weight"].T) * ple[:, lc.index]
            x = x + rms_norm(g @ w[p + "proj.weight"].T, w[p + "post_norm.weight"], eps)

        scale = w.get(p + "layer_output_scale.weight")
        return x * scale if scale is not None else x

    # -- whole model -------------------------------------------------------------

    def forward(self, tokens, cache: KVCache | None = None) -> np.ndarray:
        """Logits [len(tokens), vocab] (softcap applied), appending to `cache`."""
        cfg, w = self.cfg, self.w
        cache = cache if cache is not None else KVCache()
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = cache.length + np.arange(len(tokens))

        x = w["token_embd.weight"][tokens] * np.float32(math.sqrt(cfg.hidden))
        ple = self.per_layer_inputs(tokens, x) if cfg.ple_dim else None
        for lc in cfg.layers:
            x = self.layer(lc, x, positions, ple, cache)
        cache.length += len(tokens)

        x = rms_norm(x, w["output_norm.weight"], cfg.eps)
        head = w["output.weight"] if "output.weight" in w else w["token_embd.weight"]
        return softcap(x @ head.T, cfg.final_softcap).astype(np.float32)

    def generate_greedy(self, prompt, n_new: int) -> list[int]:
        cache = KVCache()
        logits = self.forward(prompt, cache)
        out = []
        for _ in range(n_new):
            tok = int(np.argmax(logits[-1]))
            out.append(tok)
            logits = self.forward([tok], cache)
        return out
