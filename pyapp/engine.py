"""The engine: a Gemma 4 GGUF on the GPU, prompt in, tokens out.

    eng = Engine.open("model.gguf")                     # CPython, native wgpu
    eng = await Engine.open_async(gguf, device)         # Pyodide, navigator.gpu
    res = eng.generate(prompt_ids, SamplingParams(temperature=0), on_token=print)

Weights go from the file to the GPU in chunks (pyapp.gpu upload; in the browser
Blob.slice -> writeBuffer in JS), never whole through Python. The KV cache is
allocated once for `context_length`; a new prompt that starts with the tokens
already cached (the next turn of a chat) only pays for its new tokens.

Generation is written once as a generator of GPU readbacks (`_run`), driven
synchronously natively and with `await` in the browser, where reading a
buffer back is asynchronous.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from .gpu import Device, GPUError
from .gpu import kernels as K
from .model.config import Gemma4Config
from .model.graph import Gemma4Graph, ModelError, plan_uploads

DEFAULT_CONTEXT = 4096


class EngineError(Exception):
    """A request the engine cannot serve (prompt too long, model too big, bad file)."""


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 64
    top_p: float = 0.95
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    max_tokens: int = 512

    @classmethod
    def from_ollama(cls, params: dict | None) -> "SamplingParams":
        """Defaults from an Ollama params layer ({"temperature": 1, "top_k": 64, ...})."""
        p = params or {}
        base = cls()
        return cls(temperature=float(p.get("temperature", base.temperature)),
                   top_k=int(p.get("top_k", base.top_k)), top_p=float(p.get("top_p", base.top_p)),
                   min_p=float(p.get("min_p", base.min_p)),
                   repeat_penalty=float(p.get("repeat_penalty", base.repeat_penalty)),
                   repeat_last_n=int(p.get("repeat_last_n", base.repeat_last_n)),
                   seed=p.get("seed"), max_tokens=int(p.get("num_predict", base.max_tokens) or base.max_tokens))


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


_READ_TOKEN = "token"
_READ_LOGITS = "logits"


class Engine:
    def __init__(self, dev: Device, gguf, graph: Gemma4Graph):
        self.dev, self.gguf, self.graph = dev, gguf, graph
        self.config: Gemma4Config = graph.cfg
        self.context_length = graph.ctx
        self.cached: list[int] = []       # tokens whose K/V are in the cache, in order
        self._tokenizer = None

    # -- loading ---------------------------------------------------------------
    @staticmethod
    def _prepare(dev: Device, gguf, context_length: int | None, chunk: int):
        try:
            cfg = Gemma4Config.from_gguf(gguf)
        except ValueError as e:
            raise EngineError(str(e)) from e
        ctx = min(context_length or DEFAULT_CONTEXT, cfg.context_length)
        need = sum(t.nbytes for n, t in gguf.tensors.items() if n != "per_layer_token_embd.weight")
        limit = dev.limits.get("max_buffer_size", 0) * 64   # WebGPU exposes no memory size; a sanity bound
        if limit and need > limit:
            raise EngineError(f"the model needs {need / 2**30:.1f} GiB of GPU memory; this adapter cannot hold it")
        return cfg, ctx, chunk

    @staticmethod
    def _load_steps(dev: Device, gguf, progress, cancelled):
        """Yield (buffer, file offset, n, buffer offset) uploads; returns the weights dict."""
        weights = {}
        uploads = []
        try:
            for gt, buf, off, n, dst in plan_uploads(dev, gguf):
                weights[gt.name] = gt
                uploads.append((buf, off, n, dst))
        except GPUError as e:
            raise EngineError(f"out of GPU memory while allocating the weights: {e}") from e
        except ModelError as e:
            raise EngineError(str(e)) from e
        total, done, t0 = sum(u[2] for u in uploads), 0, time.perf_counter()
        for buf, off, n, dst in uploads:
            if cancelled and cancelled():
                raise EngineError("loading cancelled")
            yield buf, off, n, dst
            done += n
            if progress:
                progress(done, total, time.perf_counter() - t0)
        return weights

    @classmethod
    def _finish(cls, dev, gguf, weights, ctx, chunk) -> "Engine":
        try:
            graph = Gemma4Graph(dev, Gemma4Config.from_gguf(gguf), gguf, weights, ctx, chunk)
            # build the plans now: shader compilation belongs to loading, not to the first reply
            graph.layers_plan(1)
            graph.layers_plan(graph.chunk)
            graph.head_plan(0, sample=True)
        except ModelError as e:
            raise EngineError(str(e)) from e
        except GPUError as e:
            raise EngineError(f"the GPU rejected the model: {e}") from e
        return cls(dev, gguf, graph)

    @classmethod
    def open(cls, model, backend: str = "native", context_length: int | None = None, chunk: int = 64,
             progress=None, cancelled=None, device: Device | None = None) -> "Engine":
        """Load a GGUF (path, ByteSource or parsed GGUFFile) onto a native GPU device."""
        from .gguf import GGUFFile, read_gguf
        from .gpu import get_device
        gguf = model if isinstance(model, GGUFFile) else read_gguf(model)
        dev = device or get_device(backend)
        _, ctx, chunk = cls._prepare(dev, gguf, context_length, chunk)
        steps = cls._load_steps(dev, gguf, progress, cancelled)
        try:
            while True:
                buf, off, n, dst = next(steps)
                dev.upload(buf, gguf.source, off, n, dst_offset=dst)
        except StopIteration as stop:
            weights = stop.value
        return cls._finish(dev, gguf, weights, ctx, chunk)

    @classmethod
    async def open_async(cls, gguf, device: Device, context_length: int | None = None, chunk: int = 64,
                         progress=None, cancelled=None) -> "Engine":
        """Load in the browser. gguf.source: a sync ByteSource (FileReaderSync, for per-token
        PLE rows) with a `.blob` (the File) so weights go Blob -> GPU inside JS."""
        _, ctx, chunk = cls._prepare(device, gguf, context_length, chunk)
        steps = cls._load_steps(device, gguf, progress, cancelled)
        try:
            while True:
                buf, off, n, dst = next(steps)
                await device.upload_async(buf, gguf.source, off, n, dst_offset=dst)
        except StopIteration as stop:
            weights = stop.value
        return cls._finish(device, gguf, weights, ctx, chunk)

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

    # -- the step loop, written once ----------------------------------------------
    def _reusable(self, prompt: list[int]) -> int:
        """How many leading prompt tokens can keep their cached K/V."""
        n = 0
        for a, b in zip(self.cached, prompt):
            if a != b:
                break
            n += 1
        n = min(n, len(prompt) - 1)          # the last prompt token must run to give logits
        rolled_back = len(self.cached) - n
        if rolled_back > 0:
            # a sliding layer's ring may have overwritten the window before n
            for lc in self.config.layers:
                slots = self.graph.kv_slots(lc)
                if lc.sliding and slots < self.context_length and rolled_back > slots - self.config.sliding_window:
                    return 0
        return n

    def _prefill(self, tokens: list[int], pos: int):
        """Run tokens through the layers in chunks; returns the row of the last token."""
        g = self.graph
        for i in range(0, len(tokens), g.chunk):
            part = tokens[i:i + g.chunk]
            g.write_step(part, pos + i)
            self.dev.submit(g.layers_plan(1 if len(part) == 1 else g.chunk))
        return (len(tokens) - 1) % g.chunk

    def _run(self, prompt: list[int], params: SamplingParams, on_token, should_stop, result: GenerationResult,
             stop_ids=None):
        """Generator: yields _READ_TOKEN when it needs the sampled id (sent back in)."""
        g, cfg = self.graph, self.config
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise EngineError("empty prompt")
        if len(prompt) >= self.context_length:
            raise EngineError(f"prompt of {len(prompt)} tokens does not fit the context of {self.context_length}")
        bad = [t for t in prompt if not 0 <= t < cfg.vocab_size]
        if bad:
            raise EngineError(f"token id {bad[0]} is outside the vocabulary ({cfg.vocab_size})")
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
            self.dev.write(g.sample_params, K.pack_sample_params(
                params.temperature, params.top_k, params.top_p, params.min_p, params.repeat_penalty,
                recent, rng.random()))
            self.dev.submit(g.head_plan(row, sample=True))
            tok = yield _READ_TOKEN
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
            if len(result.tokens) >= params.max_tokens:
                result.stop_reason = "length"
                break
            if should_stop and should_stop():
                result.stop_reason = "cancelled"
                break
            if len(self.cached) + 1 >= self.context_length:
                result.stop_reason = "context"
                break
            g.write_step([tok], len(self.cached))
            self.dev.submit(g.layers_plan(1))
            self.cached.append(tok)
            row = 0
        tail = decoder.flush() if decoder else ""
        if tail:
            result.text += tail
            if on_token:
                on_token(None, tail)
        return result

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

    def _read_token(self) -> int:
        return int.from_bytes(self.dev.read(self.graph.token, 0, 4), "little")

    async def _read_token_async(self) -> int:
        return int.from_bytes(await self.dev.read_async(self.graph.token, 0, 4), "little")

    def generate(self, prompt: list[int], params: SamplingParams | None = None, on_token=None,
                 should_stop=None, stop_ids=None) -> GenerationResult:
        """Sample until a stop token (default: the tokenizer's end-of-turn ids), max_tokens,
        should_stop() or the context end. on_token(id, text) streams decoded text."""
        result = GenerationResult()
        steps = self._run(prompt, params or SamplingParams(), on_token, should_stop, result, stop_ids)
        try:
            next(steps)
            while True:
                steps.send(self._read_token())
        except StopIteration:
            return result

    async def generate_async(self, prompt: list[int], params: SamplingParams | None = None, on_token=None,
                             should_stop=None, stop_ids=None) -> GenerationResult:
        result = GenerationResult()
        steps = self._run(prompt, params or SamplingParams(), on_token, should_stop, result, stop_ids)
        try:
            next(steps)
            while True:
                steps.send(await self._read_token_async())
        except StopIteration:
            return result

    # -- logits (tests, CLI) --------------------------------------------------------
    def _logit_rows(self, tokens: list[int]):
        """Generator: yields after each head plan; the caller reads self.graph.logits."""
        g = self.graph
        tokens = [int(t) for t in tokens]
        if len(tokens) > self.context_length:
            raise EngineError(f"{len(tokens)} tokens do not fit the context of {self.context_length}")
        self.cached = []
        for i in range(0, len(tokens), g.chunk):
            part = tokens[i:i + g.chunk]
            g.write_step(part, i)
            self.dev.submit(g.layers_plan(1 if len(part) == 1 else g.chunk))
            for r in range(len(part)):
                self.dev.submit(g.head_plan(r, sample=False))
                yield _READ_LOGITS
        self.cached = tokens

    def forward(self, tokens: list[int]) -> list[bytes]:
        """Logits for every position (softcap applied): one little-endian f32 row per token."""
        n = 4 * self.config.vocab_size
        return [self.dev.read(self.graph.logits, 0, n) for _ in self._logit_rows(tokens)]

    async def forward_async(self, tokens: list[int]) -> list[bytes]:
        n = 4 * self.config.vocab_size
        return [await self.dev.read_async(self.graph.logits, 0, n) for _ in self._logit_rows(tokens)]

    # -- benchmark ------------------------------------------------------------------
    def _bench_setup(self, prompt_tokens: int, seed: int) -> list[int]:
        rng = random.Random(seed)
        self.reset()
        return [rng.randrange(4, self.config.vocab_size) for _ in range(min(prompt_tokens, self.context_length // 2))]

    def _bench_result(self, ids: list[int], res: GenerationResult) -> dict:
        return {"adapter": self.dev.describe(), "backend": self.dev.backend,
                "prompt_tokens": len(ids), "prefill_s": res.prefill_s, "prefill_tok_s": res.prefill_tps,
                "generated_tokens": len(res.tokens), "decode_s": res.decode_s, "decode_tok_s": res.decode_tps,
                "context_length": self.context_length, "model": self.config.describe()}

    def bench(self, prompt_tokens: int = 256, gen_tokens: int = 64, seed: int = 0) -> dict:
        """Prefill and decode speed on random tokens (greedy, no early stop), after a warm-up."""
        ids = self._bench_setup(prompt_tokens, seed)
        self.generate(ids[:8], SamplingParams(temperature=0, max_tokens=2), stop_ids=())
        self.reset()
        return self._bench_result(ids, self.generate(ids, SamplingParams(temperature=0, max_tokens=gen_tokens),
                                                     stop_ids=()))

    async def bench_async(self, prompt_tokens: int = 256, gen_tokens: int = 64, seed: int = 0) -> dict:
        ids = self._bench_setup(prompt_tokens, seed)
        await self.generate_async(ids[:8], SamplingParams(temperature=0, max_tokens=2), stop_ids=())
        self.reset()
        res = await self.generate_async(ids, SamplingParams(temperature=0, max_tokens=gen_tokens), stop_ids=())
        return self._bench_result(ids, res)

    def close(self) -> None:
        self.graph = None
