"""DiffusionGemma on a GPU: the Runner's plans for the encoder, plus the decoder's over a canvas.

  layers_program(T)               the causal encoder for T tokens (pyapp.model.diffusion_gemma.DiffusionEncoder):
                                  Runner's, recorded from the encoder, so prompts and committed blocks
                                  go through the same chunked steps as Gemma 4 prefill and decode
  canvas_program(self_conditioned)  one denoising step over the canvas (DiffusionDecoder.canvas), recorded
                                  once for the config's canvas length; a shorter canvas replays it with its
                                  own token count. self_conditioned: read the previous step's processed
                                  logits from state.canvas_logits (every step but a block's first)
  sampler_plan()                  the step's sampler (shaders/denoise.wgsl): processed logits, argmax, entropies,
                                  samples, acceptance, the next canvas written to state.ids, stop flags

With streamed experts a program is Plans and ExpertRounds in turn, like the layers'.
"""

from __future__ import annotations

from ..gpu import kernels as K
from ..model.diffusion_gemma import DiffusionDecoder, DiffusionEncoder
from .ops import Ops
from .runner import Runner


class DiffusionRunner(Runner):
    model_class = DiffusionEncoder

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

    def run_canvas(self, n_tokens: int, self_conditioned: bool):
        """Steps: one denoising step over the canvas written by write_step (n_tokens ids at positions P..)."""
        yield from self.run_program(self.canvas_program(self_conditioned), n_tokens)
