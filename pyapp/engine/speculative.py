"""Speculative decoding: the next-token loop with drafts checked in one step.

Greedy only (params.speculates). Each token the CPU knows is followed by the tokens a draft source
drafts after it (prompt lookup, pyapp.prompt_lookup, or the engine's `drafter`: an assistant
drafter), all run through the layers as one step (`verify`); the drafts that match the greedy choice
after the token before them are kept, plus that choice after the last one kept. The rest of the
step's K/V lie past the kept tokens, where later steps write again in order. No draft: the one-token
step of pyapp.engine.decode.

    generation(eng, prompt, params, ...)   steps of one generation; returns its GenerationResult
    verify(eng, tok, fed, drafts)          steps: the greedy choice after tok and after each draft
    verify_drafted(eng, tok, fed, pending) the same for a drafter's round not run yet (a source's draft() may
                                           give one: an object with submit(into) and read()), whose drafts
                                           go into the checking step on the GPU
    timed_step(eng, ids, pos, few)         steps: what one step costs alone (benchmarks)
"""

from __future__ import annotations

import random
import time

from ..prompt_lookup import PromptLookup
from ..runtime.loaded import GenerationResult
from ..sampling import SamplingParams
from . import decode


def generation(eng, prompt: list[int], params: SamplingParams, on_token=None, should_stop=None, stop_ids=None,
               on_prefill=None, soft=()):
    """Steps of one generation that drafts by prompt lookup or eng.drafter (params validated, params.speculates)."""
    prompt, soft, result = decode.start(eng, prompt, soft)
    source = eng.drafter(prompt) if eng.drafter is not None else LookupDrafts(prompt)
    tokens = decode.Tokens(eng, prompt, params, result, on_token, should_stop, stop_ids, on_new=source.append)
    rng = random.Random(params.seed)
    clock = decode.Clock(eng, result)
    row = yield from decode.prefill_prompt(eng, prompt, soft, result, on_prefill)
    tok, fed = None, False      # the newest token once read; fed: its step ran (decoded ahead)
    state_row = None            # the final-normed row of the token before tok: a greedy head row, None: the last head's
    while True:
        if tok is None:         # draw the token after `row` of the last step on the GPU
            tok, fed = yield from decode.draw(eng, row, params, tokens, rng, clock)
            state_row = None
            if tokens.emit(tok):
                break
            if fed:
                eng.cached.append(tok)
        limit = draft_limit(eng, params, result, len(prompt), fed)
        drafts = yield from source.draft(eng, tok, fed, limit, state_row)
        if hasattr(drafts, "submit"):      # a drafter's round on the GPU: drafted into the checking step
            drafts, ids = yield from verify_drafted(eng, tok, fed, drafts)
        elif drafts:
            ids = yield from verify(eng, tok, fed, drafts)
        if drafts:
            clock.token_read()
            result.decode_steps += 1
            if not fed:
                eng.cached.append(tok)
            n = 0
            while n < len(drafts) and drafts[n] == ids[n]:
                n += 1
            result.drafted, result.accepted = result.drafted + len(drafts), result.accepted + n
            if emit_kept(eng, tokens, drafts[:n]) or tokens.emit(ids[n]):
                break
            state_row = last_kept_row(fed, n)
            tok, fed = ids[n], False        # the greedy choice after the last kept token: known, not fed
            continue
        if not fed:
            yield from decode.step_token(eng, tok, result)
            eng.cached.append(tok)
        tok, row = None, 0
    return decode.finish(eng, tokens, result)


class LookupDrafts:
    """Prompt lookup as a draft source: what followed the latest earlier occurrence of the text's end."""

    def __init__(self, prompt: list[int]):
        self.lookup = PromptLookup(prompt)

    def append(self, token: int) -> None:
        self.lookup.append(token)

    def draft(self, eng, tok: int, fed: bool, limit: int, state_row):
        """Steps (none): up to `limit` drafts after tok."""
        return self.lookup.draft(limit)
        yield


def last_kept_row(fed: bool, n_kept: int):
    """Where a checking step left the final-normed row of its last kept token: the greedy head's row
    (the step ran tok, then the drafts: row n_kept), or, tok's step having run ahead (the step ran the
    drafts only), row n_kept - 1; None when that token is tok itself, whose row the one-row head normed."""
    if not fed:
        return n_kept
    return n_kept - 1 if n_kept else None


def emit_kept(eng, tokens: decode.Tokens, kept: list[int]) -> bool:
    """Hand out the drafts the model confirmed (their K/V are in the cache); True when one ends generation."""
    for d in kept:
        if tokens.emit(d):
            return True
        eng.cached.append(d)
    return False


def draft_limit(eng, params: SamplingParams, result: GenerationResult, prompt_len: int, fed: bool) -> int:
    """The most drafts worth checking after the newest token: a step emits at most the drafts + 1
    tokens, within max_tokens and the context; its tokens (the newest too unless fed) fit one step."""
    room = min(params.token_limit - len(result.tokens), eng.context_length - prompt_len - len(result.tokens))
    rows = eng.runner.head_rows - (0 if fed else 1)
    return int(max(0, min(params.speculate, room - 1, rows)))


def verify(eng, tok: int, fed: bool, drafts: list[int]):
    """Steps: the drafts after tok (and tok itself unless its step ran) through the layers as one
    step at the next positions, then the greedy choice after tok and after each draft; returns
    those len(drafts) + 1 ids. fed: tok's step ran ahead and its row is still the runner's last, so its
    choice comes from the one-token head (temperature 0: the argmax) before this step overwrites it."""
    r = eng.runner
    if fed:
        r.sample(0)
    feed = drafts if fed else [tok] + drafts
    yield from eng.step(feed, len(eng.cached), few=True)
    return (yield from r.greedy(1 if fed else 0, len(drafts) + 1))


def verify_drafted(eng, tok: int, fed: bool, pending):
    """Steps: verify for drafts a drafter makes on the GPU now (pending: DraftsOnGpu): the step's ids are
    written with places for them, the drafter's round (submitted after) fills them, and the step runs behind
    it, so the CPU waits once, for the greedy ids and the drafts in one readback; returns (drafts, ids)."""
    r = eng.runner
    first = 0 if fed else 1              # where the drafts go among the step's ids: after tok unless its step ran
    feed = [tok] * first + [0] * pending.n
    pos = len(eng.cached)
    r.write_step(feed, pos)
    pending.submit(into=first)
    if fed:
        r.sample(0)
    yield from r.run_layers(len(feed), few=True)
    eng.kv_end = max(eng.kv_end, pos + len(feed))
    ids, drafts = yield from r.greedy_and_step_ids(1 if fed else 0, pending.n + 1, first, pending.n)
    pending.made(drafts)
    return drafts, ids


def timed_step(eng, ids: list[int], pos: int, few: bool):
    """Steps: one step of ids at positions pos.. with its greedy head and the readback of its ids, alone
    (no decode ahead to hide the readback); returns its seconds. few: in the plan speculation uses
    (kernels for a few tokens), else in the prefill plan. The K/V it writes are not recorded as cached:
    reset before generating again."""
    t0 = time.perf_counter()
    yield from eng.runner.step(ids, pos, few=few)
    yield from eng.runner.greedy(0, len(ids))
    return time.perf_counter() - t0
