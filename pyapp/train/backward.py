"""LoRA training on the GPU: one sequence's loss and the gradients of every trained A and B.

The GPU twin of pyapp/reference/backward.py (LoraGradients), recorded once into plans and replayed
per sequence, with the memory policy of pyapp.train.state (per-layer checkpoints):

  forward(plan)     embeddings and every layer as inference runs them (pyapp.model.gemma4, the chunk
                    path: tiled matmuls, the LoRA deltas of the trained pairs), each layer's input
                    kept; then the final norm, and the loss over the vocabulary a chunk at a time
  backward(plan)    the loss's gradient chunk by chunk through the head, the final norm; then each
                    layer from the last: its forward again from its kept input, keeping its tape
                    (`layer_taped`), and its backward (`layer_backward`)

Every op's backward is a kernel with a parity test against the oracle (tests/kernels/test_backward_kernels.py);
this file only wires them in the oracle's order, one statement per op, with the oracle's names.
Gradients flow through the frozen, still quantized weights (matmul_dx dequantizes as matmul does); the
trained pairs' dA, dB are added into the flat gradient buffer (pyapp.train.params).

Mixture-of-experts layers need every expert resident (streamed experts are refused): the backward reads
the slots grouped by expert (state.expert_groups, regrouped in the dx kernel's tiles) and each expert's
weights in place.
"""

from __future__ import annotations

from ..gpu import Plan
from ..gpu import kernels as K
from ..model.gemma4 import Gemma4
from ..runtime.ops import Ops
from ..runtime.upload import WEIGHT_PAD


