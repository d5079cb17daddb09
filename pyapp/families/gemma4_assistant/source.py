"""An assistant drafter as the engine's draft source (`Engine.drafter`): after the newest token, a round of
drafts from the target's state and K/V.

  GpuDrafts(GpuDrafter)        the drafter on the GPU (runner.py): one submit and one readback a round
  reference.ReferenceDrafts    the numpy drafter on the CPU, fed the target's state and K/V read back from the
                               GPU (CPython): what shows the GPU's rows and positions are the right ones

Both draft nothing where the target's sliding ring no longer holds the window + 1 keys before the token
(a long rollback overwrote one), and nothing at position 0. `drafts_made` keeps each round's drafts.

    engine.drafter = GpuDrafts(GpuDrafter.open(dev, drafter_gguf, engine.runner))
"""

from __future__ import annotations

from collections import deque

from ...prompt_lookup import MAX_NGRAM, PromptLookup
from .config import kv_layer
from .runner import MAX_DRAFTS

KEPT_ROUNDS = 256        # the last rounds' drafts kept for tests and the curious (a chat drafts for ever)


class DraftSource:
    """What both sources share: a source per generation (nothing kept between tokens: the drafter reads the
    target), where a round drafts, and whether the target's rings still hold its keys."""

    def __init__(self, target_config, sliding_keys: int):
        self.sliding_keys = sliding_keys              # keys a sliding layer's query sees (DrafterConfig's)
        self.sliding_source = kv_layer(target_config, True)
        self.full_source = kv_layer(target_config, False)
        self.drafts_made: deque = deque(maxlen=KEPT_ROUNDS)   # the last rounds' drafts (tests compare them)
        self.skipped_rounds = 0                       # rounds with no drafts: the sliding ring lost a key

    def __call__(self, prompt: list[int]) -> "DraftSource":
        return self

    def append(self, token: int) -> None:
        pass

    @staticmethod
    def position(eng, fed: bool) -> int:
        """The newest token's position (its K/V, when its step ran ahead, is not read)."""
        return len(eng.cached) - 1 if fed else len(eng.cached)

    def first_sliding(self, position: int) -> int:
        """The first position a sliding layer's query at `position` sees (the sliding_keys before it)."""
        return max(0, position - self.sliding_keys) if self.sliding_keys else 0

    @staticmethod
    def holds(eng, layer: int, first: int) -> bool:
        """Whether layer's cache still holds position `first`: a ring keeps the last `slots` positions written,
        and the furthest written (eng.kv_end) can lie past the cached tokens (rejected drafts, a step ahead)."""
        return first >= eng.kv_end - eng.runner.state.kv[layer].slots

    def keeps_keys(self, eng, position: int) -> bool:
        """Whether the target's sliding ring still holds every key a round at `position` reads (else the round is
        skipped: with short prompt steps the ring is small, and rejected drafts move its end forward)."""
        if self.holds(eng, self.sliding_source, self.first_sliding(position)):
            return True
        self.skipped_rounds += 1
        return False


class GpuDrafts(DraftSource):
    """The drafter on the GPU; where the text repeats (its last MAX_NGRAM tokens occurred before in the
    generation's text), prompt lookup's drafts instead: free, and right more often there."""

    def __init__(self, drafter):
        super().__init__(drafter.runner.cfg, drafter.cfg.sliding_keys)
        self.drafter = drafter
        self.lookup: PromptLookup | None = None      # the generation's text (none: the drafter always)
        self.lookup_rounds = 0                       # rounds prompt lookup drafted

    def __call__(self, prompt: list[int]) -> "GpuDrafts":
        self.lookup = PromptLookup(prompt)
        return self

    def append(self, token: int) -> None:
        if self.lookup is not None:
            self.lookup.append(token)

    def draft(self, eng, tok: int, fed: bool, limit: int, state_row):
        """Steps: up to `limit` drafts after tok: prompt lookup's where the text repeats, else a round on the
        GPU from the final-normed row state_row."""
        if self.lookup is not None and limit > 0:
            repeated = self.lookup.draft(limit, min_ngram=MAX_NGRAM)
            if repeated:
                self.lookup_rounds += 1
                return repeated
        position = self.position(eng, fed)
        if limit <= 0 or position == 0 or not self.keeps_keys(eng, position):
            return []
        drafts = yield from self.drafter.draft(tok, position, state_row, min(limit, MAX_DRAFTS))
        self.drafts_made.append(drafts)
        return drafts
