"""Upload planning: which GGUF bytes go into which GPU buffer, and the typed layout that results.

From the bound weights (pyapp.model.weights) and the device's binding limit,
`plan_uploads` decides, before a byte moves:

- the GPU form of every tensor: matrices stay in their GGUF encoding (the
  kernels dequantize), split by rows into blocks that each fit one binding;
  1-D tensors (norms, scales, frequency factors) become f32 vectors;
- fusions, produced here and recorded in the layout (never rediscovered):
  a layer's q, k (and v) rows share one buffer, rows padded to 64, so a decode
  step projects all three in one matvec (`LayerWeights.qkv`); ffn_gate and
  ffn_up share one buffer for one GeGLU matvec (`LayerWeights.ffn_gate_up`);
- residency: the per-layer embedding table (as big as the rest of an E2B) is
  uploaded like the embedding table, or, with `ple_in_file`, stays in the file
  and its rows are read per step (pyapp.runtime.state): less GPU memory, but the
  CPU must know each token before its step can start. With `expert_slots`, a
  MoE layer's expert tensors stay in the file too: each becomes a cache of that
  many experts on the GPU, filled per step (pyapp.runtime.experts).

pyapp.runtime.memory decides ple_in_file and expert_slots from the GPU budget.

It returns the layout (ModelWeights of GpuTensor) and the list of uploads the
engine's loader performs (pyapp.engine), file range -> buffer range.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .. import ggml
from ..errors import Fault, Gemma4Error
from ..gpu import Buffer, Device
from ..gpu import kernels as K
from ..model.weights import ModelWeights, names
from .requests import FileToGpu, ReadFile

WEIGHT_PAD = 4      # kernels read whole u32 words: a block may end mid-word
ROW_ALIGN = 64      # 64 rows of f32 outputs = 256 bytes: every output segment starts bindable


class ModelError(Gemma4Error, ValueError):
    """A tensor is stored in a form we cannot run on the GPU."""


@dataclass
class Part:
    buffer: Buffer
    row0: int
    rows: int


@dataclass
class GpuTensor:
    name: str
    qtype: int            # ggml type id of the bytes on the GPU
    shape: tuple          # ggml order: shape[0] is the row length
    parts: list           # [Part]: row ranges, each within one binding
    offset: int = 0       # byte offset in its buffer (q, k, v share one buffer)
    nbytes: int = 0
    cached_from: object = None   # an expert cache: the file tensor [E, n, k] whose experts it holds
    # LoRA deltas added to this projection's output: [(pyapp.runtime.adapters.GpuLora, first output column)]
    loras: list = field(default_factory=list)

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
    rows: int             # rows of the fused matvec, padding included
    q_row: int            # first output row of each projection
    k_row: int
    v_row: int            # k_row when the layer has no V (k_eq_v: V is the raw K)
    v_apart: GpuTensor | None = None   # attn_v in another encoding: its own matvec into rows v_row..
    loras: list = field(default_factory=list)   # LoRA deltas of q, k, v: [(GpuLora, its first row here)]

    @property
    def out_rows(self) -> int:
        return self.v_row + self.v_apart.shape[1] if self.v_apart is not None else self.rows


@dataclass
class FileTensor:
    """A tensor left in the file; its rows are read per step."""
    info: object          # pyapp.gguf.TensorInfo


@dataclass
class Upload:
    """File bytes [offset, offset + n) -> buffer at dst_offset (as stored, or converted to f32)."""
    buffer: Buffer
    offset: int
    n: int
    dst_offset: int = 0
    to_f32: int | None = None     # ggml type id of a vector converted to f32 on the way


def f32_vector(data: bytes, qtype: int) -> bytes:
    """A small F32/F16/BF16 vector as little-endian f32 bytes, without numpy."""
    try:
        return ggml.float_bytes_to_f32(data, qtype)
    except ValueError:
        raise ModelError(f"vectors must be F32, F16 or BF16, not {ggml.name(qtype)}") from None


def encoder_tensor(dev: Device, t, as_f32: bool = False, scale: float = 1.0):
    """Steps (ReadFile, FileToGpu): an encoder's tensor (the image or audio encoder's) on the GPU as one
    buffer: a vector, or what its kernels read as f32 (as_f32), converted to f32 [and times `scale`, a
    power of two]; a matrix as stored (its kernels dequantize; a type none reads is refused first)."""
    if len(t.shape) == 1 or as_f32:
        data = f32_vector((yield ReadFile(t.offset, t.nbytes)), t.type)
        if scale != 1.0:
            n = len(data) // 4
            data = struct.pack(f"<{n}f", *(v * scale for v in struct.unpack(f"<{n}f", data)))
        buf = dev.buffer(len(data), label=t.name)
        dev.write(buf, data)
        return GpuTensor(t.name, ggml.F32, t.shape, [Part(buf, 0, 1)])
    K.quant_type(t.type)
    buf = dev.buffer(t.nbytes + WEIGHT_PAD, label=t.name)
    yield FileToGpu(buf, t.offset, t.nbytes)
    return GpuTensor(t.name, t.type, t.shape, [Part(buf, 0, t.n_elements // t.shape[0])])


def perform(dev: Device, u: Upload):
    """Steps (FileToGpu, or ReadFile and a write): one upload."""
    if u.to_f32 is None:
        yield FileToGpu(u.buffer, u.offset, u.n, u.dst_offset)
    else:
        dev.write(u.buffer, f32_vector((yield ReadFile(u.offset, u.n)), u.to_f32), u.dst_offset)


def planned_tensor(dev: Device, t) -> tuple[GpuTensor, list[Upload]]:
    """A tensor of a model loaded beside the main one (an assistant drafter) as the main model's are laid out
    (plan_uploads): its buffers (a vector as f32, a matrix as stored in row blocks that each fit one binding)
    and the uploads that fill them. On a MemoryCounter: what it takes, and nothing read."""
    uploads: list[Upload] = []
    g = _vector(dev, t, uploads) if len(t.shape) == 1 else _matrix(dev, t, binding_limit(dev.limits), uploads)
    return g, uploads


def model_tensor(dev: Device, t):
    """Steps: planned_tensor's buffers filled from the file."""
    g, uploads = planned_tensor(dev, t)
    for u in uploads:
        yield from perform(dev, u)
    return g


