"""The engine: a Gemma 4 GGUF on the GPU, prompt in, tokens out.

    eng = Engine.open("model.gguf")                     # CPython, native wgpu
    eng = await Engine.open_async(gguf, device)         # Pyodide, navigator.gpu
    res = eng.generate(prompt_ids, SamplingParams(temperature=0), on_token=print)

Weights go from the file to the GPU in chunks (in the browser Blob.slice ->
writeBuffer inside JS), never whole through Python. The KV cache is allocated
once for `context_length`; a new prompt that starts with the tokens already
cached (the next turn of a chat) only pays for its new tokens.

Loading, generation, logits and the benchmark are each written once, as
generators of requests (pyapp.runtime.requests: copy file bytes to the GPU,
read a GPU buffer), driven by pyapp.steps: `drive` natively, `drive_async` in
the browser, where reading a buffer back is asynchronous.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

from .gpu import Device, GPUError
from .gpu import kernels as K
from .model.config import ConfigError, Gemma4Config
from .model.logits import Logits
from .model.weights import WeightsError, bind
from .runtime.requests import FileToGpu, ReadFile, ReadGpu, ReadMapped, handler
from .runtime.runner import Runner
from .runtime.upload import ModelError, binding_limit, f32_vector, plan_uploads
from .sampling import DEFAULT_CONTEXT, ParamError, SamplingParams, check_context_length  # noqa: F401 (re-exported)
from .steps import drive, drive_async

# The most tokens one prefill step takes. Long prompts need wide steps to fill a big GPU (on an
# H100, E2B prefill: 928 tok/s in steps of 64, 3026 in steps of 512); short ones take a 64-token plan.
DEFAULT_CHUNK = 512


class EngineError(Exception):
    """A request the engine cannot serve (prompt too long, model too big, bad file)."""


def _check_context_fits(dev: Device, cfg, ctx: int) -> None:
    """Each global layer's K and V caches hold the whole context in one GPU binding
    (pyapp.runtime.state): refuse a context the GPU cannot bind before any upload."""
    per_token = max((4 * lc.n_kv_heads * lc.head_dim for lc in cfg.layers if lc.owns_kv and not lc.sliding),
                    default=0)
    limit = binding_limit(dev)
    if per_token and ctx * per_token > limit:
        raise EngineError(f"a context of {ctx} tokens needs {ctx * per_token / 2**20:,.0f} MiB of KV cache per "
                          f"layer in one GPU buffer; this GPU binds at most {limit / 2**20:,.0f} MiB: choose a "
                          f"context of at most {limit // per_token} tokens")


@dataclass
class GenerationResult:
    tokens: list = field(default_factory=list)
    text: str = ""
    stop_reason: str = ""            # stop | length | cancelled | context
    prompt_tokens: int = 0           # tokens evaluated for this prompt (after cache reuse)
    cached_tokens: int = 0           # prompt tokens reused from the KV cache
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        n = len(self.tokens) - 1     # the first token comes out of prefill
        return n / self.decode_s if self.decode_s and n > 0 else 0.0


class Engine:
    def __init__(self, dev: Device, gguf, runner: Runner):
        self.dev, self.gguf, self.runner = dev, gguf, runner
        self.config: Gemma4Config = runner.cfg
        self.context_length = runner.ctx
        self.cached: list[int] = []       # tokens whose K/V are in the cache, in order
        self.kv_end = 0                   # positions written so far (a step decoded ahead may pass cached)
        self._tokenizer = None

    # -- loading, written once ---------------------------------------------------
    @classmethod
    def open(cls, model, backend: str = "native", context_length: int | None = None, chunk: int = DEFAULT_CHUNK,
             progress=None, cancelled=None, device: Device | None = None, ple_in_file: bool = False) -> "Engine":
        """Load a GGUF (path, ByteSource or parsed GGUFFile) onto a native GPU device.
        ple_in_file: keep the per-layer embedding table (E2B/E4B) in the file, one row read per token."""
        from .gguf import GGUFFile, read_gguf
        from .gpu import get_device
        gguf = model if isinstance(model, GGUFFile) else read_gguf(model)
        dev = device or get_device(backend)
        return drive(cls._load(dev, gguf, context_length, chunk, progress, cancelled, ple_in_file),
                     handler(dev, gguf.source))

    @classmethod
    async def open_async(cls, gguf, device: Device, context_length: int | None = None, chunk: int = DEFAULT_CHUNK,
                         progress=None, cancelled=None, ple_in_file: bool = False) -> "Engine":
        """Load in the browser. gguf.source: a sync ByteSource (FileReaderSync, for per-token
        PLE rows) with a `.blob` (the File) so weights go Blob -> GPU inside JS."""
        return await drive_async(cls._load(device, gguf, context_length, chunk, progress, cancelled, ple_in_file),
                                 handler(device, gguf.source, asynchronous=True))

    @classmethod
    def _load(cls, dev: Device, gguf, context_length: int | None, chunk: int, progress, cancelled,
              ple_in_file: bool = False):
        """Steps: plan the layout, copy every tensor to the GPU, build the plans; returns the Engine."""
        try:
            cfg = Gemma4Config.from_gguf(gguf)
            bound = bind(cfg, gguf.tensors)
        except (ConfigError, WeightsError) as e:
            raise EngineError(str(e)) from e
        ctx = check_context_length(context_length, cfg.context_length)
        _check_context_fits(dev, cfg, ctx)
        need = sum(t.nbytes for t in gguf.tensors.values()) - (bound.ple_token_embd.nbytes if ple_in_file else 0)
        limit = dev.limits.get("max_buffer_size", 0) * 64   # WebGPU exposes no memory size; a sanity bound
        if limit and need > limit:
            raise EngineError(f"the model needs {need / 2**30:.1f} GiB of GPU memory; this adapter cannot hold it")
        try:
            layout, uploads = plan_uploads(dev, cfg, bound, ple_in_file)
        except GPUError as e:
            raise EngineError(f"out of GPU memory while allocating the weights: {e}") from e
        except ModelError as e:
            raise EngineError(str(e)) from e

        total, done, t0 = sum(u.n for u in uploads), 0, time.perf_counter()
        for u in uploads:
            if cancelled and cancelled():
                raise EngineError("loading cancelled")
            if u.to_f32 is None:
                yield FileToGpu(u.buffer, u.offset, u.n, u.dst_offset)
            else:
                try:
                    dev.write(u.buffer, f32_vector((yield ReadFile(u.offset, u.n)), u.to_f32), u.dst_offset)
                except ModelError as e:
                    raise EngineError(str(e)) from e
            done += u.n
            if progress:
                progress(done, total, time.perf_counter() - t0)

        try:
            runner = Runner(dev, cfg, layout, gguf.source, ctx, chunk)
            # build the plans now: shader compilation belongs to loading, not to the first reply
            for size in runner.step_sizes:
                runner.layers_plan(size)
            if runner.decodes_ahead:
                runner.layers_plan(1, sampled=True)
            runner.head_plan(0, sample=True)
        except ModelError as e:
            raise EngineError(str(e)) from e
        except GPUError as e:
            raise EngineError(f"the GPU rejected the model: {e}") from e
        return cls(dev, gguf, runner)

    def _drive(self, steps):
        return drive(steps, handler(self.dev, self.gguf.source))

    async def _drive_async(self, steps):
        return await drive_async(steps, handler(self.dev, self.gguf.source, asynchronous=True))

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from .tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        return self._tokenizer

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def reset(self) -> None:
        self.cached = []
        self.kv_end = 0

    # -- the step loop, written once ----------------------------------------------
    def _reusable(self, prompt: list[int]) -> int:
        """How many leading prompt tokens can keep their cached K/V."""
        n = 0
        for a, b in zip(self.cached, prompt):
            if a != b:
                break
            n += 1
        n = min(n, len(prompt) - 1)          # the last prompt token must run to give logits
        rolled_back = max(len(self.cached), self.kv_end) - n
        if rolled_back > 0:
            # a sliding layer's ring may have overwritten the window before n
            for lc in self.config.layers:
                slots = self.runner.kv_slots(lc)
                if lc.sliding and slots < self.context_length and rolled_back > slots - self.config.sliding_window:
                    return 0
        return n

    def _layer_steps(self, tokens: list[int], pos: int):
        """Submit tokens through the layers in steps of up to chunk tokens, the first at `pos`;
        yields each step's token count once it is submitted (its rows are then in state.x)."""
        r = self.runner
        for i in range(0, len(tokens), r.chunk):
            part = tokens[i:i + r.chunk]
            r.write_step(part, pos + i)
            self.dev.submit(r.layers_plan(r.step_size(len(part))))
            self.kv_end = pos + i + len(part)
            yield len(part)

    def _prefill(self, tokens: list[int], pos: int) -> int:
        """Run tokens through the layers; returns the row of the last token in its step."""
        last = 0
        for last in self._layer_steps(tokens, pos):
            pass
        return last - 1

    def _read_token(self):
        """Step: the id the sampler wrote on the GPU."""
        data = yield ReadMapped(self.runner.state.token_readback, 0, 4)
        return int.from_bytes(data, "little")

    def _generate(self, prompt: list[int], params: SamplingParams, on_token, should_stop, stop_ids=None):
        """Steps of one generation; returns its GenerationResult."""
        params.validate()        # fields may have changed since it was made
        r = self.runner
        result = GenerationResult()
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise EngineError("empty prompt")
        if len(prompt) >= self.context_length:
            raise EngineError(f"prompt of {len(prompt)} tokens does not fit the context of {self.context_length}")
        self._check_ids(prompt)
        reuse = self._reusable(prompt)
        self.cached = prompt[:reuse]
        result.cached_tokens, result.prompt_tokens = reuse, len(prompt) - reuse
        rng = random.Random(params.seed)
        stops = self._stop_ids() if stop_ids is None else set(stop_ids)
        decoder = self._decoder()
        history = list(prompt)

        t0 = time.perf_counter()
        row = self._prefill(prompt[reuse:], reuse)
        self.cached = list(prompt)
        while True:
            recent = history[-params.repeat_last_n:] if params.repeat_last_n > 0 and params.repeat_penalty != 1 else []
            self.dev.write(r.state.sample_params, K.pack_sample_params(
                params.temperature, params.top_k, params.top_p, params.min_p, params.repeat_penalty,
                recent, rng.random()))
            self.dev.submit(r.head_plan(row, sample=True))
            # Decode ahead: feed the sampled id to the next step on the GPU before reading it, so the
            # GPU never waits for the CPU's readback and encoding. Wasted only on the last token.
            pos = len(self.cached)
            ahead = r.decodes_ahead and len(result.tokens) + 1 < params.token_limit and pos + 1 < self.context_length
            if ahead:
                r.write_position(pos)
                self.dev.submit(r.layers_plan(1, sampled=True))
                self.kv_end = max(self.kv_end, pos + 1)
            tok = yield from self._read_token()
            now = time.perf_counter()
            if not result.tokens and not result.prefill_s:
                result.prefill_s, t0 = now - t0, now
            else:
                result.decode_s = now - t0
            if tok in stops:
                result.stop_reason = "stop"
                break
            result.tokens.append(tok)
            history.append(tok)
            piece = decoder.push(tok) if decoder else ""
            result.text += piece
            if on_token:
                on_token(tok, piece)
            if len(result.tokens) >= params.token_limit:
                result.stop_reason = "length"
                break
            if should_stop and should_stop():
                result.stop_reason = "cancelled"
                break
            if len(self.cached) + 1 >= self.context_length:
                result.stop_reason = "context"
                break
            if not ahead:
                r.write_step([tok], len(self.cached))
                self.dev.submit(r.layers_plan(1))
                self.kv_end = len(self.cached) + 1
            self.cached.append(tok)
            row = 0
        tail = decoder.flush() if decoder else ""
        if tail:
            result.text += tail
            if on_token:
                on_token(None, tail)
        return result

    def _check_ids(self, tokens: list[int]) -> None:
        """Ids outside the vocabulary would read past the embedding tables on the GPU."""
        bad = [t for t in tokens if not 0 <= t < self.config.vocab_size]
        if bad:
            raise EngineError(f"token id {bad[0]} is outside the vocabulary (0..{self.config.vocab_size - 1})")

    def _decoder(self):
        """A streaming detokenizer, or None for a GGUF without a vocabulary (benchmark models)."""
        from .tokenizer import TokenizerError
        try:
            return self.tokenizer.stream()
        except TokenizerError:
            return None

    def _stop_ids(self) -> set:
        try:
            return set(self.tokenizer.stop_ids)
        except Exception:
            eos = self.gguf.metadata.get("tokenizer.ggml.eos_token_id")
            return {eos} if eos is not None else set()

    def generate(self, prompt: list[int], params: SamplingParams | None = None, on_token=None,
                 should_stop=None, stop_ids=None) -> GenerationResult:
        """Sample until a stop token (default: the tokenizer's end-of-turn ids), max_tokens,
        should_stop() or the context end. on_token(id, text) streams decoded text."""
        return self._drive(self._generate(prompt, params or SamplingParams(), on_token, should_stop, stop_ids))

    async def generate_async(self, prompt: list[int], params: SamplingParams | None = None, on_token=None,
                             should_stop=None, stop_ids=None) -> GenerationResult:
        return await self._drive_async(self._generate(prompt, params or SamplingParams(), on_token, should_stop,
                                                      stop_ids))

    # -- logits (tests, CLI) --------------------------------------------------------
    def _forward(self, tokens: list[int]):
        """Steps: logits of every position, from an empty cache."""
        r = self.runner
        tokens = [int(t) for t in tokens]
        if len(tokens) > self.context_length:
            raise EngineError(f"{len(tokens)} tokens do not fit the context of {self.context_length}")
        self._check_ids(tokens)
        self.reset()
        rows = []
        for n in self._layer_steps(tokens, 0):
            for row in range(n):
                self.dev.submit(r.head_plan(row, sample=False))
                rows.append((yield ReadGpu(r.state.logits, 0, 4 * self.config.vocab_size)))
        self.cached = tokens
        return Logits.from_rows(rows)

    def forward(self, tokens: list[int]) -> Logits:
        """Logits for every position (softcap applied), as the reference's forward returns them."""
        return self._drive(self._forward(tokens))

    async def forward_async(self, tokens: list[int]) -> Logits:
        return await self._drive_async(self._forward(tokens))

    # -- benchmark ------------------------------------------------------------------
    def _bench(self, prompt_tokens: int, gen_tokens: int, seed: int, repeat: int):
        """Steps: prefill and decode speed on random tokens (greedy, no early stop): a warm-up over
        the same prompt (every plan the runs use), then `repeat` runs; medians, and every run's."""
        rng = random.Random(seed)
        ids = [rng.randrange(4, self.config.vocab_size) for _ in range(min(prompt_tokens, self.context_length // 2))]
        runs = []
        for i in range(repeat + 1):
            self.reset()
            res = yield from self._generate(ids, SamplingParams(temperature=0, max_tokens=gen_tokens if i else 2),
                                            None, None, stop_ids=())
            if i:
                runs.append(res)
        return {"adapter": self.dev.describe(), "backend": self.dev.backend, "prompt_tokens": len(ids),
                "prefill_s": statistics.median(r.prefill_s for r in runs),
                "prefill_tok_s": statistics.median(r.prefill_tps for r in runs),
                "generated_tokens": len(runs[0].tokens),
                "decode_s": statistics.median(r.decode_s for r in runs),
                "decode_tok_s": statistics.median(r.decode_tps for r in runs),
                "runs": {"prefill_tok_s": [round(r.prefill_tps, 1) for r in runs],
                         "decode_tok_s": [round(r.decode_tps, 1) for r in runs]},
                "context_length": self.context_length, "model": self.config.describe()}

    def bench(self, prompt_tokens: int = 256, gen_tokens: int = 64, seed: int = 0, repeat: int = 3) -> dict:
        return self._drive(self._bench(prompt_tokens, gen_tokens, seed, repeat))

    async def bench_async(self, prompt_tokens: int = 256, gen_tokens: int = 64, seed: int = 0,
                          repeat: int = 3) -> dict:
        return await self._drive_async(self._bench(prompt_tokens, gen_tokens, seed, repeat))

    def close(self) -> None:
        self.runner = None
