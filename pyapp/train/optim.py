"""The optimizer of LoRA training: AdamW, a warmup + cosine learning-rate schedule, global-norm gradient
clipping. Standard library only (it runs in Pyodide); parameters, gradients and moments are flat
array('f') buffers, one per tensor, as the GPU holds them. This is also the spec of the GPU optimizer
kernel, and it computes what torch does (tests/train/test_optim.py: torch.optim.AdamW, clip_grad_norm_ and
transformers' get_cosine_schedule_with_warmup, step for step):

    lr_t    = peak * warmup_cosine(t)                           t = 0, 1, ... (the update's index)
    g      *= min(1, max_norm / (||all gradients||_2 + 1e-6))   clip_grad_norm_
    p      *= 1 - lr_t * weight_decay                           decoupled weight decay (AdamW)
    m       = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
    p      -= lr_t / (1 - b1^(t+1)) * m / (sqrt(v) / sqrt(1 - b2^(t+1)) + eps)

    opt = AdamW({"<base tensor>.lora_a": array("f", ...), ...}, weight_decay=0.01)
    sched = WarmupCosine(peak_lr=2e-4, warmup_steps=10, total_steps=200)
    norm = clip_grad_norm(grads, 1.0)          # grads scaled in place; returns the norm before clipping
    opt.step(grads, sched.lr(step))
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass


@dataclass(frozen=True)
class WarmupCosine:
    """Linear warmup from 0 to peak_lr over warmup_steps updates, then a half cosine down to
    min_ratio * peak_lr at total_steps (transformers' get_cosine_schedule_with_warmup when min_ratio is 0)."""
    peak_lr: float
    warmup_steps: int
    total_steps: int
    min_ratio: float = 0.0

    def __post_init__(self):
        if not (self.peak_lr > 0 and 0 <= self.warmup_steps <= self.total_steps and 0 <= self.min_ratio <= 1):
            raise ValueError(f"bad schedule: peak_lr {self.peak_lr}, warmup {self.warmup_steps}, total "
                             f"{self.total_steps}, min_ratio {self.min_ratio}")

    def lr(self, step: int) -> float:
        """The learning rate of update `step` (0-based)."""
        if step < self.warmup_steps:
            return self.peak_lr * step / max(1, self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.peak_lr * (self.min_ratio + (1.0 - self.min_ratio) * cosine)


def global_norm(grads: dict) -> float:
    """The L2 norm of all gradients together."""
    return math.sqrt(math.fsum(x * x for g in grads.values() for x in g))


def clip_grad_norm(grads: dict, max_norm: float) -> float:
    """Scale every gradient in place so that their global norm is at most max_norm (torch's
    clip_grad_norm_: factor max_norm / (norm + 1e-6), never above 1). Returns the norm before."""
    norm = global_norm(grads)
    factor = max_norm / (norm + 1e-6)
    if factor < 1.0:
        for g in grads.values():
            for i in range(len(g)):
                g[i] *= factor
    return norm


class AdamW:
    """torch.optim.AdamW (decoupled weight decay, bias-corrected moments) over named flat f32 buffers."""

    def __init__(self, params: dict, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        self.params = params
        self.b1, self.b2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        self.m = {n: array("f", bytes(4 * len(p))) for n, p in params.items()}
        self.v = {n: array("f", bytes(4 * len(p))) for n, p in params.items()}
        self.t = 0                                   # updates done

    def step(self, grads: dict, lr: float) -> None:
        """One update of every parameter with its gradient (same names, same lengths)."""
        if grads.keys() != self.params.keys():
            raise ValueError(f"gradients for {sorted(grads.keys() ^ self.params.keys())[:3]} do not match the "
                             "parameters")
        self.t += 1
        b1, b2, eps = self.b1, self.b2, self.eps
        step_size = lr / (1.0 - b1 ** self.t)
        root_c2 = math.sqrt(1.0 - b2 ** self.t)
        decay = 1.0 - lr * self.weight_decay
        for name, p in self.params.items():
            g, m, v = grads[name], self.m[name], self.v[name]
            if len(g) != len(p):
                raise ValueError(f"gradient {name} has {len(g)} values, the parameter {len(p)}")
            for i in range(len(p)):
                gi = g[i]
                m[i] = mi = b1 * m[i] + (1.0 - b1) * gi
                v[i] = vi = b2 * v[i] + (1.0 - b2) * gi * gi
                p[i] = p[i] * decay - step_size * mi / (math.sqrt(vi) / root_c2 + eps)

    def state(self) -> dict:
        """What a checkpoint keeps to resume: the step count and both moments."""
        return {"t": self.t, "m": self.m, "v": self.v}
