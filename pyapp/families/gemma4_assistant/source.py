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

from ...prompt_lookup import MAX_NGRAM, PromptLookup
from .config import kv_layer


class DraftSource:
    """What both sources share: a source per generation (nothing kept between tokens: the drafter reads the
    target), where a round drafts, and whether the target's rings still hold its keys."""

    def __init__(self, target_config):
        self.window = target_config.sliding_window
        self.sliding_source = kv_layer(target_config, True)
        self.full_source = kv_layer(target_config, False)
        self.drafts_made: list[list[int]] = []      # each round's drafts (tests compare them with the reference's)

    def __call__(self, prompt: list[int]) -> "DraftSource":
        return self

    def append(self, token: int) -> None:
        pass

    @staticmethod
    def position(eng, fed: bool) -> int:
        """The newest token's position (its K/V, when its step ran ahead, is not read)."""
        return len(eng.cached) - 1 if fed else len(eng.cached)

    def first_sliding(self, position: int) -> int:
        """The first position a sliding layer's query at `position` sees (window + 1 keys before it)."""
        return max(0, position - self.window - 1) if self.window else 0

    @staticmethod
    def holds(eng, layer: int, first: int) -> bool:
        """Whether layer's cache still holds position `first` (a ring keeps the last `slots` written)."""
        return first >= eng.kv_end - eng.runner.state.kv[layer].slots


class GpuDrafts(DraftSource):
    """The drafter on the GPU; where the text repeats (its last MAX_NGRAM tokens occurred before in the
    generation's text), prompt lookup's drafts instead: free, and right more often there."""

    def __init__(self, drafter):
        super().__init__(drafter.runner.cfg)
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
        from .runner import MAX_DRAFTS
        if self.lookup is not None and limit > 0:
            repeated = self.lookup.draft(limit, min_ngram=MAX_NGRAM)
            if repeated:
                self.lookup_rounds += 1
                return repeated
        position = self.position(eng, fed)
        if limit <= 0 or position == 0 or not self.holds(eng, self.sliding_source, self.first_sliding(position)):
            return []
        drafts = yield from self.drafter.draft(tok, position, state_row, min(limit, MAX_DRAFTS))
        self.drafts_made.append(drafts)
        return drafts
