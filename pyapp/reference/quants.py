"""GGML block quantization in numpy: dequantize every type Gemma 4 blobs use,
quantize the ones our tests and fixtures need.

Block layouts follow ggml-common.h. Each dequantizer takes the raw bytes as a
[n_blocks, block_bytes] uint8 array and returns [n_blocks, block_elems] float32.
Quantizers are plain round-to-nearest (not llama.cpp's error-minimising search):
they exist to make test data, and the tests compare dequantized values only.
"""

from __future__ import annotations

import numpy as np

from .. import ggml

MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of every block, as a float32 column."""
    return b[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32]: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float32)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: 32 high bits in a little-endian u32 -> [n, 32] of 0 or 16."""
    bits = np.unpackbits(qh, axis=1, bitorder="little")
    return bits.astype(np.float32) * 16


def _q4_0(b):
    return _f16(b, 0) * (_nibbles(b[:, 2:18]) - 8)


def _q4_1(b):
    return _f16(b, 0) * _nibbles(b[:, 4:20]) + _f16(b, 2)


def _q5_0(b):
    return _f16(b, 0) * (_nibbles(b[:, 6:22]) + _high_bits(b[:, 2:6]) - 16)


def _q5_1(b):
    return _f16(b, 0) * (_nibbles(b[:, 8:24]) + _high_bits(b[:, 4:8])) + _f16(b, 2)


def _q8_0(b):
    return _f16(b, 0) * b[:, 2:34].view(np.int8).astype(np.float32)


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins per block."""
    s = s.astype(np.int32)
    sc = np.empty((len(s), 8), np.int32)
    mn = np.empty((len(s), 8), np.int32)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k(b):
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scale_min(b[:, 4:16])
    qs = b[:, 16:144].reshape(-1, 4, 32)
    q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)  # sub-block j = 2*chunk + half
    return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).reshape(-1, 256)


def _q5_k(b):
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scale_min(b[:, 4:16])
    qh = b[:, 16:48]
    qs = b[:, 48:176].reshape(-1, 4, 32)
    low = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    high = np.stack([(qh >> j) & 1 for j in range(8)], axis=1).astype(np.float32) * 16  # bit j -> sub-block j
    q = low + high
    return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).reshape(-1, 256)


def _q6_k(b):
    ql = b[:, 0:128].reshape(-1, 2, 64)
    qh = b[:, 128:192].reshape(-1, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b, 208)
    lo = [ql[:, :, 0:32] & 0xF, ql[:, :, 32:64] & 0xF, ql[:, :, 0:32] >> 4, ql[:, :, 32:64] >> 4]
    q = np.stack([lo[i] | (((qh >> (2 * i)) & 3) << 4) for i in range(4)], axis=2)  # [n, half, quarter, 32]
    q = q.astype(np.float32).reshape(-1, 256) - 32
    return d * np.repeat(sc, 16, axis=1) * q


def _q2_k(b):
    sc = b[:, 0:16]
    qs = b[:, 16:80].reshape(-1, 2, 32)
    d, dmin = _f16(b, 80), _f16(b, 82)
    q = np.stack([(qs >> (2 * j)) & 3 for j in range(4)], axis=2).reshape(-1, 256).astype(np.float32)
    scale = np.repeat((sc & 0xF).astype(np.float32), 16, axis=1)
    mins = np.repeat((sc >> 4).astype(np.float32), 16, axis=1)
    return d * scale * q - dmin * mins


def _q3_k(b):
    hmask = b[:, 0:32]
    qs = b[:, 32:96].reshape(-1, 2, 32)
    s = b[:, 96:108].astype(np.int32)
    d = _f16(b, 108)
    i = np.arange(16)
    low = (s[:, i % 8] >> (4 * (i // 8))) & 0xF
    high = (s[:, 8 + i % 4] >> (2 * (i // 4))) & 3
    scales = ((low | (high << 4)) - 32).astype(np.float32)
    q = np.stack([(qs >> (2 * j)) & 3 for j in range(4)], axis=2).reshape(-1, 256).astype(np.float32)
    # element 128h + 32j + l uses hmask bit 4h + j of byte l
    bit = np.stack([(hmask >> (4 * h + j)) & 1 for h in range(2) for j in range(4)], axis=1).reshape(-1, 256)
    return d * np.repeat(scales, 16, axis=1) * (q - 4 * (1 - bit))


def _mxfp4(b):
    e = b[:, 0].astype(np.int32)
    d = np.ldexp(np.float32(0.5), e - 127).astype(np.float32)[:, None]  # E8M0, halved: values are doubled
    qs = b[:, 1:17]
    return d * MXFP4_VALUES[np.concatenate([qs & 0xF, qs >> 4], axis=1)]


_BLOCK_DEQUANT = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
                  "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "MXFP4": _mxfp4}
FLOAT_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
               "I16": np.int16, "I32": np.int32, "I64": np.int64}
SUPPORTED = sorted(["BF16", *FLOAT_TYPES, *_BLOCK_DEQUANT])


def type_name(t) -> str:
    if isinstance(t, str):
        return t.upper()
    return ggml.name(t)


def dequantize(raw, qtype, shape) -> np.ndarray:
    """Raw GGUF tensor bytes -> float32 array of numpy shape `shape` (ggml ne reversed)."""
    name = type_name(qtype)
    data = np.frombuffer(raw, dtype=np.uint8)
    if name == "BF16":
        out = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif name in FLOAT_TYPES:
        out = data.view(FLOAT_TYPES[name]).astype(np.float32)
    elif name in _BLOCK_DEQUANT:
        out = _BLOCK_DEQUANT[name](data.reshape(-1, ggml.lookup(name).block_bytes))
    else:
        raise ValueError(f"no dequantizer for ggml type {name} (supported: {', '.join(SUPPORTED)})")
    return out.reshape(shape)


def load_tensor(gguf, name_or_info) -> np.ndarray:
    """A GGUF tensor (by name, or its TensorInfo: a bound field may be a view of a fused tensor) as
    float32 in numpy order (rows = ggml's last dimension)."""
    t = gguf.tensor(name_or_info) if isinstance(name_or_info, str) else name_or_info
    return dequantize(gguf.source.read(t.offset, t.nbytes), t.type, tuple(reversed(t.shape)))


# ---------------------------------------------------------------- quantizers

def _blocks(x: np.ndarray, qk: int) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.size % qk:
        raise ValueError(f"{x.size} values are not a whole number of {qk}-element blocks")
    return x.reshape(-1, qk)


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def _safe_inv(d: np.ndarray) -> np.ndarray:
    return np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0).astype(np.float32)


