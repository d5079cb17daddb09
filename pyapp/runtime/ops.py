"""The ops recorder: what the GPU forward (pyapp.model.gemma4) calls, one method per reference op.

A method records what it computes (pyapp.runtime.lowering: an op record with the buffers it reads and
writes); it dispatches nothing. `finish()` then runs the fusion rules over the recorded ops
(pyapp.runtime.fusion) and lowers each to kernels into the Plan, so the model never decides a fusion and
never looks ahead: it writes the reference's ops in the reference's order (pyapp/reference/forward.py).

How an op runs is chosen by the plan's shape, for `T` tokens: one token takes matvec kernels, a chunk the
tiled matmuls (on int8 activations for long chunks: K.int8_matmul), a step of a few tokens (`few_tokens`:
speculative decoding's token and drafts) matvecs that multiply each weight into every token's sum; a
tensor split into row blocks runs block by block. One token also takes the fused layouts
pyapp.runtime.upload prepared: q, k and v in one matvec over their shared buffer, the decode attention
norming and roping them itself (K.QueryPrep).

A LoRA delta (pyapp.runtime.adapters) is one more op after the projection it adapts: `linear` records
`Lora` beside `Linear` when an adapter targets W. To the rules it is just another reader of x and y.

Fused kernels and the reference ops each replaces (the rules: pyapp.runtime.fusion):

| kernel | plans | reference ops (pyapp/reference/forward.py) | rule |
| --- | --- | --- | --- |
| `add_normed` (norm.wgsl) | all | `h = x + rms_norm(y, w)` [`* layer_output_scale`], then the next `rms_norm(h, w2)` | `merge_adds` |
| `moe_tail` (moe_tail.wgsl) | all but training's tape | `rms_norm(dense, post_ffw_norm_1)`, the experts' weighted sum `sum_j w_j y_j [* down scale]`, `+ rms_norm(sum, post_ffw_norm_2)` | `moe_tails` |
| matvec, GeGLU mode | one token | `x @ [gate; up]^T`, `gelu(gate) * up` | `epilogues` |
| matvec, gelu_times mode | one token | `x @ ple_gate^T`, `gelu(.) * per_layer_input` | `epilogues` |
| `moe_experts`, GeGLU mode | one token, a few | each chosen expert's `x @ [gate; up]^T`, `gelu(gate) * up` | `epilogues` |
| matvec with `K.NormInput` (matvec_input_norm.wgsl) | one token | the router's `rms_norm(h) / sqrt(d) * router_scale` and the experts' `rms_norm(h, pre_ffw_norm_2)`, `@ router^T` | `norm_inputs` |
| matvec with `K.RouteTail` (matvec_tail_route.wgsl) | one token | softmax, top-k, renormalize of the router's logits (on the dense MLP's down projection) | `route_tails` |
| matvec with `K.ResidualInput` (matvec_input_residual.wgsl) | one token, 9 storage buffers a shader | `x = x + rms_norm(y, w)` [`* scale`] and the next `rms_norm(x, w2)`: built by every matvec that reads them | `residual_inputs` |
| GeGLU matvec writing its rows rounded to int8 (matvec_out_q8.wgsl), down on the codes (x8_stored.wgsl) | one token | `gelu(gate) * up` rounded once for the down projection, not in each of its workgroups | `rounded_inputs` |
| `quantize_q8` + `matvec_tokens_x8` for the down projection | a few | its x rounded to int8 wherever the one-token plan's down reads the GeGLU's codes (a speculative check rounds as plain decoding does) | `rounded_as_one_token` |
| `quantize_q8` with `GEGLU` | chunk (int8) | `gelu(gate) * up`, rounded to int8 for the down projection in the same kernel (the dense MLP's, and the chosen experts' rows) | `quantized_geglu` |
| one `quantize_q8` for several matmuls | chunk (int8) | the q, k and v projections' rounding of their one normed x | `shared_quantized_inputs` |
| `add_normed_q8` (norm.wgsl) | chunk (int8) | `add_normed`'s next `rms_norm(h, w2)` rounded to int8 for the projections reading it (gate and up; the next layer's q, k, v) | `quantized_norms`, `unread_norm_outputs` |
| `add_q8` (norm.wgsl) | chunk (int8) | `h = x + rms_norm(y, w)` rounded to int8 for the per-layer-input gate reading it | `quantized_norms` |
| `add_normed*` with `XSPLIT` (norm.wgsl) | chunk | the o or down projection's partial sums over slices of K (sum_slices.wgsl) added as the residual add reads them | `sums_in_norms` |
| `attention_decode` with `K.QueryPrep` | one token | q/k norms, RoPE, v norm, the cache append | shape (`qkv_into_cache`, `q_proj`) |
| matvec with `K.CombineInput` (matvec_input_combine.wgsl) | one token, an attention of few splits (`K.combines_in_matvec`) read by a matvec of few workgroups (`K.combines_into_matvec`) | the decode attention's combine of its split partials, into the o projection's x | `combined_inputs` |
| `norm_rope` | chunk, few | `rope(rms_norm(q or k, norm))` | shape (`q_proj`, `qkv`) |
| `norm_pair` | chunk, few | the router's and the experts' norms of h | one op (`rms_norm_pair`) |
| `ple` | all | per_layer_inputs' tail: `(rms_norm(proj / sqrt(d), norm) + emb) / sqrt(2)` | one op (`ple_combine`) |

Residual adds in a one-token plan (`residual_inputs`): a decode step is bound by its dispatches (each costs
several microseconds of GPU time however small), so an add into the residual stream dispatches nothing
when the matvecs that read its result can build it; the first of them writes the new stream into the
stream's other buffer (state.x and state.x_alt take turns: pyapp.runtime.lowering), and finish() copies
it back into state.x, where the head plans read it.

Buffers come from the State (pyapp.runtime.state); weights are GpuTensors.
"""

