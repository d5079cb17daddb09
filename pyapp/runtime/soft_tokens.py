"""An encoder's output in a prompt: soft tokens (an image's, projected into the text model's width)
that take the place of a run of placeholder tokens.

    run = SoftRun(at=5, rows=features, n=280, key=digest)   # prompt positions 5..284, rows on the GPU

On a model whose images attend both ways (Gemma4Config.image_attention_both_ways: 26B-A4B, 31B, the 12B)
an image's soft tokens see each other both ways on the sliding layers; a clip's never do (`both_ways`
False: transformers' block masks cover image and video tokens only, llama.cpp decodes audio causally).

The text model embeds those positions from the rows instead of the token table (the per-layer
embeddings from the pad id, as transformers' Gemma4Model does); pyapp.runtime.state copies each step's
share of the rows in, so the plans never change. `key` says what the rows are of (the image and the
budget it was encoded at): the KV cache keeps a prefix only where the same images sit at the same places.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Gemma4Error


class SoftTokensError(Gemma4Error, ValueError):
    """Soft tokens that do not fit the prompt they are placed in."""


@dataclass(frozen=True)
class SoftRun:
    at: int              # prompt position of its first row
    rows: object         # GPU Buffer: f32 [n, hidden]
    n: int
    key: str             # what the rows are of: equal keys, equal rows
    both_ways: bool = True   # its rows see each other both ways where the model's images do (an image's; a clip's not)

    @property
    def end(self) -> int:
        return self.at + self.n


@dataclass(frozen=True)
class SoftSlot:
    """The cache's record of a position that held row `row` of the soft tokens `key` (never equal to a token id)."""
    key: str
    row: int


def placeholder_runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each run of `token` ids in the prompt."""
    runs, i = [], 0
    while i < len(ids):
        if ids[i] != token:
            i += 1
            continue
        j = i
        while j < len(ids) and ids[j] == token:
            j += 1
        runs.append((i, j - i))
        i = j
    return runs


def placeholder_starts(ids: list[int], sizes: list[int], token: int, kind: str = "image") -> list[int]:
    """Where each encoded input's soft tokens start in the prompt: the i-th run of `token` ids (the
    image's or the clip's soft token, by `kind`) holds input i, and must be exactly as long as its soft
    tokens (sizes[i])."""
    runs = placeholder_runs(ids, token)
    if len(runs) != len(sizes):
        raise SoftTokensError(f"the prompt holds {len(runs)} runs of the {kind} token {token} for {len(sizes)} "
                              f"{kind}s")
    for (at, n), size in zip(runs, sizes):
        if n != size:
            raise SoftTokensError(f"the placeholder run at token {at} is {n} long; its {kind} has {size} soft tokens")
    return [at for at, _ in runs]


def runs_at(ids: list[int], encoded: list, token: int, kind: str = "image", both_ways: bool = True) -> list[SoftRun]:
    """The SoftRun of each encoded input (its rows, n, key) at its placeholder run (placeholder_starts)."""
    starts = placeholder_starts(ids, [e.n for e in encoded], token, kind)
    return [SoftRun(at, e.rows, e.n, e.key, both_ways) for at, e in zip(starts, encoded)]


def check_runs(runs, prompt_length: int) -> tuple:
    """The runs sorted, checked to lie inside the prompt, apart, and before its last token (which runs
    alone as a one-token step when a prompt fills its chunks exactly: those plans embed no soft tokens)."""
    runs = tuple(sorted(runs, key=lambda r: r.at))
    end = 0
    for r in runs:
        if r.n < 1 or r.at < end or r.end > prompt_length - 1:
            raise SoftTokensError(f"soft tokens at positions {r.at}..{r.end - 1} do not fit a prompt of "
                                  f"{prompt_length} tokens (apart, before its last token)")
        end = r.end
    return runs


def cache_keys(prompt: list[int], runs) -> list:
    """The prompt as the KV cache records it: each soft position as its SoftSlot, the rest as ids."""
    keys = list(prompt)
    for r in runs:
        for i in range(r.n):
            keys[r.at + i] = SoftSlot(r.key, i)
    return keys


def step_share(runs, pos0: int, n: int) -> list[tuple[int, object, int, int, int]]:
    """The soft rows a step of n tokens at pos0 holds: (step row, rows buffer, first row, count, the step
    row of its run's last token, or None for a run whose rows see no key ahead: a clip's) each."""
    out = []
    for r in runs:
        lo, hi = max(r.at, pos0), min(r.end, pos0 + n)
        if lo < hi:
            out.append((lo - pos0, r.rows, lo - r.at, hi - lo, r.end - 1 - pos0 if r.both_ways else None))
    return out


def step_bounds(n_tokens: int, chunk: int, pos: int, runs, whole: bool, sizes=()) -> list[tuple[int, int]]:
    """(start, end) of each step feeding n_tokens tokens at pos, up to chunk each; sizes (largest first): the
    step plans, each step the largest the tokens left fill (a long prompt's tail in the usual steps, not in a
    wide one mostly idle; fewer tokens than any: one step); whole: no run split between two steps (where an
    image's tokens see each other both ways, all of them must be in the step that computes them), so every
    step is up to chunk."""
    out, i = [], 0
    while i < n_tokens:
        left = n_tokens - i
        step = chunk if whole else next((s for s in sizes if s <= left), chunk)
        end = min(i + step, n_tokens)
        for r in (r for r in runs if r.both_ways) if whole else ():
            a, b = r.at - pos, r.end - pos
            if a < end < b:
                if a <= i:
                    raise SoftTokensError(f"an image of {r.n} soft tokens does not fit one step of {chunk} tokens: "
                                          "choose a smaller image budget, or load the model with a larger chunk")
                end = a
                break
        out.append((i, end))
        i = end
    return out


def reusable_before_runs(n: int, runs) -> int:
    """n cached positions cut back to the start of a run they would end inside."""
    for r in runs:
        if r.at < n < r.end:
            return r.at
    return n