def _signed_max(x: np.ndarray) -> np.ndarray:
    """Per row: the value with the largest magnitude, keeping its sign (as ggml does)."""
    return np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)


def _quant_q8_0(x):
    d = np.abs(x).max(axis=1, keepdims=True) / 127
    q = np.round(x * _safe_inv(d)).astype(np.int8).view(np.uint8)
    return np.concatenate([_f16_bytes(d), q], axis=1)


def _quant_sym(x, levels: int):
    """Q4_0 / Q5_0: d = signed max / -levels/2, q = x/d + levels/2."""
    d = _signed_max(x) / -(levels // 2)
    q = np.clip(np.floor(x * _safe_inv(d) + levels // 2 + 0.5), 0, levels - 1).astype(np.uint32)
    return _f16_bytes(d), q


def _quant_affine(x, levels: int):
    """Q4_1 / Q5_1: x = d*q + m."""
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (hi - lo) / (levels - 1)
    q = np.clip(np.round((x - lo) * _safe_inv(d)), 0, levels - 1).astype(np.uint32)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo)], axis=1), q


def _qh_bytes(q: np.ndarray) -> np.ndarray:
    return np.packbits(((q >> 4) & 1).astype(np.uint8), axis=1, bitorder="little")


def _quant_q4_0(x):
    head, q = _quant_sym(x, 16)
    return np.concatenate([head, _pack_nibbles(q)], axis=1)


def _quant_q4_1(x):
    head, q = _quant_affine(x, 16)
    return np.concatenate([head, _pack_nibbles(q)], axis=1)


def _quant_q5_0(x):
    head, q = _quant_sym(x, 32)
    return np.concatenate([head, _qh_bytes(q), _pack_nibbles(q & 0xF)], axis=1)


