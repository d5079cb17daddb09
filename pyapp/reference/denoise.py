"""Numpy reference of DiffusionGemma generation: the CPU oracle for the GPU sampler (issue 12, item 3).

Mirrors transformers 5.23's DiffusionGemmaGenerationMixin.generate for one sequence (shared/notes/
diffusion_gemma.md (d)), on pyapp.reference.diffusion's encoder and decoder:

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

import numpy as np

from ..denoising import DenoiseParams, DenoiseResult, Draws, finish_block, temperature
from .forward import KVCache


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
    """Denoise block after block after `prompt` with `model` (a pyapp.reference.diffusion.DiffusionReference).
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
