"""The next-token step loop: the prompt through the layers, then one token a step.

Each token is drawn on the GPU from the last step's row and read back, the step that feeds it to
the layers already submitted (decode ahead): the GPU never waits for the CPU's readback and
encoding. A token is fed after it is read only where that cannot be done: the per-layer embedding
table left in the file (the CPU reads the token's row), or the last token of the generation.
Speculative decoding (pyapp.engine.speculative) is this loop with drafts checked after each token.

    generation(eng, prompt, params, ...)   steps of one generation; returns its GenerationResult
    start(eng, prompt, soft)               the prompt (and its soft tokens) checked, the cached prefix kept
    prefill_prompt(eng, prompt, ...)       steps: the prompt's new tokens; the last one's row
    prefill(eng, tokens, pos, on_prefill)  steps: tokens through the layers, chunk by chunk
    draw(eng, row, ...)                    steps: the next token, its step submitted ahead where it can be
    Tokens                                 hands each token out: stops, limits, the streamed text
"""

from __future__ import annotations

import random
import time

from ..gpu import kernels as K
from ..runtime.loaded import EngineError, GenerationResult
from ..runtime.soft_tokens import cache_keys, reusable_before_runs
from ..sampling import SamplingParams


def generation(eng, prompt: list[int], params: SamplingParams, on_token=None, should_stop=None, stop_ids=None,
               on_prefill=None, soft=()):
    """Steps of one generation (params validated); returns its GenerationResult."""
    prompt, soft, result = start(eng, prompt, soft)
    tokens = Tokens(eng, prompt, params, result, on_token, should_stop, stop_ids)
    rng = random.Random(params.seed)
    clock = Clock(eng, result)
    row = yield from prefill_prompt(eng, prompt, soft, result, on_prefill)
    while True:
        tok, fed = yield from draw(eng, row, params, tokens, rng, clock)
        if tokens.emit(tok):
            break
        if not fed:
            yield from step_token(eng, tok, result)
        eng.cached.append(tok)
        row = 0
    return finish(eng, tokens, result)


def start(eng, prompt: list[int], soft=()) -> tuple[list[int], tuple, GenerationResult]:
    """The prompt as ids and its soft tokens (pyapp.runtime.soft_tokens.SoftRun: an image's, in place of
    its placeholders), checked; the cached tokens it starts with are kept (eng.cached: ids, and the
    soft tokens' slots), the rest will be evaluated."""
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise EngineError("empty prompt")
    if len(prompt) >= eng.context_length:
        raise EngineError(f"prompt of {len(prompt)} tokens does not fit the context of {eng.context_length}")
    soft = eng.check_soft(prompt, soft)
    keys = cache_keys(prompt, soft)
    reuse = reusable_before_runs(eng.reusable(keys), soft)
    eng.cached = keys[:reuse]
    return prompt, soft, GenerationResult(cached_tokens=reuse, prompt_tokens=len(prompt) - reuse)


def prefill_prompt(eng, prompt: list[int], soft: tuple, result: GenerationResult, on_prefill=None):
    """Steps: the prompt's tokens past the cached ones through the layers; then eng.cached holds the
    whole prompt. Returns the last token's row in its step."""
    row = yield from prefill(eng, prompt[result.cached_tokens:], result.cached_tokens, on_prefill, soft)
    eng.cached = cache_keys(prompt, soft)
    return row


def prefill(eng, tokens: list[int], pos: int, on_prefill=None, soft=()):
    """Steps: tokens through the layers; returns the row of the last token in its step.
    on_prefill(done, total): after each chunk's GPU work but the last (whose end the first token
    shows), read one chunk late: chunk i's mark is awaited once chunk i + 1 is submitted, so the
    GPU never waits for the CPU."""
    r = eng.runner
    if on_prefill is None or len(tokens) <= min(r.prompt_steps):     # one step: nothing to report before it ends
        return (yield from eng.feed(tokens, pos, soft=soft)) - 1
    marked = []

    def mark(n: int):
        k = len(marked) % 2
        r.mark(k)
        marked.append((marked[-1] if marked else 0) + n)
        if len(marked) > 1:
            yield from r.read_mark(1 - k)
            on_prefill(marked[-2], len(tokens))
    return (yield from eng.feed(tokens, pos, after_each=mark, soft=soft)) - 1