def _quant_q5_1(x):
    head, q = _quant_affine(x, 32)
    return np.concatenate([head, _qh_bytes(q), _pack_nibbles(q & 0xF)], axis=1)


def _k_affine(x: np.ndarray, levels: int):
    """Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scale and min under f16 d and dmin."""
    sub = x.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(axis=2), 0)
    scale = (sub.max(axis=2) - lo) / (levels - 1)
    d = scale.max(axis=1, keepdims=True) / 63
    dmin = (-lo).max(axis=1, keepdims=True) / 63
    d, dmin = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    ls = np.clip(np.round(scale * _safe_inv(d)), 0, 63).astype(np.uint32)
    lm = np.clip(np.round(-lo * _safe_inv(dmin)), 0, 63).astype(np.uint32)
    step = d * ls
    q = np.round((sub + (dmin * lm)[:, :, None]) * _safe_inv(step)[:, :, None])
    q = np.clip(q, 0, levels - 1).astype(np.uint32)
    packed = np.zeros((len(x), 12), np.uint32)
    packed[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    packed[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    head = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed.astype(np.uint8)], axis=1)
    return head, q  # q: [n, 8, 32]


def _k_nibbles(q: np.ndarray) -> np.ndarray:
    """[n, 8, 32] -> 128 bytes: chunk c holds sub-block 2c in low nibbles, 2c+1 in high."""
    q = q & 0xF
    return (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128).astype(np.uint8)


def _quant_q4_k(x):
    head, q = _k_affine(x, 16)
    return np.concatenate([head, _k_nibbles(q)], axis=1)


def _quant_q5_k(x):
    head, q = _k_affine(x, 32)
    qh = sum(((q[:, j] >> 4) & 1) << j for j in range(8)).astype(np.uint8)  # bit j <- sub-block j
    return np.concatenate([head, qh, _k_nibbles(q)], axis=1)


def _quant_q6_k(x):
    sub = x.reshape(-1, 16, 16)
    s = _signed_max(sub.reshape(-1, 16)).reshape(-1, 16) / -32
    d = np.abs(s).max(axis=1, keepdims=True) / 127
    d = d.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(s * _safe_inv(d)), -128, 127).astype(np.int8)
    step = d * sc.astype(np.float32)
    q = np.clip(np.round(sub * _safe_inv(step)[:, :, None]) + 32, 0, 63).astype(np.uint32).reshape(-1, 2, 4, 32)
    ql = np.concatenate([(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4),
                         (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)], axis=2).reshape(-1, 128)
    qh = sum((q[:, :, i] >> 4) << (2 * i) for i in range(4)).reshape(-1, 64)
    return np.concatenate([ql.astype(np.uint8), qh.astype(np.uint8), sc.view(np.uint8), _f16_bytes(d)], axis=1)


_BLOCK_QUANT = {"Q8_0": _quant_q8_0, "Q4_0": _quant_q4_0, "Q4_1": _quant_q4_1, "Q5_0": _quant_q5_0,
                "Q5_1": _quant_q5_1, "Q4_K": _quant_q4_k, "Q5_K": _quant_q5_k, "Q6_K": _quant_q6_k}
QUANTIZABLE = sorted(["F32", "F16", "BF16", *_BLOCK_QUANT])


def quantize(x: np.ndarray, qtype) -> bytes:
    """float array (any shape, rows contiguous) -> raw GGUF bytes of that type."""
    name = type_name(qtype)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if name == "F32":
        return x.tobytes()
    if name == "F16":
        return x.astype(np.float16).tobytes()
    if name == "BF16":
        u = x.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()  # round to nearest even
    if name not in _BLOCK_QUANT:
        raise ValueError(f"no quantizer for {name} (have: {', '.join(QUANTIZABLE)})")
    return np.ascontiguousarray(_BLOCK_QUANT[name](_blocks(x, ggml.lookup(name).block))).tobytes()


# ---- int8 activations (the int8 prefill matmul, shaders/quantize_q8.wgsl and matmul_q8.wgsl) ----