from __future__ import annotations

from contextlib import contextmanager

from ..gpu import Buffer, Plan
from ..gpu import kernels as K
from .fusion import Rules, fuse
from .lowering import (AddNorm, ArgmaxRows, Attend, AttendCanvas, Combine, Copy, Elementwise, Embed,
                       ExpertRoundsBegin, ExpertRoundsEnd, Experts, GegluHalves, GeluTimes, KvStore, Linear,
                       Lora, Lowering, NormRope, PleCombine, RmsNorm, RmsNormPair, Route, Sample, Scale,
                       SoftEmbed, SoftTokens)
from .upload import GpuTensor, Part


class Ops:
    def __init__(self, dev, cfg, state, plan: Plan, T: int, step: Buffer | None = None,
                 experts_stream: bool = False, few_tokens: bool = False, int8: bool = True,
                 fuse_residual: bool = False, f16: bool = False, tape: bool = False):
        """fuse_residual: a decode step's fusions that need the runner's consent (the residual adds and the
        routing riding on matvecs); tape: every value the reference computes is written (training's
        forward kept for its backward)."""
        if few_tokens and T > K.FEW_TOKENS:
            raise ValueError(f"a plan of few tokens holds at most {K.FEW_TOKENS}, not {T}")
        self.dev, self.cfg, self.s, self.T = dev, cfg, state, T
        self.few = few_tokens and T > 1      # matvec_tokens and the per-slot expert kernels, not the tiles
        self.eps = cfg.eps
        self.experts_stream = experts_stream
        self.ops: list = []                  # what the model recorded, in order
        self._query_prep = None              # one token: what attend's split kernel norms/ropes/stores
        self._lowering = Lowering(dev, cfg, state, plan, T, step or state.step, self.few,
                                  int8=int8 and state.xq is not None, int8_x=int8, f16=f16)
        self._program: list | None = None
        one = T == 1
        self.rules = Rules(cfg.hidden, state.x, one_token=one, few=self.few, tape=tape,
                           route_tails=fuse_residual and one,
                           residual_inputs=(fuse_residual and one and K.fuses_residual_input(dev)
                                            and self._fits(cfg.hidden)),
                           reads_rounded=self._reads_rounded if fuse_residual and (one or self.few) and int8 else None,
                           quantized_inputs=self._quantized if self._lowering.int8 else None,
                           combined_inputs=self._combines if fuse_residual and one else None)

    def _quantized(self, qtype, k: int) -> bool:
        """Whether a chunk's matmul of qtype takes its k-long x as int8 activations (quantize_q8's)."""
        return K.int8_matmul(qtype, k, self.T)

    def _reads_rounded(self, qtype, k: int) -> bool:
        """Whether a one-token matvec of qtype reads its k-long x as int8 codes stored by x's producer."""
        return K.rounds_output(self.dev, k) and K.int8_rounded_matvec(self.dev, qtype)

    def _combines(self, attend: Attend, reader: Linear) -> bool:
        """Whether a one-token attention leaves its partials for the matvec reading its output to combine: few
        splits (K.combines_in_matvec), and a matvec of few workgroups (K.combines_into_matvec)."""
        w = reader.w
        k, n = w.shape[0], w.shape[1]
        return (attend.combines_in_matvec(self.cfg, self.s)
                and K.combines_into_matvec(w.qtype, k, n, self._lowering.matvec_int8(w.qtype, rows=n)))

    def _fits(self, k: int) -> bool:
        """Whether a matvec workgroup (256 threads) builds a k-float residual input: its registers
        (K.RESIDUAL_INPUT_ROUNDS vec4s a thread) and its shared memory beside the matvec's own."""
        return (k % 4 == 0 and k <= 4 * K.RESIDUAL_INPUT_ROUNDS * 256
                and 4 * k + k // 4 + 4096 <= self.dev.limits.get("max_compute_workgroup_storage_size", 16384))

    def finish(self) -> list:
        """The recorded ops fused and lowered into the plan: the step's program (Plans, and ExpertRounds
        with streamed experts). Nothing can be recorded after it."""
        if self._program is None:
            L = self._lowering
            for op in fuse(self.ops, self.rules):
                op.lower(L)
            self._program = L.finish()
        return self._program

    @property
    def program(self) -> list:
        return self.finish()

    def _record(self, op) -> None:
        if self._program is not None:
            raise RuntimeError(f"{type(op).__name__} recorded after finish(): it would never run")
        self.ops.append(op)

    # -- projections ------------------------------------------------------------
    def linear(self, w: GpuTensor, x: Buffer, y: Buffer) -> None:
        """y[T, n] = x[T, k] @ W^T (reference: x @ w.T), then the LoRA deltas on W, if an adapter targets it."""
        self._record(Linear(w, x, y))
        if w.loras:
            self._record(Lora(w.loras, x, y, w.shape[1]))

    def geglu(self, x: Buffer, out: Buffer, gate: GpuTensor | None, up: GpuTensor | None,
              gate_up: GpuTensor | None) -> None:
        """out = gelu(x @ gate^T) * (x @ up^T) (reference: mlp's first half); gate_up: gate and up rows in one
        tensor, one projection."""
        s = self.s
        if gate_up is None:
            self.linear(gate, x, s.gate)
            self.linear(up, x, s.up)
            self._record(GeluTimes(s.gate, s.up, out, gate.shape[1]))
            return
        self.linear(gate_up, x, s.gate_up)
        self._record(GegluHalves(s.gate_up, out, gate_up.shape[1] // 2))

    def gelu_gate(self, w: GpuTensor, x: Buffer, times, out: Buffer) -> None:
        """out = gelu(x @ w^T) * times (the PLE gate)."""
        self.linear(w, x, self.s.ple_gate)
        self._record(GeluTimes(self.s.ple_gate, times, out, w.shape[1]))

    # -- norms ------------------------------------------------------------------------
    def rms_norm(self, x: Buffer, y: Buffer, weight: GpuTensor | None, dim: int | None = None,
                 rows_per_token: int = 1, scale: float = 1.0) -> None:
        """y = rms_norm(x) [* weight] * scale over rows of `dim` (default hidden) floats."""
        self._record(RmsNorm(x, y, weight, dim, rows_per_token, scale))

    def rms_norm_pair(self, x: Buffer, y: Buffer, weight: GpuTensor | None, y2: Buffer, weight2: GpuTensor,
                      scale: float = 1.0) -> None:
        """Two rms_norms of the same x: y = rms_norm(x) [* weight] * scale, y2 = rms_norm(x) * weight2."""
        self._record(RmsNormPair(x, y, weight, y2, weight2, scale))

    def add_norm(self, y: Buffer, weight: GpuTensor, into: Buffer) -> None:
        """A post-norm's residual add: into = into + rms_norm(y) * weight."""
        self._record(AddNorm(y, weight, into))

    def scale(self, x: Buffer, factor: GpuTensor) -> None:
        """x *= factor (one value: a layer's output scale) over rows of hidden floats."""
        self._record(Scale(x, factor))

    # -- embeddings ---------------------------------------------------------------------
    def embed(self, table: GpuTensor, ids: Buffer, out: Buffer, scale: float) -> None:
        """out[t] = table[ids[t]] * scale (reference: w[tokens] * scale), block by block of rows."""
        self._record(Embed(table, ids, out, scale))

    def soft_tokens(self, rows: Buffer, at: Buffer, out: Buffer) -> None:
        """out[t] = rows[t] where at[t] != 0 (reference forward's soft=: an image's soft tokens in place
        of its placeholders' embeddings)."""
        self._record(SoftTokens(rows, at, out))

    def soft_embed(self, table: GpuTensor, logits: Buffer, out: Buffer, scale: float) -> None:
        """out[t] = softmax(logits[t]) @ table * scale over the whole vocabulary (DiffusionGemma's
        self-conditioning input), block by block of the table's rows."""
        self._record(SoftEmbed(table, logits, out, scale))

    def ple_combine(self, proj: Buffer, emb: Buffer, norm: GpuTensor, out: Buffer) -> None:
        """reference per_layer_inputs' tail: out[l, t] = (rms_norm(proj / sqrt(d)) * norm + emb) / sqrt(2)."""
        self._record(PleCombine(proj, emb, norm, out))

    def ple_slice(self, layer: int):
        """Layer `layer`'s per-layer inputs [T, ple_dim] inside ple_in (a bindable range)."""
        stride = self.s.ple_stride(self.T) * self.cfg.ple_dim * 4
        return (self.s.ple_in, layer * stride, stride)

    # -- attention ------------------------------------------------------------------------
    def qkv_into_cache(self, lc, w, x: Buffer, cache, freq_factors: GpuTensor | None) -> None:
        """The reference attention's first half for a layer with its own K/V:
        q = rope(rms_norm(x @ Wq) * q_norm) into state.q; k = rope(rms_norm(x @ Wk) * k_norm),
        v = rms_norm(x @ Wv) (v = the raw k when k_eq_v) written into the cache at the step's positions.
        One token with a fused q|k|v buffer: one matvec (and the deltas of an adapter), the rest done by
        the decode attention's split kernel (attend)."""
        s, g = self.s, w.qkv
        if self.T == 1 and g is not None:
            self._record(Linear(GpuTensor(g.buffer.label, g.qtype, (g.k, g.rows), [Part(g.buffer, 0, g.rows)]),
                                   x, s.qkv))
            if g.v_apart is not None:          # v in its own encoding: its own matvec into its rows
                v = g.v_apart
                self._record(Linear(v, x, (s.qkv, 4 * g.v_row, 4 * v.shape[1])))
            if g.loras:
                self._record(Lora(g.loras, x, s.qkv, g.out_rows))
            self._query_prep = K.QueryPrep(2, g.q_row, w.attn_q_norm.buffer, lc.rope_dims, lc.rope_base,
                                           freq_factors.buffer if freq_factors is not None else None, self.eps,
                                           k_off=g.k_row, v_off=g.v_row, k_weight=w.attn_k_norm.buffer)
            return
        self.qkv(lc, w, x, freq_factors)
        self._record(KvStore(s.k, s.v, cache, lc.n_kv_heads, lc.head_dim))

    def qkv(self, lc, w, x: Buffer, freq_factors: GpuTensor | None) -> None:
        """The reference attention's first half for a chunk, nothing stored: q into state.q, and
        k = rope(rms_norm(x @ Wk) * k_norm), v = rms_norm(x @ Wv) (the raw k when k_eq_v) into state.k, state.v."""
        s, hd, kvh = self.s, lc.head_dim, lc.n_kv_heads
        self.q_proj(lc, w, x, freq_factors)
        self.linear(w.attn_k, x, s.k_raw)
        v_raw = s.k_raw
        if lc.has_v:
            self.linear(w.attn_v, x, s.v_raw)
            v_raw = s.v_raw
        self._record(NormRope(s.k_raw, s.k, w.attn_k_norm, kvh, hd, lc.rope_dims, lc.rope_base, freq_factors))
        self.rms_norm(v_raw, s.v, None, dim=hd, rows_per_token=kvh)

    def q_proj(self, lc, w, x: Buffer, freq_factors: GpuTensor | None) -> None:
        """state.q = rope(rms_norm(x @ Wq) * q_norm); one token: the projection only, the decode attention's
        split kernel norms and ropes it (attend)."""
        s = self.s
        self.linear(w.attn_q, x, s.q_raw)
        if self.T == 1:
            self._query_prep = K.QueryPrep(1, 0, w.attn_q_norm.buffer, lc.rope_dims, lc.rope_base,
                                           freq_factors.buffer if freq_factors is not None else None, self.eps)
            return
        self._record(NormRope(s.q_raw, s.q, w.attn_q_norm, self.cfg.n_heads, lc.head_dim, lc.rope_dims,
                                 lc.rope_base, freq_factors))

    def attend(self, lc, q: Buffer, cache, out: Buffer, keys_before: int = 0, sliding_keys: int | None = None) -> None:
        """out = softmax(q k^T, causal [+ sliding window]) v over the cache (scale 1: q, k are normed).
        One token, or the few of a speculative step: split over the keys so the whole GPU works on few queries.
        keys_before=1, sliding_keys: an assistant drafter's query, which sees the `sliding_keys` keys before its
        position on sliding layers (0: all), every key before it on full ones."""
        prep, self._query_prep = self._query_prep, None
        if prep is not None:                 # q (and k, v) still raw: in the buffer the projections wrote
            q = self.s.qkv if prep.mode == 2 else self.s.q_raw
        self._record(Attend(lc, q, cache, out, prep, keys_before, sliding_keys))

    def attend_canvas(self, lc, q: Buffer, cache, k: Buffer, v: Buffer, out: Buffer) -> None:
        """out = softmax(q k^T) v, unmasked, over the cached prefix and the step's own k, v (DiffusionGemma's
        decoder over its canvas); sliding layers see the last window - 1 cached positions. The cache is only read."""
        if self._query_prep is not None:
            raise AssertionError("attend_canvas after a one-token q projection: q is still raw")
        keep = self.cfg.sliding_window - 1 if lc.sliding and self.cfg.sliding_window else 0
        self._record(AttendCanvas(lc, q, cache, k, v, out, keep))

    # -- mixture of experts ------------------------------------------------------------------
    def route(self, logits: Buffer, ids: Buffer, weights: Buffer) -> None:
        """ids, weights = top-k of softmax(logits), renormalized over the chosen (reference moe's router)."""
        self._record(Route(logits, ids, weights))

    @contextmanager
    def expert_rounds(self, layer: int, ids: Buffer):
        """The expert ops recorded inside run once per round of experts fetched into the GPU's cache
        (pyapp.runtime.experts); yields the ids buffer they index the expert tensors by: the router's
        ids when every expert is resident (then this is a no-op), else the ids' cache slots."""
        if not self.experts_stream:
            yield ids
            return
        self._record(ExpertRoundsBegin(layer))
        yield self.s.expert_slots
        self._record(ExpertRoundsEnd(layer))

    def experts(self, w: GpuTensor, x: Buffer, y: Buffer, ids: Buffer, per_slot_input: bool = False) -> None:
        """y[t, j] = x[t (or t, j)] @ W[ids[t, j]]^T for the chosen experts of every token."""
        self._record(Experts(w, x, y, ids, per_slot_input))

    def experts_geglu(self, x: Buffer, out: Buffer, ids: Buffer, gate: GpuTensor | None, up: GpuTensor | None,
                      gate_up: GpuTensor | None) -> None:
        """out[t, j] = gelu(x[t] @ gate[e]^T) * (x[t] @ up[e]^T) for e = ids[t, j]; gate_up: gate and up rows
        of every expert in one tensor."""
        s, KS = self.s, self.cfg.n_experts_used
        if gate_up is None:
            self.experts(gate, x, s.experts_gate, ids)
            self.experts(up, x, s.experts_up, ids)
            self._record(GeluTimes(s.experts_gate, s.experts_up, out, KS * gate.shape[1]))
            return
        self.experts(gate_up, x, s.experts_gate_up, ids)
        self._record(GegluHalves(s.experts_gate_up, out, gate_up.shape[1] // 2, KS))

    def combine(self, expert_out: Buffer, ids: Buffer, weights: Buffer, out: Buffer,
                down_scale: GpuTensor | None) -> None:
        """out[t] = sum_j weights[t, j] * expert_out[t, j] [* down_scale[ids[t, j]]]."""
        self._record(Combine(expert_out, ids, weights, out, down_scale))

    # -- head and the rest -----------------------------------------------------------------------------
    def copy(self, src: Buffer, src_offset: int, dst: Buffer, dst_offset: int, size: int) -> None:
        """dst[dst_offset ..] = src[src_offset ..], size bytes."""
        self._record(Copy(src, src_offset, dst, dst_offset, size))

    def copy_row(self, src: Buffer, row: int, dst: Buffer, width: int) -> None:
        """dst = src[row] for rows of `width` floats."""
        self.copy(src, 4 * width * row, dst, 0, 4 * width)

    def softcap(self, x: Buffer, n: int, cap: float) -> None:
        """x = tanh(x / cap) * cap for rows of n floats."""
        self._record(Elementwise("softcap", x, n, cap=cap))

    def bias(self, x: Buffer, b: Buffer, n: int) -> None:
        """x += b for rows of n floats (a constant bias, e.g. the logits' suppressed tokens)."""
        self._record(Elementwise("add", x, n, b=b))

    def add(self, a: Buffer, b: Buffer, dim: int | None = None) -> None:
        """a += b over rows of `dim` (default hidden) floats."""
        self._record(Elementwise("add", a, dim or self.cfg.hidden, b=b))

    def argmax_rows(self, w: GpuTensor, x: Buffer, ids: Buffer, first: int, cap: float) -> None:
        """ids[first + t] = argmax(softcap(x[t] @ W^T)) for each of the step's rows (at most
        kernels.HEAD_ROWS): the greedy choices, without writing the logits (shaders/head_argmax.wgsl)."""
        if w.loras:
            raise AssertionError(f"{w.name}: the greedy head takes no LoRA deltas")
        self._record(ArgmaxRows(w, x, ids, first, cap))

    def sample(self, logits: Buffer, n: int, token: Buffer) -> None:
        """token = a draw from logits under the sampling parameters in state.sample_params (on the GPU)."""
        self._record(Sample(logits, n, token))
