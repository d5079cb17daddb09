"""The LoRA parameters of a training run on the GPU: every A and B in one flat f32 buffer.

One flat buffer (and a gradient buffer of the same layout) lets the optimizer update everything in a
few dispatches and a checkpoint read it back in one go. Each tensor starts on a 256-byte boundary
(WebGPU's storage offset alignment; gpu_optim.flat_layout) so it binds on its own as a range; the
padding stays zero.

Each pair is a pyapp.runtime.adapters.GpuLora whose A and B are ranges of that buffer, put on the
layout tensor its projection runs through (`attach`), so the forward's ops add its delta as they do
an adapter loaded from a file. Only the chunk path (T > 1: one GpuTensor per projection, with
gate|up fused or not) is used by training; decode's fused q|k|v buffer is left alone.

Initialisation as PEFT's default: A uniform in +-1/sqrt(n_in) (kaiming_uniform with a = sqrt(5)),
B zero, so the adapted model starts as the base model.
"""

from __future__ import annotations

import math
import random
import struct
from array import array
from dataclasses import dataclass

from ..gpu import Buffer, Device
from ..gpu import kernels as K
from ..runtime.adapters import GpuLora
from .adapter_out import PairSpec
from .gpu_optim import flat_layout


@dataclass
class TrainPair:
    """One trained pair: where A and B sit in the flat buffers, and its GpuLora (A, B bound as ranges)."""
    spec: PairSpec
    rank: int
    a_at: int                 # float offset of A [rank, n_in]
    b_at: int                 # float offset of B [n_out, rank]
    lora: GpuLora
    da: tuple                 # (grads buffer, byte offset, bytes): dloss/dA
    db: tuple
    col0: int = 0             # its outputs' first column in the tensor it is attached to (fused gate|up: ff for up)

    @property
    def a_size(self) -> int:
        return self.rank * self.spec.n_in

    @property
    def b_size(self) -> int:
        return self.spec.n_out * self.rank


