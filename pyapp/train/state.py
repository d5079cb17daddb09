"""Every GPU buffer a training step uses besides the weights and the LoRA parameters, declared once.

Memory policy: activation checkpointing per layer. The forward keeps only each layer's input
(`layer_in`, L x T x hidden floats); the backward recomputes one layer at a time from it, into
the buffers of one layer's tape (the forward State's activations plus `h`, `xn2`, `x2`),
and runs that layer's backward right away. So activations cost L x T x hidden plus one layer,
not L layers' worth; the recompute costs one more forward of the layers (about a third more
work than keeping everything).

The forward's own buffers (residual stream, q/k/v, MLP, PLE, KV caches, the step uniform) are a
pyapp.runtime.state.State for chunk = context = seq_len: a whole sequence runs as one step from
position 0, and every layer's KV cache holds all of it (a sliding layer's ring is seq_len slots).
"""

from __future__ import annotations

from array import array

from ..gpu import Device
from ..gpu import kernels as K
from ..runtime.state import State, f32_allocator, widest


class TrainState:
    def __init__(self, dev: Device, cfg, layout, seq_len: int, vocab_chunk: int):
        self.dev, self.cfg, self.T = dev, cfg, seq_len
        self.fwd = State(dev, cfg, layout, context_length=seq_len, chunk=seq_len, int8=False)   # f32 matmuls
        T, d, H, L = seq_len, cfg.hidden, cfg.n_heads, cfg.n_layers
        hd, kvh, ff = widest(cfg)
        f32 = f32_allocator(dev)

        # checkpoints: what the backward recomputes each layer from
        self.layer_in = [f32(T * d, f"layer {i} input") for i in range(L)]    # [T, d] each
        self.x_final = f32(T * d, "x final")              # [T, d] the last layer's output
        self.x_final_norm = f32(T * d, "x final norm")    # [T, d] output_norm(x_final): the head's input
        # one layer's tape, besides fwd's activations (x, xn = attn_norm(x), q_raw, q, k_raw, v_raw, attn, attn_out,
        # gate_up / gate, up, act, ffn_out, ple_gate, ple_act, ple_out; MoE layers: dense_out, router_in,
        # router_logits, expert_ids, expert_weights, expert_groups, experts_gate_up / experts_gate, experts_up,
        # experts_act, experts_out, moe_out)
        self.h = f32(T * d, "h")                          # [T, d] x + post_attention_norm(attn_out)
        self.xn2 = f32(T * d, "xn2")                      # [T, d] ffn_norm(h): the gate/up projections' input
        self.x2 = f32(T * d, "x2")                        # [T, d] h + post_ffw_norm(ffn_out): the PLE gate's input
        if cfg.is_moe:      # [T, d] pre_ffw_norm_2(h): the experts' input (xn holds the attention's)
            self.x_experts = f32(T * d, "x experts")
        # gradients (dloss/d of what the name says)
        self.dx = f32(T * d, "dx")                        # [T, d] the residual stream, layer by layer
        self.dtmp = f32(T * d, "dtmp")                    # [T, d] a norm's output gradient (da, df, dp)
        self.dxn = f32(T * d, "dxn")                      # [T, d] a pre-norm's output (xn, xn2, router_in, x_experts)
        self.dattn = f32(T * H * hd, "dattn")             # [T, H * hd] the attention's output
        self.dq = f32(T * H * hd, "dq")                   # [T, H, hd] q after norm + RoPE
        self.dq_raw = f32(T * H * hd, "dq_raw")           # [T, H, hd] the q projection's output
        self.dk_raw = f32(T * kvh * hd, "dk_raw")         # [T, kvh, hd]
        self.dv_raw = f32(T * kvh * hd, "dv_raw")         # [T, kvh, hd]
        self.dact = f32(T * ff, "dact")                   # [T, ff] gelu(gate) * up
        self.dgate_up = f32(T * 2 * ff, "dgate_up")       # [T, 2 ff] [dgate | dup] (fused gate|up)
        self.dgate = f32(T * ff, "dgate")                 # [T, ff] (gate and up apart)
        self.dup = f32(T * ff, "dup")                     # [T, ff]
        if cfg.is_moe:
            E, KS, eff = cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_dim
            self.dsub = f32(T * d, "dsub")                # [T, d] the dense MLP's output, then the experts' sum
            self.drouter = f32(T * E, "drouter")          # [T, E] the router's logits
            self.dexperts_act = f32(T * KS * eff, "dexperts_act")   # [T*KS, eff] gelu(gate) * up per slot
            if any(lc.experts_fused for lc in cfg.layers if lc.has_moe):
                self.dexperts_gate_up = f32(T * KS * 2 * eff, "dexperts_gate_up")  # [T*KS, 2 eff] [dgate | dup]
            if any(not lc.experts_fused for lc in cfg.layers if lc.has_moe):
                self.dexperts_gate = f32(T * KS * eff, "dexperts_gate")    # [T*KS, eff] (gate and up apart)
                self.dexperts_up = f32(T * KS * eff, "dexperts_up")        # [T*KS, eff]
            self.dexperts_in = f32(T * KS * d, "dexperts_in")   # [T*KS, d] each slot's share of the experts' input
        if cfg.has_ple:
            self.dple = f32(T * cfg.ple_dim, "dple")          # [T, pd] gelu(gate) * ple_in
            self.dple_gate = f32(T * cfg.ple_dim, "dple_gate")  # [T, pd] the PLE gate's pre-activation
        # dK, dV of each layer with its own cache, in the cache's layout [kvh, T, hd]: KV-sharing layers add theirs
        self.dkv = {lc.index: (f32(lc.n_kv_heads * T * lc.head_dim, f"dk {lc.index}"),
                               f32(lc.n_kv_heads * T * lc.head_dim, f"dv {lc.index}"))
                    for lc in cfg.layers if lc.owns_kv}
        self.attn_stats = f32(2 * H * T, "attention backward stats")     # [T, H, 2]
        self.attn_scratch = f32(K.attention_backward_scratch_floats(H, hd, T), "attention backward scratch")
        self.lora_scratch = f32(K.lora_ud_floats(K.LORA_MAX_RANK, T), "lora backward scratch")
        # loss: the head's logits a vocabulary chunk at a time
        self.vocab_chunk = vocab_chunk
        self.z = f32(T * vocab_chunk, "logits chunk")     # [T, vocab_chunk] pre-softcap, then its gradient
        self.dx_final_norm = f32(T * d, "dx final norm")  # [T, d]
        self.targets = dev.buffer(4 * T, label="targets")   # u32 [T]: row t predicts targets[t]
        self.weights = f32(T, "target weights")             # [T]: mask / targets in the update
        self.ce_stats = f32(K.CE_STAT_FLOATS * T, "cross-entropy stats")
        self.loss = f32(4, "loss")                          # [1] this sequence's share of the update's loss

    def write_sequence(self, ids: list[int], mask: list[int], n_targets_in_update: int, source) -> None:
        """A sequence's ids (from position 0) and its loss targets: row t predicts ids[t + 1] with weight
        mask[t + 1] / n_targets_in_update, so the sequences of one update sum to its mean loss."""
        self.fwd.write_step(ids, 0, source)
        tgt = array("I", ids[1:] + [0])
        wt = array("f", [m / n_targets_in_update for m in mask[1:]] + [0.0])
        self.dev.write(self.targets, tgt.tobytes())
        self.dev.write(self.weights, wt.tobytes())
