"""The ops recorder: what the GPU forward (pyapp.model.gemma4) calls, one method per op.

Each method records dispatches into a Plan for up to `T` tokens. How an op runs
is decided here, not in the model: one token takes matvec kernels, a chunk the
tiled matmuls, a step of a few tokens (`few_tokens`: speculative decoding's
token and drafts) matvecs that multiply each weight into every token's sum;
tensors split into row blocks run block by block; fused kernels
are used where the layout (pyapp.runtime.upload) prepared them. Methods whose
docstring says "fuses" stand for several reference ops
(pyapp/reference/forward.py) in one or two dispatches.

Buffers come from the State (pyapp.runtime.state); weights are GpuTensors.

Residual adds in a one-token plan (`fuse_residual`): a decode step is bound by its dispatches
(each costs several microseconds of GPU time however small), so add_norm into the residual stream
dispatches nothing at first: it stays pending, and the matvecs that read its result (the next
pre-norm, or the residual stream itself) build their input from it in every workgroup
(K.ResidualInput), the first of them writing the new residual into the stream's other buffer
(state.x and state.x_alt take turns; `residual` says which holds it now). A pending add that
something else reads is dispatched on its own, as without fusion. finish() leaves the stream in
state.x, where the head plans read it.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from ..gpu import Buffer, Plan
from ..gpu import kernels as K
from .experts import ExpertRounds
from .upload import GpuTensor


@dataclass
class _PendingAdd:
    """An add_norm into the residual stream not dispatched yet (Ops: residual adds in a one-token plan):
    resid_out = (resid_in + rms_norm(y) * weight) [* scale]; next_out = rms_norm(resid_out) * next_weight."""
    y: Buffer
    weight: Buffer
    scale: Buffer | None
    next_weight: Buffer | None
    next_out: Buffer | None
    resid_in: Buffer
    resid_out: Buffer
    consumed: bool = False               # a matvec built its input from it (and wrote resid_out)

    def input(self, normed: bool) -> K.ResidualInput:
        return K.ResidualInput(self.y, self.resid_in, self.resid_out, self.weight, self.scale,
                               self.next_weight if normed else None)


class Ops:
    def __init__(self, dev, cfg, state, plan: Plan, T: int, step: Buffer | None = None,
                 experts_stream: bool = False, few_tokens: bool = False, int8: bool = True,
                 fuse_residual: bool = False, f16: bool = False):
        if few_tokens and T > K.FEW_TOKENS:
            raise ValueError(f"a plan of few tokens holds at most {K.FEW_TOKENS}, not {T}")
        self.dev, self.cfg, self.s, self.plan, self.T = dev, cfg, state, plan, T
        self.few = few_tokens and T > 1      # matvec_tokens and the per-slot expert kernels, not the tiles
        self.step = step or state.step       # the uniform holding this plan's token count and position
        self.eps = cfg.eps
        self.experts_stream = experts_stream
        self.int8 = int8 and state.xq is not None    # matmuls on int8 activations (K.int8_matmul says where)
        self.int8_x = int8                   # one-token matvecs on x rounded to int8 (K.int8_matvec says where)
        self.f16 = f16                       # the other chunk matmuls in f16 tiles (where the device has shader-f16)
        self.program: list = [plan]          # what a step runs, in order: Plans and ExpertRounds
        self._grouped_ids = None             # the ids state.expert_groups holds the grouping of
        self._query_prep = None              # decode: what attend's split kernel norms/ropes/stores (K.QueryPrep)
        # residual adds fused into the matvecs that consume them (module docstring)
        self.fuse = fuse_residual and T == 1 and not self.few and K.fuses_residual_input(dev) and self._fits(cfg.hidden)
        self.residual = state.x              # the buffer holding the residual stream now
        self._pending: _PendingAdd | None = None
        self._stale: set = set()             # pre-norm outputs a fused add never wrote (reading one is a bug)
        # a one-token plan's MoE routing rides on the next plain matvec's dispatch (route)
        self.fuse_route = fuse_residual and T == 1 and not self.few
        self._route: K.RouteTail | None = None

    # -- the residual stream (module docstring) ---------------------------------------
    def _fits(self, k: int) -> bool:
        """Whether a matvec workgroup (256 threads) builds a k-float residual input: its registers
        (K.RESIDUAL_INPUT_ROUNDS vec4s a thread) and its shared memory beside the matvec's own."""
        return (k % 4 == 0 and k <= 4 * K.RESIDUAL_INPUT_ROUNDS * 256
                and 4 * k + k // 4 + 4096 <= self.dev.limits.get("max_compute_workgroup_storage_size", 16384))

    def _x(self, buf: Buffer) -> Buffer:
        """The buffer holding buf's value now (the residual stream may live in state.x_alt)."""
        return self.residual if buf is self.s.x else buf

    def _reads(self, *bufs) -> None:
        """Before a dispatch reads bufs: dispatch the pending add (or routing) if they hold its result."""
        r = self._route
        if r is not None and any(b is r.ids or b is r.weights for b in bufs):
            self._dispatch_route()
        for b in bufs:
            if b in self._stale:
                raise AssertionError(f"{b.label} is read after the add that normed it into it was fused away")
        p = self._pending
        if p is not None and any(b is self.s.x and not p.consumed or b is p.next_out for b in bufs):
            self._dispatch_pending()

    def _writes(self, buf: Buffer) -> None:
        """A dispatch writes buf whole: a stale pre-norm is fresh again."""
        self._stale.discard(buf)
        if self._pending is not None and self._pending.next_out is buf:
            self._pending.next_out = None

    def _dispatch_pending(self) -> None:
        """The pending add's results, dispatched: the add itself, or (its consumers built the residual)
        the next pre-norm from the new residual."""
        p, self._pending = self._pending, None
        if p.next_out is not None:
            self._stale.discard(p.next_out)
        if not p.consumed:
            K.add_normed(self.dev, self.cfg.hidden, p.y, self.residual, p.weight, self.step, self.T, eps=self.eps,
                         scale=p.scale, next_out=p.next_out, next_weight=p.next_weight, plan=self.plan)
        elif p.next_out is not None:
            K.rms_norm(self.dev, self.cfg.hidden, self.residual, p.next_out, p.next_weight, self.step,
                       max_tokens=1, eps=self.eps, plan=self.plan)

    def _retire_pending(self) -> None:
        """A new add into the residual stream: the pending one is dispatched, or (consumed) its
        pre-norm output, which nothing read, is left unwritten."""
        p = self._pending
        if p is None:
            return
        if not p.consumed:
            self._dispatch_pending()
            return
        self._pending = None
        if p.next_out is not None:
            self._stale.add(p.next_out)

    def _input(self, x: Buffer, fusable: bool = False) -> tuple[Buffer, K.ResidualInput | None]:
        """(x as it is now, None) for a dispatch reading x, the pending add dispatched first if x holds its
        result; or (None, the ResidualInput it builds x from) for a fusable one: a one-token matvec reading
        all of x, no LoRA deltas on it (they would read x too). That matvec writes the new residual."""
        p = self._pending
        normed = p is not None and p.next_out is not None and x is p.next_out
        raw = p is not None and x is self.s.x and not p.consumed
        if not (fusable and (normed or raw)):
            self._reads(x)
            return self._x(x), None
        p.consumed = True
        self.residual = p.resid_out
        return None, p.input(normed)

    def _dispatch_route(self) -> None:
        """The pending routing in a dispatch of its own."""
        r, self._route = self._route, None
        K.moe_route(self.dev, r.n_experts, r.k_used, r.logits, r.ids, r.weights, self.step, self.T, plan=self.plan)

    def _route_tail(self) -> K.RouteTail | None:
        """The pending routing, taken by a one-token matvec about to be recorded."""
        r, self._route = self._route, None
        return r

    def finish(self) -> None:
        """The end of the plan: nothing pending, the residual stream in state.x."""
        if self._route is not None:
            self._dispatch_route()
        if self._pending is not None:
            self._dispatch_pending()
        if self.residual is not self.s.x:
            self.plan.copy(self.residual, 0, self.s.x, 0, 4 * self.cfg.hidden)
            self.residual = self.s.x

    # -- projections ------------------------------------------------------------
    def linear(self, w: GpuTensor, x: Buffer, y: Buffer) -> None:
        """y[T, n] = x[T, k] @ W^T (reference: x @ w.T): matvec for one token, tiled matmul for a chunk;
        then the LoRA deltas on W, if an adapter targets it."""
        dev, plan, T = self.dev, self.plan, self.T
        k, n = w.shape[0], w.shape[1]
        x, fused = self._input(x, fusable=T == 1 and len(w.parts) == 1 and not w.loras)
        if len(w.parts) == 1:
            if T == 1:
                route = self._route_tail() if fused is None else None
                K.matvec(dev, w.qtype, k, n, w.bound, x, y, plan=plan, residual=fused, route=route,
                         int8=self._int8_x(w.qtype, rows=n))
            elif self.few:
                K.matvec_tokens(dev, w.qtype, k, n, w.bound, x, y, self.step, plan=plan)
            else:
                self.matmul(w.qtype, k, x, [(w.bound, n, y, 0)])
        elif T > 1 and not self.few:      # row blocks write their columns of y
            self.matmul(w.qtype, k, x, [(p.buffer, p.rows, (y, 4 * p.row0, y.size - 4 * p.row0), n) for p in w.parts])
        else:
            for p in w.parts:
                if T == 1:
                    K.matvec(dev, w.qtype, k, p.rows, p.buffer, x, (y, 4 * p.row0, 4 * p.rows), plan=plan,
                             int8=self._int8_x(w.qtype, rows=p.rows))
                else:
                    K.matvec_tokens(dev, w.qtype, k, p.rows, p.buffer, x, (y, 4 * p.row0, y.size - 4 * p.row0),
                                    self.step, plan=plan, ldy=n)
        self.lora(w.loras, x, y, n)

    def _int8_x(self, qtype, experts: bool = False, geglu: bool = False, rows: int = 0) -> bool:
        """Whether a one-token step's matvec of `rows` rows (experts: the expert matvec) over qtype weights
        takes x rounded to int8. Steps of a few tokens (speculative decoding's checks) stay in f32, as
        their dense matvecs."""
        return self.int8_x and self.T == 1 and K.int8_matvec(self.dev, qtype, experts, geglu, rows)

    def matmul(self, qtype, k: int, x: Buffer, blocks: list) -> None:
        """y[T, n] = x[T, k] @ W^T for a chunk, for each (W buffer, n, y, ldy) of blocks (a tensor's row
        blocks, each writing its columns of y; ldy 0: y is n wide): quantized weights on int8 activations
        (x quantized here, once for every block) where K.int8_matmul says so, else the tile (in f16 where
        self.f16 and the device has shader-f16)."""
        dev, s, plan, T = self.dev, self.s, self.plan, self.T
        int8 = self.int8 and K.int8_matmul(qtype, k, T)
        if int8:
            K.quantize_q8(dev, k, x, s.xq, s.xq_scales, self.step, T, plan=plan)
        for w, n, y, ldy in blocks:
            if int8:
                K.matmul_q8(dev, qtype, k, n, w, s.xq, s.xq_scales, y, self.step, T, plan=plan, ldy=ldy)
            else:
                K.matmul(dev, qtype, k, n, w, x, y, self.step, n_tokens=T, plan=plan, ldy=ldy, f16=self.f16)

    def lora(self, deltas: list, x: Buffer, y: Buffer, ldy: int) -> None:
        """y[t, col0 + i] += scale * B (A x[t]) for each (GpuLora, col0) of an adapted projection whose
        base output is already in y (rows of ldy floats)."""
        if deltas:
            self._reads(x, y)
        for g, col0 in deltas:
            K.lora(self.dev, g.k, g.n, g.rank, g.a, g.b, x, y, g.scale, self.step, self.T, ldy=ldy, col0=col0,
                   plan=self.plan, bounds=g.bounds)

    def geglu(self, x: Buffer, out: Buffer, gate: GpuTensor | None, up: GpuTensor | None,
              gate_up: GpuTensor | None) -> None:
        """out = gelu(x @ gate^T) * (x @ up^T). With gate and up in one buffer (gate_up) it fuses the
        two projections and the GeGLU: one matvec for a token, one matmul + one GeGLU for a chunk."""
        dev, s, T = self.dev, self.s, self.T
        if T == 1 and gate_up is not None and not gate_up.loras:
            x, fused = self._input(x, fusable=True)
            K.matvec(dev, gate_up.qtype, gate_up.shape[0], gate_up.shape[1] // 2, gate_up.buffer, x, out, geglu=True,
                     plan=self.plan, residual=fused, int8=self._int8_x(gate_up.qtype))
            return
        if gate_up is None:
            ff = gate.shape[1]
            self.linear(gate, x, s.gate)
            self.linear(up, x, s.up)
            K.elementwise(dev, "geglu", ff, s.gate, self.step, T, b=s.up, out=out, plan=self.plan)
            return
        ff = gate_up.shape[1] // 2
        x, _ = self._input(x)
        if T == 1:            # adapted: the [gate | up] rows, their deltas, then the GeGLU
            K.matvec(dev, gate_up.qtype, gate_up.shape[0], 2 * ff, gate_up.buffer, x, s.gate_up, plan=self.plan,
                     int8=self._int8_x(gate_up.qtype))
        elif self.few:
            K.matvec_tokens(dev, gate_up.qtype, gate_up.shape[0], 2 * ff, gate_up.buffer, x, s.gate_up, self.step,
                            plan=self.plan)
        else:
            self.matmul(gate_up.qtype, gate_up.shape[0], x, [(gate_up.buffer, 2 * ff, s.gate_up, 0)])
        self.lora(gate_up.loras, x, s.gate_up, 2 * ff)
        K.geglu_halves(dev, ff, 1, s.gate_up, out, self.step, T, plan=self.plan)

    def gelu_gate(self, w: GpuTensor, x: Buffer, times, out: Buffer) -> None:
        """out = gelu(x @ w^T) * times (the PLE gate); fuses the product into the matvec for a token
        (unless an adapter targets w: its delta goes in before the GeLU)."""
        n = w.shape[1]
        if self.T == 1 and not w.loras:
            x, fused = self._input(x, fusable=True)
            K.matvec(self.dev, w.qtype, w.shape[0], n, w.buffer, x, out, gelu_times=times, plan=self.plan,
                     residual=fused, int8=self._int8_x(w.qtype))
        else:
            self.linear(w, x, self.s.ple_gate)
            K.elementwise(self.dev, "geglu", n, self.s.ple_gate, self.step, self.T, b=times, out=out, plan=self.plan)

    # -- norms ------------------------------------------------------------------------
    def rms_norm(self, x: Buffer, y: Buffer, weight: GpuTensor | None, dim: int | None = None,
                 rows_per_token: int = 1, scale: float = 1.0) -> None:
        """y = rms_norm(x) [* weight] * scale over rows of `dim` (default hidden) floats."""
        x, _ = self._input(x)
        self._writes(y)
        K.rms_norm(self.dev, dim or self.cfg.hidden, x, y, weight.buffer if weight is not None else None,
                   self.step, max_tokens=self.T, rows_per_token=rows_per_token, eps=self.eps, scale=scale,
                   plan=self.plan)

    def rms_norm_pair(self, x: Buffer, y: Buffer, weight: GpuTensor | None, y2: Buffer, weight2: GpuTensor,
                      scale: float = 1.0) -> None:
        """Fuses two rms_norms of the same x: y = rms_norm(x) [* weight] * scale, y2 = rms_norm(x) * weight2."""
        x, _ = self._input(x)
        self._writes(y)
        self._writes(y2)
        K.rms_norm_pair(self.dev, self.cfg.hidden, x, y, weight.buffer if weight is not None else None, y2,
                        weight2.buffer, self.step, self.T, eps=self.eps, scale=scale, plan=self.plan)

    def add_norm(self, y: Buffer, weight: GpuTensor, into: Buffer, scale: GpuTensor | None = None,
                 next_weight: GpuTensor | None = None, next_out: Buffer | None = None) -> None:
        """Fuses a post-norm's residual add, the layer scale and the next pre-norm:
        into = (into + rms_norm(y) * weight) [* scale]; then, given next_weight,
        next_out = rms_norm(into) * next_weight.
        Into the residual stream of a one-token plan it only becomes pending (module docstring)."""
        if next_weight is None:
            next_out = None
        if self.fuse and into is self.s.x:
            self._reads(y)
            self._retire_pending()
            self._stale.discard(next_out)
            other = self.s.x_alt if self.residual is self.s.x else self.s.x
            self._pending = _PendingAdd(y, weight.buffer, scale.buffer if scale is not None else None,
                                        next_weight.buffer if next_weight is not None else None, next_out,
                                        resid_in=self.residual, resid_out=other)
            return
        self._reads(y, into)
        into = self._x(into)
        if next_out is not None:
            self._writes(next_out)
        K.add_normed(self.dev, self.cfg.hidden, y, into, weight.buffer, self.step, self.T, eps=self.eps,
                     scale=scale.buffer if scale is not None else None, next_out=next_out,
                     next_weight=next_weight.buffer if next_weight is not None else None, plan=self.plan)

    # -- embeddings ---------------------------------------------------------------------
    def embed(self, table: GpuTensor, ids: Buffer, out: Buffer, scale: float) -> None:
        """out[t] = table[ids[t]] * scale (reference: w[tokens] * scale), block by block of rows."""
        for p in table.parts:
            K.embed(self.dev, table.qtype, table.shape[0], p.buffer, ids, out, self.step, self.T, scale=scale,
                    row0=p.row0, nrows=p.rows, plan=self.plan)

    def soft_embed(self, table: GpuTensor, logits: Buffer, out: Buffer, scale: float) -> None:
        """out[t] = softmax(logits[t]) @ table * scale over the whole vocabulary (DiffusionGemma's
        self-conditioning input), block by block of the table's rows."""
        K.soft_embed(self.dev, table.qtype, table.shape[1], table.shape[0], logits, self.s.soft_stats,
                     [(p.buffer, p.row0, p.rows) for p in table.parts], out, self.step, self.T, scale=scale,
                     plan=self.plan)

    def ple_combine(self, proj: Buffer, emb: Buffer, norm: GpuTensor, out: Buffer) -> None:
        """Fuses reference per_layer_inputs' tail: out[l, t] = (rms_norm(proj / sqrt(d)) * norm + emb) / sqrt(2)."""
        cfg = self.cfg
        K.ple_combine(self.dev, cfg.n_layers, cfg.ple_dim, self.s.ple_stride(self.T), proj, emb, norm.buffer, out,
                      self.step, cfg.hidden, self.eps, plan=self.plan)

    def ple_slice(self, layer: int):
        """Layer `layer`'s per-layer inputs [T, ple_dim] inside ple_in (a bindable range)."""
        stride = self.s.ple_stride(self.T) * self.cfg.ple_dim * 4
        return (self.s.ple_in, layer * stride, stride)

    # -- attention ------------------------------------------------------------------------
    def qkv_into_cache(self, lc, w, x: Buffer, cache, freq_factors: GpuTensor | None) -> None:
        """Fuses the reference attention's first half for a layer with its own K/V:
        q = rope(rms_norm(x @ Wq) * q_norm) into state.q; k = rope(rms_norm(x @ Wk) * k_norm),
        v = rms_norm(x @ Wv) (v = the raw k when k_eq_v) written into the cache at the step's positions.
        One token with a fused q/k/v buffer: one matvec, then one dispatch norms and ropes q and
        writes K/V straight into the cache."""
        dev, s, plan, T = self.dev, self.s, self.plan, self.T
        H, hd, kvh = self.cfg.n_heads, lc.head_dim, lc.n_kv_heads
        ff = freq_factors.buffer if freq_factors is not None else None
        g = w.qkv
        if T == 1 and g is not None:
            xq, fused = self._input(x, fusable=not g.loras)
            K.matvec(dev, g.qtype, g.k, g.rows, g.buffer, xq, s.qkv, plan=plan, residual=fused,
                     int8=self._int8_x(g.qtype))
            if g.v_apart is not None:
                v = g.v_apart
                xv, fused = self._input(x, fusable=not g.loras)
                K.matvec(dev, v.qtype, g.k, v.shape[1], v.bound, xv, (s.qkv, 4 * g.v_row, 4 * v.shape[1]), plan=plan,
                         residual=fused, int8=self._int8_x(v.qtype))
            self.lora(g.loras, x, s.qkv, g.out_rows)
            # the decode attention's split kernel norms and ropes q, k and v and stores k, v (attend)
            self._query_prep = K.QueryPrep(2, g.q_row, w.attn_q_norm.buffer, lc.rope_dims, lc.rope_base, ff, self.eps,
                                           k_off=g.k_row, v_off=g.v_row, k_weight=w.attn_k_norm.buffer)
            return
        self.qkv(lc, w, x, freq_factors)
        K.kv_store(dev, s.k, s.v, cache.k, cache.v, self.step, kvh, hd, cache.slots, T, plan=plan)

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
        K.norm_rope(self.dev, s.k_raw, s.k, w.attn_k_norm.buffer, self.step, kvh, hd, lc.rope_dims, lc.rope_base,
                    self.T, eps=self.eps, freq_factors=freq_factors.buffer if freq_factors is not None else None,
                    plan=self.plan)
        self.rms_norm(v_raw, s.v, None, dim=hd, rows_per_token=kvh)

    def q_proj(self, lc, w, x: Buffer, freq_factors: GpuTensor | None) -> None:
        """Fuses q's norm and RoPE: state.q = rope(rms_norm(x @ Wq) * q_norm)."""
        s = self.s
        self.linear(w.attn_q, x, s.q_raw)
        if self.T == 1:          # the decode attention's split kernel norms and ropes it (attend)
            self._query_prep = K.QueryPrep(1, 0, w.attn_q_norm.buffer, lc.rope_dims, lc.rope_base,
                                           freq_factors.buffer if freq_factors is not None else None, self.eps)
            return
        K.norm_rope(self.dev, s.q_raw, s.q, w.attn_q_norm.buffer, self.step, self.cfg.n_heads, lc.head_dim,
                    lc.rope_dims, lc.rope_base, self.T, eps=self.eps,
                    freq_factors=freq_factors.buffer if freq_factors is not None else None, plan=self.plan)

    def attend(self, lc, q: Buffer, cache, out: Buffer) -> None:
        """out = softmax(q k^T, causal [+ sliding window]) v over the cache (scale 1: q, k are normed).
        One token, or the few of a speculative step: split over the keys so the whole GPU works on few queries."""
        H, hd, kvh = self.cfg.n_heads, lc.head_dim, lc.n_kv_heads
        window = self.cfg.sliding_window if lc.sliding else 0
        if self.T == 1:
            prep, self._query_prep = self._query_prep, None
            if prep is not None:         # q (and k, v) still raw: in the buffer the projections wrote
                q = self.s.qkv if prep.mode == 2 else self.s.q_raw
            K.attention_decode(self.dev, q, cache.k, cache.v, out, self.s.partials, self.step, H, kvh, hd, cache.slots,
                               self.s.max_keys(lc), window=window, plan=self.plan, prep=prep)
        elif self.few and self.s.few_partials() is not None:     # a few queries: each split over the keys too
            K.attention_decode(self.dev, q, cache.k, cache.v, out, self.s.few_partials(), self.step, H, kvh, hd,
                               cache.slots, self.s.max_keys(lc), window=window, plan=self.plan, max_tokens=self.T)
        else:
            K.attention(self.dev, q, cache.k, cache.v, out, self.step, H, kvh, hd, cache.slots, self.T, window=window,
                        plan=self.plan)

    def attend_canvas(self, lc, q: Buffer, cache, k: Buffer, v: Buffer, out: Buffer) -> None:
        """out = softmax(q k^T) v, unmasked, over the cached prefix and the step's own k, v (DiffusionGemma's
        decoder over its canvas); sliding layers see the last window - 1 cached positions. The cache is only read."""
        if self._query_prep is not None:
            raise AssertionError("attend_canvas after a one-token q projection: q is still raw")
        keep = self.cfg.sliding_window - 1 if lc.sliding and self.cfg.sliding_window else 0
        K.attention_canvas(self.dev, q, cache.k, cache.v, k, v, out, self.step, self.cfg.n_heads, lc.n_kv_heads,
                           lc.head_dim, cache.slots, self.T, keep=keep, plan=self.plan)

    # -- mixture of experts ------------------------------------------------------------------
    def route(self, logits: Buffer, ids: Buffer, weights: Buffer) -> None:
        """ids, weights = top-k of softmax(logits), renormalized over the chosen (reference moe's router).
        In a one-token plan it stays pending: one workgroup more in the next plain matvec's dispatch
        does it (K.RouteTail), or its own dispatch before anything reads ids or weights."""
        self._grouped_ids = None             # new ids: the next chunk's expert products group them again
        self._reads(ids, weights)            # an earlier routing still pending into them
        self._route = K.RouteTail(self.cfg.n_experts, self.cfg.n_experts_used, logits, ids, weights)
        if not self.fuse_route:
            self._dispatch_route()

    def router(self, x: Buffer, w: GpuTensor, w_scale: GpuTensor | None, scale: float, experts_in: Buffer,
               experts_norm: GpuTensor, router_in: Buffer, logits: Buffer, ids: Buffer, weights: Buffer) -> None:
        """Fuses reference moe's router front: experts_in = rms_norm(x) * experts_norm;
        router_in = rms_norm(x) [* w_scale] * scale; logits = router_in @ w^T; ids, weights = route(logits).
        One token: the norms built by the router matvec's workgroups (K.NormInput), then the routing."""
        if self.T == 1 and not w.loras and len(w.parts) == 1:
            x, _ = self._input(x)
            self._writes(experts_in)
            self._writes(router_in)
            normed = K.NormInput(x, router_in, w_scale.buffer if w_scale is not None else None, experts_norm.buffer,
                                 experts_in, scale=scale, eps=self.eps)
            K.matvec(self.dev, w.qtype, w.shape[0], w.shape[1], w.buffer, None, logits, plan=self.plan,
                     residual=normed)
        else:
            self.rms_norm_pair(x, router_in, w_scale, experts_in, experts_norm, scale=scale)
            self.linear(w, router_in, logits)
        self.route(logits, ids, weights)

    @contextmanager
    def expert_rounds(self, layer: int, ids: Buffer):
        """The expert ops recorded inside run once per round of experts fetched into the GPU's cache
        (pyapp.runtime.experts); yields the ids buffer they index the expert tensors by: the router's
        ids when every expert is resident (then this is a no-op), else the ids' cache slots."""
        self._reads(ids)                     # the expert ops read the ids (and a streamed round's fetch)
        if not self.experts_stream:
            yield ids
            return
        self.plan = self.dev.plan()
        yield self.s.expert_slots
        self.program.append(ExpertRounds(layer, self.plan))
        self.plan = self.dev.plan()
        self.program.append(self.plan)

    def experts(self, w: GpuTensor, x: Buffer, y: Buffer, ids: Buffer, per_slot_input: bool = False,
                geglu: bool = False) -> None:
        """y[t, j] = x[t (or t, j)] @ W[ids[t, j]]^T for the chosen experts of every token
        (one dispatch per buffer of a split W, each writing the slots of its experts).
        A chunk groups its slots by expert first (once per ids), then runs a tiled matmul per
        expert: each expert's weights are read once per 64 slots, not once per slot. A step of
        few tokens runs the decode kernel for each slot.
        geglu (one token): W holds gate then up rows per expert; y = gelu(x @ gate^T) * (x @ up^T)."""
        cfg, k, n, E = self.cfg, w.shape[0], w.shape[1], w.shape[2]     # E: experts W holds (or cache slots)
        x, _ = self._input(x)
        if self.T > 1 and not self.few:
            s, KS = self.s, cfg.n_experts_used
            if self._grouped_ids is not ids:
                K.moe_group(self.dev, E, KS, ids, s.expert_groups, self.step, plan=self.plan)
                self._grouped_ids = ids
            int8 = self.int8 and K.int8_matmul(w.qtype, k, self.T)
            if int8:        # the input rows (a token's, or each slot's) once, for every buffer of W
                K.quantize_q8(self.dev, k, x, s.xq, s.xq_scales, self.step, self.T, plan=self.plan,
                              rows_per_token=KS if per_slot_input else 1)
            for p in w.parts:
                where = dict(plan=self.plan, first_expert=p.row0 // n, experts_here=p.rows // n)
                if int8:
                    K.moe_experts_grouped_q8(self.dev, w.qtype, k, n, E, KS, p.buffer, s.xq, s.xq_scales, y,
                                             s.expert_groups, self.T, per_slot_input=per_slot_input, **where)
                else:
                    K.moe_experts_grouped(self.dev, w.qtype, k, n, E, KS, p.buffer, x, y, s.expert_groups, self.T,
                                          per_slot_input=per_slot_input, f16=self.f16, **where)
            return
        for p in w.parts:
            K.moe_experts(self.dev, w.qtype, w.shape[0], n // 2 if geglu else n, E, cfg.n_experts_used,
                          p.buffer, x, y, ids, self.step, self.T, per_slot_input=per_slot_input, plan=self.plan,
                          first_expert=p.row0 // n, experts_here=p.rows // n, geglu=geglu,
                          int8=self._int8_x(w.qtype, experts=True, geglu=geglu))

    def experts_geglu(self, x: Buffer, out: Buffer, ids: Buffer, gate: GpuTensor | None, up: GpuTensor | None,
                      gate_up: GpuTensor | None) -> None:
        """out[t, j] = gelu(x[t] @ gate[e]^T) * (x[t] @ up[e]^T) for e = ids[t, j]. With gate and up
        in one tensor it fuses the GeGLU into the expert matvec for one token or few (one dispatch)."""
        s, KS = self.s, self.cfg.n_experts_used
        if gate_up is not None and (self.T == 1 or self.few):
            self.experts(gate_up, x, out, ids, geglu=True)
        elif gate_up is not None:
            self.experts(gate_up, x, s.experts_gate_up, ids)
            K.geglu_halves(self.dev, gate_up.shape[1] // 2, KS, s.experts_gate_up, out, self.step, self.T, plan=self.plan)
        else:
            self.experts(gate, x, s.experts_gate, ids)
            self.experts(up, x, s.experts_up, ids)
            K.elementwise(self.dev, "geglu", KS * gate.shape[1], s.experts_gate, self.step, self.T, b=s.experts_up,
                          out=out, plan=self.plan)

    def combine(self, expert_out: Buffer, ids: Buffer, weights: Buffer, out: Buffer,
                down_scale: GpuTensor | None) -> None:
        """out[t] = sum_j weights[t, j] * expert_out[t, j] [* down_scale[ids[t, j]]]."""
        self._reads(ids, weights)
        K.moe_combine(self.dev, self.cfg.hidden, self.cfg.n_experts_used, expert_out, ids, weights, out, self.step,
                      self.T, down_scale=down_scale.buffer if down_scale is not None else None, plan=self.plan)

    def moe_output(self, dense: Buffer, dense_norm: GpuTensor, expert_out: Buffer, ids: Buffer, weights: Buffer,
                   down_scale: GpuTensor | None, moe_norm: GpuTensor, out: Buffer) -> None:
        """Fuses a MoE layer's tail (reference layer: post_ffw_norm_1(mlp) + post_ffw_norm_2(moe)):
        out[t] = rms_norm(dense[t]) * dense_norm + rms_norm(sum_j weights[t, j] * expert_out[t, j]
        [* down_scale[ids[t, j]]]) * moe_norm, in one dispatch."""
        self._reads(dense, expert_out, ids, weights)
        K.moe_tail(self.dev, self.cfg.hidden, self.cfg.n_experts_used, dense, dense_norm.buffer, expert_out, ids,
                   weights, moe_norm.buffer, out, self.step, self.T, eps=self.eps,
                   down_scale=down_scale.buffer if down_scale is not None else None, plan=self.plan)

    # -- head -----------------------------------------------------------------------------
    def copy_row(self, src: Buffer, row: int, dst: Buffer, width: int) -> None:
        """dst = src[row] for rows of `width` floats."""
        src, _ = self._input(src)
        self.plan.copy(src, 4 * width * row, dst, 0, 4 * width)

    def softcap(self, x: Buffer, n: int, cap: float) -> None:
        """x = tanh(x / cap) * cap for rows of n floats."""
        K.elementwise(self.dev, "softcap", n, x, self.step, self.T, cap=cap, plan=self.plan)

    def bias(self, x: Buffer, b: Buffer, n: int) -> None:
        """x += b for rows of n floats (a constant bias, e.g. the logits' suppressed tokens)."""
        K.elementwise(self.dev, "add", n, x, self.step, self.T, b=b, plan=self.plan)

    def add(self, a: Buffer, b: Buffer, dim: int | None = None) -> None:
        """a += b over rows of `dim` (default hidden) floats."""
        self._reads(b)
        a, _ = self._input(a)
        K.elementwise(self.dev, "add", dim or self.cfg.hidden, a, self.step, self.T, b=b, plan=self.plan)

    def argmax_rows(self, w: GpuTensor, x: Buffer, ids: Buffer, first: int, cap: float) -> None:
        """ids[first + t] = argmax(softcap(x[t] @ W^T)) for each of the step's rows (at most
        kernels.HEAD_ROWS): the greedy choices, without writing the logits (shaders/head_argmax.wgsl)."""
        if w.loras:
            raise AssertionError(f"{w.name}: the greedy head takes no LoRA deltas")
        parts = [(w.bound, 0, w.shape[1])] if len(w.parts) == 1 else [(p.buffer, p.row0, p.rows) for p in w.parts]
        K.head_argmax(self.dev, w.qtype, w.shape[0], parts, x, self.s.head_partials, ids, self.step, cap=cap,
                      out0=first, plan=self.plan)

    def sample(self, logits: Buffer, n: int, token: Buffer) -> None:
        """token = a draw from logits under the sampling parameters in state.sample_params (on the GPU)."""
        K.sample(self.dev, n, logits, token, self.s.sample_params, self.s.sample_scratch, plan=self.plan)
