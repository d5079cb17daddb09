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
from ..model.logits import Logits
from ..model.lora import LoraAdapter, load_lora
from ..model.weights import LayerWeights, ModelWeights, bind
from .quants import load_tensor


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """RMSNorm over the last axis; Gemma 4 stores the multiplier as is (no +1). float32 at least
    (float64 stays float64: the gradient oracle runs the forward in float64)."""
    x = x.astype(np.promote_types(x.dtype, np.float32))
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
    dtype = np.promote_types(x.dtype, np.float32)         # float64 stays float64 (the gradient oracle)
    cos = np.cos(angles)[:, None, :].astype(dtype)
    sin = np.sin(angles)[:, None, :].astype(dtype)
    out = x.copy()
    a, b = x[..., :half], x[..., half:dims]
    out[..., :half] = a * cos - b * sin
    out[..., half:dims] = b * cos + a * sin
    return out


def apply_lora(w: ModelWeights, adapter: LoraAdapter) -> None:
    """W += scale * B @ A for each target: the same y = W x + scale * B (A x) as llama.cpp's
    build_lora_mm, merged into the float32 weights."""
    for t in adapter.targets:
        a, b = (np.frombuffer(raw, np.float32) for raw in adapter.arrays(t))
        owner = w if t.layer is None else w.layers[t.layer]
        delta = b.reshape(t.n_out, t.rank).astype(np.float64) @ a.reshape(t.rank, t.n_in)
        base = getattr(owner, t.field)
        setattr(owner, t.field, (base + adapter.scale(t) * delta).astype(np.float32))


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

    def allowed(self, lc: LayerConfig, positions: np.ndarray, n_keys: int, window: int) -> np.ndarray:
        """Which keys each query sees [n, n_keys]: causal, within the window on sliding layers."""
        key_pos = np.arange(n_keys)
        allowed = key_pos[None, :] <= positions[:, None]
        if lc.sliding and window > 0:
            allowed &= positions[:, None] - key_pos[None, :] < window
        return allowed


def image_key_last(positions: np.ndarray, soft_positions: np.ndarray) -> np.ndarray:
    """Each query's last key on a both-ways model's sliding layers: its own position, or for a soft
    token the last position of its image (a contiguous run of soft positions)."""
    last = positions.copy()
    soft_positions = np.sort(np.asarray(soft_positions, np.int64))
    start = 0
    for i in range(1, len(soft_positions) + 1):
        if i == len(soft_positions) or soft_positions[i] != soft_positions[i - 1] + 1:
            run = soft_positions[start:i]
            last[np.isin(positions, run)] = run[-1]
            start = i
    return last


