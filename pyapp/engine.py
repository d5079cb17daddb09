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
import struct
import time
from dataclasses import dataclass, field

from .errors import Gemma4Error
from .gguf import GGUFError
from .gpu import Device, GPUError
from .gpu import kernels as K
from .model.config import ConfigError, Gemma4Config, model_config
from .model.logits import Logits
from .model.lora import LoraError, load_lora
from .model.weights import WeightsError, bind
from .prompt_lookup import PromptLookup
from .runtime.adapters import GpuAdapters
from .runtime.requests import FileToGpu, ReadFile, ReadGpu, ReadMapped, handler
from .runtime.runner import Runner
from .runtime.memory import PlanError, plan_memory
from .runtime.upload import ModelError, binding_limit, f32_vector, plan_uploads
from .sampling import DEFAULT_CONTEXT, ParamError, SamplingParams, check_context_length  # noqa: F401 (re-exported)
from .source import SourceError
from .steps import drive, drive_async

# The most tokens one prefill step takes. Long prompts need wide steps to fill a big GPU (on an
# H100, E2B prefill: 928 tok/s in steps of 64, 3026 in steps of 512); short ones take a 64-token plan.
DEFAULT_CHUNK = 512


def _mib(n: float | None) -> int | None:
    """MiB (fractions allowed: tests give tiny models tiny caches) -> bytes; EngineError for a size that is
    not a finite number of at least 0 (the CLI's --gpu-memory / --expert-cache and the page's field alike)."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not 0 <= n <= 1 << 40:   # NaN fails here too
        raise EngineError(f"a GPU memory size must be a number of MiB from 0 to {1 << 40}, got {n!r}")
    return int(n * 2**20)


class EngineError(Gemma4Error):
    """A request the engine cannot serve (prompt too long, model too big, bad file)."""


def _check_context_fits(limits: dict, cfg, ctx: int) -> None:
    """Each global layer's K and V caches hold the whole context in one GPU binding
    (pyapp.runtime.state): refuse a context the GPU cannot bind before any upload."""
    per_token = max((4 * lc.n_kv_heads * lc.head_dim for lc in cfg.layers if lc.owns_kv and not lc.sliding),
                    default=0)
    limit = binding_limit(limits)
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
    # streamed experts: the cache's (hits, misses, bytes read) at the start, the first token, the end
    expert_counts: list = field(default_factory=list)
    decode_steps: int = 0            # layer steps after the prompt's: one token each, or a token and its drafts
    drafted: int = 0                 # speculative decoding: tokens drafted by prompt lookup
    accepted: int = 0                # of those, the ones the model's greedy choice confirmed

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


class Engine:
    def __init__(self, dev: Device, gguf, runner: Runner):
        self.dev, self.gguf, self.runner = dev, gguf, runner
        self.config: Gemma4Config = runner.cfg
        self.context_length = runner.ctx
        self.cached: list[int] = []       # tokens whose K/V are in the cache, in order
        self.kv_end = 0                   # furthest position written (decoded ahead, rejected drafts: past cached)
        self._tokenizer = None
        self.memory_plan = None           # pyapp.runtime.memory.MemoryPlan it was loaded with
        self.adapters = None              # pyapp.runtime.adapters.GpuAdapters: the LoRA adapters applied
        self.load_bytes_per_s = 0.0       # file -> GPU rate of the load: what streamed experts may expect

    # -- loading, written once ---------------------------------------------------
    @classmethod
    def open(cls, model, backend: str = "native", context_length: int | None = None, chunk: int = DEFAULT_CHUNK,
             progress=None, cancelled=None, device: Device | None = None, **memory) -> "Engine":
        """Load a GGUF (path, ByteSource or parsed GGUFFile) onto a native GPU device.
        memory: gpu_memory_mib, expert_cache_mib, ple_in_file, on_plan, lora, int8, f16 (see _load)."""
        from .gguf import GGUFFile, read_gguf
        from .gpu import get_device
        gguf = model if isinstance(model, GGUFFile) else read_gguf(model)
        dev = device or get_device(backend)
        return drive(cls._load(dev, gguf, context_length, chunk, progress, cancelled, **memory),
                     handler(dev, gguf.source))

    @classmethod
    async def open_async(cls, gguf, device: Device, context_length: int | None = None, chunk: int = DEFAULT_CHUNK,
                         progress=None, cancelled=None, **memory) -> "Engine":
        """Load in the browser. gguf.source: a sync ByteSource (FileReaderSync, for per-token
        PLE rows) with a `.blob` (the File) so weights go Blob -> GPU inside JS."""
        return await drive_async(cls._load(device, gguf, context_length, chunk, progress, cancelled, **memory),
                                 handler(device, gguf.source, asynchronous=True))

    @classmethod
    def _load(cls, dev: Device, gguf, context_length: int | None, chunk: int, progress, cancelled,
              gpu_memory_mib: int | None = None, expert_cache_mib: int | None = None,
              ple_in_file: bool | None = None, on_plan=None, lora=(), int8: bool = True, f16: bool = False):
        """Steps: plan the memory and the layout, copy every resident tensor to the GPU, build the
        plans; returns the Engine. gpu_memory_mib: the GPU memory budget (None: everything
        resident); expert_cache_mib: the streamed experts' cache, directly; ple_in_file: keep the
        per-layer embedding table (E2B/E4B) in the file, one row read per token (None: the plan
        decides); on_plan(MemoryPlan) sees the plan before anything is uploaded; lora: [(adapter, user
        scale)], each adapter a path, a synchronous ByteSource or a parsed GGUF of llama.cpp's LoRA format
        (pyapp.model.lora), applied in every projection it targets (Engine.set_lora_scale changes a scale);
        int8: steps of more than 64 tokens multiply Q4_K, Q4_0, Q5_0 and Q8_0 weights by int8 activations,
        and one-token steps their Q4_K matvecs and experts (K.int8_matvec), as llama.cpp does (faster prefill
        and decode, logits within int8's rounding); False keeps every matmul and matvec in f32.
        f16: the chunk matmuls int8 does not take (other weight types, steps of at most 64 tokens) in f16
        tiles where the device has shader-f16 (K.MatmulTile.half: activations rounded to f16, so they must stay
        within +-65504); False (default): in f32."""
        cfg, bound, mem = cls._plan(gguf, dev.limits, context_length, chunk, gpu_memory_mib, expert_cache_mib,
                                    ple_in_file)
        try:
            adapters = [load_lora(src, cfg, bound, scale, gguf.architecture) for src, scale in lora]
        except (LoraError, GGUFError, SourceError, OSError) as e:
            raise EngineError(f"LoRA adapter: {e}") from e
        ctx = mem.context_length
        if on_plan:
            on_plan(mem)
        try:
            layout, uploads = plan_uploads(dev, cfg, bound, mem.ple_in_file, mem.slots)
        except GPUError as e:
            raise EngineError(f"out of GPU memory while allocating the weights ({mem.total / 2**20:,.0f} MiB "
                              f"planned): {e}. Set a GPU memory budget (--gpu-memory) below what the GPU "
                              "has free.") from e
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
        load_s = time.perf_counter() - t0

        engine_class, runner_class = cls, Runner
        if cfg.is_diffusion:
            from .diffusion import DiffusionEngine
            from .runtime.canvas import DiffusionRunner
            engine_class, runner_class = DiffusionEngine, DiffusionRunner
        try:
            gpu_adapters = None
            if adapters:
                gpu_adapters = GpuAdapters(dev, adapters)
                gpu_adapters.attach(layout)        # before the plans are recorded: they include the deltas
            runner = runner_class(dev, cfg, layout, gguf.source, ctx, chunk, expert_slots=mem.slots, int8=int8,
                                  f16=f16)
            runner.prepare()
        except ModelError as e:
            raise EngineError(str(e)) from e
        except GPUError as e:
            raise EngineError(f"the GPU rejected the model: {e}") from e
        engine = engine_class(dev, gguf, runner)
        engine.memory_plan = mem
        engine.adapters = gpu_adapters
        engine.load_bytes_per_s = total / load_s if load_s > 0 else 0.0
        return engine

    @staticmethod
    def plan(gguf, limits: dict, context_length: int | None = None, gpu_memory_mib: float | None = None,
             expert_cache_mib: float | None = None, ple_in_file: bool | None = None, chunk: int = DEFAULT_CHUNK):
        """The MemoryPlan loading would follow (see _load's options), without a GPU."""
        return Engine._plan(gguf, limits, context_length, chunk, gpu_memory_mib, expert_cache_mib, ple_in_file)[2]

    @staticmethod
    def _plan(gguf, limits, context_length, chunk, gpu_memory_mib, expert_cache_mib, ple_in_file):
        try:
            cfg = model_config(gguf)
            bound = bind(cfg, gguf.tensors)
            ctx = check_context_length(context_length, cfg.context_length)
            _check_context_fits(limits, cfg, ctx)
            mem = plan_memory(limits, cfg, bound, ctx, chunk, _mib(gpu_memory_mib), _mib(expert_cache_mib),
                              ple_in_file)
        except (ConfigError, WeightsError, ModelError, PlanError, GPUError) as e:
            raise EngineError(str(e)) from e
        return cfg, bound, mem

    def set_lora_scale(self, i: int, user_scale: float) -> None:
        """The user scale of loaded adapter i (0: off) from the next step on; the KV cache is dropped
        (its keys and values were made with the old scale)."""
        if self.adapters is None or not 0 <= i < len(self.adapters.adapters):
            raise EngineError(f"no LoRA adapter {i} is loaded")
        self.adapters.set_scale(i, user_scale)
        self.reset()

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
    def reusable(self, prompt: list[int]) -> int:
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

    def _layer_steps(self, tokens: list[int], pos: int, after_each=None):
        """Steps: tokens through the layers in steps of up to chunk tokens, the first at `pos`; after
        each step, `after_each(n)`'s steps (its n rows are then in state.x). Returns the last n.
        kv_end keeps the furthest position written since the cache was last filled from position 0:
        a sliding layer's ring may still hold what an earlier turn wrote past this prompt's end (a token
        decoded ahead, rejected drafts), over positions a later turn rolling back further needs."""
        r = self.runner
        if pos == 0:             # every position before the end is written again, after anything older
            self.kv_end = 0
        n = 0
        for i in range(0, len(tokens), r.chunk):
            part = tokens[i:i + r.chunk]
            r.write_step(part, pos + i)
            yield from r.run_layers(len(part))
            self.kv_end = max(self.kv_end, pos + i + len(part))
            n = len(part)
            if after_each:
                yield from after_each(n)
        return n

    def _prefill(self, tokens: list[int], pos: int, on_prefill=None):
        """Steps: tokens through the layers; returns the row of the last token in its step.
        on_prefill(done, total): after each chunk's GPU work but the last (whose end the first token
        shows), read one chunk late: chunk i's mark is awaited once chunk i + 1 is submitted, so the
        GPU never waits for the CPU."""
        if on_prefill is None or len(tokens) <= self.runner.chunk:
            return (yield from self._layer_steps(tokens, pos)) - 1
        r, marked = self.runner, []

        def mark(n: int):
            k = len(marked) % 2
            self.dev.submit(r.mark_plan(k))
            marked.append(len(marked) * r.chunk + n)
            if len(marked) > 1:
                yield ReadMapped(r.state.chunk_marks[1 - k], 0, 4)
                on_prefill(marked[-2], len(tokens))
        return (yield from self._layer_steps(tokens, pos, after_each=mark)) - 1

    def _read_token(self):
        """Step: the id the sampler wrote on the GPU."""
        data = yield ReadMapped(self.runner.state.token_readback, 0, 4)
        return int.from_bytes(data, "little")

    def _generate(self, prompt: list[int], params: SamplingParams, on_token, should_stop, stop_ids=None,
                  on_prefill=None):
        """Steps of one generation; returns its GenerationResult.

        Each token is drawn on the GPU from the last step's row and read back, the step that feeds
        it to the layers already submitted (decode ahead). With speculation (params.speculates:
        greedy, params.speculate drafts), each token the CPU knows is followed by the tokens prompt
        lookup drafts after it, all run through the layers as one step (_verify); the drafts that
        match the greedy choice after the token before them are kept, plus that choice after the
        last one kept. The rest of the step's K/V lie past the kept tokens, where later steps write
        again in order. No draft: the one-token step as without speculation."""
        params.validate()        # fields may have changed since it was made
        r = self.runner
        result = GenerationResult()
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise EngineError("empty prompt")
        if len(prompt) >= self.context_length:
            raise EngineError(f"prompt of {len(prompt)} tokens does not fit the context of {self.context_length}")
        self._check_ids(prompt)
        reuse = self.reusable(prompt)
        self.cached = prompt[:reuse]
        result.cached_tokens, result.prompt_tokens = reuse, len(prompt) - reuse
        rng = random.Random(params.seed)
        stops = self._stop_ids() if stop_ids is None else set(stop_ids)
        decoder = self._decoder()
        history = list(prompt)
        # the speculative check picks argmax over every token; a model with suppressed tokens decodes
        # one token a step, through the sampler that leaves them out
        lookup = PromptLookup(prompt) if params.speculates and not self.config.suppress_tokens else None

        def emit(tok: int) -> bool:
            """Hand out the next token; True when generation ends with it (result.stop_reason says why)."""
            if tok in stops:
                result.stop_reason = "stop"
                return True
            result.tokens.append(tok)
            history.append(tok)
            if lookup:
                lookup.append(tok)
            piece = decoder.push(tok) if decoder else ""
            result.text += piece
            if on_token:
                on_token(tok, piece)
            if len(result.tokens) >= params.token_limit:
                result.stop_reason = "length"
            elif should_stop and should_stop():
                result.stop_reason = "cancelled"
            elif len(prompt) + len(result.tokens) >= self.context_length:
                result.stop_reason = "context"
            return bool(result.stop_reason)

        self._count_experts(result)
        t0 = time.perf_counter()
        row = yield from self._prefill(prompt[reuse:], reuse, on_prefill)
        self.cached = list(prompt)
        tok, fed = None, False      # the newest token once read; fed: its step ran (decoded ahead)
        while True:
            if tok is None:         # draw the token after `row` of the last step on the GPU
                recent = history[-params.repeat_last_n:] if params.repeat_last_n > 0 and params.repeat_penalty != 1 else []
                self.dev.write(r.state.sample_params, K.pack_sample_params(
                    params.temperature, params.top_k, params.top_p, params.min_p, params.repeat_penalty,
                    recent, rng.random()))
                self.dev.submit(r.head_plan(row, sample=True))
                # Decode ahead: feed the sampled id to the next step on the GPU before reading it, so the
                # GPU never waits for the CPU's readback and encoding. Wasted only on the last token.
                pos = len(self.cached)
                fed = r.decodes_ahead and len(result.tokens) + 1 < params.token_limit and pos + 1 < self.context_length
                if fed:
                    r.write_position(pos)
                    yield from r.run_layers(1, sampled=True)
                    self.kv_end = max(self.kv_end, pos + 1)
                    result.decode_steps += 1
                tok = yield from self._read_token()
                t0 = self._clock(result, t0)
                if emit(tok):
                    break
                if fed:
                    self.cached.append(tok)
            drafts = lookup.draft(self._draft_limit(params, result, len(prompt), fed)) if lookup else []
            if drafts:
                ids = yield from self._verify(tok, fed, drafts)
                t0 = self._clock(result, t0)
                result.decode_steps += 1
                if not fed:
                    self.cached.append(tok)
                n = 0
                while n < len(drafts) and drafts[n] == ids[n]:
                    n += 1
                result.drafted, result.accepted = result.drafted + len(drafts), result.accepted + n
                ended = False
                for d in drafts[:n]:
                    ended = emit(d)
                    if ended:
                        break
                    self.cached.append(d)
                if ended or emit(ids[n]):
                    break
                tok, fed = ids[n], False        # the greedy choice after the last kept token: known, not fed
                continue
            if not fed:
                r.write_step([tok], len(self.cached))
                yield from r.run_layers(1)
                self.kv_end = max(self.kv_end, len(self.cached) + 1)
                result.decode_steps += 1
                self.cached.append(tok)
            tok, row = None, 0
        self._count_experts(result)
        tail = decoder.flush() if decoder else ""
        if tail:
            result.text += tail
            if on_token:
                on_token(None, tail)
        return result

    def _clock(self, result: GenerationResult, t0: float) -> float:
        """A token was read: the first ends prefill (t0 restarts), later ones extend decode."""
        now = time.perf_counter()
        if not result.tokens and not result.prefill_s:
            result.prefill_s = now - t0
            self._count_experts(result)
            return now
        result.decode_s = now - t0
        return t0

    def _draft_limit(self, params: SamplingParams, result: GenerationResult, prompt_len: int, fed: bool) -> int:
        """The most drafts worth checking after the newest token: a step emits at most the drafts + 1
        tokens, within max_tokens and the context; its tokens (the newest too unless fed) fit one step."""
        room = min(params.token_limit - len(result.tokens), self.context_length - prompt_len - len(result.tokens))
        rows = self.runner.state.head_rows - (0 if fed else 1)
        return int(max(0, min(params.speculate, room - 1, rows)))

    def _verify(self, tok: int, fed: bool, drafts: list[int]):
        """Steps: the drafts after tok (and tok itself unless its step ran) through the layers as one
        step at the next positions, then the greedy choice after tok and after each draft; returns
        those len(drafts) + 1 ids. fed: tok's step ran ahead and its row is still in state.x, so its
        choice comes from the one-token head (temperature 0: the argmax) before this step overwrites it."""
        r = self.runner
        if fed:
            self.dev.submit(r.head_plan(0, sample=True))
        feed = drafts if fed else [tok] + drafts
        pos = len(self.cached)
        r.write_step(feed, pos)
        yield from r.run_layers(len(feed), few=True)
        self.kv_end = max(self.kv_end, pos + len(feed))
        self.dev.submit(r.greedy_plan(1 if fed else 0))
        data = yield ReadMapped(r.state.greedy_readback, 0, 4 * (len(drafts) + 1))
        return list(struct.unpack(f"<{len(drafts) + 1}I", bytes(data)))

    def _count_experts(self, result: GenerationResult) -> None:
        cache = self.runner.experts
        if cache is not None:
            result.expert_counts.append((cache.hits, cache.misses, cache.bytes_read))

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
                 should_stop=None, stop_ids=None, on_prefill=None) -> GenerationResult:
        """Sample until a stop token (default: the tokenizer's end-of-turn ids), max_tokens,
        should_stop() or the context end. on_token(id, text) streams decoded text; on_prefill(done,
        total): the prompt tokens the GPU has read, after each of its chunks but the last."""
        return self._drive(self._generate(prompt, params or SamplingParams(), on_token, should_stop, stop_ids,
                                          on_prefill))

    async def generate_async(self, prompt: list[int], params: SamplingParams | None = None, on_token=None,
                             should_stop=None, stop_ids=None, on_prefill=None) -> GenerationResult:
        return await self._drive_async(self._generate(prompt, params or SamplingParams(), on_token, should_stop,
                                                      stop_ids, on_prefill))

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

        def logits_of_step(n: int):
            for row in range(n):
                self.dev.submit(r.head_plan(row, sample=False))
                rows.append((yield ReadGpu(r.state.logits, 0, 4 * self.config.vocab_size)))

        yield from self._layer_steps(tokens, 0, after_each=logits_of_step)
        self.cached = tokens
        return Logits.from_rows(rows)

    def forward(self, tokens: list[int]) -> Logits:
        """Logits for every position (softcap applied), as the reference's forward returns them."""
        return self._drive(self._forward(tokens))

    async def forward_async(self, tokens: list[int]) -> Logits:
        return await self._drive_async(self._forward(tokens))

    # -- benchmark ------------------------------------------------------------------
    BENCH_PROMPTS = ("random", "repeat")
    REPEAT_BLOCK = 16          # tokens of the block a "repeat" benchmark prompt repeats

    def _bench(self, prompt_tokens: int, gen_tokens: int, seed: int, repeat: int, temperature: float = 0.0,
               speculate: int = 0, prompt: str = "random"):
        """Steps: prefill and decode speed on random tokens (greedy unless temperature > 0, no early
        stop): a warm-up over the same prompt (every plan the runs use), then `repeat` runs; medians,
        and every run's. (Greedy decoding of random weights repeats itself, and so does its expert
        routing: temperature 1 gives the varied tokens that measure an expert cache fairly.)
        speculate: drafts per step (greedy only), reported with what was drafted and accepted;
        prompt: "random" ids, or "repeat": a random block of REPEAT_BLOCK ids over and over (text
        that repeats: what prompt lookup drafts from)."""
        if prompt not in self.BENCH_PROMPTS:
            raise EngineError(f"benchmark prompt must be one of {', '.join(self.BENCH_PROMPTS)}, not {prompt!r}")
        rng = random.Random(seed)
        n = min(prompt_tokens, self.context_length // 2)
        block = self.REPEAT_BLOCK if prompt == "repeat" else n
        ids = [rng.randrange(4, self.config.vocab_size) for _ in range(min(block, n))]
        ids = (ids * -(-n // max(len(ids), 1)))[:n]
        runs = []
        for i in range(repeat + 1):
            self.reset()
            warm_up = min(gen_tokens, 16) if speculate else 2     # speculating: some steps of drafts too
            params = SamplingParams(temperature=temperature, seed=seed + i, max_tokens=gen_tokens if i else warm_up,
                                    speculate=speculate)
            res = yield from self._generate(ids, params, None, None, stop_ids=())
            if i:
                runs.append(res)
        first = runs[0]
        return {"adapter": self.dev.describe(), "backend": self.dev.backend, "prompt_tokens": len(ids),
                "prompt": prompt,
                "prefill_s": statistics.median(r.prefill_s for r in runs),
                "prefill_tok_s": statistics.median(r.prefill_tps for r in runs),
                "generated_tokens": len(first.tokens),
                "decode_s": statistics.median(r.decode_s for r in runs),
                "decode_tok_s": statistics.median(r.decode_tps for r in runs),
                "runs": {"prefill_tok_s": [round(r.prefill_tps, 1) for r in runs],
                         "decode_tok_s": [round(r.decode_tps, 1) for r in runs]},
                "context_length": self.context_length, "model": self.config.describe(), "temperature": temperature,
                "speculate": speculate if params.speculates else 0,
                # the first run's (greedy runs draft alike): steps after the prompt's, tokens each gave
                "decode_steps": first.decode_steps, "tokens_per_step": round(first.tokens_per_step, 3),
                "drafted": first.drafted, "accepted": first.accepted,
                "acceptance": round(first.accepted / first.drafted, 3) if first.drafted else None,
                **(yield from self._bench_steps(speculate if params.speculates else 0)),
                **self._bench_memory(runs)}

    def _bench_steps(self, speculate: int, repeat: int = 5):
        """Steps: with speculation, what a step costs alone (no decode ahead to hide the readback), each
        with its greedy head and the readback of its ids, medians of `repeat` in ms: a one-token step,
        and a step of a token and `speculate` drafts (as many as fit one step) in the plan speculation
        uses (kernels for a few tokens) and in the prefill plan (64-token tiles), for comparison. A
        step of drafts pays off when it gives more tokens than its time over the one-token step's
        (roughly: plain decoding also hides its readbacks behind the next step)."""
        if not speculate:
            return {}
        r = self.runner
        n = min(1 + speculate, r.state.head_rows)
        runs = {"one": (1, False), "few": (n, True), "tiles": (n, False)}
        times = {k: [] for k in runs}
        for _ in range(repeat):
            for key, (k, few) in runs.items():
                pos = min(len(self.cached), self.context_length - n)
                t0 = time.perf_counter()
                r.write_step(self.cached[-k:] if len(self.cached) >= k else [0] * k, pos)
                yield from r.run_layers(k, few=few)
                self.dev.submit(r.greedy_plan(0))
                yield ReadMapped(r.state.greedy_readback, 0, 4 * k)
                times[key].append(time.perf_counter() - t0)
        self.reset()                  # those steps wrote K/V past the cached tokens
        ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
        return {"one_token_step_ms": round(ms["one"], 3), "draft_step_tokens": n,
                "draft_step_ms": round(ms["few"], 3), "draft_step_tiles_ms": round(ms["tiles"], 3),
                "break_even_tokens_per_step": round(ms["few"] / ms["one"], 2)}

    def _bench_memory(self, runs: list) -> dict:
        """The memory plan, and with streamed experts what decoding read: hit rate, bytes per token."""
        plan = self.memory_plan
        out = {"gpu_memory_mib": round(plan.total / 2**20), "budget_mib": plan.budget and round(plan.budget / 2**20)}
        if not plan.streams:
            return out
        hits = misses = read = tokens = 0
        for r in runs:          # decode only: from the first token to the end
            (h0, m0, b0), (h1, m1, b1) = r.expert_counts[1], r.expert_counts[-1]
            hits, misses, read, tokens = hits + h1 - h0, misses + m1 - m0, read + b1 - b0, tokens + len(r.tokens) - 1
        return {**out, "expert_slots": plan.slots, "expert_cache_mib": round(plan.expert_cache / 2**20),
                "decode_expert_hit_rate": round(hits / max(hits + misses, 1), 3),
                "decode_read_mib_per_token": round(read / max(tokens, 1) / 2**20, 1),
                "planned_read_mib_per_token": round(plan.read_per_token / 2**20, 1),
                "load_read_gb_s": round(self.load_bytes_per_s / 1e9, 2)}

    def bench(self, prompt_tokens: int = 256, gen_tokens: int = 64, seed: int = 0, repeat: int = 3,
              temperature: float = 0.0, speculate: int = 0, prompt: str = "random") -> dict:
        return self._drive(self._bench(prompt_tokens, gen_tokens, seed, repeat, temperature, speculate, prompt))

    async def bench_async(self, prompt_tokens: int = 256, gen_tokens: int = 64, seed: int = 0,
                          repeat: int = 3, temperature: float = 0.0, speculate: int = 0,
                          prompt: str = "random") -> dict:
        return await self._drive_async(self._bench(prompt_tokens, gen_tokens, seed, repeat, temperature, speculate,
                                                   prompt))

    def close(self) -> None:
        self.runner = None