def quantize_activations_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of x [t, k] in blocks of 32 as int8, as llama.cpp's quantize_q8_1: (q int8 [t, k],
    d [t, k / 32] = max |x| / 127, sums [t, k / 32] of the blocks' x)."""
    x = np.asarray(x, dtype=np.float32)
    t, k = x.shape
    b = x.reshape(t, k // 32, 32)
    d = np.abs(b).max(axis=-1) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.round(b * inv[..., None]).astype(np.int8)
    return q.reshape(t, k), d.astype(np.float32), b.sum(axis=-1, dtype=np.float64).astype(np.float32)


def int8_blocks(raw: bytes, qtype, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A weight tensor [n, k] as the int8 matmul reads it, per sub-block of g weights w = a q - b:
    (codes int64 [n, k / g, g], a, b [n, k / g]), g = 32 but for Q6_K's 16. Q4_K: a = d sc, b = dmin m;
    Q6_K: a = d sc, b = 0 with signed codes q - 32; Q4_0 / Q5_0: a = d, b = 8 d / 16 d with 4- / 5-bit
    codes; Q8_0: a = d, b = 0 with the signed bytes as codes."""
    t = ggml.lookup(qtype).id
    if t == ggml.Q4_K:
        blocks = np.frombuffer(raw, np.uint8).reshape(n * k // 256, 144)
        dm = blocks[:, :4].copy().view(np.float16).astype(np.float64)            # [blocks, 2]: d, dmin
        sc, mn = (v.astype(np.float64) for v in _k_scale_min(blocks[:, 4:16]))   # [blocks, 8]
        qs = blocks[:, 16:].reshape(-1, 4, 32)
        codes = np.concatenate([qs & 15, qs >> 4], axis=2)
        return (codes.reshape(n, k // 32, 32).astype(np.int64), (dm[:, :1] * sc).reshape(n, k // 32),
                (dm[:, 1:] * mn).reshape(n, k // 32))
    if t == ggml.Q6_K:
        blocks = np.frombuffer(raw, np.uint8).reshape(n * k // 256, 210)
        ql = blocks[:, 0:128].reshape(-1, 2, 64)
        qh = blocks[:, 128:192].reshape(-1, 2, 32)
        low = [ql[:, :, 0:32] & 15, ql[:, :, 32:64] & 15, ql[:, :, 0:32] >> 4, ql[:, :, 32:64] >> 4]
        codes = np.stack([low[g] | (((qh >> (2 * g)) & 3) << 4) for g in range(4)], axis=2).astype(np.int64) - 32
        a = _f16(blocks, 208).astype(np.float64) * blocks[:, 192:208].view(np.int8).astype(np.float64)
        return codes.reshape(n, k // 16, 16), a.reshape(n, k // 16), np.zeros((n, k // 16))
    size = {ggml.Q4_0: 18, ggml.Q5_0: 22, ggml.Q8_0: 34}[t]
    blocks = np.frombuffer(raw, np.uint8).reshape(n * k // 32, size)
    d = _f16(blocks, 0).astype(np.float64)[:, 0]
    if t == ggml.Q8_0:
        codes, b = blocks[:, 2:].view(np.int8).astype(np.int64), 0.0 * d
    elif t == ggml.Q4_0:
        codes, b = _nibbles(blocks[:, 2:]).astype(np.int64), 8.0 * d
    else:
        codes, b = (_nibbles(blocks[:, 6:]) + _high_bits(blocks[:, 2:6])).astype(np.int64), 16.0 * d
    return codes.reshape(n, k // 32, 32), d.reshape(n, k // 32), b.reshape(n, k // 32)


def matmul_int8(raw: bytes, qtype, n: int, q: np.ndarray, d: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """Y [t, n] = X W^T with W raw GGUF rows [n, k] of an int8-matmul type and X as
    quantize_activations_q8 gave it: per sub-block, a d_x sum(code q_x) - b sum(x), the sum of codes
    exact (float64 here; b is 0 where sub-blocks are shorter than the activations' 32)."""
    t, k = q.shape
    codes, a, b = int8_blocks(raw, qtype, n, k)
    g = codes.shape[2]
    isum = np.einsum("nbk,tbk->tnb", codes, q.reshape(t, k // g, g).astype(np.int64))
    dx = np.repeat(d.astype(np.float64), 32 // g, axis=1)
    return (isum * a[None] * dx[:, None, :]).sum(-1) - sums.astype(np.float64) @ b[:, ::32 // g].T