def binding_limit(limits: dict) -> int:
    """The most bytes one binding may hold on a device with these limits (WebGPU's defaults if absent)."""
    return min(limits.get("max_storage_buffer_binding_size", 1 << 27), limits.get("max_buffer_size", 1 << 28))


EXPERT_FIELDS = ("experts_gate_up", "experts_gate", "experts_up", "experts_down")


def layer_experts(weights: ModelWeights, lc) -> list:
    """A MoE layer's expert tensors (of whatever kind `weights` holds), the absent ones left out."""
    return [t for t in (getattr(weights.layers[lc.index], f) for f in EXPERT_FIELDS) if t is not None]


def plan_uploads(dev: Device, cfg, bound: ModelWeights, ple_in_file: bool = False, expert_slots: int | None = None
                 ) -> tuple[ModelWeights, list[Upload]]:
    """The GPU layout of the bound weights (TensorInfo fields) and the uploads that fill it.
    expert_slots: experts held per MoE layer when experts stream (None: every expert uploaded)."""
    limit = binding_limit(dev.limits)
    uploads: list[Upload] = []
    gpu: dict[int, object] = {}       # id(TensorInfo) -> its GPU form

    for lc, lw in zip(cfg.layers, bound.layers):
        if lc.owns_kv:
            _fuse_qkv(dev, lw, limit, uploads, gpu)
        _fuse_gate_up(dev, lw, limit, uploads, gpu)
    for name, owner, field_name in names(cfg, bound):
        t = getattr(owner, field_name)
        if id(t) in gpu:        # fused above
            continue
        if owner is bound and field_name == "ple_token_embd" and ple_in_file:
            gpu[id(t)] = FileTensor(t)
        elif field_name in EXPERT_FIELDS and expert_slots is not None:
            gpu[id(t)] = _expert_cache(dev, t, expert_slots, limit)
        elif len(t.shape) == 1:
            gpu[id(t)] = _vector(dev, t, uploads)
        else:
            gpu[id(t)] = _matrix(dev, t, limit, uploads)

    layout = bound.map(lambda t: gpu[id(t)])
    for lw_in, lw in zip(bound.layers, layout.layers):
        lw.qkv = gpu.get(("qkv", id(lw_in.attn_q)))
        lw.ffn_gate_up = gpu.get(("gate_up", id(lw_in.ffn_gate)))
    return layout, uploads


def _check_kernel(t) -> None:
    if t.type not in K.KERNEL_TYPES:
        supported = ", ".join(sorted(ggml.name(i) for i in K.KERNEL_TYPES))
        raise ModelError(f"{t.name} is stored as {t.type_name}, which has no GPU kernel (supported: {supported})",
                         fault=Fault.NO_KERNEL)


def _vector(dev: Device, t, uploads: list) -> GpuTensor:
    buf = dev.buffer(4 * t.shape[0], label=t.name)
    uploads.append(Upload(buf, t.offset, t.nbytes, to_f32=t.type))
    return GpuTensor(t.name, ggml.F32, t.shape, [Part(buf, 0, 1)])


