"""Streamed experts: a MoE layer's experts stay in the file; the GPU holds a cache of a few per layer.

When the GPU budget cannot hold every expert (pyapp.runtime.memory), each expert
tensor [E, n, k] of a MoE layer becomes a cache of `slots` experts on the GPU
(pyapp.runtime.upload). A layer's forward then runs in three parts:

  1. up to the router: the chosen expert ids of every token land in state.expert_ids;
  2. on the host (`ExpertCache.run`): read those ids back, and in rounds of at
     most `slots` distinct experts: copy the missing ones from the file into free
     or least recently used slots (file -> GPU, never through Python in the
     browser; a round's copies at once), write each token's slot ids to
     state.expert_slots, and replay the layer's expert kernels
     (`ExpertRounds.plan`), which index the cache by slot;
  3. the rest: the weighted sum (by expert id, for the per-expert scales) and on.

Rounds make prefill read each expert at most once per chunk: a chunk of 512
tokens routes to nearly every expert, more than a small cache holds, so its
tokens are served expert group by expert group. A slot id of NOT_HERE makes the
expert kernels skip that token's slot in this round (moe.wgsl's "here" test).
Decode needs one round: a token's experts always fit (slots >= experts used).
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

from ..gpu import Plan
from .requests import FilesToGpu, FileToGpu, ReadGpu
from .upload import layer_experts

NOT_HERE = 0xFFFFFFFF


class ExpertCounts(NamedTuple):
    """What the cache did so far; `since` gives what it did between two counts."""
    hits: int
    misses: int
    bytes_read: int
    wait_s: float      # waiting for the router's choices: the GPU's work up to them and the readback
    copy_s: float      # copying missed experts file -> GPU

    def since(self, before: "ExpertCounts") -> "ExpertCounts":
        return ExpertCounts(*(a - b for a, b in zip(self, before)))


@dataclass
class ExpertRounds:
    """The expert kernels of one MoE layer, replayed once per round of cached experts."""
    layer: int
    plan: Plan


class ExpertCache:
    def __init__(self, dev, cfg, state, layout, slots: int):
        self.dev, self.state, self.slots = dev, state, slots
        self.used = cfg.n_experts_used
        # per MoE layer: its expert caches (GpuTensor.cached_from = the file tensor)
        self.tensors = {lc.index: layer_experts(layout, lc) for lc in cfg.layers if lc.has_moe}
        self.resident = {i: OrderedDict() for i in self.tensors}   # expert -> slot, least recently used first
        self.hits = self.misses = self.bytes_read = 0
        self.wait_s = self.copy_s = 0.0

    def rounds(self, layer: int, ids: list[int]):
        """Groups of at most `slots` distinct experts covering ids, each with {expert: slot} and the
        (expert, slot) pairs to copy in. Cached experts come first: they cost no reads."""
        cached = self.resident[layer]
        wanted = list(dict.fromkeys(ids))
        wanted.sort(key=lambda e: e not in cached)
        for i in range(0, len(wanted), self.slots):
            group = wanted[i:i + self.slots]
            keep = set(group)
            slot_of, copies = {}, []
            for e in group:
                if e in cached:
                    cached.move_to_end(e)
                    self.hits += 1
                else:
                    slot = len(cached) if len(cached) < self.slots else self._evict(cached, keep)
                    cached[e] = slot
                    copies.append((e, slot))
                    self.misses += 1
                slot_of[e] = cached[e]
            yield slot_of, copies

    @staticmethod
    def _evict(cached: OrderedDict, keep: set) -> int:
        """Free the least recently used slot whose expert this round does not need."""
        victim = next(e for e in cached if e not in keep)
        return cached.pop(victim)

    def copy_in(self, layer: int, expert: int, slot: int):
        """Requests: the expert's rows of every tensor of the layer, file -> its slot."""
        for t in self.tensors[layer]:
            src, n = t.cached_from, t.shape[1]
            size = n * src.row_bytes
            part = next(p for p in t.parts if p.row0 <= slot * n < p.row0 + p.rows)
            self.bytes_read += size
            yield FileToGpu(part.buffer, src.offset + expert * size, size, (slot * n - part.row0) * src.row_bytes)

    def run(self, step: ExpertRounds, n_tokens: int):
        """Steps: serve the experts the router chose for n_tokens tokens of step.layer."""
        s = self.state
        start = time.perf_counter()
        ids = array("I", (yield ReadGpu(s.expert_ids, 0, 4 * n_tokens * self.used)))
        self.wait_s += time.perf_counter() - start
        for slot_of, copies in self.rounds(step.layer, list(ids)):
            if copies:
                start = time.perf_counter()
                yield FilesToGpu(tuple(c for expert, slot in copies for c in self.copy_in(step.layer, expert, slot)))
                self.copy_s += time.perf_counter() - start
            self.dev.write(s.expert_slots, array("I", (slot_of.get(e, NOT_HERE) for e in ids)).tobytes())
            self.dev.submit(step.plan)

    def counts(self) -> ExpertCounts:
        return ExpertCounts(self.hits, self.misses, self.bytes_read, self.wait_s, self.copy_s)

    def stats(self) -> dict:
        looked = self.hits + self.misses
        return {"expert_slots": self.slots, "expert_hits": self.hits, "expert_misses": self.misses,
                "expert_hit_rate": round(self.hits / looked, 4) if looked else None,
                "expert_bytes_read": self.bytes_read}
