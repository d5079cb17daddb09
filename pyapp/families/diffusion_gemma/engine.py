"""DiffusionGemma's engine: text by denoising a canvas (issue 12; shared/notes/diffusion_gemma.md).

    eng = Engine.open("diffusion.gguf")          # a DiffusionEngine: the file's family says so
    logits = eng.decoder_logits(prompt, canvas, prev_logits)    # one denoising step, [C, vocab]
    res = eng.denoise(prompt, eng.denoise_params(seed=1), on_block=print)

Generation runs block by block: encode (the prompt, then each committed block), then per step one canvas
program and the sampler on the GPU (runner.py); per step the CPU writes the step's settings and draws (a
few KiB) and reads back the stop flags, the argmax draft and the acceptance mask (2 C + 8 words).
`generate` takes the engine's SamplingParams too (max_tokens, seed), so callers written for Gemma 4 work.
It has no next-token logits, so no `forward`: `decoder_logits` scores a canvas.

The encoder is the loaded model's prefill (LoadedModel.feed: chunked steps writing the KV cache, here
through DiffusionEncoder's plans); the decoder runs one canvas program per step, the cache only read.
Written once as generators of requests, like pyapp.engine, driven sync or async.
"""

from __future__ import annotations

import time
from array import array

from ...gpu import kernels as K
from ...model.logits import Logits
from ...runtime.loaded import EngineError, GenerationResult, LoadedModel
from ...sampling import SamplingParams
from .denoising import DenoiseParams, DenoiseResult, SeededDraws, finish_block, temperature


