"""Buffers on the native device and random GGUF tensors for the kernel parity tests (tests/kernels/, and the
diffusion and training kernels): raw bytes of every quant type with finite scales, their float64 dequantization
by gguf-py's numpy code (independent of ours), and the error bound of a dot product."""

from __future__ import annotations

import numpy as np

from pyapp import ggml


def f32(dev, a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = dev.buffer(a.nbytes)
    dev.write(b, a.tobytes())
    return b


def read_f32(dev, buf, n) -> np.ndarray:
    return np.frombuffer(dev.read(buf, 0, 4 * n), dtype=np.float32).copy()


def u32(dev, *vals, kind="uniform"):
    a = np.array(vals + (0,) * (-len(vals) % 4), dtype=np.uint32)
    b = dev.buffer(a.nbytes, kind)
    dev.write(b, a.tobytes())
    return b


def step_buffer(dev, n_tokens, pos0=0):
    """The per-step uniform: n_tokens tokens, the first at position pos0."""
    from pyapp.gpu import kernels as K
    b = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, b, n_tokens, pos0)
    return b


def q8_sentinels(dev, rows: int, k: int):
    """quantize_q8's outputs for rows of k (int8 codes, (d, sum) a block), every word 7.0: rows a kernel
    must not touch keep it."""
    from pyapp.gpu import kernels as K
    xq_bytes, xs_bytes = K.q8_bytes(rows, k)
    return f32(dev, np.full(xq_bytes // 4, 7.0)), f32(dev, np.full(xs_bytes // 4, 7.0))


def read_q8(dev, xq, xs, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The codes [rows, k] and the (d, sum) pairs [rows, k / 32, 2] of quantize_q8's outputs."""
    from pyapp.gpu import kernels as K
    xq_bytes, xs_bytes = K.q8_bytes(rows, k)
    return (np.frombuffer(dev.read(xq, 0, xq_bytes), np.int8).reshape(rows, k),
            read_f32(dev, xs, xs_bytes // 4).reshape(rows, k // 32, 2))


def assert_rounded_q8(q: np.ndarray, ds: np.ndarray, want: np.ndarray) -> None:
    """The first len(want) rows of codes q and (d, sum) pairs ds are want's rows rounded to int8 by
    pyapp.reference.quants' rule (a code 1 apart where x / d lies within float rounding of .5); the rows
    after them untouched (q8_sentinels)."""
    from pyapp.reference.quants import quantize_activations_q8
    rows = len(want)
    want_q, want_d, want_sum = quantize_activations_q8(want)
    np.testing.assert_allclose(ds[:rows, :, 0], want_d, rtol=1e-5)
    np.testing.assert_allclose(ds[:rows, :, 1], want_sum, rtol=1e-4, atol=1e-4)
    assert np.abs(q[:rows].astype(int) - want_q).max() <= 1 and (q[:rows] != want_q).mean() < 1e-2
    assert (ds[rows:] == 7.0).all()


# ---- random GGUF blocks --------------------------------------------------------

# byte offsets of the f16 scale fields in each block type (the rest is random bits)
F16_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2),
              "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}


def random_tensor(qtype: str, rows: int, k: int, rng) -> bytes:
    """Raw GGUF bytes of a random [rows, k] tensor of type qtype (valid, finite scales)."""
    if qtype == "f32":
        return rng.standard_normal((rows, k)).astype(np.float32).tobytes()
    if qtype == "f16":
        return rng.standard_normal((rows, k)).astype(np.float16).tobytes()
    if qtype == "bf16":
        return (rng.standard_normal((rows, k)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    gt = ggml.lookup(qtype)
    blocks = rng.integers(0, 256, size=(rows * k // gt.block, gt.block_bytes), dtype=np.uint8)
    if qtype == "mxfp4":
        blocks[:, 0] = rng.integers(120, 132, size=len(blocks))
    for off in F16_FIELDS.get(qtype, ()):
        d = (rng.uniform(0.5, 1.5, len(blocks)) * rng.choice([-1, 1], len(blocks)) / 64).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.tobytes()


def dequantize(qtype: str, raw: bytes, rows: int, k: int) -> np.ndarray:
    """float64 [rows, k] reference dequantization (gguf-py's numpy code)."""
    if qtype == "f32":
        return np.frombuffer(raw, np.float32).reshape(rows, k).astype(np.float64)
    if qtype == "f16":
        return np.frombuffer(raw, np.float16).reshape(rows, k).astype(np.float64)
    if qtype == "bf16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(rows, k).astype(np.float64)
    import gguf
    t = gguf.GGMLQuantizationType[qtype.upper()]
    data = np.frombuffer(raw, np.uint8).reshape(rows, -1)
    return gguf.quants.dequantize(data, t).reshape(rows, k).astype(np.float64)


def weight_buffer(dev, raw: bytes):
    b = dev.buffer(len(raw) + 4)           # +4: rd32 may touch the word after the last byte
    dev.write(b, raw)
    return b


QTYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "mxfp4"]


def assert_close_dot(got, w, x, ref, tol=2e-5):
    """|got - ref| within tol * sum |w||x| per output (the scale of rounding in a dot product)."""
    scale = np.abs(w) @ np.abs(x).T if x.ndim > 1 else np.abs(w) @ np.abs(x)
    err = np.abs(got - ref) / (scale + 1e-30)
    assert err.max() < tol, f"max relative error {err.max():.3g}"


def int8_reference(raw, rows, x, qtype="q4_k"):
    """Rows . x with x rounded to int8 per 32 as the int8 kernels round it (float64 sums)."""
    from pyapp.reference.quants import matmul_int8, quantize_activations_q8
    q, d, sums = quantize_activations_q8(np.asarray(x, np.float32)[None])
    return matmul_int8(raw, qtype, rows, q, d, sums)[0]


def route_reference(logits: np.ndarray, ksel: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, weights): top-k of softmax(logits) per row, lowest id on ties, renormalized (reference moe)."""
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :ksel]
    want = np.take_along_axis(probs, top, -1)
    return top, want / want.sum(-1, keepdims=True)
