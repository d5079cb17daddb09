"""The model on a GPU: layout (weights), state (activations, KV cache) and the plans that use them.

Plans are recorded once per shape by running the model's forward
(pyapp.model.gemma4) against the ops recorder, then replayed every step with
only the small per-step inputs rewritten (`write_step`):

  layers_program(T)    embeddings -> every layer, for T tokens at positions pos0..pos0+T-1
                       (T = 1: matvec kernels for decode; T > 1: tiled matmuls for prefill;
                       `few=True`, T <= state.head_rows: speculative decoding's steps of a
                       token and its drafts, matvecs over a few tokens);
                       `sampled=True`: one token, the id the sampler left on the GPU, so a
                       decode step can be submitted before the CPU has read that id.
                       One Plan; with streamed experts, Plans and ExpertRounds in turn
                       (pyapp.runtime.experts), which `run_layers` executes
  head_plan(row, ...)  final norm, output projection and softcap for one row of the
                       last step, then (sample=True) the next token id drawn on the GPU and
                       copied to a readback buffer
  greedy_plan(first)   the greedy next token after every row of the last step (speculative
                       decoding checks its drafts with it), ids copied to a readback buffer

The Runner is the one owner of the State: the engines step, sample and read through the methods
below (`step`, `sample`, `read_token`, `greedy`, `logits`, `mark`), never through its buffers.
"""

from __future__ import annotations

import struct

from ..gpu import Device, Plan
from ..model.gemma4 import Gemma4
from .experts import ExpertCache, ExpertRounds
from .ops import Ops
from .requests import ReadGpu, ReadMapped
from .state import State


# The prompt step plans a runner builds below its largest (its chunk): each step of a prompt takes the largest
# that its tokens left fill (pyapp.runtime.soft_tokens.step_bounds), so a long prompt's tail goes in the usual
# steps instead of one wide step mostly idle (a plan does the work of its size). LONG_STEP is also the step
# a long context takes by default where the memory plan has room (pyapp.engine.loading.long_step).
PROMPT_STEP = 512
LONG_STEP = 2048


