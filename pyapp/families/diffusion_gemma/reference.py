"""DiffusionGemma's numpy reference (CPython only): the CPU oracle of the GPU forward and of generation.

One denoising step (issue 12). Mirrors transformers 5.23's models/diffusion_gemma/modeling_diffusion_gemma.py (shared/notes/
diffusion_gemma.md (c)). The text stack is a Gemma 4 26B-A4B stack, run by pyapp.reference.forward's
pieces (attention, MLP, MoE, layer) in two modes that differ only in their layer scales, inputs and
attention:

  encode(ids, cache)       causal, over the prompt (or a committed block) at positions cache.length..:
                           x = embed(ids) * sqrt(hidden); every layer appends its K/V to the cache and
                           scales by enc_output_scale. Nothing else of it is used.
  decode(canvas, cache, L) bidirectional, over the C canvas ids at positions P..P+C-1 (P = cache.length):
                           e = embed(canvas) * sqrt(hidden)
                           soft = softmax(L) @ embed * sqrt(hidden)    (0 without previous logits L)
                           s = self_cond_down(gelu(self_cond_gate(n)) * self_cond_up(n)), n = pre_norm(soft)
                           x = rms(e + s)                               (no gain)
                           layers with the decoder's scale (output_scale); attention unmasked over the
                           cached prefix + canvas, the cache read, never written; sliding layers see only
                           the last sliding_window - 1 prefix positions (what transformers' DynamicCache
                           keeps), full layers all of it
                           logits = softcap(output_norm(x) @ embed^T)   [C, vocab], row j scores canvas
                           position j itself

`L` is the previous step's processed (temperature-divided) logits [C, vocab].

Generation (issue 12, item 3). Mirrors transformers 5.23's DiffusionGemmaGenerationMixin.generate for
one sequence (shared/notes/diffusion_gemma.md (d)), on the encoder and decoder above:

  for each block (ceil(max_new_tokens / C) at most):
      encode what is not cached yet (the prompt, then the last committed block)
      canvas = draws.canvas(); previous logits = none; argmax history empty
      for cur = steps .. 1:
          proc = decoder(canvas, cache, previous) / temperature(cur)
          sample = a draw from softmax(proc) per position; am = argmax(proc); ent = entropy(softmax(proc))
          accepted: sort by entropy; accept while (cumsum - own entropy) <= entropy_bound
          canvas = accepted ? sample : renoise ids (drawn every step)
          stable = the last stability_threshold argmaxes all equal am; confident = mean(ent) < threshold
          previous = proc; stop the block if stable and confident
      commit am (the last step's argmax); pad after the first eos and stop; stop at max_new_tokens

`step_decisions` is one step's sampler on given logits, the piece the GPU's shaders/denoise.wgsl mirrors.
"""

from __future__ import annotations

import math

import numpy as np

from ...model.config import LayerConfig
from ...reference.forward import KVCache, ReferenceModel, gelu_tanh, rms_norm, softcap
from .config import DiffusionGemmaConfig
from .denoising import DenoiseParams, DenoiseResult, Draws, finish_block, temperature


class DecoderView:
    """The decoder's read-only view of the encoder's KVCache: attention over the cached prefix (sliding
    layers: its last window - 1 positions) and the canvas, unmasked; nothing is stored."""

    def __init__(self, cache: KVCache, cfg: DiffusionGemmaConfig):
        self.cache, self.window = cache, cfg.sliding_window
        self.sliding = {lc.index: lc.sliding for lc in cfg.layers}

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k, v = k.transpose(1, 0, 2), v.transpose(1, 0, 2)      # [n, kvh, hd] -> [kvh, n, hd]
        if layer not in self.cache.k:                           # nothing encoded yet
            return k, v
        keys, values = self.cache.k[layer], self.cache.v[layer]
        if self.sliding[layer] and self.window > 0:
            first = max(keys.shape[1] - (self.window - 1), 0)
            keys, values = keys[:, first:], values[:, first:]
        return np.concatenate([keys, k], axis=1), np.concatenate([values, v], axis=1)

    def allowed(self, lc: LayerConfig, positions: np.ndarray, n_keys: int, window: int) -> np.ndarray:
        return np.ones((len(positions), n_keys), dtype=bool)


