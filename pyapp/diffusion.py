"""DiffusionGemma on the engine: text by denoising a canvas (issue 12; shared/notes/diffusion_gemma.md).

    eng = Engine.open("diffusion.gguf")          # a DiffusionEngine: the file says what it is
    logits = eng.decoder_logits(prompt, canvas, prev_logits)    # one denoising step, [C, vocab]

The encoder is the engine's prefill (pyapp.engine: chunked steps writing the KV cache, here through
DiffusionEncoder's plans); the decoder runs one canvas program (pyapp.runtime.canvas) per step, the
cache only read. Written once as generators of requests, like the engine, driven sync or async.
"""

from __future__ import annotations

from array import array

from .engine import Engine, EngineError
from .model.logits import Logits
from .runtime.requests import ReadGpu


class DiffusionEngine(Engine):
    @property
    def canvas_length(self) -> int:
        return self.config.canvas_length

    # -- the two passes ---------------------------------------------------------------
    def _encode(self, tokens: list[int]):
        """Steps: the causal encoder over tokens after those cached (their K/V appended)."""
        tokens = [int(t) for t in tokens]
        self._check_ids(tokens)
        pos = len(self.cached)
        if pos + len(tokens) > self.context_length:
            raise EngineError(f"{pos + len(tokens)} tokens do not fit the context of {self.context_length}")
        if tokens:
            yield from self._layer_steps(tokens, pos)
        self.cached = self.cached + tokens

    def _decode(self, canvas: list[int], prev_logits=None):
        """Steps: one denoising step over canvas at positions len(cached)..; the logits are left in
        state.canvas_logits [len(canvas), vocab]. prev_logits: the previous step's processed logits
        (float32 bytes [len(canvas), vocab]) to write there first; None: the state's, when self_conditioned
        is wanted by the caller through _run_canvas."""
        canvas = [int(t) for t in canvas]
        self._check_canvas(canvas)
        s = self.runner.state
        if prev_logits is not None:
            data = memoryview(prev_logits).cast("B")
            if len(data) != 4 * len(canvas) * self.config.vocab_size:
                raise EngineError(f"previous logits of {len(data) // 4} floats; a canvas of {len(canvas)} needs "
                                  f"{len(canvas)} x {self.config.vocab_size}")
            self.dev.write(s.canvas_logits, data)
        yield from self._run_canvas(canvas, prev_logits is not None)

    def _run_canvas(self, canvas: list[int], self_conditioned: bool):
        self.runner.write_step(canvas, len(self.cached))
        yield from self.runner.run_canvas(len(canvas), self_conditioned)

    def _check_canvas(self, canvas: list[int]) -> None:
        if not 1 <= len(canvas) <= self.canvas_length:
            raise EngineError(f"a canvas of {len(canvas)} tokens: this model's holds 1..{self.canvas_length}")
        self._check_ids(canvas)

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
        n, V = len(canvas), self.config.vocab_size
        data = yield ReadGpu(self.runner.state.canvas_logits, 0, 4 * n * V)
        return Logits(array("f", bytes(data)), V)

    def decoder_logits(self, prompt, canvas, prev_logits=None, blocks=()) -> Logits:
        """One denoising step's logits [len(canvas), vocab] (softcap applied) after encoding the prompt and
        the committed blocks; prev_logits (float32 bytes-like [len(canvas), vocab]) self-conditions it."""
        return self._drive(self._decoder_logits(prompt, canvas, prev_logits, blocks))

    async def decoder_logits_async(self, prompt, canvas, prev_logits=None, blocks=()) -> Logits:
        return await self._drive_async(self._decoder_logits(prompt, canvas, prev_logits, blocks))