def _matrix(dev: Device, t, limit: int, uploads: list) -> GpuTensor:
    """The tensor as stored, in row blocks that each fit one binding."""
    g = GpuTensor(t.name, t.type, t.shape, _row_blocks(dev, t, t.n_elements // t.shape[0], limit))
    uploads.extend(Upload(p.buffer, t.offset + p.row0 * t.row_bytes, p.rows * t.row_bytes) for p in g.parts)
    return g


def _expert_cache(dev: Device, t, slots: int, limit: int) -> GpuTensor:
    """GPU room for `slots` of the experts of t [E, n, k], filled per step from the file."""
    if (t.shape[1] * t.row_bytes) % 4:
        raise ModelError(f"{t.name}: one expert is {t.shape[1] * t.row_bytes} bytes, not whole u32 words; "
                         "its experts cannot be streamed")
    shape = (t.shape[0], t.shape[1], slots)
    return GpuTensor(t.name, t.type, shape, _row_blocks(dev, t, slots * t.shape[1], limit), cached_from=t)


def _row_blocks(dev: Device, t, rows: int, limit: int) -> list:
    """Buffers for `rows` rows of t, each within one binding: a multiple of 64 rows for a matrix
    (its outputs start 256-byte aligned), whole experts for an expert tensor [E, n, k]."""
    _check_kernel(t)
    if rows == 0:                  # an expert cache of no slots (pyapp.runtime.memory's count of the rest)
        return []
    rb = t.row_bytes
    unit = t.shape[1] if len(t.shape) == 3 else 64          # rows of one expert, or 64
    per = rows if rows * rb + WEIGHT_PAD <= limit else max(1, (limit - WEIGHT_PAD) // rb // unit) * unit
    if per * rb + WEIGHT_PAD > limit:
        what = "one expert" if len(t.shape) == 3 else "one row block"
        raise ModelError(f"{t.name}: {what} ({per * rb} bytes) exceeds the GPU's binding limit ({limit})",
                         fault=Fault.DOES_NOT_FIT)
    return [Part(dev.buffer(min(per, rows - r0) * rb + WEIGHT_PAD, label=t.name), r0, min(per, rows - r0))
            for r0 in range(0, rows, per)]


def _fuse_qkv(dev: Device, lw, limit: int, uploads: list, gpu: dict) -> None:
    """q with k and v in one buffer, when they share q's encoding and fit one binding.
    (Q4_K_M keeps some attn_v in Q6_K: that v gets its own matvec into the same output.)"""
    q, k, v = lw.attn_q, lw.attn_k, lw.attn_v
    together = [t for t in (q, k, v) if t is not None and t.type == q.type and len(t.shape) == 2
                and t.shape[0] == q.shape[0]]
    if k not in together or q.row_bytes % 4:
        return
    if v is not None and v not in together and v.nbytes + WEIGHT_PAD > limit:
        return      # a v of its own encoding must fit one binding to join the fused matvec
    padded = [-(-t.shape[1] // ROW_ALIGN) * ROW_ALIGN for t in together]
    if sum(padded) * q.row_bytes + WEIGHT_PAD > limit:
        return
    _check_kernel(q)
    buf = dev.buffer(sum(padded) * q.row_bytes + WEIGHT_PAD, label=f"{q.name} (q|k|v)")
    first = {}
    row0 = 0
    for t, r in zip(together, padded):
        first[id(t)] = row0
        gpu[id(t)] = GpuTensor(t.name, t.type, t.shape, [Part(buf, 0, t.shape[1])], row0 * q.row_bytes, t.nbytes)
        uploads.append(Upload(buf, t.offset, t.nbytes, row0 * q.row_bytes))
        row0 += r
    if v is None:
        v_row, v_apart = first[id(k)], None
    elif id(v) in first:
        v_row, v_apart = first[id(v)], None
    else:
        v_row, v_apart = row0, _matrix(dev, v, limit, uploads)
        gpu[id(v)] = v_apart
    gpu[("qkv", id(q))] = QKV(buf, q.type, q.shape[0], row0, first[id(q)], first[id(k)], v_row, v_apart)


def _fuse_gate_up(dev: Device, lw, limit: int, uploads: list, gpu: dict) -> None:
    """ffn_gate rows then ffn_up rows in one buffer: one GeGLU matvec, one matmul."""
    g, u = lw.ffn_gate, lw.ffn_up
    if (u.type, u.shape) != (g.type, g.shape) or g.nbytes % 4 or 2 * g.nbytes + WEIGHT_PAD > limit:
        return
    _check_kernel(g)
    buf = dev.buffer(2 * g.nbytes + WEIGHT_PAD, label=g.name)
    fused = GpuTensor(g.name, g.type, (g.shape[0], 2 * g.shape[1]), [Part(buf, 0, 2 * g.shape[1])])
    uploads.append(Upload(buf, g.offset, g.nbytes))
    uploads.append(Upload(buf, u.offset, u.nbytes, g.nbytes))
    gpu[id(g)] = gpu[id(u)] = None        # the layout holds them only as ffn_gate_up
    gpu[("gate_up", id(g))] = fused
