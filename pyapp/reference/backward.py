"""Numpy gradient oracle for LoRA training: the loss and its gradients with respect to every LoRA A and B.

The spec the GPU backward kernels are tested against, as forward.py is the spec of the forward ones.
CPython only, float64 throughout (frozen base weights dequantized as the forward does, then widened).

Forward: forward.py's model, with each adapted projection run unmerged,

    y = x W^T + scale * (x A^T) B^T          (llama.cpp's build_lora_mm; scale = user_scale * alpha / r)

and the loss the trainer minimises:

    loss = mean over positions i >= 1 with mask[i] of  -log softmax(logits[i - 1])[tokens[i]]

(logits softcapped; mask[i] says token i is a target, e.g. an assistant token of a chat).

Backward: one small function per op, in the reverse order of the forward, each named after the
forward.py op it inverts (`rms_norm` -> `rms_norm_backward`) and each with its own finite-difference
test (tests/train/test_lora_backward.py). What the forward keeps for the backward (`Tape`): the input of
every projection and every norm, the pre-activation of every GeGLU, the attention's Q, K and V after
norm and RoPE (the probabilities are recomputed from Q and K, as a memory-bounded GPU backward does),
the router's probabilities and choices. Gradients flow through the frozen weights (base, norms,
experts, head) but are only kept for A and B.

Not covered: LoRA on the MoE expert tensors (3-D; pyapp.model.lora refuses them for now), and the
PLE inputs (built from the token embedding alone: they do not depend on any LoRA, so no gradient
flows into them).

    oracle = LoraGradients(gguf, [("adapter.gguf", 1.0)])      # or lora=LoraParams(...) of your own
    loss, grads = oracle.loss_and_grads(tokens, mask)           # grads: {"<base tensor>.lora_a": [r, n_in], ...}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..model.config import Gemma4Config, LayerConfig
from ..model.lora import load_lora
from ..model.weights import bind
from .forward import KVCache, ReferenceModel, gelu_tanh, rms_norm, rope_neox, softcap
from .quants import load_tensor

GELU_C = math.sqrt(2.0 / math.pi)


# ---- one backward per op: given the op's inputs and dL/d(output), dL/d(inputs) --------------------------

def linear_backward(w: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """y = x W^T (W frozen): dx = dy W."""
    return dy @ w


def lora_backward(x: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float, dy: np.ndarray):
    """y = scale * (x A^T) B^T, x [n, in], A [r, in], B [out, r]: (dx, dA, dB).

    The rank-r intermediate u = x A^T is recomputed (n * r values), as the GPU kernel can."""
    u = x @ a.T                        # [n, r]
    du = scale * (dy @ b)              # [n, r]
    return du @ a, du.T @ x, scale * (dy.T @ u)


def rms_norm_backward(x: np.ndarray, weight: np.ndarray | None, eps: float, dy: np.ndarray) -> np.ndarray:
    """y = x / rms(x) * weight over the last axis (weight frozen):
    dx = (g - x_hat * mean(g * x_hat)) / rms, g = dy * weight, x_hat = x / rms."""
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    g = dy * weight if weight is not None else dy
    x_hat = x * inv
    return inv * (g - x_hat * np.mean(g * x_hat, axis=-1, keepdims=True))


def gelu_tanh_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """y = x/2 (1 + tanh(c (x + 0.044715 x^3)))."""
    t = np.tanh(GELU_C * (x + 0.044715 * x ** 3))
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * x * x))


def geglu_backward(gate: np.ndarray, up: np.ndarray, dy: np.ndarray):
    """y = gelu_tanh(gate) * up: (dgate, dup)."""
    return gelu_tanh_backward(gate, dy * up), dy * gelu_tanh(gate)


def softcap_backward(x: np.ndarray, cap: float, dy: np.ndarray) -> np.ndarray:
    """y = cap * tanh(x / cap) (cap 0: identity)."""
    if cap <= 0:
        return dy
    t = np.tanh(x / cap)
    return dy * (1.0 - t * t)


def rope_neox_backward(dy: np.ndarray, positions: np.ndarray, dims: int, base: float,
                       freq_factors: np.ndarray | None = None) -> np.ndarray:
    """RoPE is a rotation per pair: its transpose is the rotation by the opposite angle."""
    return rope_neox(dy, -np.asarray(positions), dims, base, freq_factors)


def softmax_backward(p: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """p = softmax(s) over the last axis: ds = p * (dp - sum(dp * p))."""
    return p * (dp - np.sum(dp * p, axis=-1, keepdims=True))


def attention_probs(q: np.ndarray, keys: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """softmax(q k^T) over the allowed keys (scale 1.0: q and k are normed), q [n, H, hd], keys
    [KVH, T, hd] shared by H / KVH query heads: [H, n, T]. The backward recomputes these."""
    kq = np.repeat(keys, q.shape[1] // keys.shape[0], axis=0)
    scores = np.einsum("nhd,htd->hnt", q, kq)
    scores = np.where(allowed[None], scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return probs / probs.sum(axis=-1, keepdims=True)


def attention_backward(q: np.ndarray, keys: np.ndarray, values: np.ndarray, allowed: np.ndarray,
                       dout: np.ndarray):
    """out[n, h] = sum_t P[h, n, t] V[h // group, t], P = attention_probs(q, keys): (dq, dkeys, dvalues),
    the K/V gradients summed over the query heads of each KV head (GQA)."""
    heads, kv_heads = q.shape[1], keys.shape[0]
    group = heads // kv_heads
    probs = attention_probs(q, keys, allowed)                            # recomputed, never stored
    kq, vq = np.repeat(keys, group, axis=0), np.repeat(values, group, axis=0)
    dvq = np.einsum("hnt,nhd->htd", probs, dout)
    dscores = softmax_backward(probs, np.einsum("nhd,htd->hnt", dout, vq))   # masked keys: p = 0, ds = 0
    dq = np.einsum("hnt,htd->nhd", dscores, kq)
    dkq = np.einsum("hnt,nhd->htd", dscores, q)
    per_kv = lambda g: g.reshape(kv_heads, group, *g.shape[1:]).sum(axis=1)    # noqa: E731
    return dq, per_kv(dkq), per_kv(dvq)


def cross_entropy(logits: np.ndarray, tokens: np.ndarray, mask: np.ndarray) -> float:
    """Mean -log p(tokens[i] | logits[i - 1]) over i >= 1 with mask[i]."""
    z = logits[:-1] - logits[:-1].max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    picked = logp[np.arange(len(tokens) - 1), tokens[1:]]
    m = mask[1:].astype(np.float64)
    return float(-(picked * m).sum() / m.sum())


def cross_entropy_backward(logits: np.ndarray, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """dloss/dlogits: (softmax - onehot(next token)) / n_targets on the counted rows, 0 elsewhere."""
    m = mask[1:].astype(np.float64)
    z = logits[:-1] - logits[:-1].max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    p[np.arange(len(tokens) - 1), tokens[1:]] -= 1.0
    d = np.zeros_like(logits)
    d[:-1] = p * (m / m.sum())[:, None]
    return d


def router_weights(logits: np.ndarray, k: int):
    """The MoE router: softmax over all experts, the top k, renormalized: (probs, top [n, k], weights [n, k])."""
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    chosen = np.take_along_axis(probs, top, axis=-1)
    return probs, top, chosen / chosen.sum(axis=-1, keepdims=True)


def router_weights_backward(probs: np.ndarray, top: np.ndarray, dweights: np.ndarray) -> np.ndarray:
    """dloss/d(router logits) given dloss/d(weights): the choice is piecewise constant (no gradient);
    through w = p_top / sum(p_top) and the softmax."""
    chosen = np.take_along_axis(probs, top, axis=-1)
    total = chosen.sum(axis=-1, keepdims=True)
    w = chosen / total
    dchosen = (dweights - np.sum(dweights * w, axis=-1, keepdims=True)) / total
    dprobs = np.zeros_like(probs)
    np.put_along_axis(dprobs, top, dchosen, axis=-1)
    return softmax_backward(probs, dprobs)


def experts_backward(x: np.ndarray, top: np.ndarray, weights: np.ndarray, gate_w, up_w, down_w,
                     down_scale, dout: np.ndarray):
    """out[t] = sum_j weights[t, j] * expert_{top[t, j]}(x[t]), each expert a GeGLU MLP (frozen), times
    its down scale when present: (dx, dweights)."""
    dx, dweights = np.zeros_like(x), np.zeros_like(weights)
    for t in range(x.shape[0]):
        for j, e in enumerate(top[t]):
            gate, up = gate_w[e] @ x[t], up_w[e] @ x[t]
            s = down_scale[e] if down_scale is not None else 1.0
            y = (down_w[e] @ (gelu_tanh(gate) * up)) * s
            dweights[t, j] = dout[t] @ y
            dmid = down_w[e].T @ (weights[t, j] * s * dout[t])
            dgate, dup = geglu_backward(gate, up, dmid)
            dx[t] += gate_w[e].T @ dgate + up_w[e].T @ dup
    return dx, dweights


# ---- the model ------------------------------------------------------------------------------------------

@dataclass
class LoraPair:
    """One adapted projection: y += scale * (x A^T) B^T. A [r, n_in], B [n_out, r] (PEFT's layout)."""
    name: str                  # the base tensor's GGUF name: the gradients are name + ".lora_a" / ".lora_b"
    a: np.ndarray
    b: np.ndarray
    scale: float


@dataclass
class Tape:
    """What the forward keeps for the backward, per layer: named arrays (see LoraGradients.layer)."""
    layers: dict = field(default_factory=dict)      # layer index -> {name: array}
    final: dict = field(default_factory=dict)


class LoraGradients(ReferenceModel):
    """The fixture model's forward with LoRA unmerged, in float64, and its backward."""

    def __init__(self, gguf, lora=(), config: Gemma4Config | None = None, pairs: dict | None = None):
        """lora: [(adapter path or source, user scale)] as ReferenceModel takes; or `pairs`:
        {(layer, field): LoraPair} directly (a trainer's own parameters)."""
        self.cfg = config or Gemma4Config.from_gguf(gguf)
        bound = bind(self.cfg, gguf.tensors)
        self.w = bound.map(lambda t: load_tensor(gguf, t).astype(np.float64))
        self.pairs: dict = dict(pairs or {})
        for src, user_scale in lora:
            adapter = load_lora(src, self.cfg, bound, user_scale, gguf.architecture)
            for t in adapter.targets:
                a, b = (np.frombuffer(raw, np.float32).astype(np.float64) for raw in adapter.arrays(t))
                if (t.layer, t.field) in self.pairs:
                    raise ValueError(f"two adapters for {t.name}: the oracle takes one")
                self.pairs[(t.layer, t.field)] = LoraPair(t.name, a.reshape(t.rank, t.n_in),
                                                          b.reshape(t.n_out, t.rank), adapter.scale(t))
        self.grads: dict = {}

    # -- adapted projections -------------------------------------------------------------------------

    def proj(self, layer: int | None, name: str, x: np.ndarray, tape: dict) -> np.ndarray:
        """x W^T (+ the LoRA delta), its input kept on the tape under the field's name."""
        tape[name] = x
        owner = self.w if layer is None else self.w.layers[layer]
        y = x @ getattr(owner, name).T
        pair = self.pairs.get((layer, name))
        if pair is not None:
            y = y + pair.scale * (x @ pair.a.T) @ pair.b.T
        return y

    def proj_backward(self, layer: int | None, name: str, dy: np.ndarray, tape: dict) -> np.ndarray:
        """dx of proj; the pair's dA, dB added to self.grads."""
        x = tape[name]
        owner = self.w if layer is None else self.w.layers[layer]
        dx = linear_backward(getattr(owner, name), dy)
        pair = self.pairs.get((layer, name))
        if pair is not None:
            dx_lora, da, db = lora_backward(x, pair.a, pair.b, pair.scale, dy)
            for suffix, g in ((".lora_a", da), (".lora_b", db)):
                self.grads[pair.name + suffix] = self.grads.get(pair.name + suffix, 0.0) + g
            dx = dx + dx_lora
        return dx

    # -- forward, keeping the tape ---------------------------------------------------------------------

    def attention(self, lc: LayerConfig, w, x: np.ndarray, positions: np.ndarray, kv: dict, t: dict):
        cfg, n, hd = self.cfg, x.shape[0], lc.head_dim
        rope = (positions, lc.rope_dims, lc.rope_base, None if lc.sliding else self.w.rope_freqs)
        t["q_raw"] = self.proj(lc.index, "attn_q", x, t).reshape(n, cfg.n_heads, hd)
        t["q"] = rope_neox(rms_norm(t["q_raw"], w.attn_q_norm, cfg.eps), *rope)
        if lc.owns_kv:
            t["k_raw"] = self.proj(lc.index, "attn_k", x, t).reshape(n, lc.n_kv_heads, hd)
            # No V projection (attention_k_eq_v): V is the raw K projection.
            t["v_raw"] = self.proj(lc.index, "attn_v", x, t).reshape(n, lc.n_kv_heads, hd) if lc.has_v \
                else t["k_raw"]
            k = rope_neox(rms_norm(t["k_raw"], w.attn_k_norm, cfg.eps), *rope)
            v = rms_norm(t["v_raw"], None, cfg.eps)
            kv[lc.index] = (k.transpose(1, 0, 2), v.transpose(1, 0, 2))        # [KVH, T, hd]
        keys, values = kv[lc.kv_source]
        t["allowed"] = KVCache().allowed(lc, positions, keys.shape[1], cfg.sliding_window)
        probs = attention_probs(t["q"], keys, t["allowed"])                     # not kept
        out = np.einsum("hnt,htd->nhd", probs, np.repeat(values, cfg.n_heads // keys.shape[0], axis=0))
        return self.proj(lc.index, "attn_output", out.reshape(n, -1), t)

    def mlp(self, layer: int, x: np.ndarray, t: dict) -> np.ndarray:
        t["gate"], t["up"] = self.proj(layer, "ffn_gate", x, t), self.proj(layer, "ffn_up", x, t)
        return self.proj(layer, "ffn_down", gelu_tanh(t["gate"]) * t["up"], t)

    def moe(self, w, lc: LayerConfig, h: np.ndarray, x: np.ndarray, t: dict) -> np.ndarray:
        cfg = self.cfg
        r = rms_norm(h, None, cfg.eps) / math.sqrt(cfg.hidden)
        if w.router_scale is not None:
            r = r * w.router_scale
        logits = self.proj(lc.index, "router", r, t)
        t["probs"], t["top"], t["weights"] = router_weights(logits, cfg.n_experts_used)
        t["experts_in"] = x
        out = np.zeros_like(x)
        for i in range(x.shape[0]):
            for e, g in zip(t["top"][i], t["weights"][i]):
                gate_w, up_w, down_w, scale = self.expert(w, lc, e)
                out[i] += g * scale * (down_w @ (gelu_tanh(gate_w @ x[i]) * (up_w @ x[i])))
        return out

    def expert(self, w, lc: LayerConfig, e: int):
        """Expert e's gate [ff, hidden], up [ff, hidden], down [hidden, ff] and down scale."""
        if lc.experts_fused:
            ff = w.experts_gate_up.shape[1] // 2
            gate_w, up_w = w.experts_gate_up[e, :ff], w.experts_gate_up[e, ff:]
        else:
            gate_w, up_w = w.experts_gate[e], w.experts_up[e]
        scale = w.experts_down_scale[e] if w.experts_down_scale is not None else 1.0
        return gate_w, up_w, w.experts_down[e], scale

    def layer(self, lc: LayerConfig, x: np.ndarray, positions: np.ndarray, ple, kv: dict, t: dict):
        w, eps = self.w.layers[lc.index], self.cfg.eps
        t["x"] = x
        t["a"] = self.attention(lc, w, rms_norm(x, w.attn_norm, eps), positions, kv, t)
        h = t["h"] = x + rms_norm(t["a"], w.post_attention_norm, eps)
        if lc.has_moe:
            t["m"] = self.mlp(lc.index, rms_norm(h, w.ffn_norm, eps), t)
            t["sparse"] = self.moe(w, lc, h, rms_norm(h, w.pre_ffw_norm_2, eps), t)
            f = rms_norm(t["m"], w.post_ffw_norm_1, eps) + rms_norm(t["sparse"], w.post_ffw_norm_2, eps)
        else:
            f = self.mlp(lc.index, rms_norm(h, w.ffn_norm, eps), t)
        t["f"] = f
        x = h + rms_norm(f, w.post_ffw_norm, eps)
        if lc.has_ple:
            t["ple_in"] = ple[:, lc.index]
            t["g_pre"] = self.proj(lc.index, "ple_gate", x, t)
            t["p"] = self.proj(lc.index, "ple_proj", gelu_tanh(t["g_pre"]) * t["ple_in"], t)
            x = x + rms_norm(t["p"], w.ple_post_norm, eps)
        return x * w.output_scale if w.output_scale is not None else x

    def forward_logits(self, tokens, tape: Tape) -> np.ndarray:
        """Softcapped logits [n, vocab] (float64) from position 0, filling `tape`."""
        cfg, w = self.cfg, self.w
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = np.arange(len(tokens))
        x = w.token_embd[tokens] * math.sqrt(cfg.hidden)
        ple = self.per_layer_inputs(tokens, x) if cfg.has_ple else None    # no LoRA upstream: a constant
        kv: dict = {}
        for lc in cfg.layers:
            tape.layers[lc.index] = {"positions": positions, "kv": kv}
            x = self.layer(lc, x, positions, ple, kv, tape.layers[lc.index])
        tape.final["x"] = x
        tape.final["z"] = rms_norm(x, w.output_norm, cfg.eps) @ w.head.T       # the head takes no LoRA
        return softcap(tape.final["z"], cfg.final_softcap)

    # -- backward ---------------------------------------------------------------------------------------

    def attention_backward(self, lc: LayerConfig, w, da: np.ndarray, dkv: dict, t: dict) -> np.ndarray:
        """dloss/d(attention input); dK/dV for another layer's cache (KV sharing) accumulate in dkv."""
        cfg, n, hd = self.cfg, da.shape[0], lc.head_dim
        rope = (t["positions"], lc.rope_dims, lc.rope_base, None if lc.sliding else self.w.rope_freqs)
        dout = self.proj_backward(lc.index, "attn_output", da, t).reshape(n, cfg.n_heads, hd)
        keys, values = t["kv"][lc.kv_source]
        dq, dkeys, dvalues = attention_backward(t["q"], keys, values, t["allowed"], dout)
        prev = dkv.get(lc.kv_source)
        dkv[lc.kv_source] = (dkeys, dvalues) if prev is None else (prev[0] + dkeys, prev[1] + dvalues)

        dq_raw = rms_norm_backward(t["q_raw"], w.attn_q_norm, cfg.eps, rope_neox_backward(dq, *rope))
        dx = self.proj_backward(lc.index, "attn_q", dq_raw.reshape(n, -1), t)
        if lc.owns_kv:       # every later layer that reads this cache has added its part by now
            dkeys, dvalues = (g.transpose(1, 0, 2) for g in dkv.pop(lc.index))     # [n, KVH, hd]
            dk_raw = rms_norm_backward(t["k_raw"], w.attn_k_norm, cfg.eps, rope_neox_backward(dkeys, *rope))
            dv_raw = rms_norm_backward(t["v_raw"], None, cfg.eps, dvalues)
            if lc.has_v:
                dx = dx + self.proj_backward(lc.index, "attn_v", dv_raw.reshape(n, -1), t)
            else:
                dk_raw = dk_raw + dv_raw
            dx = dx + self.proj_backward(lc.index, "attn_k", dk_raw.reshape(n, -1), t)
        return dx

    def mlp_backward(self, layer: int, dy: np.ndarray, t: dict) -> np.ndarray:
        dmid = self.proj_backward(layer, "ffn_down", dy, t)
        dgate, dup = geglu_backward(t["gate"], t["up"], dmid)
        return self.proj_backward(layer, "ffn_gate", dgate, t) + self.proj_backward(layer, "ffn_up", dup, t)

    def moe_backward(self, w, lc: LayerConfig, h: np.ndarray, dout: np.ndarray, t: dict):
        """(dloss/dh through the router, dloss/d(experts' input))."""
        cfg, x = self.cfg, t["experts_in"]
        experts = [self.expert(w, lc, e) for e in range(cfg.n_experts)]
        gate_w, up_w, down_w, scales = (np.stack([ex[i] for ex in experts]) for i in range(4))
        dx, dweights = experts_backward(x, t["top"], t["weights"], gate_w, up_w, down_w,
                                        scales if w.experts_down_scale is not None else None, dout)
        dlogits = router_weights_backward(t["probs"], t["top"], dweights)
        dr = self.proj_backward(lc.index, "router", dlogits, t)
        if w.router_scale is not None:
            dr = dr * w.router_scale
        return rms_norm_backward(h, None, cfg.eps, dr / math.sqrt(cfg.hidden)), dx

    def layer_backward(self, lc: LayerConfig, dy: np.ndarray, dkv: dict, t: dict) -> np.ndarray:
        w, eps = self.w.layers[lc.index], self.cfg.eps
        if w.output_scale is not None:
            dy = dy * w.output_scale
        if lc.has_ple:
            dp = rms_norm_backward(t["p"], w.ple_post_norm, eps, dy)
            dg = self.proj_backward(lc.index, "ple_proj", dp, t)
            dy = dy + self.proj_backward(lc.index, "ple_gate", gelu_tanh_backward(t["g_pre"], dg * t["ple_in"]), t)
        h = t["h"]
        df = rms_norm_backward(t["f"], w.post_ffw_norm, eps, dy)
        dh = dy
        if lc.has_moe:
            dm = rms_norm_backward(t["m"], w.post_ffw_norm_1, eps, df)
            dh = dh + rms_norm_backward(h, w.ffn_norm, eps, self.mlp_backward(lc.index, dm, t))
            dsparse = rms_norm_backward(t["sparse"], w.post_ffw_norm_2, eps, df)
            dh_router, dx_experts = self.moe_backward(w, lc, h, dsparse, t)
            dh = dh + dh_router + rms_norm_backward(h, w.pre_ffw_norm_2, eps, dx_experts)
        else:
            dh = dh + rms_norm_backward(h, w.ffn_norm, eps, self.mlp_backward(lc.index, df, t))
        da = rms_norm_backward(t["a"], w.post_attention_norm, eps, dh)
        dxn = self.attention_backward(lc, w, da, dkv, t)
        return dh + rms_norm_backward(t["x"], w.attn_norm, eps, dxn)

    def loss_and_grads(self, tokens, mask) -> tuple[float, dict]:
        """The masked mean cross-entropy and {"<base>.lora_a" / ".lora_b": gradient} for every pair."""
        tokens, mask = np.asarray(tokens, dtype=np.int64), np.asarray(mask, dtype=bool)
        if len(tokens) != len(mask) or not mask[1:].any():
            raise ValueError("one mask entry per token, and at least one target after the first token")
        cfg, w = self.cfg, self.w
        tape = Tape()
        logits = self.forward_logits(tokens, tape)
        loss = cross_entropy(logits, tokens, mask)

        self.grads = {}
        dz = softcap_backward(tape.final["z"], cfg.final_softcap, cross_entropy_backward(logits, tokens, mask))
        dx = rms_norm_backward(tape.final["x"], w.output_norm, cfg.eps, linear_backward(w.head, dz))
        dkv: dict = {}
        for lc in reversed(cfg.layers):
            dx = self.layer_backward(lc, dx, dkv, tape.layers[lc.index])
        grads = {}
        for pair in self.pairs.values():        # a pair no loss path reaches gets zeros
            grads[pair.name + ".lora_a"] = self.grads.get(pair.name + ".lora_a", np.zeros_like(pair.a))
            grads[pair.name + ".lora_b"] = self.grads.get(pair.name + ".lora_b", np.zeros_like(pair.b))
        return loss, grads

    def loss(self, tokens, mask) -> float:
        tokens = np.asarray(tokens, dtype=np.int64)
        return cross_entropy(self.forward_logits(tokens, Tape()), tokens, np.asarray(mask, dtype=bool))