class LoraParams:
    """Every trained pair's A and B in `params`, their gradients in `grads` (same layout)."""

    def __init__(self, dev: Device, specs: list[PairSpec], rank: int, alpha: float):
        if not 1 <= rank <= K.LORA_MAX_RANK:
            raise ValueError(f"LoRA rank {rank}: choose 1 to {K.LORA_MAX_RANK}")
        self.dev, self.rank, self.alpha = dev, rank, float(alpha)
        self.scale = self.alpha / rank                    # llama.cpp's alpha / r, user scale 1
        sizes = []
        for s in specs:
            sizes += [rank * s.n_in, s.n_out * rank]
        offsets, self.n_floats = flat_layout(sizes)
        self.params = dev.buffer(4 * self.n_floats, label="lora params")
        self.grads = dev.buffer(4 * self.n_floats, label="lora grads")
        self.scales = dev.buffer(len(specs) * K.LORA_SCALE_STRIDE, label="lora train scales")
        for i in range(len(specs)):
            dev.write(self.scales, struct.pack("<f", self.scale), i * K.LORA_SCALE_STRIDE)
        self.pairs: list[TrainPair] = []
        for i, s in enumerate(specs):
            a_at, b_at = offsets[2 * i], offsets[2 * i + 1]
            a_n, b_n = rank * s.n_in, s.n_out * rank
            lora = GpuLora(s.name, (self.params, 4 * a_at, 4 * a_n), (self.params, 4 * b_at, 4 * b_n), rank,
                           s.n_in, s.n_out, (self.scales, i * K.LORA_SCALE_STRIDE, 4))
            self.pairs.append(TrainPair(s, rank, a_at, b_at, lora, (self.grads, 4 * a_at, 4 * a_n),
                                        (self.grads, 4 * b_at, 4 * b_n)))
        self.by_target = {(p.spec.layer, p.spec.field): p for p in self.pairs}
        self._attached: list = []

    @property
    def n_trainable(self) -> int:
        return sum(p.a_size + p.b_size for p in self.pairs)

    def initialize(self, seed: int) -> None:
        """A ~ U(-1/sqrt(n_in), 1/sqrt(n_in)) from random.Random(seed), B = 0 (PEFT's default)."""
        rng = random.Random(seed)
        flat = array("f", bytes(4 * self.n_floats))
        for p in self.pairs:
            bound = 1.0 / math.sqrt(p.spec.n_in)
            for i in range(p.a_at, p.a_at + p.a_size):
                flat[i] = rng.uniform(-bound, bound)
        self.dev.write(self.params, flat.tobytes())
        self.dev.write(self.grads, bytes(4 * self.n_floats))

    def load(self, tensors: dict) -> None:
        """Parameters from {"<base>.lora_a": array('f'), "<base>.lora_b": ...} (a checkpoint)."""
        flat = array("f", bytes(4 * self.n_floats))
        for p in self.pairs:
            for suffix, at, n in ((".lora_a", p.a_at, p.a_size), (".lora_b", p.b_at, p.b_size)):
                values = tensors.get(p.spec.name + suffix)
                if values is None or len(values) != n:
                    raise ValueError(f"the checkpoint has no {n}-value tensor {p.spec.name + suffix}: it was made "
                                     "for another model, rank or targets")
                flat[at:at + n] = array("f", values)
        self.dev.write(self.params, flat.tobytes())

    def split(self, data: bytes) -> dict:
        """A flat buffer's bytes (params, grads or a moment) as {"<base>.lora_a" / ".lora_b": array('f')}."""
        flat = array("f")
        flat.frombytes(data[:4 * self.n_floats])
        out = {}
        for p in self.pairs:
            out[p.spec.name + ".lora_a"] = flat[p.a_at:p.a_at + p.a_size]
            out[p.spec.name + ".lora_b"] = flat[p.b_at:p.b_at + p.b_size]
        return out

    def join(self, tensors: dict) -> bytes:
        """The inverse of split: per-tensor arrays back to the flat layout's bytes."""
        flat = array("f", bytes(4 * self.n_floats))
        for p in self.pairs:
            flat[p.a_at:p.a_at + p.a_size] = array("f", tensors[p.spec.name + ".lora_a"])
            flat[p.b_at:p.b_at + p.b_size] = array("f", tensors[p.spec.name + ".lora_b"])
        return flat.tobytes()

    def adapter_pairs(self, data: bytes) -> dict:
        """{base tensor name: (A, B)} from the params' bytes, as pyapp.train.adapter_out writes them."""
        t = self.split(data)
        return {p.spec.name: (t[p.spec.name + ".lora_a"], t[p.spec.name + ".lora_b"]) for p in self.pairs}

    # -- on the layout -----------------------------------------------------------------------------

    def attach(self, layout) -> None:
        """Put every pair's delta on the GpuTensor its projection runs through for a chunk of tokens:
        its own tensor, or the fused gate|up tensor at the gate's (column 0) or up's (column ff) outputs."""
        for p in self.pairs:
            lw = layout.layers[p.spec.layer]
            tensor, col0 = getattr(lw, p.spec.field), 0
            if tensor is None and p.spec.field in ("ffn_gate", "ffn_up") and lw.ffn_gate_up is not None:
                tensor = lw.ffn_gate_up
                col0 = 0 if p.spec.field == "ffn_gate" else tensor.shape[1] // 2
            if tensor is None:
                raise ValueError(f"{p.spec.name}: the loaded model has no GPU tensor for it")
            p.col0 = col0
            entry = (p.lora, col0)
            tensor.loras.append(entry)
            self._attached.append((tensor, entry))

    def detach(self) -> None:
        """Take the deltas off the layout again (the engine's later plans run the base model)."""
        for tensor, entry in self._attached:
            tensor.loras[:] = [e for e in tensor.loras if e is not entry]
        self._attached = []

    def buffers(self) -> list[Buffer]:
        return [self.params, self.grads, self.scales]
