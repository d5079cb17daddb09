"""LoRA adapters on the GPU: each target's A and B as f32 buffers, attached to the layout.

An adapter (pyapp.model.lora.LoraAdapter, already checked and bound to weight fields)
becomes one GpuLora per target, appended to the `loras` of the GpuTensor that
projection runs through. The ops recorder (pyapp.runtime.ops) then records one more op
after each adapted projection, `scale * B (A x)` added into its output (shaders/lora.wgsl),
and the model file needs no change. To the fusion rules (pyapp.runtime.fusion) the delta
is one more reader of the projection's x and y: a one-token projection whose output goes
through a GeGLU or the PLE gate's product keeps that product apart (the delta comes first:
one dispatch more), and a projection reading a pre-norm output builds nothing from the add
before it (the delta reads that output too: the add is dispatched).
Fused layouts take the delta at the projection's rows of the fused output:

- q, k, v in one buffer (decode's single q|k|v matvec): the QKV's loras, at q_row / k_row / v_row;
- ffn_gate and ffn_up in one buffer: the fused tensor's loras at column 0 / ff;
- the deltas of one fused output go as one group (one dispatch) when they share a rank: their
  A's and B's are copied one after the other (`group`).

Each target's scale (user_scale * alpha / r) sits in its own slot of one small buffer,
so changing the user scale (the app's slider, its off switch = 0) rewrites 4 bytes a
target and keeps every recorded plan.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..gpu import Buffer, Device
from ..gpu import kernels as K
from ..model.lora import check_user_scale

QKV_ROWS = {"attn_q": "q_row", "attn_k": "k_row", "attn_v": "v_row"}


@dataclass
class GpuLora:
    """One target's pair on the GPU: A [rank, k] and B [n, rank] f32, its scale slot."""
    name: str
    a: Buffer
    b: Buffer
    rank: int
    k: int                # input width (the base tensor's row length)
    n: int                # output width
    scale: tuple          # (buffer, offset, 4): a bindable f32
    bounds: tuple = ()    # a group (see group): where its second and third projections' outputs start


class GpuAdapters:
    """The loaded adapters' buffers and scales; `attach` has put their deltas on the layout."""

    def __init__(self, dev: Device, adapters: list):
        self.dev, self.adapters = dev, adapters
        self.slots: list[list[GpuLora]] = []             # per adapter, its targets in order
        self.grouped_bytes = 0                           # the fused outputs' grouped copies of A and B
        n = sum(len(a.targets) for a in adapters)
        self.scales = dev.buffer(max(1, n) * K.LORA_SCALE_STRIDE, label="lora scales")
        slot = 0
        for adapter in adapters:
            mine = []
            for t in adapter.targets:
                a, b = adapter.arrays(t)
                ga, gb = dev.buffer(len(a), label=f"{t.name}.lora_a"), dev.buffer(len(b), label=f"{t.name}.lora_b")
                dev.write(ga, a)
                dev.write(gb, b)
                mine.append(GpuLora(t.name, ga, gb, t.rank, t.n_in, t.n_out,
                                    (self.scales, slot * K.LORA_SCALE_STRIDE, 4)))
                slot += 1
            self.slots.append(mine)
        for i, adapter in enumerate(adapters):
            self.set_scale(i, adapter.user_scale)

    @property
    def nbytes(self) -> int:
        return sum(g.a.size + g.b.size for mine in self.slots for g in mine) + self.scales.size + self.grouped_bytes

    def set_scale(self, i: int, user_scale: float) -> None:
        """Adapter i's user scale (0: off) for every later step; plans need no rebuild. A scale that is not
        finite or beyond +-MAX_USER_SCALE is a LoraError (pyapp.model.lora.check_user_scale)."""
        adapter = self.adapters[i]
        adapter.user_scale = check_user_scale(user_scale)
        for t, g in zip(adapter.targets, self.slots[i]):
            self.dev.write(g.scale[0], struct.pack("<f", adapter.scale(t)), g.scale[1])

    def attach(self, layout) -> None:
        """Put every target's delta on the layout tensors (and fused groups) its projection runs through."""
        for adapter, mine in zip(self.adapters, self.slots):
            fused: dict = {}                                 # (fused tensor's id) -> (tensor, [(GpuLora, col0, target)])
            for t, g in zip(adapter.targets, mine):
                owner = layout if t.layer is None else layout.layers[t.layer]
                tensor = getattr(owner, t.field)
                if tensor is not None:                       # its own GpuTensor (prefill; unfused decode)
                    tensor.loras.append((g, 0))
                if t.field in QKV_ROWS and owner.qkv is not None:
                    at = getattr(owner.qkv, QKV_ROWS[t.field])
                    fused.setdefault(id(owner.qkv), (owner.qkv, []))[1].append((g, at, t))
                if t.field in ("ffn_gate", "ffn_up") and owner.ffn_gate_up is not None:
                    ff = owner.ffn_gate_up.shape[1] // 2
                    at = 0 if t.field == "ffn_gate" else ff
                    fused.setdefault(id(owner.ffn_gate_up), (owner.ffn_gate_up, []))[1].append((g, at, t))
            for tensor, deltas in fused.values():
                tensor.loras.extend(self.group(adapter, deltas))

    def group(self, adapter, deltas: list) -> list:
        """The deltas of one fused output: one grouped GpuLora (one dispatch, shaders/lora.wgsl) when
        they have one rank, else one each: [(GpuLora, col0)]. Padding rows between the projections
        (the fused q|k|v pads each to 64 rows) get zero rows of B: a delta of 0."""
        deltas = sorted(deltas, key=lambda d: d[1])
        apart = [(g, at) for g, at, _ in deltas]
        if len(deltas) == 1 or len({g.rank for g, _ in apart}) != 1:
            return apart
        first, col0 = apart[0]
        row_bytes = 4 * first.rank
        parts = [adapter.arrays(t) for _, _, t in deltas]
        a = b"".join(p[0] for p in parts)
        b = bytearray()
        for (g, at), (_, pb) in zip(apart, parts):
            b += bytes(row_bytes * (at - col0 - len(b) // row_bytes)) + pb     # zero rows up to this projection
        b = bytes(b)
        ga, gb = self.dev.buffer(len(a), label=f"{first.name} group.lora_a"), self.dev.buffer(len(b), label=f"{first.name} group.lora_b")
        self.dev.write(ga, a)
        self.dev.write(gb, b)
        self.grouped_bytes += len(a) + len(b)
        starts = [at - col0 for _, at in apart[1:]]
        # one rank, one adapter: every member's scale is the same, so the group reads the first one's slot
        return [(GpuLora(first.name, ga, gb, first.rank, first.k, len(b) // row_bytes, first.scale,
                         tuple(starts)), col0)]
