"""DiffusionGemma on a GPU: the Runner's plans for the encoder, plus the decoder's over a canvas.

  layers_program(T)               the causal encoder for T tokens (model.DiffusionEncoder): Runner's,
                                  recorded from the encoder, so prompts and committed blocks go through
                                  the same chunked steps as Gemma 4 prefill and decode
  canvas_program(self_conditioned)  one denoising step over the canvas (DiffusionDecoder.canvas), recorded
                                  once for the config's canvas length; a shorter canvas replays it with its
                                  own token count. self_conditioned: read the previous step's processed
                                  logits from state.canvas_logits (every step but a block's first)
  sampler_plan()                  the step's sampler (shaders/denoise.wgsl): processed logits, argmax, entropies,
                                  samples, acceptance, the next canvas written to state.ids, stop flags

With streamed experts a program is Plans and ExpertRounds in turn, like the layers'. CanvasState is
the State with the decoder's own buffers; like Runner, the DiffusionRunner is their one owner: the
engine writes and reads them through its methods (`write_canvas_logits`, `canvas_logits`, `denoise_step`).
"""

from __future__ import annotations

from array import array

from ...errors import Fault
from ...gpu import Device, GPUError
from ...gpu import kernels as K
from ...runtime.ops import Ops
from ...runtime.requests import ReadGpu, ReadMapped
from ...runtime.runner import Runner
from ...runtime.state import State, f32_allocator
from ...runtime.upload import binding_limit
from .model import DiffusionDecoder, DiffusionEncoder


class CanvasState(State):
    """Every buffer of the encoder (State's, for steps of at least a canvas: the decoder's activations are
    the chunk's) and the decoder's own over a canvas of C tokens."""

    def __init__(self, dev: Device, cfg, layout, context_length: int, chunk: int, int8: bool = True):
        C, d, V = cfg.canvas_length, cfg.hidden, cfg.vocab_size
        limit = binding_limit(dev.limits)
        if 4 * C * V > limit:
            raise GPUError(f"the canvas logits ({C} x {V} floats, {4 * C * V / 2**20:,.0f} MiB) exceed this GPU's "
                           f"binding limit ({limit / 2**20:,.0f} MiB)", fault=Fault.DOES_NOT_FIT)
        super().__init__(dev, cfg, layout, context_length, max(chunk, C), int8=int8)   # the canvas: one step

        f32 = f32_allocator(dev)

        # [C, V] the decoder's logits (softcapped); the sampler divides them by the step's temperature in
        # place, and so they are the next step's self-conditioning input
        self.canvas_logits = f32(C * V, "canvas logits")
        self.canvas_embd = f32(C * d, "canvas embd")    # [C, d] token_embd[canvas] * sqrt(d) (+ self_cond), un-normed
        self.soft_stats = f32(2 * C, "soft stats")      # [C, 2] max and 1 / sum(exp) of each row of the logits
        self.soft = f32(C * d, "soft")                  # [C, d] softmax(logits) @ token_embd * sqrt(d)
        self.self_cond = f32(C * d, "self_cond")        # [C, d] the self-conditioning MLP's output
        # the sampler (shaders/denoise.wgsl): the step's settings and draws in, a few small vectors out
        self.denoise_params = f32(K.denoise_param_words(C), "denoise params")   # u32 (kernels.pack_denoise_step)
        self.entropies = f32(C, "entropies")            # [C] of softmax(processed logits)
        self.canvas_argmax = f32(C, "canvas argmax")    # u32 [C] this step's draft
        self.samples = f32(C, "samples")                # u32 [C] one id drawn per position
        self.denoise_prev = f32(1 + C, "denoise prev")  # u32: steps in a row with the same argmax, the last argmax
        self.denoise_out = f32(K.DENOISE_HEADER + 2 * C, "denoise out")   # u32: stop flags, argmax, accepted
        self.denoise_readback = dev.buffer(self.denoise_out.size, "readback", "denoise readback")


class DiffusionRunner(Runner):
    model_class = DiffusionEncoder
    state_class = CanvasState

    def __init__(self, dev, cfg, layout, source, context_length: int, chunk: int = 64,
                 expert_slots: int | None = None, int8: bool = True, f16: bool = False):
        super().__init__(dev, cfg, layout, source, context_length, chunk, expert_slots, int8, f16=f16)
        self.canvas_length = cfg.canvas_length
        self.decoders = {sc: DiffusionDecoder(cfg, layout, self.state, sc) for sc in (False, True)}

    @property
    def decodes_ahead(self) -> bool:
        return False          # nothing is decoded token by token

    def prepare(self) -> None:
        for size in self.step_sizes:
            self.layers_program(size)
        for sc in (False, True):
            self.canvas_program(sc)
        self.sampler_plan()

    def sampler_plan(self):
        """The step's sampler on the canvas logits (shaders/denoise.wgsl, settings and draws in
        state.denoise_params): the next canvas into state.ids, the small results copied for the CPU."""
        if "sampler" not in self._plans:
            s = self.state
            plan = K.denoise(self.dev, self.cfg.vocab_size, self.canvas_length, s.canvas_logits, s.denoise_params,
                             s.entropies, s.canvas_argmax, s.samples, s.ids, s.denoise_prev, s.denoise_out)
            plan.copy(s.denoise_out, 0, s.denoise_readback, 0, s.denoise_out.size)
            self._plans["sampler"] = plan
        return self._plans["sampler"]

    def canvas_program(self, self_conditioned: bool) -> list:
        key = ("canvas", self_conditioned)
        if key not in self._plans:
            ops = Ops(self.dev, self.cfg, self.state, self.dev.plan(), self.canvas_length,
                      experts_stream=self.experts is not None, int8=self.int8, f16=self.f16)
            self.decoders[self_conditioned].canvas(ops)
            self._plans[key] = ops.program
        return self._plans[key]

    # -- what the denoising loop asks of it --------------------------------------------
    def run_canvas(self, n_tokens: int, self_conditioned: bool):
        """Steps: one denoising step over the canvas written by write_step (n_tokens ids at positions P..)."""
        yield from self.run_program(self.canvas_program(self_conditioned), n_tokens)

    def write_canvas_logits(self, data) -> None:
        """The previous step's processed logits [C', vocab] (float32 bytes), the next step's self-conditioning."""
        self.dev.write(self.state.canvas_logits, data)

    def canvas_logits(self, n_tokens: int):
        """Steps: the last decoder step's logits of n_tokens canvas positions, float32 bytes [n_tokens, vocab]."""
        return (yield ReadGpu(self.state.canvas_logits, 0, 4 * n_tokens * self.cfg.vocab_size))

    def denoise_step(self, params: bytes, self_conditioned: bool):
        """Steps: one step over the whole canvas (written by write_step; the sampler writes the next canvas
        in its place): the decoder, then the sampler with the step's settings and draws (params:
        kernels.pack_denoise_step); returns its results, u32: K.DENOISE_HEADER words of stop flags, then
        the argmax draft and the acceptance mask."""
        s = self.state
        self.dev.write(s.denoise_params, params)
        yield from self.run_canvas(self.canvas_length, self_conditioned)
        self.dev.submit(self.sampler_plan())
        return array("I", bytes((yield ReadMapped(s.denoise_readback, 0, s.denoise_out.size))))

    def wait(self):
        """Steps: wait until every submitted plan has run (a small read after them)."""
        yield ReadGpu(self.state.denoise_out, 0, 4)
