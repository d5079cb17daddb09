"""Numpy reference of an assistant drafter (CPython only): transformers' Gemma4AssistantForCausalLM,
chained as its assisted generation (Gemma4AssistantCandidateGenerator) chains it.

One draft step, for the newest token t at position p (the target has K/V for positions 0..p-1 and
its final-normed hidden state s at p-1):

  x = pre_projection([target_embed(t) * sqrt(backbone), s])
  for each layer (no K/V of its own):
      q  = rope(q_norm(q_proj(attn_norm(x))), p)
      a  = attention(q, target K/V of the layer's kind)      full: keys 0..p-1; sliding: the last W+1 keys
      h  = x + post_attn_norm(o_proj(a))
      x  = (h + post_ffw_norm(mlp(ffn_norm(h)))) * layer_output_scale
  y = output_norm(x)
  logits = y @ token_embd.T           (no softcap)
  state  = post_projection(y)          (the next step's s)

The next step takes argmax(logits) as t and `state` as s, at the same position p against the same
K/V: drafting never writes the target's cache. The sliding window is transformers' bidirectional
one (|q - k| <= W, flipped onto the keys' end), so it sees W + 1 keys where the target's own sliding
layers see W (their key at p among them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...reference.forward import gelu_tanh, rms_norm, rope_neox
from ...reference.quants import load_tensor
from .config import DrafterConfig
from .source import DraftSource
from .weights import bind


@dataclass
class TargetKV:
    """The target's K/V the drafter reads, after norm and RoPE: [n_kv_heads, positions, head_dim] each."""
    k_sliding: np.ndarray
    v_sliding: np.ndarray
    k_full: np.ndarray
    v_full: np.ndarray

    def of_kind(self, sliding: bool) -> tuple[np.ndarray, np.ndarray]:
        if sliding:
            return self.k_sliding, self.v_sliding
        return self.k_full, self.v_full


@dataclass
class DraftStep:
    logits: np.ndarray       # [vocab]
    state: np.ndarray        # [backbone]: the next step's input state

    @property
    def token(self) -> int:
        return int(np.argmax(self.logits))


class DrafterReference:
    def __init__(self, gguf, config: DrafterConfig | None = None):
        self.cfg = config or DrafterConfig.from_gguf(gguf)
        self.w = bind(self.cfg, gguf.tensors).map(lambda t: load_tensor(gguf, t))

    def attention(self, lc, lw, x: np.ndarray, position: int, kv: TargetKV) -> np.ndarray:
        cfg = self.cfg
        freq_factors = None if lc.sliding else self.w.rope_freqs
        keys, values = kv.of_kind(lc.sliding)
        keys = keys[:, :position]
        values = values[:, :position]
        if lc.sliding and cfg.sliding_window > 0:
            first_visible = max(0, position - cfg.sliding_keys)
            keys = keys[:, first_visible:]
            values = values[:, first_visible:]

        q = (x @ lw.attn_q.T).reshape(1, cfg.n_heads, lc.head_dim)
        q = rms_norm(q, lw.attn_q_norm, cfg.eps)
        q = rope_neox(q, np.array([position]), lc.rope_dims, lc.rope_base, freq_factors)

        group = cfg.n_heads // keys.shape[0]
        keys_per_head = np.repeat(keys, group, axis=0)         # [heads, T, hd]
        values_per_head = np.repeat(values, group, axis=0)
        scores = np.einsum("nhd,htd->hnt", q, keys_per_head)  # attention scale 1.0 (q and k are normed)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = np.einsum("hnt,htd->nhd", probs, values_per_head).reshape(1, cfg.n_heads * lc.head_dim)
        return out @ lw.attn_output.T

    def mlp(self, lw, x: np.ndarray) -> np.ndarray:
        gate = gelu_tanh(x @ lw.ffn_gate.T)
        up = x @ lw.ffn_up.T
        return (gate * up) @ lw.ffn_down.T

    def layer(self, lc, x: np.ndarray, position: int, kv: TargetKV) -> np.ndarray:
        lw, eps = self.w.layers[lc.index], self.cfg.eps
        attended = self.attention(lc, lw, rms_norm(x, lw.attn_norm, eps), position, kv)
        h = x + rms_norm(attended, lw.post_attention_norm, eps)
        f = self.mlp(lw, rms_norm(h, lw.ffn_norm, eps))
        x = h + rms_norm(f, lw.post_ffw_norm, eps)
        return x * lw.output_scale

    def step(self, token_embedding: np.ndarray, state: np.ndarray, position: int, kv: TargetKV) -> DraftStep:
        """One draft step: token_embedding is the target's scaled embedding of the newest token (at
        `position`), state the target's final-normed hidden state before it (or the last step's state)."""
        w = self.w
        joined = np.concatenate([token_embedding, state]).astype(np.float32)[None, :]
        x = joined @ w.pre_projection.T
        for lc in self.cfg.layers:
            x = self.layer(lc, x, position, kv)
        y = rms_norm(x, w.output_norm, self.cfg.eps)
        logits = (y @ w.token_embd.T)[0].astype(np.float32)
        next_state = (y @ w.post_projection.T)[0].astype(np.float32)
        return DraftStep(logits=logits, state=next_state)

    def draft(self, target_embed, token: int, state: np.ndarray, position: int, kv: TargetKV,
              n: int) -> list[DraftStep]:
        """n greedy draft steps from the newest token; target_embed(token) -> its scaled embedding row."""
        steps = []
        for _ in range(n):
            step = self.step(target_embed(token), state, position, kv)
            steps.append(step)
            token, state = step.token, step.state
        return steps


