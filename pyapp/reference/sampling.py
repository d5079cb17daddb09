"""Numpy reference of the token sampler that runs on the GPU (shaders/sample.wgsl).

Order of operations (Ollama's sampler order, with llama.cpp's repeat penalty):
  1. repeat penalty on the logits of recently generated tokens
     (positive logits divided by the penalty, negative ones multiplied)
  2. temperature <= 0: greedy argmax (lowest id wins ties)
  3. top-k: the k largest logits (k is capped at MAX_TOP_K on the GPU)
  4. softmax of logits / temperature over those k
  5. top-p: the smallest prefix (by descending probability) whose mass >= top_p (at least one)
  6. min-p: drop tokens whose probability < min_p * the largest probability
  7. renormalize and pick with a uniform u in [0, 1) supplied by the caller
"""

from __future__ import annotations

import numpy as np

MAX_TOP_K = 256


def sample(logits: np.ndarray, *, temperature: float, top_k: int, top_p: float, min_p: float,
           repeat_penalty: float = 1.0, recent: list[int] | tuple = (), u: float = 0.0) -> int:
    x = np.asarray(logits, dtype=np.float32).copy()
    if repeat_penalty != 1.0 and len(recent):
        ids = np.unique(np.asarray(recent, dtype=np.int64))
        vals = x[ids]
        x[ids] = np.where(vals > 0, vals / repeat_penalty, vals * repeat_penalty)
    if temperature <= 0:
        return int(np.argmax(x))

    k = MAX_TOP_K if top_k <= 0 else min(top_k, MAX_TOP_K)
    k = min(k, x.size)
    order = np.lexsort((np.arange(x.size), -x))[:k]          # descending logit, ascending id
    z = x[order].astype(np.float64) / temperature
    p = np.exp(z - z[0])
    p /= p.sum()

    keep = len(p)
    if top_p < 1.0:                       # 0 keeps only the most likely (as Ollama)
        keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
        keep = min(keep, len(p))
    if min_p > 0.0:
        keep = min(keep, int(np.sum(p >= min_p * p[0])))
    keep = max(keep, 1)

    p = p[:keep] / p[:keep].sum()
    idx = int(np.searchsorted(np.cumsum(p), u, side="right"))
    return int(order[min(idx, keep - 1)])