class LoraBackward:
    def __init__(self, dev, cfg, layout, state, params):
        if any(layout.layers[lc.index].experts_down.cached_from is not None for lc in cfg.layers if lc.has_moe):
            raise ValueError("training a mixture-of-experts model needs every expert on the GPU, not streamed")
        self.dev, self.cfg, self.w, self.t, self.p = dev, cfg, layout, state, params
        self.s = state.fwd                  # the forward's activations (one layer's tape between them)
        self.T, self.eps = state.T, cfg.eps
        self.model = Gemma4(cfg, layout, self.s)
        self.head_chunks = self._head_chunks(layout.head, state.vocab_chunk)

    def ops(self, plan: Plan, tape: bool = False) -> Ops:
        """The recorder for plan, on the f32 forward (its gradients are the oracle's); tape: every value
        written, for the backward to read."""
        return Ops(self.dev, self.cfg, self.s, plan, self.T, int8=False, tape=tape)

    # -- forward --------------------------------------------------------------------------------------

    def forward(self, plan: Plan) -> None:
        """The sequence's layers (each layer's input kept), the final norm and the loss (t.loss)."""
        s, t, ops = self.s, self.t, self.ops(plan)
        d_bytes = 4 * self.T * self.cfg.hidden
        self.model.embed(ops)
        for lc in self.cfg.layers:
            ops.copy(s.x, 0, t.layer_in[lc.index], 0, d_bytes)
            self.model.layer(ops, lc)
        ops.copy(s.x, 0, t.x_final, 0, d_bytes)
        ops.rms_norm(t.x_final, t.x_final_norm, self.w.output_norm)
        ops.finish()
        for i, chunk in enumerate(self.head_chunks):
            self.head_chunk(plan, chunk)
            K.cross_entropy_stats(self.dev, chunk[3], chunk[2], t.z, t.targets, t.weights, t.ce_stats, s.step, self.T,
                                  cap=self.cfg.final_softcap, first=i == 0, plan=plan)
        K.cross_entropy_loss(self.dev, t.ce_stats, t.weights, t.loss, s.step, plan=plan)

    def _head_chunks(self, head, chunk_rows: int) -> list:
        """(buffer, byte offset, first vocabulary id, rows) of each vocabulary chunk of the head, within its parts
        (chunk_rows a multiple of 256: every chunk's offset is 256-byte aligned)."""
        rb = K.row_bytes(head.qtype, head.shape[0])
        out = []
        for p in head.parts:
            for r0 in range(0, p.rows, chunk_rows):
                out.append((p.buffer, r0 * rb, p.row0 + r0, min(chunk_rows, p.rows - r0)))
        return out

    def head_chunk(self, plan: Plan, chunk) -> None:
        """t.z [T, rows] = x_final_norm @ head[v0 : v0 + rows]^T."""
        buf, off, v0, rows = chunk
        head = self.w.head
        n_bytes = min(buf.size - off, rows * K.row_bytes(head.qtype, head.shape[0]) + WEIGHT_PAD)
        K.matmul(self.dev, head.qtype, head.shape[0], rows, (buf, off, n_bytes), self.t.x_final_norm, self.t.z,
                 self.s.step, n_tokens=self.T, plan=plan)

    # -- backward -------------------------------------------------------------------------------------

    def backward(self, plan: Plan) -> None:
        """dA, dB of every trained pair added into the gradient buffer, for the sequence forward() ran."""
        t, s, d = self.t, self.s, self.cfg.hidden
        head = self.w.head
        for i, chunk in enumerate(self.head_chunks):
            buf, off, v0, rows = chunk
            self.head_chunk(plan, chunk)
            K.cross_entropy_grad(self.dev, rows, v0, t.z, t.targets, t.weights, t.ce_stats, s.step, self.T,
                                 cap=self.cfg.final_softcap, plan=plan)
            n_bytes = min(buf.size - off, rows * K.row_bytes(head.qtype, d) + WEIGHT_PAD)
            K.matmul_dx(self.dev, head.qtype, d, rows, (buf, off, n_bytes), t.z, t.dx_final_norm, s.step, self.T,
                        accumulate=i > 0, plan=plan)
        K.rms_norm_backward(self.dev, d, t.x_final, t.dx_final_norm, t.dx, self.w.output_norm.buffer, s.step,
                            self.T, eps=self.eps, plan=plan)
        kv_started: set = set()              # KV sources whose dK/dV a later layer has begun
        for lc in reversed(self.cfg.layers):
            self.layer_taped(plan, lc)
            self.layer_backward(plan, lc, kv_started)

    def layer_taped(self, plan: Plan, lc) -> None:
        """reference: LoraGradients.layer. The layer's forward again from its kept input, every value its
        backward reads left in a buffer of its own (the output itself is not needed)."""
        s, t, w, ops = self.s, self.t, self.w.layers[lc.index], self.ops(plan, tape=True)
        d_bytes = 4 * self.T * self.cfg.hidden
        ops.copy(t.layer_in[lc.index], 0, s.x, 0, d_bytes)
        ops.rms_norm(s.x, s.xn, w.attn_norm)
        self.model.attention(ops, lc, w)
        ops.copy(s.x, 0, t.h, 0, d_bytes)
        ops.add_norm(s.attn_out, w.post_attention_norm, into=t.h)
        ops.rms_norm(t.h, t.xn2, w.ffn_norm)
        if lc.has_moe:       # as Gemma4.layer's MoE branch, the router on h and the experts' input kept apart
            self.model.mlp(ops, w, t.xn2, s.dense_out)
            ops.rms_norm(s.dense_out, s.ffn_out, w.post_ffw_norm_1)
            self.model.moe(ops, lc, w, h=t.h, experts_in=t.x_experts)
            ops.add_norm(s.moe_out, w.post_ffw_norm_2, into=s.ffn_out)
        else:
            self.model.mlp(ops, w, t.xn2, s.ffn_out)
        if lc.has_ple:
            ops.copy(t.h, 0, t.x2, 0, d_bytes)
            ops.add_norm(s.ffn_out, w.post_ffw_norm, into=t.x2)
            ops.gelu_gate(w.ple_gate, t.x2, ops.ple_slice(lc.index), s.ple_act)
            ops.linear(w.ple_proj, s.ple_act, s.ple_out)
        ops.finish()

    def layer_backward(self, plan: Plan, lc, kv_started: set) -> None:
        """reference: LoraGradients.layer_backward. t.dx: dloss/d(layer output) in, dloss/d(layer input) out."""
        s, t, w, eps, T, d = self.s, self.t, self.w.layers[lc.index], self.eps, self.T, self.cfg.hidden
        dev, dy = self.dev, t.dx
        if w.output_scale is not None:
            K.elementwise(dev, "scale", d, dy, s.step, T, b=w.output_scale.buffer, plan=plan)
        if lc.has_ple:
            pd = self.cfg.ple_dim
            self.norm_backward(plan, d, s.ple_out, dy, t.dtmp, w.ple_post_norm)
            self.linear_backward(plan, lc.index, "ple_proj", w.ple_proj, s.ple_act, t.dtmp, t.dple)
            ple_in = self.ops(plan).ple_slice(lc.index)
            K.gelu_times_backward(dev, pd, s.ple_gate, ple_in, t.dple, t.dple_gate, s.step, T, plan=plan)
            self.linear_backward(plan, lc.index, "ple_gate", w.ple_gate, t.x2, t.dple_gate, dy, accumulate=True)
        # dy: dloss/dx2 (x2 = h + post_ffw_norm(f))
        self.norm_backward(plan, d, s.ffn_out, dy, t.dtmp, w.post_ffw_norm)
        if lc.has_moe:       # f = post_ffw_norm_1(m) + post_ffw_norm_2(sparse)
            self.norm_backward(plan, d, s.dense_out, t.dtmp, t.dsub, w.post_ffw_norm_1)
            self.mlp_backward(plan, lc, w, t.dsub, t.dxn)
            self.norm_backward(plan, d, t.h, t.dxn, dy, w.ffn_norm, accumulate=True)
            self.norm_backward(plan, d, s.moe_out, t.dtmp, t.dsub, w.post_ffw_norm_2)
            self.moe_backward(plan, lc, w, t.dsub, dy)
        else:
            self.mlp_backward(plan, lc, w, t.dtmp, t.dxn)
            self.norm_backward(plan, d, t.h, t.dxn, dy, w.ffn_norm, accumulate=True)
        # dy: dloss/dh (h = x + post_attention_norm(a))
        self.norm_backward(plan, d, s.attn_out, dy, t.dtmp, w.post_attention_norm)
        self.attention_backward(plan, lc, w, t.dtmp, t.dxn, kv_started)
        self.norm_backward(plan, d, s.x, t.dxn, dy, w.attn_norm, accumulate=True)

    def mlp_backward(self, plan: Plan, lc, w, df, dxn) -> None:
        """reference: mlp_backward. df: dloss/d(ffn_down's output) -> dxn: dloss/d(the MLP's input)."""
        s, t, T, dev = self.s, self.t, self.T, self.dev
        self.linear_backward(plan, lc.index, "ffn_down", w.ffn_down, s.act, df, t.dact)
        if w.ffn_gate_up is not None:
            ff = w.ffn_gate_up.shape[1] // 2
            K.geglu_backward(dev, ff, s.gate_up, t.dact, t.dgate_up, s.step, T, plan=plan)
            self.linear_backward(plan, lc.index, ("ffn_gate", "ffn_up"), w.ffn_gate_up, t.xn2, t.dgate_up, dxn)
            return
        ff = w.ffn_gate.shape[1]
        K.gelu_times_backward(dev, ff, s.gate, s.up, t.dact, t.dgate, s.step, T, plan=plan)
        K.elementwise(dev, "geglu", ff, s.gate, s.step, T, b=t.dact, out=t.dup, plan=plan)    # dup = gelu(gate) dy
        self.linear_backward(plan, lc.index, "ffn_gate", w.ffn_gate, t.xn2, t.dgate, dxn)
        self.linear_backward(plan, lc.index, "ffn_up", w.ffn_up, t.xn2, t.dup, dxn, accumulate=True)

    def moe_backward(self, plan: Plan, lc, w, dout, dh) -> None:
        """reference: moe_backward, then its two norms' backward. dout: dloss/d(the experts' weighted sum) ->
        dh += the gradient through the router (its input norm, the projection and its LoRA, the top-k
        weights) and through the experts' input (pre_ffw_norm_2)."""
        s, t, T, dev, cfg, d = self.s, self.t, self.T, self.dev, self.cfg, self.cfg.hidden
        KS = cfg.n_experts_used
        scale = w.experts_down_scale.buffer if w.experts_down_scale is not None else None
        K.moe_router_backward(dev, cfg.n_experts, KS, d, s.router_logits, s.expert_ids, dout, s.experts_out,
                              t.drouter, s.step, T, down_scale=scale, plan=plan)
        self.linear_backward(plan, lc.index, "router", w.router, s.router_in, t.drouter, t.dxn)
        self.norm_backward(plan, d, t.h, t.dxn, dh, w.router_scale, accumulate=True, scale=self.model.router_scale)
        # experts_backward's dx: dmid = down^T (weight * scale * dout) per slot, through the GeGLU, gate/up.
        # Its kernel reads the slots grouped in tiles of its own size: regroup (the forward grouped for its tile).
        K.moe_group(dev, cfg.n_experts, KS, s.expert_ids, s.expert_groups, s.step, plan=plan, tile=K.MOE_DX_GROUPS)
        self.experts_dx(plan, w.experts_down, dout, t.dexperts_act, weights=s.expert_weights, down_scale=scale)
        if w.experts_gate_up is not None:
            eff = w.experts_gate_up.shape[1] // 2
            K.geglu_backward(dev, eff, s.experts_gate_up, t.dexperts_act, t.dexperts_gate_up, s.step, T,
                             rows_per_token=KS, plan=plan)
            self.experts_dx(plan, w.experts_gate_up, t.dexperts_gate_up, t.dexperts_in, per_slot=True)
        else:
            eff = w.experts_gate.shape[1]
            K.gelu_times_backward(dev, KS * eff, s.experts_gate, s.experts_up, t.dexperts_act, t.dexperts_gate,
                                  s.step, T, plan=plan)
            K.elementwise(dev, "geglu", KS * eff, s.experts_gate, s.step, T, b=t.dexperts_act, out=t.dexperts_up,
                          plan=plan)                                 # dup = gelu(gate) dmid
            self.experts_dx(plan, w.experts_gate, t.dexperts_gate, t.dexperts_in, per_slot=True)
            self.experts_dx(plan, w.experts_up, t.dexperts_up, t.dexperts_in, per_slot=True, accumulate=True)
        K.moe_slot_sum(dev, d, KS, t.dexperts_in, t.dxn, s.step, T, plan=plan)
        self.norm_backward(plan, d, t.h, t.dxn, dh, w.pre_ffw_norm_2, accumulate=True)

    def experts_dx(self, plan: Plan, w, dy, dx, per_slot: bool = False, weights=None, down_scale=None,
                   accumulate: bool = False) -> None:
        """dx[s] (+)= c(s) dy[t or s] @ W[ids[s]] through the frozen experts W [E, n, k], slot by slot (c: the
        slot's weight and down scale, given weights), buffer by buffer of W; the slots grouped by expert in
        state.expert_groups (moe_backward regroups them in moe_experts_dx's tiles)."""
        s, n = self.s, w.shape[1]
        for p in w.parts:
            K.moe_experts_dx(self.dev, w.qtype, w.shape[0], n, w.shape[2], self.cfg.n_experts_used, p.buffer, dy, dx,
                             s.expert_groups, self.T, per_slot_dy=per_slot, weights=weights, down_scale=down_scale,
                             accumulate=accumulate, first_expert=p.row0 // n, experts_here=p.rows // n, plan=plan)

    def attention_backward(self, plan: Plan, lc, w, da, dxn, kv_started: set) -> None:
        """reference: attention_backward. da: dloss/d(attn_output's output) -> dxn: dloss/d(the attention's
        input). dK, dV of the cache this layer reads are added to its source's (KV sharing); a layer with
        its own cache turns them into its k/v projections' gradients (every reader has added by then:
        readers come later in the model, earlier in the backward)."""
        s, t, T, dev, cfg = self.s, self.t, self.T, self.dev, self.cfg
        H, hd, kvh = cfg.n_heads, lc.head_dim, lc.n_kv_heads
        ff = None if lc.sliding else self.w.rope_freqs
        ff = ff.buffer if ff is not None else None
        rope = (lc.rope_dims, lc.rope_base)
        cache = s.kv[lc.kv_source]
        dk, dv = t.dkv[lc.kv_source]
        window = cfg.sliding_window if lc.sliding else 0
        self.linear_backward(plan, lc.index, "attn_output", w.attn_output, s.attn, da, t.dattn)
        K.attention_backward(dev, s.q, cache.k, cache.v, t.dattn, t.attn_stats, t.dq, dk, dv, s.step, H, kvh, hd,
                             cache.slots, T, t.attn_scratch, window=window, accumulate=lc.kv_source in kv_started,
                             plan=plan)
        kv_started.add(lc.kv_source)
        K.rms_norm_backward(dev, hd, s.q_raw, t.dq, t.dq_raw, w.attn_q_norm.buffer, s.step, T, rows_per_token=H,
                            eps=self.eps, rope=rope, freq_factors=ff, plan=plan)
        self.linear_backward(plan, lc.index, "attn_q", w.attn_q, s.xn, t.dq_raw, dxn)
        if not lc.owns_kv:
            return
        K.rms_norm_backward(dev, hd, s.k_raw, dk, t.dk_raw, w.attn_k_norm.buffer, s.step, T, rows_per_token=kvh,
                            eps=self.eps, rope=rope, freq_factors=ff, dy_ctx=cache.slots, plan=plan)
        if lc.has_v:
            K.rms_norm_backward(dev, hd, s.v_raw, dv, t.dv_raw, None, s.step, T, rows_per_token=kvh, eps=self.eps,
                                dy_ctx=cache.slots, plan=plan)
            self.linear_backward(plan, lc.index, "attn_v", w.attn_v, s.xn, t.dv_raw, dxn, accumulate=True)
        else:       # V is the raw K (k_eq_v): its gradient joins K's
            K.rms_norm_backward(dev, hd, s.k_raw, dv, t.dk_raw, None, s.step, T, rows_per_token=kvh, eps=self.eps,
                                dy_ctx=cache.slots, accumulate=True, plan=plan)
        self.linear_backward(plan, lc.index, "attn_k", w.attn_k, s.xn, t.dk_raw, dxn, accumulate=True)

    # -- one op's backward ------------------------------------------------------------------------------

    def norm_backward(self, plan: Plan, d: int, x, dy, dx, weight, accumulate: bool = False,
                      scale: float = 1.0) -> None:
        K.rms_norm_backward(self.dev, d, x, dy, dx, weight.buffer if weight is not None else None, self.s.step,
                            self.T, eps=self.eps, accumulate=accumulate, scale=scale, plan=plan)

    def linear_backward(self, plan: Plan, layer: int, fields, w, x, dy, dx, accumulate: bool = False) -> None:
        """reference: proj_backward. dx (+)= dy @ W through the frozen (quantized) W, then each trained pair on
        it: dx += its LoRA part, dA and dB added. fields: the projection's field, or the fields a fused
        tensor holds (gate|up)."""
        k, n = w.shape[0], w.shape[1]
        for i, part in enumerate(w.parts):
            buf = w.bound if len(w.parts) == 1 else part.buffer
            K.matmul_dx(self.dev, w.qtype, k, part.rows, buf, dy, dx, self.s.step, self.T, ldd=n, col0=part.row0,
                        accumulate=accumulate or i > 0, plan=plan)
        for f in (fields,) if isinstance(fields, str) else fields:
            pair = self.p.by_target.get((layer, f))
            if pair is None:
                continue
            g = pair.lora
            K.lora_backward(self.dev, g.k, g.n, g.rank, g.a, g.b, x, dy, dx, pair.da, pair.db, self.t.lora_scratch,
                            g.scale, self.s.step, self.T, ldd=n, col0=pair.col0, plan=plan)