class ReferenceModel:
    def __init__(self, gguf, config: Gemma4Config | None = None, lora=()):
        """lora: [(adapter path or source, user scale)] in llama.cpp's format (pyapp.model.lora)."""
        self.cfg = config or Gemma4Config.from_gguf(gguf)
        # every tensor dequantized to float32, bound to its field once
        bound = bind(self.cfg, gguf.tensors)
        self.w: ModelWeights = bound.map(lambda t: load_tensor(gguf, t))
        self.pad_id = int(gguf.metadata.get("tokenizer.ggml.padding_token_id", 0))
        self.key_last = None      # during a forward with soft tokens on a both-ways model: each query's last key
        self.final_hidden = None  # the last forward's final-normed rows [n, hidden] (an assistant drafter's input)
        self.adapters = [load_lora(src, self.cfg, bound, scale, gguf.architecture) for src, scale in lora]
        for adapter in self.adapters:
            apply_lora(self.w, adapter)

    # -- pieces, each mirroring one Go type ------------------------------------

    def per_layer_inputs(self, tokens: np.ndarray, x: np.ndarray) -> np.ndarray:
        """PerLayerProjector: [n, n_layers, ple_dim]."""
        cfg, w, n = self.cfg, self.w, len(tokens)
        emb = w.ple_token_embd[tokens] * math.sqrt(cfg.ple_dim)
        emb = emb.reshape(n, cfg.n_layers, cfg.ple_dim)
        proj = (x @ w.ple_model_proj.T) / math.sqrt(cfg.hidden)
        proj = rms_norm(proj.reshape(n, cfg.n_layers, cfg.ple_dim), w.ple_proj_norm, cfg.eps)
        return (proj + emb) / math.sqrt(2.0)

    def attention(self, lc: LayerConfig, w: LayerWeights, x: np.ndarray, positions: np.ndarray,
                  cache: KVCache) -> np.ndarray:
        cfg, n = self.cfg, x.shape[0]
        hd = lc.head_dim
        freq_factors = None if lc.sliding else self.w.rope_freqs

        q = (x @ w.attn_q.T).reshape(n, cfg.n_heads, hd)
        q = rms_norm(q, w.attn_q_norm, cfg.eps)
        q = rope_neox(q, positions, lc.rope_dims, lc.rope_base, freq_factors)

        if lc.shares_kv:
            keys, values = cache.k[lc.kv_source], cache.v[lc.kv_source]
        else:
            k = (x @ w.attn_k.T).reshape(n, lc.n_kv_heads, hd)
            # No V projection (attention_k_eq_v): V is the raw K projection.
            v = (x @ w.attn_v.T).reshape(n, lc.n_kv_heads, hd) if lc.has_v else k
            k = rms_norm(k, w.attn_k_norm, cfg.eps)
            v = rms_norm(v, None, cfg.eps)
            k = rope_neox(k, positions, lc.rope_dims, lc.rope_base, freq_factors)
            keys, values = cache.append(lc.index, k, v)

        allowed = cache.allowed(lc, positions, keys.shape[1], cfg.sliding_window)
        if lc.sliding and self.key_last is not None:       # an image's soft tokens see their whole image
            later = np.arange(keys.shape[1])[None, :]
            allowed |= (later > positions[:, None]) & (later <= self.key_last[:, None])
        group = cfg.n_heads // keys.shape[0]
        kq = np.repeat(keys, group, axis=0)                    # [heads, T, hd]
        vq = np.repeat(values, group, axis=0)
        scores = np.einsum("nhd,htd->hnt", q, kq)              # attention scale is 1.0 (q/k are normed)
        scores = np.where(allowed[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = np.einsum("hnt,htd->nhd", probs, vq).reshape(n, cfg.n_heads * hd)
        return out @ w.attn_output.T

    def mlp(self, w: LayerWeights, x: np.ndarray) -> np.ndarray:
        return (gelu_tanh(x @ w.ffn_gate.T) * (x @ w.ffn_up.T)) @ w.ffn_down.T

    def moe(self, w: LayerWeights, lc: LayerConfig, h: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Router on the raw residual h; experts on x (= pre_ffw_norm_2(h))."""
        cfg = self.cfg
        r = rms_norm(h, None, cfg.eps) / math.sqrt(cfg.hidden)
        if w.router_scale is not None:
            r = r * w.router_scale
        logits = r @ w.router.T                                              # [n, E]
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)                           # softmax over all experts
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :cfg.n_experts_used]
        weights = np.take_along_axis(probs, top, axis=-1)
        weights /= weights.sum(axis=-1, keepdims=True)                       # renormalize the chosen

        if lc.experts_fused:
            ff = w.experts_gate_up.shape[1] // 2                             # [E, 2*ff, hidden]
            gate_w, up_w = w.experts_gate_up[:, :ff], w.experts_gate_up[:, ff:]
        else:
            gate_w, up_w = w.experts_gate, w.experts_up
        down_w = w.experts_down                                              # [E, hidden, ff]

        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            for e, g in zip(top[t], weights[t]):
                y = (gelu_tanh(gate_w[e] @ x[t]) * (up_w[e] @ x[t])) @ down_w[e].T
                if w.experts_down_scale is not None:
                    y = y * w.experts_down_scale[e]
                out[t] += g * y
        return out

    def layer(self, lc: LayerConfig, x: np.ndarray, positions: np.ndarray, ple: np.ndarray | None,
              cache: KVCache, scale: np.ndarray | None = None) -> np.ndarray:
        """`scale` replaces the layer's output scale (DiffusionGemma's encoder has its own)."""
        w, eps = self.w.layers[lc.index], self.cfg.eps
        scale = w.output_scale if scale is None else scale

        a = self.attention(lc, w, rms_norm(x, w.attn_norm, eps), positions, cache)
        h = x + rms_norm(a, w.post_attention_norm, eps)

        if lc.has_moe:
            dense = rms_norm(self.mlp(w, rms_norm(h, w.ffn_norm, eps)), w.post_ffw_norm_1, eps)
            sparse = self.moe(w, lc, h, rms_norm(h, w.pre_ffw_norm_2, eps))
            f = dense + rms_norm(sparse, w.post_ffw_norm_2, eps)
        else:
            f = self.mlp(w, rms_norm(h, w.ffn_norm, eps))
        x = h + rms_norm(f, w.post_ffw_norm, eps)

        if lc.has_ple:
            g = gelu_tanh(x @ w.ple_gate.T) * ple[:, lc.index]
            x = x + rms_norm(g @ w.ple_proj.T, w.ple_post_norm, eps)

        return x * scale if scale is not None else x

    # -- whole model -------------------------------------------------------------

    def forward(self, tokens, cache: KVCache | None = None, soft=None) -> Logits:
        """Logits [len(tokens), vocab] (softcap applied), appending to `cache`.

        soft: (indices into tokens, rows [n, hidden][, both ways [n] bools]): an encoder's soft tokens (an
        image's projected features) in place of those positions' embeddings; there the per-layer embedding
        is the pad id's (transformers' Gemma4Model), its projection part made from the soft token. On
        models whose images attend both ways (Gemma4Config.image_attention_both_ways: 26B-A4B, 31B, the
        12B) each contiguous run of those marked both ways (all, unless said: a clip's are not) is one
        image: on sliding layers its tokens also see the image's later tokens."""
        cfg, w = self.cfg, self.w
        cache = cache if cache is not None else KVCache()
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = cache.length + np.arange(len(tokens))

        if soft is not None:
            at, rows = np.asarray(soft[0], np.int64), np.asarray(soft[1], np.float32)
            tokens = tokens.copy()
            tokens[at] = self.pad_id
        x = w.token_embd[tokens] * np.float32(math.sqrt(cfg.hidden))
        if soft is not None:
            x[at] = rows
        ple = self.per_layer_inputs(tokens, x) if cfg.has_ple else None
        if soft is not None and cfg.image_attention_both_ways:
            both_ways = np.asarray(soft[2], bool) if len(soft) > 2 else np.ones(len(at), bool)
            self.key_last = image_key_last(positions, at[both_ways] + cache.length)
        try:
            for lc in cfg.layers:
                x = self.layer(lc, x, positions, ple, cache)
        finally:
            self.key_last = None
        cache.length += len(tokens)

        x = rms_norm(x, w.output_norm, cfg.eps)
        self.final_hidden = x
        logits = softcap(x @ w.head.T, cfg.final_softcap).astype(np.float32)
        return Logits.from_rows(list(logits))

    def generate_greedy(self, prompt, n_new: int) -> list[int]:
        cache = KVCache()
        logits = self.forward(prompt, cache)
        out = []
        for _ in range(n_new):
            tok = logits.argmax_row(-1)
            out.append(tok)
            logits = self.forward([tok], cache)
        return out
