"""The one table of ggml tensor types: id, name and block size (ggml.h, ggml.c, ggml-common.h).

    ggml.TYPES[ggml.Q4_K]          # GGMLType(id=12, name='Q4_K', block=256, block_bytes=144)
    ggml.lookup("q4_k").id         # by id, name (any case), GGMLType or enum with .value
    ggml.row_bytes(ggml.Q4_K, 2048)   # 1152

Float and integer types are 1-element blocks here (the shaders' 4-element pseudo
blocks for F32/F16/BF16 are derived in pyapp.gpu.kernels).
Standard library only: tools/make_bench_model.py imports it without the rest of pyapp.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str          # as ggml spells it: "Q4_K", "BF16"
    block: int         # elements per block
    block_bytes: int   # bytes per block

    def row_bytes(self, n: int) -> int:
        """Bytes of a row of n elements; n must fill whole blocks."""
        if n % self.block:
            raise ValueError(f"row length {n} is not a multiple of the {self.name} block ({self.block})")
        return n // self.block * self.block_bytes


# ids used by name in code
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 0, 1, 2, 3, 6, 7, 8, 9
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
IQ2_XXS, I8, I16, I32, I64, F64, BF16, MXFP4 = 16, 24, 25, 26, 27, 28, 30, 39

TYPES: dict[int, GGMLType] = {t.id: t for t in (GGMLType(*row) for row in (
    (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22), (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84), (11, "Q3_K", 256, 110), (12, "Q4_K", 256, 144), (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210), (15, "Q8_K", 256, 292), (16, "IQ2_XXS", 256, 66), (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98), (19, "IQ1_S", 256, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82), (23, "IQ4_XS", 256, 136), (24, "I8", 1, 1), (25, "I16", 1, 2),
    (26, "I32", 1, 4), (27, "I64", 1, 8), (28, "F64", 1, 8), (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2), (34, "TQ1_0", 256, 54), (35, "TQ2_0", 256, 66), (39, "MXFP4", 32, 17),
))}
_BY_NAME = {t.name: t for t in TYPES.values()}


def lookup(t) -> GGMLType:
    """The GGMLType of an id, a name in any case ('q4_k'), a GGMLType or an enum with .value
    (gguf-py's GGMLQuantizationType). Unknown types raise ValueError."""
    if isinstance(t, GGMLType):
        return t
    if isinstance(t, str):
        try:
            return _BY_NAME[t.upper()]
        except KeyError:
            raise ValueError(f"unknown ggml type {t!r}") from None
    i = int(getattr(t, "value", t))
    try:
        return TYPES[i]
    except KeyError:
        raise ValueError(f"unknown ggml type {i}") from None


def name(t) -> str:
    """'Q4_K' for 12, 'q4_k', ..."""
    return lookup(t).name


def row_bytes(t, n: int) -> int:
    """Bytes of a row of n elements of type t."""
    return lookup(t).row_bytes(n)


def float_bytes_to_f32(data: bytes, t) -> bytes:
    """F32, F16 or BF16 values as little-endian f32 bytes, without numpy (ValueError for other types)."""
    tid = lookup(t).id
    if tid == F32:
        return bytes(data)
    if tid == F16:
        return array("f", struct.unpack(f"<{len(data) // 2}e", data)).tobytes()
    if tid == BF16:
        return array("I", [h << 16 for h in array("H", data)]).tobytes()
    raise ValueError(f"expected F32, F16 or BF16 values, not {name(tid)}")
