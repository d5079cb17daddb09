"""Gemma 4 forward pass on the GPU: weights on the device and the dispatch plans.

Mirrors pyapp/reference/forward.py (itself Ollama's model_text.go) op for op;
each block below names the reference function it mirrors. The plans are built
once per shape and replayed per step with only the small per-step buffers
rewritten (token ids, positions, PLE rows, sampling parameters):

  layers(T)   embeddings -> every layer, for T tokens at positions pos0..pos0+T-1
              (T = 1: matvec kernels for decode; T > 1: tiled matmuls for prefill)
  head(row)   final norm, output projection and softcap for one row of the last
              step, then the sampler writes the next token id on the GPU

Activations are f32; weights stay in their GGUF encoding and are dequantized
inside the kernels. Tensors bigger than one storage binding are split by rows.
"""

from __future__ import annotations

import math
import struct
from array import array
from dataclasses import dataclass

from ..gpu import Buffer, Device, GPUError, Plan
from ..gpu import kernels as K
from .config import Gemma4Config, LayerConfig

WEIGHT_PAD = 4  # kernels read whole u32 words: a block may end mid-word


class ModelError(ValueError):
    """The GGUF lacks a tensor the graph needs or stores one in a form we cannot run."""


@dataclass
class Part:
    buffer: Buffer
    row0: int
    rows: int


@dataclass
class GpuTensor:
    name: str
    qtype: int
    shape: tuple          # ggml order: shape[0] is the row length
    parts: list           # [Part]: row ranges, each within one binding
    offset: int = 0       # byte offset in its buffer (q, k, v share one buffer)
    nbytes: int = 0

    @property
    def buffer(self) -> Buffer:
        if len(self.parts) != 1:
            raise ModelError(f"{self.name} is split over {len(self.parts)} buffers; this op needs it whole")
        return self.parts[0].buffer

    @property
    def bound(self):
        """What a bind group takes: the buffer, or its range when the buffer is shared."""
        return self.buffer if not self.offset else (self.buffer, self.offset, self.nbytes + WEIGHT_PAD)


@dataclass
class QKV:
    """A layer's q, k (and v) projections in one buffer, rows padded to 64: one matvec for all."""
    buffer: Buffer
    qtype: int
    k: int                # row length (hidden)
    rows: int             # all rows, padding included
    q_row: int
    k_row: int
    v_row: int | None     # None: no V (attention_k_eq_v)
    v_apart: str | None = None   # attn_v in another encoding: its own matvec into row v_row of the output
    v_rows: int = 0


ROW_ALIGN = 64            # 64 rows of f32 outputs = 256 bytes: every segment starts bindable


def f32_bytes(gguf, name: str) -> bytes:
    """A small tensor (norm weights, scales) as little-endian f32 bytes, without numpy."""
    t = gguf.tensor(name)
    raw = gguf.read_tensor(name)
    if t.type == 0:
        return raw
    if t.type == 1:
        return array("f", struct.unpack(f"<{len(raw) // 2}e", raw)).tobytes()
    if t.type == 30:
        return array("I", [h << 16 for h in array("H", raw)]).tobytes()
    raise ModelError(f"{name} is {t.type_name}; vectors must be F32, F16 or BF16")


def _scaled(data: bytes, factor: float) -> bytes:
    return array("f", [v * factor for v in array("f", data)]).tobytes()


