"""Gemma 4 forward on the GPU, written op by op against the ops recorder (pyapp.runtime.ops).

It reads like pyapp/reference/forward.py, which it mirrors function for
function: one statement per reference op, in the reference's order, branches
only on flags LayerConfig resolved once. It holds no buffers and does no I/O:
activations live in the State (`s.x` is the residual stream, `s.xn` the normed
input of the block at hand) and weights in the layout (pyapp.model.weights
fields holding GPU tensors). Whether an op runs as matvec or matmul, and which
ops share a kernel, is decided after the whole step is recorded
(pyapp.runtime.fusion), never here.

  embed(ops)          x = token_embd[ids] * sqrt(hidden), an image's soft tokens in place (+ per-layer inputs)
  layer(ops, lc)      one decoder layer on x, for the T tokens of the plan
  head(ops, row)      logits of one row of x [+ the sampled next token]
  head_argmax(ops)    the greedy next token after every row of x (speculative decoding's check)
"""

from __future__ import annotations

import math

from .config import Gemma4Config, LayerConfig
from .weights import LayerWeights, ModelWeights


class Gemma4:
    def __init__(self, cfg: Gemma4Config, weights: ModelWeights, state):
        self.cfg, self.w, self.s = cfg, weights, state
        self.embed_scale = math.sqrt(cfg.hidden)
        self.ple_scale = math.sqrt(cfg.ple_dim) if cfg.has_ple else 0.0
        self.router_scale = 1.0 / math.sqrt(cfg.hidden)
        # per-layer embedding rows: looked up by token id, or (table left in the file) the step's rows in order
        self.ple_table, self.ple_ids = ((state.ple_rows, state.iota) if cfg.has_ple and state.ple_file_table
                                        else (weights.ple_token_embd, state.ids))

    def layers(self, ops) -> None:
        """Embeddings and every layer, for the tokens of one step."""
        self.embed(ops)
        for lc in self.cfg.layers:
            self.layer(ops, lc)

    def embed(self, ops) -> None:
        """reference: forward's embedding, then per_layer_inputs."""
        s, w = self.s, self.w
        ops.embed(w.token_embd, s.ids, s.x, scale=self.embed_scale)
        ops.soft_tokens(s.soft_rows, s.soft_at, s.x)
        if self.cfg.has_ple:
            ops.embed(self.ple_table, self.ple_ids, s.ple_emb, scale=self.ple_scale)
            ops.linear(w.ple_model_proj, s.x, s.ple_proj)
            ops.ple_combine(s.ple_proj, s.ple_emb, w.ple_proj_norm, s.ple_in)

    def layer(self, ops, lc: LayerConfig) -> None:
        """reference: layer, on the residual stream s.x; s.xn holds each block's normed input."""
        s, w = self.s, self.w.layers[lc.index]
        ops.rms_norm(s.x, s.xn, w.attn_norm)
        self.attention(ops, lc, w)
        ops.add_norm(s.attn_out, w.post_attention_norm, into=s.x)
        ops.rms_norm(s.x, s.xn, w.ffn_norm)
        if lc.has_moe:
            self.mlp(ops, w, s.xn, s.dense_out)
            ops.rms_norm(s.dense_out, s.ffn_out, w.post_ffw_norm_1)
            self.moe(ops, lc, w)
            ops.add_norm(s.moe_out, w.post_ffw_norm_2, into=s.ffn_out)
        else:
            self.mlp(ops, w, s.xn, s.ffn_out)
        ops.add_norm(s.ffn_out, w.post_ffw_norm, into=s.x)
        if lc.has_ple:
            ops.gelu_gate(w.ple_gate, s.x, ops.ple_slice(lc.index), s.ple_act)
            ops.linear(w.ple_proj, s.ple_act, s.ple_out)
            ops.add_norm(s.ple_out, w.ple_post_norm, into=s.x)
        scale = self.layer_scale(w)
        if scale is not None:
            ops.scale(s.x, scale)

    def layer_scale(self, w: LayerWeights):
        """The factor a layer's output is scaled by (layer_output_scale; None: 1)."""
        return w.output_scale

    def attention(self, ops, lc: LayerConfig, w: LayerWeights) -> None:
        """reference: attention on s.xn, result in s.attn_out."""
        s = self.s
        cache = s.kv[lc.kv_source]
        freq_factors = None if lc.sliding else self.w.rope_freqs
        if lc.owns_kv:
            ops.qkv_into_cache(lc, w, s.xn, cache, freq_factors)
        else:
            ops.q_proj(lc, w, s.xn, freq_factors)
        ops.attend(lc, s.q, cache, s.attn)
        ops.linear(w.attn_output, s.attn, s.attn_out)

    def mlp(self, ops, w: LayerWeights, x, out) -> None:
        """reference: mlp (GeGLU)."""
        ops.geglu(x, self.s.act, gate=w.ffn_gate, up=w.ffn_up, gate_up=w.ffn_gate_up)
        ops.linear(w.ffn_down, self.s.act, out)

    def moe(self, ops, lc: LayerConfig, w: LayerWeights, h=None, experts_in=None) -> None:
        """reference: moe, into s.moe_out. The router reads the raw residual h (default s.x); the experts
        read pre_ffw_norm_2(h), written to experts_in (default s.xn; training keeps it apart). With
        streamed experts the expert kernels index a cache by slot (ops.expert_rounds)."""
        s = self.s
        h = s.x if h is None else h
        xe = s.xn if experts_in is None else experts_in
        ops.rms_norm_pair(h, s.router_in, w.router_scale, xe, w.pre_ffw_norm_2, scale=self.router_scale)
        ops.linear(w.router, s.router_in, s.router_logits)
        ops.route(s.router_logits, s.expert_ids, s.expert_weights)
        with ops.expert_rounds(lc.index, s.expert_ids) as slots:
            ops.experts_geglu(xe, s.experts_act, slots, gate=w.experts_gate, up=w.experts_up,
                              gate_up=w.experts_gate_up)
            ops.experts(w.experts_down, s.experts_act, s.experts_out, slots, per_slot_input=True)
        ops.combine(s.experts_out, s.expert_ids, s.expert_weights, s.moe_out, w.experts_down_scale)

    def head(self, ops, row: int, sample: bool) -> None:
        """reference: forward's tail for one row of the last step: final norm, output, softcap [, sample]."""
        s, cfg = self.s, self.cfg
        ops.copy_row(s.x, row, s.x_last, cfg.hidden)
        ops.rms_norm(s.x_last, s.x_last_norm, self.w.output_norm)
        ops.linear(self.w.head, s.x_last_norm, s.logits)
        if cfg.final_softcap:
            ops.softcap(s.logits, cfg.vocab_size, cfg.final_softcap)
        if sample:
            if s.logit_bias is not None:          # tokens the model's generation config never samples
                ops.bias(s.logits, s.logit_bias, cfg.vocab_size)
            ops.sample(s.logits, cfg.vocab_size, s.token)

    def head_argmax(self, ops, first: int) -> None:
        """reference: forward's tail for every row of the last step, then the greedy pick of each:
        final norm, output, softcap and argmax, ids into s.greedy_ids[first ..] (no logits written)."""
        s = self.s
        ops.rms_norm(s.x, s.x_rows_norm, self.w.output_norm)
        ops.argmax_rows(self.w.head, s.x_rows_norm, s.greedy_ids, first, self.cfg.final_softcap or 0.0)
