"""Every GPU buffer a forward pass reads or writes besides the weights, declared once with its shape.

Like llama2.c's RunState: activations for up to `chunk` tokens (T below), the
KV cache, the head's buffers and the per-step inputs, all f32 unless noted,
allocated here and nowhere else (a family that needs more buffers subclasses it:
DiffusionGemma's CanvasState). `write_step` fills the per-step inputs.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from ..gpu import Buffer, Device, GPUError
from ..gpu import kernels as K
from ..model.weights import names
from .upload import WEIGHT_PAD, FileTensor, GpuTensor, Part

SUPPRESSED = -1e30       # a suppressed token's logit bias: finite (no inf - inf), never drawn after softcap


@dataclass
class KVCache:
    """One layer's keys and values after norm + RoPE: [n_kv_heads, slots, head_dim] each."""
    k: Buffer
    v: Buffer
    slots: int        # positions held: the whole context, or a ring for sliding layers


def widest(cfg) -> tuple[int, int, int]:
    """The largest head_dim, KV head count and FFN width over the layers: what per-layer buffers are sized by."""
    return (max(lc.head_dim for lc in cfg.layers), max(lc.n_kv_heads for lc in cfg.layers),
            max(lc.ffn_dim for lc in cfg.layers))


def f32_allocator(dev: Device):
    """f32(n, label): a storage buffer of n floats (at least 4: a binding may not be empty)."""
    def f32(n: int, label: str) -> Buffer:
        return dev.buffer(4 * max(n, 4), label=label)
    return f32


# tables a step looks rows up in, and the head (one row a step: a matvec): no chunk multiplies them
NOT_CHUNK_MATMULS = ("token_embd", "output", "ple_token_embd")


def split_partial_floats(dev: Device, cfg, layout, T: int, int8: bool = True) -> int:
    """Floats of partial sums that a step of T tokens' matmuls over slices of K need (K.q8_tile_split for the
    int8 ones, K.matmul_split_for for the f32 tile's): the most that any row block of the layers' projections
    asks for; 0 where none is split (int8: whether the runner's chunks take int8 activations). (A chunk
    multiplies q, k and v apart, ops.qkv: the fused q|k|v is one token's matvec; gate|up it multiplies fused.)"""
    if T == 1:
        return 0
    blocks = []                 # (type, row length, rows) of each row block a matmul multiplies
    for _, owner, field_name in names(cfg, layout):
        t = getattr(owner, field_name)
        if isinstance(t, GpuTensor) and len(t.shape) == 2 and field_name not in NOT_CHUNK_MATMULS:
            blocks += [(t.qtype, t.shape[0], p.rows) for p in t.parts]
    for lw in layout.layers:
        if lw.ffn_gate_up is not None:
            blocks += [(lw.ffn_gate_up.qtype, lw.ffn_gate_up.shape[0], p.rows) for p in lw.ffn_gate_up.parts]
    splits = [(K.q8_tile_split(rows, k, T, room=1 << 62)[1] if int8 and K.int8_matmul(qtype, k, T) else
               K.matmul_split_for(K.fit_tile(dev, K.matmul_tile_for(rows, T)), rows, k, T, room=1 << 62), rows)
              for qtype, k, rows in blocks]
    return max((split * T * rows for split, rows in splits if split > 1), default=0)