class DiffusionEngine(LoadedModel):
    @property
    def canvas_length(self) -> int:
        return self.config.canvas_length

    def denoise_params(self, **overrides) -> DenoiseParams:
        """The model's own generation settings (its GGUF's diffusion.* keys), with the overrides not None."""
        return DenoiseParams.from_config(self.config, **overrides)

    # -- the two passes ---------------------------------------------------------------
    def _encode(self, tokens: list[int]):
        """Steps: the causal encoder over tokens after those cached (their K/V appended)."""
        tokens = [int(t) for t in tokens]
        self.check_ids(tokens)
        pos = len(self.cached)
        if pos + len(tokens) > self.context_length:
            raise EngineError(f"{pos + len(tokens)} tokens do not fit the context of {self.context_length}")
        if tokens:
            yield from self.feed(tokens, pos)
        self.cached = self.cached + tokens

    def _decode(self, canvas: list[int], prev_logits=None):
        """Steps: one denoising step over canvas at positions len(cached)..; the runner keeps its logits
        [len(canvas), vocab]. prev_logits: the previous step's processed logits (float32 bytes
        [len(canvas), vocab]) given to the step to self-condition it; None: a first step."""
        canvas = [int(t) for t in canvas]
        self._check_canvas(canvas)
        if prev_logits is not None:
            data = memoryview(prev_logits).cast("B")
            if len(data) != 4 * len(canvas) * self.config.vocab_size:
                raise EngineError(f"previous logits of {len(data) // 4} floats; a canvas of {len(canvas)} needs "
                                  f"{len(canvas)} x {self.config.vocab_size}")
            self.runner.write_canvas_logits(data)
        self.runner.write_step(canvas, len(self.cached))
        yield from self.runner.run_canvas(len(canvas), prev_logits is not None)

    def _check_canvas(self, canvas: list[int]) -> None:
        if not 1 <= len(canvas) <= self.canvas_length:
            raise EngineError(f"a canvas of {len(canvas)} tokens: this model's holds 1..{self.canvas_length}")
        self.check_ids(canvas)

    # -- one step's logits (tests, CLI diffusion-logits) --------------------------------------
    def _decoder_logits(self, prompt, canvas, prev_logits=None, blocks=()):
        """Steps: encode the prompt (then each committed block) from an empty cache, one decoder step."""
        if not len(prompt):
            raise EngineError("empty prompt")
        self.reset()
        yield from self._encode(prompt)
        for block in blocks:
            yield from self._encode(block)
        yield from self._decode(canvas, prev_logits)
        data = yield from self.runner.canvas_logits(len(canvas))
        return Logits(array("f", bytes(data)), self.config.vocab_size)

    def decoder_logits(self, prompt, canvas, prev_logits=None, blocks=()) -> Logits:
        """One denoising step's logits [len(canvas), vocab] (softcap applied) after encoding the prompt and
        the committed blocks; prev_logits (float32 bytes-like [len(canvas), vocab]) self-conditions it."""
        return self.drive(self._decoder_logits(prompt, canvas, prev_logits, blocks))

    async def decoder_logits_async(self, prompt, canvas, prev_logits=None, blocks=()) -> Logits:
        return await self.drive_async(self._decoder_logits(prompt, canvas, prev_logits, blocks))

    # -- generation -------------------------------------------------------------------------
    def denoising(self, prompt, params: DenoiseParams, draws=None, on_step=None, on_block=None, should_stop=None,
                  timed: bool = False):
        """Steps of one generation (reference: reference.generate). on_step(block, step, argmax, accepted)
        sees each step's draft; on_block(block index, tokens) each committed block. timed: wait for each
        encoder pass to finish, so res.encode_seconds time it alone (benchmarks)."""
        params.validate()
        C, V = self.canvas_length, self.config.vocab_size
        r = self.runner
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise EngineError("empty prompt")
        self.check_ids(prompt)
        draws = draws or SeededDraws(params.seed, V, C)
        eos = set(params.eos_ids)
        res = DenoiseResult()
        t0 = time.perf_counter()
        reuse = self.reusable(prompt)        # a chat's next turn keeps the cached turns
        self.cached = prompt[:reuse]
        todo = prompt[reuse:]
        for b in range(-(-params.max_new_tokens // C)):
            t_enc = time.perf_counter()
            yield from self._encode(todo)
            if timed:
                yield from r.wait()
                res.encode_seconds.append(time.perf_counter() - t_enc)
            P = len(self.cached)
            if P + C > self.context_length:
                res.stop_reason = "context"
                break
            canvas = draws.canvas()
            self._check_canvas(canvas)
            r.write_step(canvas, P)
            am, steps = None, 0
            for cur in range(params.steps, 0, -1):
                u, forced, noise = draws.step()
                t_step = time.perf_counter()
                out = yield from r.denoise_step(K.pack_denoise_step(
                    C, temperature(cur, params.steps, params.t_min, params.t_max), params.entropy_bound,
                    params.confidence_threshold, params.stability_threshold, steps == 0, noise, u, forced), steps > 0)
                res.step_seconds.append(time.perf_counter() - t_step)
                head = K.DENOISE_HEADER
                am = out[head:head + C].tolist()
                accepted = [bool(x) for x in out[head + C:head + 2 * C]]
                steps += 1
                res.argmax.append(am)
                res.accepted.append(accepted)
                if on_step:
                    on_step(b, steps, am, accepted)
                if out[0]:
                    break
                if should_stop and should_stop():
                    break
            res.steps.append(steps)
            if should_stop and should_stop():
                res.stop_reason = "cancelled"
                break
            block, had_eos = finish_block(am, eos, params.pad_id)
            res.blocks.append(block)
            res.tokens += block
            if on_block:
                on_block(b, block)
            if had_eos:
                res.stop_reason = "stop"
                break
            todo = block
        else:
            res.stop_reason = "length"
        res.seconds = time.perf_counter() - t0
        return res

    def denoise(self, prompt, params: DenoiseParams | None = None, draws=None, on_step=None, on_block=None,
                should_stop=None) -> DenoiseResult:
        """Generate by denoising block after block (params: the model's defaults unless given; draws:
        SeededDraws(params.seed) unless given, e.g. a ReplayDraws of a recorded trace)."""
        return self.drive(self.denoising(prompt, params or self.denoise_params(), draws, on_step, on_block,
                                         should_stop))

    async def denoise_async(self, prompt, params: DenoiseParams | None = None, draws=None, on_step=None,
                            on_block=None, should_stop=None) -> DenoiseResult:
        return await self.drive_async(self.denoising(prompt, params or self.denoise_params(), draws, on_step,
                                                     on_block, should_stop))

    # -- the engine's generate, by denoising ---------------------------------------------------
    def generation(self, prompt, params=None, on_token=None, should_stop=None, stop_ids=None, on_prefill=None,
                   soft=()):
        """Steps of pyapp.engine.Engine.generate's contract on a DiffusionGemma model: params a DenoiseParams,
        or the engine's SamplingParams (its max_tokens and seed; the rest are autoregressive settings,
        unused); on_token(id, text) gets each committed block's tokens up to its eos. stop_ids and
        on_prefill are the next-token engine's (the model's own eos ids end a block here); it takes no
        soft tokens (DiffusionGemma has no image encoder)."""
        if soft:
            raise EngineError("DiffusionGemma takes no images")
        params = params or SamplingParams()
        if not isinstance(params, DenoiseParams):
            limit = min(params.token_limit, self.context_length - len(prompt))
            params = self.denoise_params(seed=params.seed, max_new_tokens=max(1, int(limit)))
        result = GenerationResult(prompt_tokens=len(prompt))
        decoder = self.decoder()
        eos = set(params.eos_ids)

        def on_block(_b, block):
            for t in block:
                if t in eos:
                    return
                result.tokens.append(t)
                piece = decoder.push(t) if decoder else ""
                result.text += piece
                if on_token:
                    on_token(t, piece)

        res = yield from self.denoising(prompt, params, None, None, on_block, should_stop)
        tail = decoder.flush() if decoder else ""
        if tail:
            result.text += tail
            if on_token:
                on_token(None, tail)
        result.stop_reason, result.decode_s = res.stop_reason, res.seconds
        result.denoise = res
        return result

    def generate(self, prompt, params=None, on_token=None, should_stop=None, stop_ids=None,
                 on_prefill=None) -> GenerationResult:
        return self.drive(self.generation(prompt, params, on_token, should_stop, stop_ids, on_prefill))

    async def generate_async(self, prompt, params=None, on_token=None, should_stop=None, stop_ids=None,
                             on_prefill=None) -> GenerationResult:
        return await self.drive_async(self.generation(prompt, params, on_token, should_stop, stop_ids, on_prefill))
