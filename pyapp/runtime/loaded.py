"""A model loaded on the GPU: what every family's engine runs on, returns and raises.

pyapp.engine's loading makes one (the file's family says which class: pyapp.engine.Engine for the
families that generate token by token, DiffusionGemma's DiffusionEngine for denoising) from

  family          what the file is (pyapp.families: its config, runner, reference, ...)
  runner          the one owner of the GPU state: plans, activations, KV cache (pyapp.runtime.runner)
  memory_plan     the plan it was loaded with (pyapp.runtime.memory.MemoryPlan)
  adapters        the LoRA adapters applied (pyapp.runtime.adapters.GpuAdapters) or None

and keeps the record of what the KV cache holds (`cached`, `kv_end`), so a prompt that starts with
the cached tokens (a chat's next turn) only pays for its new ones. The work is written once as
generators of requests (pyapp.steps), run by `drive` natively and `drive_async` in the browser.

This module sits below pyapp.engine and the families (pyapp.families): both build on it, neither
is imported by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import Gemma4Error
from ..steps import drive, drive_async
from .requests import handler
from .soft_tokens import SoftTokensError, check_runs, step_bounds, step_share


class EngineError(Gemma4Error):
    """A request the engine cannot serve (prompt too long, model too big, bad file)."""


@dataclass
class GenerationResult:
    tokens: list = field(default_factory=list)
    text: str = ""
    stop_reason: str = ""            # stop | length | cancelled | context
    prompt_tokens: int = 0           # tokens evaluated for this prompt (after cache reuse)
    cached_tokens: int = 0           # prompt tokens reused from the KV cache
    prefill_s: float = 0.0
    decode_s: float = 0.0
    # streamed experts: the cache's ExpertCounts at the start, the first token, the end
    expert_counts: list = field(default_factory=list)
    decode_steps: int = 0            # layer steps after the prompt's: one token each, or a token and its drafts
    drafted: int = 0                 # speculative decoding: tokens drafted by prompt lookup
    accepted: int = 0                # of those, the ones the model's greedy choice confirmed
    denoise: object = None           # a denoising family's own record (DiffusionGemma: its DenoiseResult)

    @property
    def tokens_per_step(self) -> float:
        """Tokens each decode step gave (the first token comes out of prefill)."""
        n = len(self.tokens) - 1
        return n / self.decode_steps if self.decode_steps and n > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        n = len(self.tokens) - 1     # the first token comes out of prefill
        return n / self.decode_s if self.decode_s and n > 0 else 0.0


class LoadedModel:
    # a draft source in place of prompt lookup when speculating: drafter(prompt) -> an object with append(token)
    # and draft(eng, tok, fed, limit, state_row) (steps -> drafts), as pyapp.engine.speculative's LookupDrafts;
    # only an Engine speculates, but every loaded model answers whether it has one (the page asks)
    drafter = None

    def __init__(self, dev, gguf, runner, family, memory_plan=None, adapters=None, load_bytes_per_s: float = 0.0):
        self.dev, self.gguf, self.runner = dev, gguf, runner
        self.family = family              # pyapp.families.family.Family: what the file is
        self.config = runner.cfg
        self.context_length = runner.ctx
        self.memory_plan = memory_plan
        self.adapters = adapters
        self.load_bytes_per_s = load_bytes_per_s      # file -> GPU rate of the load: what streamed experts may expect
        self.cached: list[int] = []       # tokens whose K/V are in the cache, in order
        self.kv_end = 0                   # furthest position written (decoded ahead, rejected drafts: past cached)
        self._tokenizer = None

    # -- steps, driven sync or async ---------------------------------------------
    def drive(self, steps):
        """Run steps (generators of requests, pyapp.steps) to their result, natively."""
        return drive(steps, handler(self.dev, self.gguf.source))

    async def drive_async(self, steps):
        """Run steps to their result in the browser, where file copies and readbacks are awaited."""
        return await drive_async(steps, handler(self.dev, self.gguf.source, asynchronous=True))

    # -- the tokenizer -------------------------------------------------------------
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from ..tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        return self._tokenizer

    def decoder(self):
        """A streaming detokenizer, or None for a GGUF without a vocabulary (benchmark models)."""
        from ..tokenizer import TokenizerError
        try:
            return self.tokenizer.stream()
        except TokenizerError:
            return None

    def stop_ids(self) -> set:
        try:
            return set(self.tokenizer.stop_ids)
        except Exception:
            eos = self.gguf.metadata.get("tokenizer.ggml.eos_token_id")
            return {eos} if eos is not None else set()

    # -- what the KV cache holds -----------------------------------------------------
    @property
    def n_past(self) -> int:
        return len(self.cached)

    def reset(self) -> None:
        self.cached = []
        self.kv_end = 0

    def reusable(self, prompt: list) -> int:
        """How many leading prompt tokens can keep their cached K/V (prompt: as the cache records it,
        pyapp.runtime.soft_tokens.cache_keys)."""
        n = 0
        for a, b in zip(self.cached, prompt):
            if a != b:
                break
            n += 1
        n = min(n, len(prompt) - 1)          # the last prompt token must run to give logits
        rolled_back = max(len(self.cached), self.kv_end) - n
        if rolled_back > 0 and not self.runner.keeps_window(rolled_back):
            return 0
        return n

    def check_ids(self, tokens: list[int]) -> None:
        """Ids outside the vocabulary would read past the embedding tables on the GPU."""
        bad = [t for t in tokens if not 0 <= t < self.config.vocab_size]
        if bad:
            raise EngineError(f"token id {bad[0]} is outside the vocabulary (0..{self.config.vocab_size - 1})")

    def check_soft(self, tokens: list[int], soft) -> tuple:
        """The ids checked against the vocabulary and the soft tokens against the prompt: the runs, sorted."""
        self.check_ids(tokens)
        try:
            return check_runs(soft, len(tokens))
        except SoftTokensError as e:
            raise EngineError(str(e)) from e

    def step(self, tokens: list[int], pos: int, few: bool = False, soft=()):
        """Steps: one step of tokens through the layers at positions pos.. (few: a token and its drafts;
        soft: the step's share of soft tokens, soft_tokens.step_share)."""
        yield from self.runner.step(tokens, pos, few=few, soft=soft)
        self.kv_end = max(self.kv_end, pos + len(tokens))

    def step_sampled(self, pos: int):
        """Steps: a one-token step at pos on the id the GPU's sampler left, before the CPU has read it."""
        yield from self.runner.step_sampled(pos)
        self.kv_end = max(self.kv_end, pos + 1)

    def feed(self, tokens: list[int], pos: int, after_each=None, soft=()):
        """Steps: tokens through the layers in steps of up to chunk tokens, the first at `pos`; after
        each step, `after_each(n)`'s steps (its n rows are then the runner's last step). Returns the last n.
        soft: the prompt's soft tokens (SoftRun, at prompt positions), each step given its share.
        kv_end keeps the furthest position written since the cache was last filled from position 0:
        a sliding layer's ring may still hold what an earlier turn wrote past this prompt's end (a token
        decoded ahead, rejected drafts), over positions a later turn rolling back further needs."""
        if pos == 0:             # every position before the end is written again, after anything older
            self.kv_end = 0
        n = 0
        whole = any(r.both_ways for r in soft) and self.config.image_attention_both_ways
        try:
            bounds = step_bounds(len(tokens), self.runner.chunk, pos, soft, whole, self.runner.prompt_steps)
        except SoftTokensError as e:
            raise EngineError(str(e)) from e
        for i, end in bounds:
            part = tokens[i:end]
            yield from self.step(part, pos + i, soft=step_share(soft, pos + i, len(part)))
            n = len(part)
            if after_each:
                yield from after_each(n)
        return n

    def expert_counts(self):
        """The streamed experts' cache so far (pyapp.runtime.experts.ExpertCounts); None when every
        expert is resident."""
        cache = self.runner.experts
        return None if cache is None else cache.counts()

    # -- LoRA ------------------------------------------------------------------------
    def set_lora_scale(self, i: int, user_scale: float) -> None:
        """The user scale of loaded adapter i (0: off) from the next step on; the KV cache is dropped
        (its keys and values were made with the old scale)."""
        if self.adapters is None or not 0 <= i < len(self.adapters.adapters):
            raise EngineError(f"no LoRA adapter {i} is loaded")
        self.adapters.set_scale(i, user_scale)
        self.reset()

    def close(self) -> None:
        self.runner = None
        self.drafter = None           # an assistant drafter holds the runner too