def target_embedder(target_token_embd: np.ndarray):
    """target_embed(token) for DrafterReference.draft: the target's embedding row times sqrt(width), as
    Gemma 4's scaled embedding gives it."""
    scale = np.float32(math.sqrt(target_token_embd.shape[1]))

    def target_embed(token: int) -> np.ndarray:
        return target_token_embd[token] * scale
    return target_embed


@dataclass
class SpeculativeResult:
    tokens: list[int]
    drafted: int          # drafts checked by the target
    accepted: int         # drafts the target's greedy choice confirmed
    steps: int            # target steps after the prompt

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def speculative_greedy(target, drafter: DrafterReference, prompt: list[int], n_new: int,
                       n_drafts: int) -> SpeculativeResult:
    """Greedy generation of n_new tokens by a numpy target (pyapp.reference.forward.ReferenceModel) with
    the drafter's n_drafts drafts checked in each target step, as transformers' assisted generation
    chains them: the drafter starts from the newest token and the target's final-normed state of the
    token before it, reads the target's K/V of the positions before it, and the target's cache is cut
    back to the kept tokens after each check. The tokens equal target.generate_greedy's."""
    from ...reference.forward import KVCache
    from .config import kv_layer
    drafter.cfg.check_target(target.cfg)
    sliding_source = kv_layer(target.cfg, True)
    full_source = kv_layer(target.cfg, False)
    target_embed = target_embedder(target.w.token_embd)
    cache = KVCache()
    logits = target.forward(prompt, cache)
    token = logits.argmax_row(-1)
    state = target.final_hidden[-1]
    out = [token]
    drafted = accepted = steps = 0
    while len(out) < n_new:
        position = cache.length
        kv = TargetKV(cache.k[sliding_source], cache.v[sliding_source], cache.k[full_source], cache.v[full_source])
        n_ask = min(n_drafts, n_new - len(out) - 1)
        drafts = [step.token for step in drafter.draft(target_embed, token, state, position, kv, n_ask)]
        logits = target.forward([token] + drafts, cache)
        choices = [logits.argmax_row(row) for row in range(len(drafts) + 1)]
        kept = 0
        while kept < len(drafts) and drafts[kept] == choices[kept]:
            kept += 1
        drafted += len(drafts)
        accepted += kept
        steps += 1
        out += drafts[:kept] + [choices[kept]]
        cut_back(cache, position + 1 + kept)
        state = target.final_hidden[kept]
        token = choices[kept]
    return SpeculativeResult(tokens=out[:n_new], drafted=drafted, accepted=accepted, steps=steps)


def cut_back(cache, length: int) -> None:
    """Forget a numpy KVCache's positions from `length` on (rejected drafts)."""
    for layer in cache.k:
        cache.k[layer] = cache.k[layer][:, :length]
        cache.v[layer] = cache.v[layer][:, :length]
    cache.length = length


class ReferenceDrafts(DraftSource):
    def __init__(self, drafter: DrafterReference, target_config, target_token_embd: np.ndarray):
        super().__init__(target_config, drafter.cfg.sliding_keys)
        drafter.cfg.check_target(target_config)
        self.drafter = drafter
        self.layers = {self.sliding_source: target_config.layers[self.sliding_source],
                       self.full_source: target_config.layers[self.full_source]}
        self.target_embed = target_embedder(target_token_embd)

    def draft(self, eng, tok: int, fed: bool, limit: int, state_row):
        """Steps: up to `limit` drafts after tok, at its position, by the numpy drafter."""
        position = self.position(eng, fed)
        if limit <= 0 or position == 0 or not self.keeps_keys(eng, position):
            return []
        sliding = yield from self.keys_and_values(eng, self.sliding_source, self.first_sliding(position), position)
        full = yield from self.keys_and_values(eng, self.full_source, 0, position)
        row = yield from eng.runner.final_norm_row(state_row)
        state = np.frombuffer(bytes(row), np.float32)
        kv = TargetKV(*sliding, *full)
        steps = self.drafter.draft(self.target_embed, tok, state, position, kv, limit)
        drafts = [step.token for step in steps]
        self.drafts_made.append(drafts)
        return drafts

    def keys_and_values(self, eng, layer: int, first: int, end: int):
        """Steps: a layer's K and V [n_kv_heads, end, head_dim] with positions first..end-1 filled from its
        cache (the rest zero: never looked at; keeps_keys saw that its ring still holds them)."""
        keys, values, slots = yield from eng.runner.kv_of_layer(layer)
        lc = self.layers[layer]
        shape = (lc.n_kv_heads, slots, lc.head_dim)
        cached_keys = np.frombuffer(bytes(keys), np.float32).reshape(shape)
        cached_values = np.frombuffer(bytes(values), np.float32).reshape(shape)
        slot_of = np.arange(first, end) % slots
        out_keys = np.zeros((lc.n_kv_heads, end, lc.head_dim), np.float32)
        out_values = np.zeros_like(out_keys)
        out_keys[:, first:end] = cached_keys[:, slot_of]
        out_values[:, first:end] = cached_values[:, slot_of]
        return out_keys, out_values
