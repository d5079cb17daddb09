"""An assistant drafter as the engine's draft source (`Engine.drafter`): after the newest token, a round of
drafts from the target's state and K/V.

  GpuDrafts(GpuDrafter)        the drafter on the GPU (runner.py): a round is one submit, its drafts read with
                               the step that checks them (DraftsOnGpu), prompt lookup where the text repeats
  reference.ReferenceDrafts    the numpy drafter on the CPU, fed the target's state and K/V read back from the
                               GPU (CPython): what shows the GPU's rows and positions are the right ones

Both draft nothing where the target's sliding ring no longer holds the window + 1 keys before the token
(a small ring, or rejected drafts written past the kept tokens, overwrote one: `keeps_keys`), and nothing at
position 0. `drafts_made` keeps the last rounds' drafts.

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


class DraftsOnGpu:
    """A drafter's round not run yet, whose drafts go straight into the step that checks them
    (pyapp.engine.speculative.verify_drafted): the CPU reads them only with that step's greedy ids, from the
    step's own ids (made: what they were)."""

    def __init__(self, source: "GpuDrafts", token: int, position: int, row: int | None, n: int):
        self.source, self.token, self.position, self.row, self.n = source, token, position, row, n

    def submit(self, into: int | None) -> None:
        """The round, its drafts also copied to the target's step ids from index `into` (None: not)."""
        self.source.drafter.submit(self.token, self.position, self.row, self.n, into)

    def made(self, drafts: list[int]) -> None:
        """The round's drafts as the checking step read them back."""
        self.source.drafts_made.append(drafts)


class GpuDrafts(DraftSource):
    """The drafter on the GPU; where the text repeats (its last MAX_NGRAM tokens occurred before in the
    generation's text), prompt lookup's drafts instead: free, and right more often there. A round's drafts go
    into the checking step on the GPU (DraftsOnGpu) where the step's ids need not be known on the CPU (a per-layer
    embedding table left in the file needs them: there a round is read back first)."""

    def __init__(self, drafter, lookup: bool = True):
        super().__init__(drafter.runner.cfg, drafter.cfg.sliding_keys)
        self.drafter = drafter
        self.uses_lookup = lookup                    # False: the drafter drafts every round
        self.lookup: PromptLookup | None = None      # the generation's text
        self.lookup_rounds = 0                       # rounds prompt lookup drafted

    def __call__(self, prompt: list[int]) -> "GpuDrafts":
        self.lookup = PromptLookup(prompt) if self.uses_lookup else None
        return self

    def append(self, token: int) -> None:
        if self.lookup is not None:
            self.lookup.append(token)

    def draft(self, eng, tok: int, fed: bool, limit: int, state_row):
        """Steps: up to `limit` drafts after tok: prompt lookup's where the text repeats, else a round on the
        GPU from the final-normed row state_row (DraftsOnGpu where they can stay there)."""
        if self.lookup is not None and limit > 0:
            repeated = self.lookup.draft(limit, min_ngram=MAX_NGRAM)
            if repeated:
                self.lookup_rounds += 1
                return repeated
        position = self.position(eng, fed)
        if limit <= 0 or position == 0 or not self.keeps_keys(eng, position):
            return []
        pending = DraftsOnGpu(self, tok, position, state_row, min(limit, MAX_DRAFTS))
        if eng.runner.decodes_ahead:
            return pending
        pending.submit(None)
        return (yield from pending.read())
