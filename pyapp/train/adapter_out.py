"""Write a trained LoRA adapter as llama.cpp's adapter GGUF, the file pyapp/model/lora.py reads.

What llama.cpp (src/llama-adapter.cpp) accepts, and what its convert_lora_to_gguf.py writes:

    GGUF v3, alignment 32 (the default, so no general.alignment key)
    general.architecture = the base model's     STRING
    general.type         = "adapter"            STRING
    adapter.type         = "lora"               STRING
    adapter.lora.alpha   = alpha                FLOAT32 (llama.cpp aborts on any other type)
    per adapted tensor, in order:  <base tensor name>.lora_a  F32, ggml ne [n_in, r]  (numpy [r, n_in])
                                   <base tensor name>.lora_b  F32, ggml ne [r, n_out] (numpy [n_out, r])

so y = W x + (user_scale * alpha / r) * B (A x), PEFT's lora_A / lora_B with no transpose. Which
tensors get a pair comes from --targets (`lora_targets`): only the projections llama.cpp applies a
LoRA to for Gemma 4 (lora.ADAPTED), and only where the layer has the tensor: KV-shared layers have
no K/V projection (llama.cpp rejects a pair for one), k_eq_v layers no V.

    specs = lora_targets(cfg, bound, "q,k,v,o,gate,up,down")    # [PairSpec]: name, layer, field, n_in, n_out
    data = adapter_gguf({s.name: (a, b) for s, (a, b) in ...}, rank=8, alpha=16.0)   # bytes
    write_adapter("tuned.gguf", pairs, rank=8, alpha=16.0)       # atomically

Pure Python (struct, array): gguf-py is not available in Pyodide.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from dataclasses import dataclass

from .. import ggml
from ..errors import Gemma4Error
from ..gguf import DEFAULT_ALIGNMENT, MAGIC
from ..model.config import ARCH
from ..model.lora import ADAPTED, ALPHA_KEY, F32_VALUE
from ..model.weights import LayerWeights, gguf_name
from .files import write_atomic

VERSION = 3
STRING_VALUE = 8                  # GGUF metadata value type of a string (pyapp.gguf.VALUE_TYPE_NAMES)
# --targets names -> the LayerWeights field each adapts (all in lora.ADAPTED)
TARGETS = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
           "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down",
           "ple_gate": "ple_gate", "ple_proj": "ple_proj", "router": "router"}
DEFAULT_TARGETS = "q,k,v,o,gate,up,down"
assert set(TARGETS.values()) <= ADAPTED


class AdapterWriteError(Gemma4Error, ValueError):
    """The tensors given do not make an adapter llama.cpp would load; the message names the tensor."""


@dataclass(frozen=True)
class PairSpec:
    """One LoRA pair to train: the base tensor it adapts and its sizes."""
    name: str                 # the base tensor's GGUF name
    layer: int
    field: str                # LayerWeights field
    n_in: int                 # lora_a is [r, n_in]
    n_out: int                # lora_b is [n_out, r]


def parse_targets(targets) -> list[str]:
    """The LayerWeights fields of a --targets list ("q,k,v" or ["q", "k"]), in TARGETS order."""
    names = [t.strip() for t in (targets.split(",") if isinstance(targets, str) else targets) if t.strip()]
    unknown = [t for t in names if t not in TARGETS]
    if unknown or not names:
        raise ValueError(f"unknown LoRA target(s) {', '.join(map(repr, unknown)) or '(none given)'}: choose from "
                         f"{', '.join(TARGETS)} (embeddings and the LM head take no LoRA for Gemma 4)")
    return [f for t, f in TARGETS.items() if t in names]


def lora_targets(cfg, bound, targets=DEFAULT_TARGETS) -> list[PairSpec]:
    """The pairs an adapter for this model has, layer by layer: each requested projection the layer
    has (bound = weights.bind(cfg, tensors); a field is None where the layer lacks the tensor)."""
    fields = parse_targets(targets)
    out = []
    for lc, lw in zip(cfg.layers, bound.layers):
        for f in fields:
            w = getattr(lw, f)
            if w is not None:
                out.append(PairSpec(gguf_name(LayerWeights, f, lc.index), lc.index, f, w.shape[0], w.shape[1]))
    if not out:
        raise ValueError(f"this model has none of the targets {targets!r}")
    return out


def _f32(values, what: str) -> bytes:
    """Little-endian f32 bytes of array('f'), a flat list, or a list of rows; finite values only."""
    if isinstance(values, array) and values.typecode == "f":
        arr = values
    else:
        flat = [x for row in values for x in row] if values and isinstance(values[0], (list, tuple, array)) \
            else values
        arr = array("f", flat)
    if not math.isfinite(math.fsum(arr)):
        raise AdapterWriteError(f"{what} holds NaN or infinite values: training diverged")
    if sys.byteorder == "big":
        arr = array("f", arr)
        arr.byteswap()
    return arr.tobytes()


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pad(n: int) -> int:
    return -n % DEFAULT_ALIGNMENT


def adapter_parts(pairs: dict, rank: int, alpha: float, arch: str = ARCH, name: str | None = None):
    """The adapter file as a sequence of byte strings (header, then each tensor's data and padding):
    pairs {base tensor name: (A, B)}, A [rank, n_in] and B [n_out, rank] row-major."""
    if rank < 1:
        raise AdapterWriteError(f"rank {rank} must be at least 1")
    if not pairs:
        raise AdapterWriteError("an adapter needs at least one LoRA pair")
    tensors = []                                  # (name, ne, data)
    for base, (a, b) in pairs.items():
        if base.endswith((".lora_a", ".lora_b")):
            raise AdapterWriteError(f"{base!r}: give the base tensor's name; the writer adds .lora_a / .lora_b")
        da, db = _f32(a, base + " A"), _f32(b, base + " B")
        if len(da) % (4 * rank) or len(db) % (4 * rank) or not da or not db:
            raise AdapterWriteError(f"LoRA pair for {base!r}: A has {len(da) // 4} values and B {len(db) // 4}; "
                                    f"each must be a whole number of rank-{rank} rows")
        tensors.append((base + ".lora_a", (len(da) // (4 * rank), rank), da))
        tensors.append((base + ".lora_b", (rank, len(db) // (4 * rank)), db))
    meta = [("general.architecture", STRING_VALUE, _string(arch)),
            ("general.type", STRING_VALUE, _string("adapter"))]
    if name:
        meta.append(("general.name", STRING_VALUE, _string(name)))
    meta += [("adapter.type", STRING_VALUE, _string("lora")),
             (ALPHA_KEY, F32_VALUE, struct.pack("<f", alpha))]
    head = [MAGIC, struct.pack("<IQQ", VERSION, len(tensors), len(meta))]
    for key, vtype, value in meta:
        head += [_string(key), struct.pack("<I", vtype), value]
    offset = 0
    for t_name, ne, data in tensors:
        head += [_string(t_name), struct.pack("<I", len(ne)), struct.pack(f"<{len(ne)}Q", *ne),
                 struct.pack("<IQ", ggml.F32, offset)]
        offset += len(data) + _pad(len(data))
    header = b"".join(head)
    yield header + bytes(_pad(len(header)))
    for _, _, data in tensors:
        yield data
        if _pad(len(data)):
            yield bytes(_pad(len(data)))


def adapter_gguf(pairs: dict, rank: int, alpha: float, arch: str = ARCH, name: str | None = None) -> bytes:
    """The adapter file's bytes (for a download in the browser)."""
    return b"".join(adapter_parts(pairs, rank, alpha, arch, name))


def write_adapter(path, pairs: dict, rank: int, alpha: float, arch: str = ARCH, name: str | None = None) -> int:
    """Write the adapter to `path` atomically (a temporary file renamed over it); returns its size."""
    return write_atomic(path, adapter_parts(pairs, rank, alpha, arch, name))
