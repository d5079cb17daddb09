"""Gemma 4 forward on the GPU, written op by op against the ops recorder (pyapp.runtime.ops).

It reads like pyapp/reference/forward.py, which it mirrors function for
function: one statement per op, branches only on flags LayerConfig resolved
once. It holds no buffers and does no I/O: activations live in the State
(`s.x` is the residual stream, `s.xn` the normed input of the next block) and
weights in the layout (pyapp.model.weights fields holding GPU tensors). Whether
an op runs as matvec or matmul, and which kernels it fuses, is the recorder's
business. Fused ops are named for what they compute; their docstrings list the
reference ops they stand for.

  embed(ops)          x = token_embd[ids] * sqrt(hidden) (+ per-layer inputs)
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
        layers = self.cfg.layers
        for i, lc in enumerate(layers):
            following = self.w.layers[layers[i + 1].index] if i + 1 < len(layers) else None
            self.layer(ops, lc, following)

    def embed(self, ops) -> None:
        """reference: forward's embedding, then per_layer_inputs."""
        s, w = self.s, self.w
        ops.embed(w.token_embd, s.ids, s.x, scale=self.embed_scale)
        if self.cfg.has_ple:
            ops.embed(self.ple_table, self.ple_ids, s.ple_emb, scale=self.ple_scale)
            ops.linear(w.ple_model_proj, s.x, s.ple_proj)
            ops.ple_combine(s.ple_proj, s.ple_emb, w.ple_proj_norm, s.ple_in)

    def layer(self, ops, lc: LayerConfig, following: LayerWeights | None) -> None:
        """reference: layer. Each post-norm's residual add also writes the next pre-norm into s.xn
        (ffn_norm, and at the end the following layer's attn_norm)."""
        s, w = self.s, self.w.layers[lc.index]
        last_norm = following.attn_norm if following is not None else None
        if lc.index == 0:        # later layers get it from the previous layer's last add
            ops.rms_norm(s.x, s.xn, w.attn_norm)
        self.attention(ops, lc, w)
        ops.add_norm(s.attn_out, w.post_attention_norm, into=s.x, next_weight=w.ffn_norm, next_out=s.xn)
        if lc.has_moe:           # the router between the dense MLP's matvecs: its top-k rides on the down's dispatch
            ops.geglu(s.xn, s.act, gate=w.ffn_gate, up=w.ffn_up, gate_up=w.ffn_gate_up)
            self.router(ops, w)
            ops.linear(w.ffn_down, s.act, s.dense_out)
            self.experts(ops, lc, w, combine=False)
            ops.moe_output(s.dense_out, w.post_ffw_norm_1, s.experts_out, s.expert_ids, s.expert_weights,
                           w.experts_down_scale, w.post_ffw_norm_2, s.ffn_out)
        else:
            self.mlp(ops, w, s.xn, s.ffn_out)
        if not lc.has_ple:
            ops.add_norm(s.ffn_out, w.post_ffw_norm, into=s.x, scale=self.layer_scale(w), next_weight=last_norm,
                         next_out=s.xn)
            return
        ops.add_norm(s.ffn_out, w.post_ffw_norm, into=s.x)
        ops.gelu_gate(w.ple_gate, s.x, ops.ple_slice(lc.index), s.ple_act)
        ops.linear(w.ple_proj, s.ple_act, s.ple_out)
        ops.add_norm(s.ple_out, w.ple_post_norm, into=s.x, scale=self.layer_scale(w), next_weight=last_norm,
                     next_out=s.xn)

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

    def moe(self, ops, lc: LayerConfig, w: LayerWeights, x=None, experts_in=None, combine: bool = True) -> None:
        """reference: moe. Router on the raw residual x (default s.x), experts on pre_ffw_norm_2(x), written to
        experts_in (default s.xn; training keeps it apart); result in s.moe_out (combine=False: the chosen
        experts' outputs left in s.experts_out, for ops.moe_output)."""
        self.router(ops, w, x, experts_in)
        self.experts(ops, lc, w, experts_in, combine)

    def router(self, ops, w: LayerWeights, x=None, experts_in=None) -> None:
        """reference: moe's router: s.expert_ids, s.expert_weights from x (default s.x); the experts'
        input pre_ffw_norm_2(x) into experts_in (default s.xn)."""
        s = self.s
        x = s.x if x is None else x
        xe = s.xn if experts_in is None else experts_in
        ops.router(x, w.router, w.router_scale, self.router_scale, xe, w.pre_ffw_norm_2,
                   s.router_in, s.router_logits, s.expert_ids, s.expert_weights)

    def experts(self, ops, lc: LayerConfig, w: LayerWeights, experts_in=None, combine: bool = True) -> None:
        """reference: moe's experts on experts_in (default s.xn) for the routed ids, into s.experts_out
        [and combined into s.moe_out]. With streamed experts the expert kernels index a cache by slot
        (ops.expert_rounds)."""
        s = self.s
        xe = s.xn if experts_in is None else experts_in
        with ops.expert_rounds(lc.index, s.expert_ids) as slots:
            ops.experts_geglu(xe, s.experts_act, slots, gate=w.experts_gate, up=w.experts_up,
                              gate_up=w.experts_gate_up)
            ops.experts(w.experts_down, s.experts_act, s.experts_out, slots, per_slot_input=True)
        if combine:
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
