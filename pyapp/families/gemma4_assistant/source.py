"""An assistant drafter as the engine's draft source, drafting on the CPU with the numpy reference from
the target's state and K/V read back from the GPU (CPython; the drafter's GPU forward is not written
yet). It shows the engine hands the drafter the right rows and positions: greedy output must not
change, and the drafts are the reference chain's.

    engine.drafter = ReferenceDrafts(DrafterReference(drafter_gguf), engine.config, target_token_embd)
"""

from __future__ import annotations

import numpy as np

from .config import kv_layer
from .reference import DrafterReference, TargetKV, target_embedder


class ReferenceDrafts:
    def __init__(self, drafter: DrafterReference, target_config, target_token_embd: np.ndarray):
        drafter.cfg.check_target(target_config)
        self.drafter = drafter
        self.window = target_config.sliding_window
        self.sliding_source = kv_layer(target_config, True)
        self.full_source = kv_layer(target_config, False)
        self.layers = {self.sliding_source: target_config.layers[self.sliding_source],
                       self.full_source: target_config.layers[self.full_source]}
        self.target_embed = target_embedder(target_token_embd)
        self.hidden = target_config.hidden
        self.drafts_made: list[list[int]] = []      # each round's drafts (tests compare them with the reference's)

    def __call__(self, prompt: list[int]) -> "ReferenceDrafts":
        """The source of one generation (nothing kept between tokens: the drafter reads the target)."""
        return self

    def append(self, token: int) -> None:
        pass

    def draft(self, eng, tok: int, fed: bool, limit: int, state_row):
        """Steps: up to `limit` drafts after tok, at its position (tok's K/V, when its step ran ahead, is not
        read); none when the sliding ring no longer holds the window + 1 keys before it."""
        position = len(eng.cached) - 1 if fed else len(eng.cached)
        if limit <= 0 or position == 0:
            return []
        first_sliding = max(0, position - self.window - 1)
        sliding = yield from self.keys_and_values(eng, self.sliding_source, first_sliding, position)
        full = yield from self.keys_and_values(eng, self.full_source, 0, position)
        if sliding is None or full is None:
            return []
        row = yield from eng.runner.final_norm_row(state_row)
        state = np.frombuffer(bytes(row), np.float32)
        kv = TargetKV(*sliding, *full)
        steps = self.drafter.draft(self.target_embed, tok, state, position, kv, limit)
        drafts = [step.token for step in steps]
        self.drafts_made.append(drafts)
        return drafts

    def keys_and_values(self, eng, layer: int, first: int, end: int):
        """Steps: a layer's K and V [n_kv_heads, end, head_dim] with positions first..end-1 filled from its
        cache (the rest zero: never looked at), or None when its ring has overwritten one of them."""
        keys, values, slots = yield from eng.runner.kv_of_layer(layer)
        if first < eng.kv_end - slots:
            return None
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