class Runner:
    model_class = Gemma4          # what layers_program records (DiffusionGemma's runner: its encoder)
    state_class = State           # the buffers it allocates (DiffusionGemma's: the canvas's too)

    def __init__(self, dev: Device, cfg, layout, source, context_length: int, chunk: int = 64,
                 expert_slots: int | None = None, int8: bool = True, fuse_residual: bool = True, f16: bool = False):
        self.dev, self.cfg, self.layout, self.source = dev, cfg, layout, source
        self.state = self.state_class(dev, cfg, layout, context_length, chunk, int8=int8)
        self.ctx, self.chunk = context_length, self.state.chunk
        self.int8 = int8              # int8 activations: long steps' matmuls (Ops.matmul), one-token matvecs
        self.f16 = f16                # the other chunk matmuls in f16 tiles where the device has shader-f16
        self.fuse_residual = fuse_residual   # decode: residual adds fused into their consumers (Ops)
        self.model = self.model_class(cfg, layout, self.state)
        # experts streamed from the file into a cache of expert_slots per layer (None: all resident)
        self.experts = ExpertCache(dev, cfg, self.state, layout, expert_slots) if expert_slots is not None else None
        # a plan per size, built at load: one token, a short prompt's 64, the usual and the long step, the largest
        self.step_sizes = sorted({1, min(64, self.chunk), min(PROMPT_STEP, self.chunk), min(LONG_STEP, self.chunk),
                                  self.chunk})
        # the sizes a long prompt is cut into, largest first (pyapp.runtime.soft_tokens.step_bounds)
        self.prompt_steps = tuple(sorted((s for s in self.step_sizes if s >= min(PROMPT_STEP, self.chunk)),
                                         reverse=True))
        self._plans: dict = {}

    def step_size(self, n: int) -> int:
        """The plan for a step of n tokens: the smallest size that holds them."""
        return next(size for size in self.step_sizes if size >= n)

    def layers_program(self, T: int, sampled: bool = False, few: bool = False) -> list:
        """Embeddings and every layer for up to T tokens (T: one of step_sizes; few: state.head_rows)."""
        key = ("layers", T, sampled, few)
        if key not in self._plans:
            plan = self.dev.plan()
            if sampled:
                plan.copy(self.state.token, 0, self.state.ids, 0, 4)
            ops = Ops(self.dev, self.cfg, self.state, plan, T, experts_stream=self.experts is not None, few_tokens=few,
                      int8=self.int8, f16=self.f16, fuse_residual=self.fuse_residual)
            self.model.layers(ops)
            ops.finish()
            self._plans[key] = ops.program
        return self._plans[key]

    def layers_plan(self, T: int, sampled: bool = False) -> Plan:
        """The layers as one Plan (every expert resident): for profiling."""
        program = self.layers_program(T, sampled)
        if len(program) != 1:
            raise ValueError("experts stream: the layers run as several plans (layers_program)")
        return program[0]

    def prepare(self) -> None:
        """Build every plan a generation uses now: shader compilation belongs to loading, not to the first reply."""
        for size in self.step_sizes:
            self.layers_program(size)
        if self.decodes_ahead:
            self.layers_program(1, sampled=True)
        self.head_plan(0, sample=True)

    def run_layers(self, n_tokens: int, sampled: bool = False, few: bool = False):
        """Steps: submit the layers for a step of n_tokens (written by write_step / write_position);
        few: with the kernels for a few tokens (n_tokens <= state.head_rows: a token and its drafts)."""
        if few:
            if n_tokens > self.state.head_rows:
                raise ValueError(f"a step of few tokens holds at most {self.state.head_rows}, not {n_tokens}")
            program = self.layers_program(self.state.head_rows, few=True)
        else:
            program = self.layers_program(self.step_size(n_tokens), sampled)
        yield from self.run_program(program, n_tokens)

    def run_program(self, program: list, n_tokens: int):
        """Steps: submit a program (Plans, and ExpertRounds served from the expert cache) for n_tokens."""
        for part in program:
            if isinstance(part, ExpertRounds):
                yield from self.experts.run(part, n_tokens)
            else:
                self.dev.submit(part)

    def head_plan(self, row: int, sample: bool) -> Plan:
        """Logits of row `row` of the last step [+ sampling]."""
        key = ("head", row, sample)
        if key not in self._plans:
            plan = self.dev.plan()
            ops = Ops(self.dev, self.cfg, self.state, plan, 1, step=self.state.one, int8=self.int8)
            self.model.head(ops, row, sample)
            ops.finish()
            if sample:
                plan.copy(self.state.token, 0, self.state.token_readback, 0, self.state.token.size)
            self._plans[key] = plan
        return self._plans[key]

    def mark_plan(self, k: int) -> Plan:
        """A copy into state.chunk_marks[k], done when every plan submitted before it is."""
        key = ("mark", k)
        if key not in self._plans:
            plan = self.dev.plan()
            plan.copy(self.state.token, 0, self.state.chunk_marks[k], 0, 4)
            self._plans[key] = plan
        return self._plans[key]

    # Speculative decoding's plans (layers_program(few=True), greedy_plan) are built on the first step
    # that uses them, not at load: a generation speculates only when asked to.
    def greedy_plan(self, first: int, step_ids: bool = False) -> Plan:
        """state.greedy_ids[first + t] = the greedy next token after row t of the last step (up to
        state.head_rows rows), then the ids copied to state.greedy_readback. first = 1: greedy_ids[0]
        is the id a head_plan(sample=True) at temperature 0 left in state.token (a step before).
        step_ids: the step's own ids (state.ids, as many) copied after them, to come back in the same read."""
        key = ("greedy", first, step_ids)
        if key not in self._plans:
            s = self.state
            plan = self.dev.plan()
            if first:
                plan.copy(s.token, 0, s.greedy_ids, 0, 4)
            ops = Ops(self.dev, self.cfg, s, plan, s.head_rows, int8=self.int8)
            self.model.head_argmax(ops, first)
            ops.finish()
            plan.copy(s.greedy_ids, 0, s.greedy_readback, 0, s.greedy_ids.size)
            if step_ids:
                plan.copy(s.ids, 0, s.greedy_readback, s.greedy_ids.size, min(s.ids.size, s.greedy_ids.size))
            self._plans[key] = plan
        return self._plans[key]

    # -- what the step loops ask of it ------------------------------------------------
    def write_step(self, tokens: list[int], pos0: int, soft=()) -> None:
        """The next step's inputs: token ids at positions pos0.. (and PLE rows read from the file, the
        step's share of soft tokens: pyapp.runtime.soft_tokens.step_share)."""
        self.state.write_step(tokens, pos0, self.source, soft)

    def step(self, tokens: list[int], pos0: int, few: bool = False, soft=()):
        """Steps: tokens through the layers at positions pos0.. (few: a token and its drafts)."""
        self.write_step(tokens, pos0, soft)
        yield from self.run_layers(len(tokens), few=few)

    def step_sampled(self, pos: int):
        """Steps: a one-token step at pos on the id the sampler left on the GPU (decode ahead)."""
        self.state.write_position(pos)
        yield from self.run_layers(1, sampled=True)

    def sample(self, row: int, params: bytes | None = None) -> None:
        """Draw the next token from row `row` of the last step on the GPU (params: the sampler's settings,
        kernels.pack_sample_params; None keeps the last ones); read_token reads it."""
        if params is not None:
            self.dev.write(self.state.sample_params, params)
        self.dev.submit(self.head_plan(row, sample=True))

    def read_token(self):
        """Step: the id the sampler wrote."""
        data = yield ReadMapped(self.state.token_readback, 0, 4)
        return int.from_bytes(data, "little")

    def greedy(self, first: int, n: int):
        """Steps: the greedy next token after each of the last step's rows (greedy_plan), n ids."""
        self.dev.submit(self.greedy_plan(first))
        data = yield ReadMapped(self.state.greedy_readback, 0, 4 * n)
        return list(struct.unpack(f"<{n}I", bytes(data)))

    def greedy_and_step_ids(self, first: int, n: int, ids_from: int, n_ids: int):
        """Steps: greedy's n ids, and the step's own ids ids_from .. ids_from + n_ids (the drafts a drafter
        wrote into it on the GPU), in one readback."""
        self.dev.submit(self.greedy_plan(first, step_ids=True))
        at = self.state.greedy_ids.size
        data = bytes((yield ReadMapped(self.state.greedy_readback, 0, at + 4 * (ids_from + n_ids))))
        return (list(struct.unpack_from(f"<{n}I", data)),
                list(struct.unpack_from(f"<{n_ids}I", data, at + 4 * ids_from)))

    def logits(self, row: int):
        """Steps: the logits of row `row` of the last step (softcap applied), float32 bytes [vocab]."""
        self.dev.submit(self.head_plan(row, sample=False))
        return (yield ReadGpu(self.state.logits, 0, 4 * self.cfg.vocab_size))

    def final_norm_at(self, row: int | None) -> tuple:
        """(buffer, byte offset) of a final-normed row the heads computed last, float32 [hidden]: row `row` of
        the greedy head's rows (greedy), or (None) the one row of the last head_plan (sample, logits). An
        assistant drafter starts from it."""
        if row is None:
            return self.state.x_last_norm, 0
        return self.state.x_rows_norm, 4 * self.cfg.hidden * row

    def final_norm_row(self, row: int | None):
        """Steps: the bytes of that row (final_norm_at)."""
        buffer, offset = self.final_norm_at(row)
        return (yield ReadGpu(buffer, offset, 4 * self.cfg.hidden))

    def kv_of_layer(self, layer: int):
        """Steps: (K bytes, V bytes, slots) of a layer that computes its own K/V: float32 [n_kv_heads,
        slots, head_dim] each, position j in slot j % slots."""
        cache = self.state.kv[layer]
        keys = yield ReadGpu(cache.k, 0, cache.k.size)
        values = yield ReadGpu(cache.v, 0, cache.v.size)
        return keys, values, cache.slots

    def mark(self, k: int) -> None:
        """Mark the end of the work submitted so far in chunk mark k (0 or 1); read_mark waits for it."""
        self.dev.submit(self.mark_plan(k))

    def read_mark(self, k: int):
        yield ReadMapped(self.state.chunk_marks[k], 0, 4)

    @property
    def head_rows(self) -> int:
        """The most rows one step's greedy head scores: a token and its drafts fit one step."""
        return self.state.head_rows

    @property
    def decodes_ahead(self) -> bool:
        """Whether a decode step can start from the GPU's sampled id; with the per-layer embedding
        table left in the file the CPU must know the id first, to read its row."""
        return self.state.ple_file_table is None

    def keeps_window(self, rolled_back: int) -> bool:
        """Whether every sliding layer's ring still holds its window before a position `rolled_back`
        positions before the furthest one written (a ring may have overwritten it)."""
        window = self.cfg.sliding_window
        for lc in self.cfg.layers:
            slots = self.state.kv_slots(lc)
            if lc.sliding and slots < self.ctx and rolled_back > slots - window:
                return False
        return True
