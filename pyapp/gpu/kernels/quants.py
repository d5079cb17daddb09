"""Weight formats as the shaders read them: which ggml types have kernels, and the WGSL prelude that
picks a type's dequantization (shaders/quants.wgsl, quants_dot.wgsl, b32_codes.wgsl)."""

from __future__ import annotations

from ... import ggml


# ggml types with a dq4_<name> in shaders/quants.wgsl, and those with a dot32_<name> in quants_dot.wgsl
KERNEL_TYPES = frozenset({ggml.F32, ggml.F16, ggml.BF16, ggml.Q8_0, ggml.Q4_0, ggml.Q4_1, ggml.Q5_0,
                          ggml.Q5_1, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K, ggml.MXFP4})
DOT32_TYPES = frozenset({ggml.Q4_0, ggml.Q5_0, ggml.Q8_0, ggml.Q4_K, ggml.Q5_K, ggml.Q6_K})
UNIT_TYPES = frozenset({ggml.Q4_K, ggml.Q5_K, ggml.Q6_K})    # where matvec's 32-weight units are faster (see matvec)
INT8_UNIT_TYPES = frozenset({ggml.Q4_0, ggml.Q5_0, ggml.Q8_0, ggml.Q6_K})   # a dot32_<type>_x8 in quants_dot_x8.wgsl


def quant_type(t) -> int:
    """GGML type id of a type with a GPU kernel, from an id, a name ('Q4_K', 'q4_k') or an enum."""
    try:
        gt = ggml.lookup(t)
    except ValueError:
        gt = None
    if gt is None or gt.id not in KERNEL_TYPES:
        supported = ", ".join(sorted(ggml.name(i) for i in KERNEL_TYPES))
        raise ValueError(f"ggml type {gt.name if gt else t!r} has no GPU kernel (supported: {supported})")
    return gt.id


def shader_block(t) -> tuple[str, int, int]:
    """(dq4 suffix, QK, QB) of a type: float types are read as 4-element pseudo blocks (one vec4)."""
    gt = ggml.TYPES[quant_type(t)]
    if gt.block == 1:
        return gt.name.lower(), 4, 4 * gt.block_bytes
    return gt.name.lower(), gt.block, gt.block_bytes


def quant_prelude(t) -> str:
    name, qk, qb = shader_block(t)
    return (f"const QK: u32 = {qk}u;\nconst QB: u32 = {qb}u;\n"
            f"fn dq4(bb: u32, i: u32) -> vec4<f32> {{ return dq4_{name}(bb, i); }}\n")


def row_bytes(t, k: int) -> int:
    """Bytes of a row of k weights of type t; k must fill whole (shader) blocks."""
    name, qk, qb = shader_block(t)
    if k % qk:
        raise ValueError(f"row length {k} is not a multiple of the {name} block ({qk})")
    return k // qk * qb


B32_TYPES = {ggml.Q4_0: 0, ggml.Q5_0: 1, ggml.Q8_0: 2}     # q8_weights_b32.wgsl's B32_TYPE


def q8_b32_prelude(qtype) -> str:
    """QK, QB and B32_TYPE of a 32-weight block type for b32_codes.wgsl."""
    t = quant_type(qtype)
    return quant_prelude(t) + f"const B32_TYPE: u32 = {B32_TYPES[t]}u;\n"