def plan_uploads(dev: Device, gguf, skip=("per_layer_token_embd.weight",)):
    """Yield (GpuTensor, Buffer, file offset, n bytes, buffer offset) for every matrix to upload.

    Small f32 vectors are made by Gemma4Graph itself; `skip` names tensors read per
    token from the file instead (the PLE table is as big as the model). A layer's
    ffn_gate and ffn_up share one buffer (gate rows, then up rows) as
    `blk.N.ffn_gate_up.weight`, so one dispatch computes both and the GeGLU."""
    limit = min(dev.limits.get("max_storage_buffer_binding_size", 1 << 27),
                dev.limits.get("max_buffer_size", 1 << 28))
    fused = set()
    for t in gguf.tensors.values():
        if t.name in skip or t.name in fused or len(t.shape) < 2:
            continue
        if t.name.endswith(".attn_q.weight"):
            # q with k and v when they share its encoding (Q4_K_M keeps some attn_v in Q6_K: those stay apart)
            group = [t] + [g for g in (gguf.tensors.get(t.name.replace("attn_q", n)) for n in ("attn_k", "attn_v"))
                           if g is not None and g.type == t.type]
            rows = [-(-g.shape[1] // ROW_ALIGN) * ROW_ALIGN for g in group]
            if len(group) > 1 and all(len(g.shape) == 2 and (g.type, g.shape[0]) == (t.type, t.shape[0]) for g in group) \
                    and t.row_bytes % 4 == 0 and sum(rows) * t.row_bytes + WEIGHT_PAD <= limit:
                buf = dev.buffer(sum(rows) * t.row_bytes + WEIGHT_PAD, label=t.name.replace("attn_q", "attn_qkv"))
                row0 = 0
                for g, r in zip(group, rows):
                    fused.add(g.name)
                    gt = GpuTensor(g.name, g.type, g.shape, [Part(buf, 0, g.shape[1])], row0 * t.row_bytes, g.nbytes)
                    yield gt, buf, g.offset, g.nbytes, row0 * t.row_bytes
                    row0 += r
                continue
        if t.name.endswith(".ffn_gate.weight"):
            up = gguf.tensors.get(t.name.replace(".ffn_gate.", ".ffn_up."))
            if up is not None and (up.type, up.shape) == (t.type, t.shape) and t.nbytes % 4 == 0 \
                    and 2 * t.nbytes + WEIGHT_PAD <= limit:
                fused.add(up.name)
                buf = dev.buffer(2 * t.nbytes + WEIGHT_PAD, label=t.name)
                gt = GpuTensor(t.name.replace(".ffn_gate.", ".ffn_gate_up."), t.type, (t.shape[0], 2 * t.shape[1]),
                               [Part(buf, 0, 2 * t.shape[1])])
                yield gt, buf, t.offset, t.nbytes, 0
                yield gt, buf, up.offset, up.nbytes, t.nbytes
                continue
        rows = t.n_elements // t.shape[0]
        rb = t.row_bytes
        # row blocks of a multiple of 64 rows: their outputs start on 256-byte aligned offsets
        per = rows if t.nbytes + WEIGHT_PAD <= limit else max(64, (limit - WEIGHT_PAD) // rb // 64 * 64)
        if per * rb + WEIGHT_PAD > limit:
            raise ModelError(f"{t.name}: one row block ({per * rb} bytes) exceeds the GPU's binding limit ({limit})")
        parts = []
        for r0 in range(0, rows, per):
            n = min(per, rows - r0)
            parts.append(Part(dev.buffer(n * rb + WEIGHT_PAD, label=t.name), r0, n))
        gt = GpuTensor(t.name, t.type, t.shape, parts)
        for p in parts:
            yield gt, p.buffer, t.offset + p.row0 * rb, p.rows * rb, 0


class Gemma4Graph:
    """Device buffers (weights, KV cache, activations) and the plans that use them."""

    def __init__(self, dev: Device, cfg: Gemma4Config, gguf, weights: dict[str, GpuTensor],
                 context_length: int, chunk: int = 64):
        self.dev, self.cfg, self.gguf, self.w = dev, cfg, gguf, weights
        self.ctx = context_length
        self.chunk = chunk
        self._check_supported()
        self.qkv = self._qkv_groups()
        self.vec = self._vectors()
        self._alloc()
        self._plans: dict = {}

    # -- set-up ------------------------------------------------------------
    def _check_supported(self):
        for name, t in self.w.items():
            if t.qtype not in K.QUANTS:
                raise ModelError(f"{name} is stored as {self.gguf.tensor(name).type_name}, which has no GPU kernel "
                                 f"(supported: {', '.join(sorted(n.upper() for n, _, _ in K.QUANTS.values()))})")
        need = ["token_embd.weight", "output_norm.weight"]
        for lc in self.cfg.layers:
            p = f"blk.{lc.index}."
            need += [p + "attn_norm.weight", p + "attn_q.weight", p + "attn_output.weight"]
        missing = [n for n in need if n not in self.gguf.tensors]
        if missing:
            raise ModelError(f"the GGUF lacks {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")

    def _qkv_groups(self) -> dict[int, QKV]:
        """Layers whose q, k (, v) share a buffer (plan_uploads fused them)."""
        out = {}
        for lc in self.cfg.layers:
            p = f"blk.{lc.index}."
            q, k, v = (self.w.get(p + n) for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight"))
            if q is None or k is None or len(q.parts) != 1 or len(k.parts) != 1 or q.buffer is not k.buffer:
                continue
            rb = self.gguf.tensor(q.name).row_bytes
            v_in = v is not None and len(v.parts) == 1 and v.buffer is q.buffer
            if v is not None and not v_in and len(v.parts) != 1:
                continue
            last = v if v_in else k
            rows = last.offset // rb + -(-last.shape[1] // ROW_ALIGN) * ROW_ALIGN
            g = QKV(q.buffer, q.qtype, q.shape[0], rows, q.offset // rb, k.offset // rb,
                    v.offset // rb if v_in else (rows if v is not None else None))
            if v is not None and not v_in:
                g.v_apart, g.v_rows = v.name, v.shape[1]
            out[lc.index] = g
        return out

    def _vectors(self) -> dict[str, Buffer]:
        """Every 1-D tensor (norms, scales, rope freqs) as an f32 buffer; derived constants too."""
        dev, cfg, g = self.dev, self.cfg, self.gguf
        out = {}
        for t in g.tensors.values():
            if len(t.shape) == 1:
                data = f32_bytes(g, t.name)
                if t.name.endswith("ffn_gate_inp.scale"):
                    data = _scaled(data, 1.0 / math.sqrt(cfg.hidden))  # router: rms_norm(h)/sqrt(d)*scale
                b = dev.buffer(len(data), label=t.name)
                dev.write(b, data)
                out[t.name] = b
        if cfg.is_moe:
            for lc in cfg.layers:
                if f"blk.{lc.index}.ffn_gate_inp.weight" in g.tensors and \
                        f"blk.{lc.index}.ffn_gate_inp.scale" not in out:
                    ones = array("f", [1.0 / math.sqrt(cfg.hidden)] * cfg.hidden).tobytes()
                    b = dev.buffer(len(ones))
                    dev.write(b, ones)
                    out[f"blk.{lc.index}.ffn_gate_inp.scale"] = b
        return out

    def _alloc(self):
        dev, cfg, T = self.dev, self.cfg, self.chunk
        f = lambda n, label="": dev.buffer(4 * max(n, 4), label=label)  # noqa: E731
        hd = max(lc.head_dim for lc in cfg.layers)
        kvh = max(lc.n_kv_heads for lc in cfg.layers)
        ff = max(lc.ffn_dim for lc in cfg.layers)
        d, H = cfg.hidden, cfg.n_heads
        self.step = dev.buffer(16, "uniform", "step")          # x: tokens this step, y: first position
        self.one = dev.buffer(16, "uniform", "one")            # x = 1: for the per-row head ops
        dev.write(self.one, struct.pack("<4I", 1, 0, 0, 0))
        self.ids = dev.buffer(4 * T, label="ids")
        self.iota = dev.buffer(4 * T, label="iota")
        dev.write(self.iota, array("I", range(T)).tobytes())
        for name in ("x", "xn", "o", "o2", "f", "f2"):
            setattr(self, name, f(T * d, name))
        self.qraw, self.q, self.attn = f(T * H * hd), f(T * H * hd), f(T * H * hd)
        self.qkv_out = f(max((g.v_row + g.v_rows if g.v_apart else g.rows for g in self.qkv.values()), default=4),
                         "qkv")
        self.kraw, self.k, self.vraw, self.v = (f(T * kvh * hd) for _ in range(4))
        self.gate, self.up, self.act, self.gu_dense = f(T * ff), f(T * ff), f(T * ff), f(T * 2 * ff)
        if cfg.is_moe:
            E, KS, eff = cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_dim
            self.rlog, self.rids, self.rwts = f(T * E), f(T * KS), f(T * KS)
            self.gu, self.eact, self.ye = f(T * KS * 2 * eff), f(T * KS * eff), f(T * KS * d)
            self.eg, self.eu = f(T * KS * eff), f(T * KS * eff)
        if cfg.ple_dim:
            L, pd = cfg.n_layers, cfg.ple_dim
            table = self.gguf.tensor("per_layer_token_embd.weight")
            self.ple_row_bytes = table.row_bytes
            self.ple_rows = dev.buffer(T * table.row_bytes + WEIGHT_PAD, label="ple rows")
            self.ple_emb, self.ple_proj = f(T * L * pd), f(T * L * pd)
            self.ple_in = f(L * self._ple_stride(T) * pd, "ple in")
            self.pg, self.pa, self.pp = f(T * pd), f(T * pd), f(T * d)
        self.xlast, self.xlast_n = f(d), f(d)
        self.logits = f(cfg.vocab_size, "logits")
        self.token = dev.buffer(16, label="token")
        self.sample_params = dev.buffer(K.SAMPLE_PARAMS_BYTES, label="sample params")
        self.sample_scratch = dev.buffer(max(16, K.sample_scratch_bytes(cfg.vocab_size)), label="sample scratch")
        self.partials = f(max(K.decode_partials(H, lc.head_dim, self.max_keys(lc)) for lc in cfg.layers), "partials")
        # KV cache: global layers hold the whole context; sliding layers a ring big
        # enough for the window plus one chunk of new tokens.
        self.kv = {}
        for lc in cfg.layers:
            if lc.shares_kv:
                continue
            n = self.kv_slots(lc)
            size = lc.n_kv_heads * n * lc.head_dim
            self.kv[lc.index] = (f(size, f"k cache {lc.index}"), f(size, f"v cache {lc.index}"), n)

    def max_keys(self, lc: LayerConfig) -> int:
        """The most keys one query of this layer attends to."""
        if lc.sliding and self.cfg.sliding_window:
            return min(self.ctx, self.cfg.sliding_window)
        return self.ctx

    def kv_slots(self, lc: LayerConfig) -> int:
        if lc.sliding and self.cfg.sliding_window:
            return min(self.ctx, self.cfg.sliding_window + self.chunk - 1)
        return self.ctx

    def _ple_stride(self, T: int) -> int:
        """Tokens per layer slice of ple_in, so each slice starts on a bindable offset."""
        align = self.dev.limits.get("min_storage_buffer_offset_alignment", 256)
        s = T
        while (s * self.cfg.ple_dim * 4) % align:
            s += 1
        return s

    # -- plan pieces ----------------------------------------------------------
    def _mm(self, plan: Plan, name: str, x: Buffer, y: Buffer, T: int):
        """y[T, n] = x[T, k] @ W^T: matvec for one token, tiled matmul for a chunk."""
        t = self.w[name]
        k, n = t.shape[0], t.shape[1]
        if T == 1 and len(t.parts) == 1:
            K.matvec(self.dev, t.qtype, k, n, t.bound, x, y, plan=plan)
        elif T == 1:
            for p in t.parts:
                K.matvec(self.dev, t.qtype, k, p.rows, p.buffer, x, (y, 4 * p.row0, 4 * p.rows), plan=plan)
        elif len(t.parts) == 1:
            K.matmul(self.dev, t.qtype, k, n, t.bound, x, y, self.step, n_tokens=T, plan=plan)
        else:   # row blocks write their columns of y: bound from the block's first column on
            for p in t.parts:
                K.matmul(self.dev, t.qtype, k, p.rows, p.buffer, x, (y, 4 * p.row0, y.size - 4 * p.row0),
                         self.step, n_tokens=T, plan=plan, ldy=n)

    def _norm(self, plan, x, y, weight: str | None, d, T, rows_per_token=1, step=None):
        w = self.vec[weight] if weight else None
        K.rms_norm(self.dev, d, x, y, w, step or self.step, max_tokens=T, rows_per_token=rows_per_token,
                   eps=self.cfg.eps, plan=plan)

    def _embed(self, plan, T):
        """reference: x = token_embd[tokens] * sqrt(hidden) (+ per-layer inputs)."""
        cfg, dev = self.cfg, self.dev
        t = self.w["token_embd.weight"]
        for p in t.parts:
            K.embed(dev, t.qtype, cfg.hidden, p.buffer, self.ids, self.x, self.step, T,
                    scale=math.sqrt(cfg.hidden), row0=p.row0, nrows=p.rows, plan=plan)
        if cfg.ple_dim:   # reference: per_layer_inputs
            L, pd = cfg.n_layers, cfg.ple_dim
            table = self.gguf.tensor("per_layer_token_embd.weight")
            K.embed(dev, table.type, L * pd, self.ple_rows, self.iota, self.ple_emb, self.step, T,
                    scale=math.sqrt(pd), plan=plan)
            self._mm(plan, "per_layer_model_proj.weight", self.x, self.ple_proj, T)
            K.ple_combine(dev, L, pd, self._ple_stride(T), self.ple_proj, self.ple_emb,
                          self.vec["per_layer_proj_norm.weight"], self.ple_in, self.step, cfg.hidden,
                          cfg.eps, plan=plan)

    def _attention(self, plan, lc: LayerConfig, T):
        """reference: ReferenceModel.attention on xn, result in self.o."""
        cfg, dev, p = self.cfg, self.dev, f"blk.{lc.index}."
        H, hd, kvh = cfg.n_heads, lc.head_dim, lc.n_kv_heads
        ff = None if lc.sliding else self.vec.get("rope_freqs.weight")
        kc, vc, slots = self.kv[lc.kv_source]
        g = self.qkv.get(lc.index) if T == 1 and not lc.shares_kv else None
        if g is not None:   # decode: q, k, v in one matvec; K and V normed straight into the cache
            K.matvec(dev, g.qtype, g.k, g.rows, g.buffer, self.xn, self.qkv_out, plan=plan)
            if g.v_apart:
                v = self.w[g.v_apart]
                K.matvec(dev, v.qtype, g.k, g.v_rows, v.bound, self.xn, (self.qkv_out, 4 * g.v_row, 4 * g.v_rows),
                         plan=plan)
            K.norm_rope(dev, self.qkv_out, self.q, self.vec[p + "attn_q_norm.weight"], self.step, H, hd,
                        lc.rope_dims, lc.rope_base, T, eps=cfg.eps, freq_factors=ff, plan=plan)
            v_row = g.v_row if g.v_row is not None else g.k_row   # attention_k_eq_v: V is the raw K
            K.kv_prep(dev, self.qkv_out, g.k_row, v_row, self.vec[p + "attn_k_norm.weight"], kc, vc, self.step,
                      kvh, hd, lc.rope_dims, lc.rope_base, slots, eps=cfg.eps, freq_factors=ff, plan=plan)
        else:
            self._qkv_separate(plan, lc, T, kc, vc, slots, ff)
        self._attend(plan, lc, T, kc, vc, slots)

    def _qkv_separate(self, plan, lc: LayerConfig, T: int, kc, vc, slots, ff):
        """q, k, v projections one by one (prefill, shared-KV layers, mixed quant types)."""
        cfg, dev, p = self.cfg, self.dev, f"blk.{lc.index}."
        H, hd, kvh = cfg.n_heads, lc.head_dim, lc.n_kv_heads
        self._mm(plan, p + "attn_q.weight", self.xn, self.qraw, T)
        K.norm_rope(dev, self.qraw, self.q, self.vec[p + "attn_q_norm.weight"], self.step, H, hd, lc.rope_dims,
                    lc.rope_base, T, eps=cfg.eps, freq_factors=ff, plan=plan)
        if not lc.shares_kv:
            self._mm(plan, p + "attn_k.weight", self.xn, self.kraw, T)
            vsrc = self.kraw          # no attn_v (attention_k_eq_v): V is the raw K projection
            if p + "attn_v.weight" in self.w:
                self._mm(plan, p + "attn_v.weight", self.xn, self.vraw, T)
                vsrc = self.vraw
            K.norm_rope(dev, self.kraw, self.k, self.vec[p + "attn_k_norm.weight"], self.step, kvh, hd,
                        lc.rope_dims, lc.rope_base, T, eps=cfg.eps, freq_factors=ff, plan=plan)
            self._norm(plan, vsrc, self.v, None, hd, T, rows_per_token=kvh)
            K.kv_store(dev, self.k, self.v, kc, vc, self.step, kvh, hd, slots, T, plan=plan)

    def _attend(self, plan, lc: LayerConfig, T: int, kc, vc, slots):
        """softmax(q k^T) v over the cache, then the output projection into self.o."""
        cfg, dev, p = self.cfg, self.dev, f"blk.{lc.index}."
        H, hd, kvh = cfg.n_heads, lc.head_dim, lc.n_kv_heads
        window = cfg.sliding_window if lc.sliding else 0
        if T == 1:   # decode: split over the keys so the whole GPU works on one query
            K.attention_decode(dev, self.q, kc, vc, self.attn, self.partials, self.step, H, kvh, hd, slots,
                               self.max_keys(lc), window=window, plan=plan)
        else:
            K.attention(dev, self.q, kc, vc, self.attn, self.step, H, kvh, hd, slots, T, window=window, plan=plan)
        self._mm(plan, p + "attn_output.weight", self.attn, self.o, T)

    def _mlp(self, plan, p: str, x: Buffer, out: Buffer, T: int, ff: int):
        """reference: ReferenceModel.mlp (GeGLU); gate and up fused when they share a buffer."""
        dev = self.dev
        if p + "ffn_gate_up.weight" in self.w:
            gu = self.w[p + "ffn_gate_up.weight"]
            if T == 1:
                K.matvec(dev, gu.qtype, gu.shape[0], ff, gu.buffer, x, self.act, geglu=True, plan=plan)
            else:
                K.matmul(dev, gu.qtype, gu.shape[0], 2 * ff, gu.buffer, x, self.gu_dense, self.step, n_tokens=T,
                         plan=plan)
                K.moe_geglu(dev, ff, 1, self.gu_dense, self.act, self.step, T, plan=plan)
        else:
            self._mm(plan, p + "ffn_gate.weight", x, self.gate, T)
            self._mm(plan, p + "ffn_up.weight", x, self.up, T)
            K.elementwise(dev, "geglu", ff, self.gate, self.step, T, b=self.up, out=self.act, plan=plan)
        self._mm(plan, p + "ffn_down.weight", self.act, out, T)

    def _moe(self, plan, p: str, T: int, out: Buffer):
        """reference: ReferenceModel.moe: router on the raw residual self.x, experts on pre_ffw_norm_2(x)."""
        cfg, dev = self.cfg, self.dev
        E, KS, eff, d = cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_dim, cfg.hidden
        self._norm(plan, self.x, self.o2, p + "ffn_gate_inp.scale", d, T)
        self._mm(plan, p + "ffn_gate_inp.weight", self.o2, self.rlog, T)
        K.moe_route(dev, E, KS, self.rlog, self.rids, self.rwts, self.step, T, plan=plan)
        self._norm(plan, self.x, self.xn, p + "pre_ffw_norm_2.weight", d, T)
        if p + "ffn_gate_up_exps.weight" in self.w:
            gu = self.w[p + "ffn_gate_up_exps.weight"]
            K.moe_experts(dev, gu.qtype, d, 2 * eff, E, KS, gu.buffer, self.xn, self.gu, self.rids, self.step, T,
                          plan=plan)
            K.moe_geglu(dev, eff, KS, self.gu, self.eact, self.step, T, plan=plan)
        else:
            g, u = self.w[p + "ffn_gate_exps.weight"], self.w[p + "ffn_up_exps.weight"]
            K.moe_experts(dev, g.qtype, d, eff, E, KS, g.buffer, self.xn, self.eg, self.rids, self.step, T, plan=plan)
            K.moe_experts(dev, u.qtype, d, eff, E, KS, u.buffer, self.xn, self.eu, self.rids, self.step, T, plan=plan)
            K.elementwise(dev, "geglu", KS * eff, self.eg, self.step, T, b=self.eu, out=self.eact, plan=plan)
        dn = self.w[p + "ffn_down_exps.weight"]
        K.moe_experts(dev, dn.qtype, eff, d, E, KS, dn.buffer, self.eact, self.ye, self.rids, self.step, T,
                      per_slot_input=True, plan=plan)
        K.moe_combine(dev, d, KS, self.ye, self.rids, self.rwts, out, self.step, T,
                      down_scale=self.vec.get(p + "ffn_down_exps.scale"), plan=plan)

    def _layer(self, plan, lc: LayerConfig, T: int, next_norm: str | None):
        """reference: ReferenceModel.layer; the residual stream lives in self.x.

        Each post-norm's residual add also writes the next pre-norm into self.xn (the
        ffn_norm, and at the end the next layer's attn_norm, `next_norm`)."""
        cfg, dev, p, d = self.cfg, self.dev, f"blk.{lc.index}.", self.cfg.hidden
        out_scale = self.vec.get(p + "layer_output_scale.weight")

        def add_normed(y: Buffer, norm: str, last: bool = False, then: str | None = None):
            # x = (x + norm(y)) [* layer scale]; then xn = norm'(x)
            K.add_normed(dev, d, y, self.x, self.vec[p + norm], self.step, T, eps=cfg.eps,
                         scale=out_scale if last else None, next_out=self.xn if then else None,
                         next_weight=self.vec[then] if then else None, plan=plan)

        if lc.index == 0:      # later layers get their attn_norm from the previous layer's last add
            self._norm(plan, self.x, self.xn, p + "attn_norm.weight", d, T)
        self._attention(plan, lc, T)
        add_normed(self.o, "post_attention_norm.weight", then=p + "ffn_norm.weight")    # h = x + attn
        if p + "ffn_gate_inp.weight" in self.w:
            self._mlp(plan, p, self.xn, self.o, T, lc.ffn_dim)
            self._norm(plan, self.o, self.f, p + "post_ffw_norm_1.weight", d, T)
            self._moe(plan, p, T, self.o)
            K.add_normed(dev, d, self.o, self.f, self.vec[p + "post_ffw_norm_2.weight"], self.step, T, eps=cfg.eps,
                         plan=plan)
        else:
            self._mlp(plan, p, self.xn, self.f, T, lc.ffn_dim)
        if not cfg.ple_dim:
            add_normed(self.f, "post_ffw_norm.weight", last=True, then=next_norm)
            return
        add_normed(self.f, "post_ffw_norm.weight")
        pd = cfg.ple_dim
        stride = self._ple_stride(T) * pd * 4
        ple = (self.ple_in, lc.index * stride, stride)
        gate = self.w[p + "inp_gate.weight"]
        if T == 1:
            K.matvec(dev, gate.qtype, d, pd, gate.buffer, self.x, self.pa, gelu_times=ple, plan=plan)
        else:
            self._mm(plan, p + "inp_gate.weight", self.x, self.pg, T)
            K.elementwise(dev, "geglu", pd, self.pg, self.step, T, b=ple, out=self.pa, plan=plan)
        self._mm(plan, p + "proj.weight", self.pa, self.pp, T)
        add_normed(self.pp, "post_norm.weight", last=True, then=next_norm)

    # -- plans ------------------------------------------------------------------
    def layers_plan(self, T: int) -> Plan:
        """Embeddings and every layer for up to T tokens (T is 1 or the chunk size)."""
        key = ("layers", T)
        if key not in self._plans:
            plan = self.dev.plan()
            self._embed(plan, T)
            layers = self.cfg.layers
            for i, lc in enumerate(layers):
                nxt = f"blk.{layers[i + 1].index}.attn_norm.weight" if i + 1 < len(layers) else None
                self._layer(plan, lc, T, nxt)
            self._plans[key] = plan
        return self._plans[key]

    def head_plan(self, row: int, sample: bool) -> Plan:
        """Logits of row `row` of the last step (final norm, output, softcap) [+ sampling]."""
        key = ("head", row, sample)
        if key not in self._plans:
            cfg, dev, d = self.cfg, self.dev, self.cfg.hidden
            plan = dev.plan().copy(self.x, 4 * d * row, self.xlast, 0, 4 * d)
            self._norm(plan, self.xlast, self.xlast_n, "output_norm.weight", d, 1, step=self.one)
            head = self.w.get("output.weight") or self.w["token_embd.weight"]
            for p in head.parts:
                out = self.logits if len(head.parts) == 1 else (self.logits, 4 * p.row0, 4 * p.rows)
                K.matvec(dev, head.qtype, d, p.rows, p.buffer, self.xlast_n, out, plan=plan)
            if cfg.final_softcap:
                K.elementwise(dev, "softcap", cfg.vocab_size, self.logits, self.one, 1, cap=cfg.final_softcap,
                              plan=plan)
            if sample:
                K.sample(dev, cfg.vocab_size, self.logits, self.token, self.sample_params, self.sample_scratch,
                         plan=plan)
            self._plans[key] = plan
        return self._plans[key]

    # -- per-step inputs ----------------------------------------------------------
    def write_step(self, tokens: list[int], pos0: int) -> None:
        """Token ids, positions and (PLE models) the tokens' per-layer embedding rows."""
        dev = self.dev
        if not 0 < len(tokens) <= self.chunk:
            raise GPUError(f"a step takes 1..{self.chunk} tokens, got {len(tokens)}")
        dev.write(self.step, struct.pack("<4I", len(tokens), pos0, 0, 0))
        dev.write(self.ids, array("I", tokens).tobytes())
        if self.cfg.ple_dim:
            t = self.gguf.tensor("per_layer_token_embd.weight")
            rb = self.ple_row_bytes
            rows = b"".join(self.gguf.source.read(t.offset + tok * rb, rb) for tok in tokens)
            dev.write(self.ple_rows, rows)