class State:
    def __init__(self, dev: Device, cfg, layout, context_length: int, chunk: int, int8: bool = True):
        self.dev, self.cfg, self.ctx, self.chunk = dev, cfg, context_length, chunk
        T, d, H, V = chunk, cfg.hidden, cfg.n_heads, cfg.vocab_size
        hd, kvh, ff = widest(cfg)
        f32 = f32_allocator(dev)

        # per-step inputs
        self.step = dev.buffer(K.STEP_BYTES, "uniform", "step")     # Step: tokens this step, first position
        self.ids = dev.buffer(4 * T, label="token ids")              # u32 [T]
        self.iota = dev.buffer(4 * T, label="iota")                  # u32 [T] = 0..T-1 (PLE rows in order)
        dev.write(self.iota, array("I", range(T)).tobytes())
        # an encoder's soft tokens (an image's) over this step's embeddings: rows copied in per step
        self.soft_rows = f32(T * d, "soft rows")                     # [T, d] the step's soft tokens, in place
        self.soft_at = dev.buffer(4 * T, label="soft at")            # u32 [T]: 1 where row t is a soft token
        self.soft_written = False                                    # soft_at holds a 1 (cleared when a step has none)
        # models whose images attend both ways (26B-A4B, 31B): the keys after its own each row also sees
        self.keys_ahead = dev.buffer(4 * T, label="keys ahead") if cfg.image_attention_both_ways else None   # u32 [T]
        # residual stream and the blocks' inputs and outputs
        self.x = f32(T * d, "x")                        # [T, d] residual stream
        self.x_alt = f32(d, "x alt")                    # [d] a decode step's residual stream, every other fused add (Ops)
        self.xn = f32(T * d, "xn")                      # [T, d] pre-norm of the next block
        self.attn_out = f32(T * d, "attn_out")          # [T, d] attention after its output projection
        self.ffn_out = f32(T * d, "ffn_out")            # [T, d] FFN result before post_ffw_norm
        # attention
        self.q_raw = f32(T * H * hd, "q_raw")           # [T, H, hd] q projection
        self.q = f32(T * H * hd, "q")                   # [T, H, hd] q normed + roped
        self.k_raw = f32(T * kvh * hd, "k_raw")         # [T, kvh, hd]
        self.k = f32(T * kvh * hd, "k")                 # [T, kvh, hd] normed + roped
        self.v_raw = f32(T * kvh * hd, "v_raw")         # [T, kvh, hd]
        self.v = f32(T * kvh * hd, "v")                 # [T, kvh, hd] normed
        self.attn = f32(T * H * hd, "attn")             # [T, H * hd] softmax(q k^T) v
        qkv_rows = [lw.qkv.out_rows for lw in layout.layers if lw.qkv is not None]
        self.qkv = f32(max(qkv_rows, default=4), "qkv")  # [q rows | k rows | v rows] of one decode token
        self.partials = f32(max(K.decode_partials(H, lc.head_dim, self.max_keys(lc)) for lc in cfg.layers),
                            "attention partials")       # split-K decode: per 32-key softmax states
        # int8 activations of a chunk's quantized matmuls and of a few-token step's (K.quantize_q8): codes and
        # (scale, sum) per 32
        self.xq = self.xq_scales = None
        rounded = T if T > K.INT8_MIN_TOKENS else min(T, K.HEAD_ROWS)     # a chunk's rows, or a few-token step's
        if rounded > 1:
            rows_k = rounded * max(d, ff, H * hd)      # a projection's input; the experts' down: a row a slot
            if cfg.is_moe:
                rows_k = max(rows_k, rounded * cfg.n_experts_used * cfg.expert_ffn_dim)
            xq_bytes, xs_bytes = K.q8_bytes(1, rows_k)
            self.xq = dev.buffer(xq_bytes, label="xq")              # i8 [T, k]
            self.xq_scales = dev.buffer(xs_bytes, label="xq scales")  # [T, k / 32, 2] f32
        # partial sums of a chunk's matmuls over slices of K (K.q8_tile_split, K.matmul_split_for: few rows)
        partial_floats = split_partial_floats(dev, cfg, layout, T, int8)
        self.matmul_partials = f32(partial_floats, "matmul partials") if partial_floats else None  # [slices, T, rows]
        # dense MLP
        q8_codes, q8_scales = K.q8_bytes(1, ff)        # a decode step's GeGLU output rounded to int8 per 32
        self.act_q8 = dev.buffer(q8_codes, label="act q8")                   # i8 [ff] (K.RoundedX)
        self.act_q8_scales = dev.buffer(q8_scales, label="act q8 scales")    # [ff / 32, 2] f32: (d, sum)
        self.gate = f32(T * ff, "gate")                 # [T, ff]
        self.up = f32(T * ff, "up")                     # [T, ff]
        self.gate_up = f32(T * 2 * ff, "gate_up")       # [T, 2 ff] fused gate|up rows
        self.act = f32(T * ff, "act")                   # [T, ff] gelu(gate) * up
        if cfg.is_moe:
            E, KS, eff = cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_dim
            self.dense_out = f32(T * d, "dense_out")            # [T, d] the MoE layer's dense MLP
            self.router_in = f32(T * d, "router_in")            # [T, d] rms_norm(x) / sqrt(d) * scale
            self.router_logits = f32(T * E, "router_logits")    # [T, E]
            self.expert_ids = f32(T * KS, "expert_ids")         # u32 [T, KS] chosen experts
            self.expert_slots = f32(T * KS, "expert_slots")     # u32 [T, KS] their cache slots (streamed experts)
            self.expert_groups = f32(K.moe_group_rows(E, KS, T), "expert_groups")  # u32: the slots by expert
            self.expert_weights = f32(T * KS, "expert_weights")  # [T, KS] renormalized probabilities
            self.experts_gate_up = f32(T * KS * 2 * eff, "experts_gate_up")  # [T*KS, 2 eff]
            self.experts_gate = f32(T * KS * eff, "experts_gate")  # [T*KS, eff]
            self.experts_up = f32(T * KS * eff, "experts_up")      # [T*KS, eff]
            self.experts_act = f32(T * KS * eff, "experts_act")    # [T*KS, eff]
            self.experts_out = f32(T * KS * d, "experts_out")      # [T*KS, d] before the weighted sum
            self.moe_out = f32(T * d, "moe_out")                   # [T, d]
        self.ple_file_table = None
        if cfg.has_ple:
            L, pd = cfg.n_layers, cfg.ple_dim
            if isinstance(layout.ple_token_embd, FileTensor):      # the table stays in the file
                table = self.ple_file_table = layout.ple_token_embd.info
                rows = dev.buffer(T * table.row_bytes + WEIGHT_PAD, label="ple rows")
                self.ple_rows = GpuTensor("ple rows", table.type, (L * pd, T), [Part(rows, 0, T)])  # [T] its rows
            self.ple_emb = f32(T * L * pd, "ple_emb")               # [T, L * pd] rows * sqrt(pd)
            self.ple_proj = f32(T * L * pd, "ple_proj")             # [T, L * pd] x @ per_layer_model_proj
            self.ple_in = f32(L * self.ple_stride(T) * pd, "ple_in")  # [L, stride >= T, pd] per-layer inputs
            self.ple_gate = f32(T * pd, "ple_gate")                 # [T, pd] x @ inp_gate
            self.ple_act = f32(T * pd, "ple_act")                   # [T, pd] gelu(gate) * ple_in[layer]
            self.ple_out = f32(T * d, "ple_out")                    # [T, d] @ proj
        # head: one row at a time
        self.one = dev.buffer(K.STEP_BYTES, "uniform", "one token")  # Step of one token (head ops)
        K.write_step(dev, self.one, 1, 0)
        self.x_last = f32(d, "x_last")                  # [d] the row whose logits are wanted
        self.x_last_norm = f32(d, "x_last_norm")        # [d]
        self.logits = f32(V, "logits")                  # [V] softcapped
        self.logit_bias = None                          # [V] -1e30 at cfg.suppress_tokens, else 0 (sampling only)
        if cfg.suppress_tokens:
            bias = array("f", bytes(4 * V))
            for i in cfg.suppress_tokens:
                bias[i] = SUPPRESSED
            self.logit_bias = f32(V, "logit bias")
            dev.write(self.logit_bias, bias.tobytes())
        self.token = dev.buffer(16, label="token")      # u32 sampled id
        self.token_readback = dev.buffer(16, "readback", "token readback")   # its copy for the CPU
        # a prompt's chunks, each marked done by a copy into one of these (in turn: the CPU waits for one
        # chunk's mark while the next chunk runs); what is copied does not matter, only when
        self.chunk_marks = [dev.buffer(16, "readback", f"chunk mark {i}") for i in range(2)]
        self.sample_params = dev.buffer(K.SAMPLE_PARAMS_BYTES, label="sample params")
        self.sample_scratch = dev.buffer(max(16, K.sample_scratch_bytes(V)), label="sample scratch")
        # greedy verification of a speculative step (Gemma4.head_argmax): every row of the step, up to
        # head_rows, normed and scored over the vocabulary; only their argmax ids come back
        self.head_rows = min(T, K.HEAD_ROWS)
        self.x_rows_norm = f32(self.head_rows * d, "x_rows_norm")          # [head_rows, d]
        self.head_partials = dev.buffer(K.head_argmax_scratch_bytes([p.rows for p in layout.head.parts]),
                                        label="head argmax partials")      # per row and workgroup: (logit, id)
        self.greedy_ids = dev.buffer(4 * (1 + K.HEAD_ROWS), label="greedy ids")   # u32: the ids of a step
        # the greedy ids, then (greedy_plan's step_ids) the step's own ids: a drafter's drafts, in one readback
        self.greedy_readback = dev.buffer(2 * self.greedy_ids.size, "readback", "greedy ids readback")
        # KV cache: global layers hold the whole context; sliding layers a ring big
        # enough for the window plus one chunk of new tokens. Shared layers read their source's.
        self.kv = {lc.index: KVCache(f32(lc.n_kv_heads * self.kv_slots(lc) * lc.head_dim, f"k cache {lc.index}"),
                                     f32(lc.n_kv_heads * self.kv_slots(lc) * lc.head_dim, f"v cache {lc.index}"),
                                     self.kv_slots(lc))
                   for lc in cfg.layers if lc.owns_kv}

    FEW_PARTIALS_LIMIT = 256 << 20        # bytes: beyond, a speculative step's attention uses the tiled kernel

    def few_partials(self) -> Buffer | None:
        """Split-K attention partials for the head_rows queries of a speculative step (made on first use,
        as those plans are); None when they would take more than FEW_PARTIALS_LIMIT (long contexts)."""
        if not hasattr(self, "_few_partials"):
            n = self.head_rows * max(K.decode_partials(self.cfg.n_heads, lc.head_dim, self.max_keys(lc))
                                     for lc in self.cfg.layers)
            self._few_partials = (self.dev.buffer(4 * n, label="attention partials (few tokens)")
                                  if 4 * n <= self.FEW_PARTIALS_LIMIT else None)
        return self._few_partials

    def max_keys(self, lc) -> int:
        """The most keys one query of this layer attends to."""
        if lc.sliding and self.cfg.sliding_window:
            return min(self.ctx, self.cfg.sliding_window)
        return self.ctx

    def kv_slots(self, lc) -> int:
        if lc.sliding and self.cfg.sliding_window:
            return min(self.ctx, self.cfg.sliding_window + self.chunk - 1)
        return self.ctx

    def ple_stride(self, T: int) -> int:
        """Tokens per layer slice of ple_in, so each slice starts on a bindable offset."""
        align = self.dev.limits.get("min_storage_buffer_offset_alignment", 256)
        s = T
        while (s * self.cfg.ple_dim * 4) % align:
            s += 1
        return s

    def _write_soft(self, tokens: list[int], soft) -> list[int]:
        """The soft rows and their flags (cleared after a step that had some); the ids with the pad id there."""
        at = array("I", bytes(4 * len(tokens)))
        ahead = array("I", bytes(4 * len(tokens)))
        tokens = list(tokens)
        row_bytes = 4 * self.cfg.hidden
        if soft:
            copies = self.dev.plan()
            for row, rows, first, n, last in soft:
                copies.copy(rows, first * row_bytes, self.soft_rows, row * row_bytes, n * row_bytes)
                for t in range(row, row + n):
                    at[t] = 1
                    tokens[t] = self.cfg.pad_id
                    ahead[t] = 0 if last is None else last - t
            self.dev.submit(copies)
        self.dev.write(self.soft_at, at.tobytes())
        if self.keys_ahead is not None:
            if any(last is not None and last >= len(tokens) for *_, last in soft):
                raise GPUError("an image's soft tokens are split between two steps on a model whose images "
                               "attend both ways (pyapp.runtime.soft_tokens.step_bounds keeps them whole)")
            self.dev.write(self.keys_ahead, ahead.tobytes())
        self.soft_written = bool(soft)
        return tokens

    def write_position(self, pos: int) -> None:
        """A one-token step at `pos` whose id the sampler already wrote on the GPU."""
        K.write_step(self.dev, self.step, 1, pos)

    def write_step(self, tokens: list[int], pos0: int, source, soft=()) -> None:
        """Token ids, positions and (PLE models) the tokens' per-layer embedding rows from `source`;
        soft: the step's share of soft tokens (pyapp.runtime.soft_tokens.step_share), whose rows are
        copied in and whose positions take the pad id."""
        if not 0 < len(tokens) <= self.chunk:
            raise GPUError(f"a step takes 1..{self.chunk} tokens, got {len(tokens)}")
        K.write_step(self.dev, self.step, len(tokens), pos0)
        if soft or self.soft_written:
            tokens = self._write_soft(tokens, soft)
        self.dev.write(self.ids, array("I", tokens).tobytes())
        if self.ple_file_table is not None:
            t = self.ple_file_table
            self.dev.write(self.ple_rows.buffer, b"".join(source.read(t.offset + tok * t.row_bytes, t.row_bytes)
                                                   for tok in tokens))