class DiffusionReference(ReferenceModel):
    def __init__(self, gguf, config: DiffusionGemmaConfig | None = None):
        super().__init__(gguf, config or DiffusionGemmaConfig.from_gguf(gguf))
        self.embed_scale = np.float32(math.sqrt(self.cfg.hidden))

    def encode(self, tokens, cache: KVCache | None = None) -> KVCache:
        """The causal encoder pass over `tokens` at positions cache.length..: appends K/V to the cache."""
        cfg, w = self.cfg, self.w
        cache = cache if cache is not None else KVCache()
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = cache.length + np.arange(len(tokens))
        x = w.token_embd[tokens] * self.embed_scale
        for lc in cfg.layers:
            x = self.layer(lc, x, positions, None, cache, scale=w.layers[lc.index].enc_output_scale)
        cache.length += len(tokens)
        return cache

    def self_conditioning_signal(self, prev_logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(soft, s) of the previous logits [C, vocab]: the soft embeddings softmax(L) @ embed * sqrt(hidden)
        and the MLP's signal s added to the canvas embedding (the GPU's state.soft and state.self_cond)."""
        cfg, w = self.cfg, self.w
        z = np.asarray(prev_logits, dtype=np.float32)
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)                      # over the full vocabulary, f32
        soft = (p @ w.token_embd) * self.embed_scale
        n = rms_norm(soft, w.self_cond_pre_norm, cfg.eps)
        return soft, (gelu_tanh(n @ w.self_cond_gate.T) * (n @ w.self_cond_up.T)) @ w.self_cond_down.T

    def self_conditioning(self, embedded: np.ndarray, prev_logits: np.ndarray | None) -> np.ndarray:
        """The decoder's input: rms(embedded + self-conditioning signal of the previous logits)."""
        s = np.zeros_like(embedded) if prev_logits is None else self.self_conditioning_signal(prev_logits)[1]
        return rms_norm(embedded + s, None, self.cfg.eps)

    def decode(self, canvas, cache: KVCache, prev_logits: np.ndarray | None = None) -> np.ndarray:
        """One denoising step's logits [len(canvas), vocab] float32 (softcap applied); the cache is only read."""
        cfg, w = self.cfg, self.w
        canvas = np.asarray(canvas, dtype=np.int64)
        if prev_logits is not None and np.shape(prev_logits) != (len(canvas), cfg.vocab_size):
            raise ValueError(f"previous logits of shape {np.shape(prev_logits)}, expected "
                             f"[{len(canvas)}, {cfg.vocab_size}]")
        positions = cache.length + np.arange(len(canvas))
        x = self.self_conditioning(w.token_embd[canvas] * self.embed_scale, prev_logits)
        view = DecoderView(cache, cfg)
        for lc in cfg.layers:
            x = self.layer(lc, x, positions, None, view)
        x = rms_norm(x, w.output_norm, cfg.eps)
        return softcap(x @ w.head.T, cfg.final_softcap).astype(np.float32)

    def decoder_step(self, prompt, canvas, prev_logits: np.ndarray | None = None, blocks=()) -> np.ndarray:
        """Encode the prompt, then each committed block in turn, then one decoder step over the canvas."""
        cache = self.encode(prompt)
        for block in blocks:
            self.encode(block, cache)
        return self.decode(canvas, cache, prev_logits)


# -- generation --------------------------------------------------------------------------------------
def inverse_cdf(probs: np.ndarray, u) -> np.ndarray:
    """Per row, the first id whose cumulative probability exceeds u * total (the GPU sampler's rule)."""
    c = np.cumsum(probs, axis=-1)
    idx = (c > np.asarray(u)[:, None] * c[:, -1:]).argmax(-1)
    return idx.astype(np.int64)


def step_decisions(raw: np.ndarray, temp: float, entropy_bound: float):
    """One step's sampler on raw logits [C, V]: processed logits (f32, raw / temp), probabilities (f64),
    entropies (f32), argmax and the entropy-bound acceptance mask."""
    proc = (raw.astype(np.float32) / np.float32(temp)).astype(np.float32)
    z = proc.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    s = e.sum(-1, keepdims=True)
    probs = e / s
    ent = (np.log(s[:, 0]) - (e * z).sum(-1) / s[:, 0]).astype(np.float32)
    am = proc.argmax(-1)
    order = np.argsort(ent, kind="stable")
    cum = np.cumsum(ent[order], dtype=np.float64).astype(np.float32)       # torch accumulates in double
    accepted = np.zeros(len(ent), bool)
    accepted[order] = (cum - ent[order]) <= np.float32(entropy_bound)
    return proc, probs, ent, am, accepted


def generate(model, prompt, params: DenoiseParams, draws: Draws, on_step=None) -> DenoiseResult:
    """Denoise block after block after `prompt` with `model` (a DiffusionReference).
    on_step(block, step, argmax, accepted) sees each step's draft."""
    params.validate()
    C = model.cfg.canvas_length
    res = DenoiseResult()
    cache = KVCache()
    todo = list(prompt)
    max_len = len(prompt) + params.max_new_tokens
    seq = list(prompt)
    for b in range(-(-params.max_new_tokens // C)):
        model.encode(todo, cache)
        canvas = draws.canvas()
        prev, history, am = None, [], None
        steps = 0
        for cur in range(params.steps, 0, -1):
            raw = model.decode(canvas, cache, prev)
            proc, probs, ent, am, accepted = step_decisions(raw, temperature(cur, params.steps, params.t_min,
                                                                            params.t_max), params.entropy_bound)
            u, forced, noise = draws.step()
            sample = np.asarray(forced) if forced is not None else inverse_cdf(probs, u)
            canvas = np.where(accepted, sample, np.asarray(noise)).tolist()
            k = params.stability_threshold
            stable = k == 0 or (len(history) >= k and all((h == am).all() for h in history[-k:]))
            history.append(am)
            confident = float(ent.astype(np.float64).mean()) < params.confidence_threshold
            prev = proc
            steps += 1
            res.accepted.append(accepted)
            res.argmax.append(am)
            if on_step:
                on_step(b, steps, am, accepted)
            if stable and confident:
                break
        block, eos = finish_block([int(t) for t in am], set(params.eos_ids), params.pad_id)
        res.blocks.append(block)
        res.tokens += block
        res.steps.append(steps)
        seq += block
        if eos:
            res.stop_reason = "stop"
            break
        if len(seq) >= max_len:
            res.stop_reason = "length"
            break
        todo = block
    return res