def draw(eng, row: int, params: SamplingParams, tokens: "Tokens", rng: random.Random, clock: "Clock"):
    """Steps: the token after `row` of the last step, drawn on the GPU and read; returns (token, fed).
    Decode ahead: the sampled id is fed to the next step on the GPU before it is read (fed), so the
    GPU never waits for the CPU's readback and encoding. Wasted only on the last token."""
    r, result = eng.runner, tokens.result
    recent = tokens.history[-params.repeat_last_n:] if params.repeat_last_n > 0 and params.repeat_penalty != 1 else []
    r.sample(row, K.pack_sample_params(params.temperature, params.top_k, params.top_p, params.min_p,
                                       params.repeat_penalty, recent, rng.random()))
    pos = len(eng.cached)
    fed = r.decodes_ahead and len(result.tokens) + 1 < params.token_limit and pos + 1 < eng.context_length
    if fed:
        yield from eng.step_sampled(pos)
        result.decode_steps += 1
    tok = yield from r.read_token()
    clock.token_read()
    return tok, fed


def step_token(eng, tok: int, result: GenerationResult):
    """Steps: a token the CPU knows, whose step did not run ahead, through the layers."""
    yield from eng.step([tok], len(eng.cached))
    result.decode_steps += 1


def finish(eng, tokens: "Tokens", result: GenerationResult) -> GenerationResult:
    count_experts(eng, result)
    tokens.flush()
    return result


def count_experts(eng, result: GenerationResult) -> None:
    counts = eng.expert_counts()
    if counts is not None:
        result.expert_counts.append(counts)


class Tokens:
    """Hands out a generation's tokens: each one's text streamed to on_token, the stop reason set
    once one ends it (a stop id, max_tokens, should_stop(), the context's end)."""

    def __init__(self, eng, prompt: list[int], params: SamplingParams, result: GenerationResult, on_token=None,
                 should_stop=None, stop_ids=None, on_new=None):
        self.result, self.limit, self.on_token, self.should_stop = result, params.token_limit, on_token, should_stop
        self.stops = eng.stop_ids() if stop_ids is None else set(stop_ids)
        self.decoder = eng.decoder()
        self.room = eng.context_length - len(prompt)      # positions left after the prompt
        self.history = list(prompt)                       # the prompt and the tokens so far (repeat penalty)
        self.on_new = on_new                              # sees each token handed out (speculation's drafter)

    def emit(self, tok: int) -> bool:
        """Hand out the next token; True when generation ends with it (result.stop_reason says why)."""
        result = self.result
        if tok in self.stops:
            result.stop_reason = "stop"
            return True
        result.tokens.append(tok)
        self.history.append(tok)
        if self.on_new:
            self.on_new(tok)
        piece = self.decoder.push(tok) if self.decoder else ""
        result.text += piece
        if self.on_token:
            self.on_token(tok, piece)
        if len(result.tokens) >= self.limit:
            result.stop_reason = "length"
        elif self.should_stop and self.should_stop():
            result.stop_reason = "cancelled"
        elif len(result.tokens) >= self.room:
            result.stop_reason = "context"
        return bool(result.stop_reason)

    def flush(self) -> None:
        """The text the detokenizer still holds (an incomplete character at the end)."""
        tail = self.decoder.flush() if self.decoder else ""
        if tail:
            self.result.text += tail
            if self.on_token:
                self.on_token(None, tail)


class Clock:
    """A generation's time: prefill until its first token is read, decode from then to the latest token;
    with streamed experts, the cache's counts at the start and at the first token."""

    def __init__(self, eng, result: GenerationResult):
        self.eng, self.result = eng, result
        count_experts(eng, result)
        self.t0 = time.perf_counter()

    def token_read(self) -> None:
        now = time.perf_counter()
        if not self.result.tokens and not self.result.prefill_s:
            self.result.prefill_s = now - self.t0
            count_experts(self.eng, self.result)
            self.t0 = now
        else:
            self.result.decode_s = now - self.t0
