"""Parity of the WGSL kernels (native wgpu backend) against numpy, on odd sizes."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

try:
    from pyapp.gpu import GPUError, get_device
    from pyapp.gpu import kernels as K
    _DEV = get_device("native")
    _SKIP = None
except Exception as e:  # no wgpu, no driver, no adapter
    _DEV, _SKIP = None, f"no WebGPU adapter for the native backend ({e}); apt-get install mesa-vulkan-drivers"


@pytest.fixture(scope="module")
def dev():
    if _DEV is None:
        pytest.skip(_SKIP)
    return _DEV


def f32(dev, a) -> "K.Buffer":
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = dev.buffer(a.nbytes)
    dev.write(b, a.tobytes())
    return b


def read_f32(dev, buf, n) -> np.ndarray:
    return np.frombuffer(dev.read(buf, 0, 4 * n), dtype=np.float32).copy()


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
    _, qk, qb = K.QUANTS[K.TYPE_IDS[qtype]]
    blocks = rng.integers(0, 256, size=(rows * k // qk, qb), dtype=np.uint8)
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


@pytest.mark.parametrize("qtype", QTYPES)
def test_matvec(dev, qtype):
    rng = np.random.default_rng(K.TYPE_IDS[qtype])
    qk = K.QUANTS[K.TYPE_IDS[qtype]][1]
    rows = 37
    k = qk * (3 if qk == 256 else 13) if qk > 4 else 4 * 97      # never a multiple of the workgroup
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal(k)
    y = dev.buffer(4 * rows)
    plan = K.matvec(dev, qtype, k, rows, weight_buffer(dev, raw), f32(dev, x), y)
    dev.submit(plan)
    assert_close_dot(read_f32(dev, y, rows), w, x, w @ x)


def u32(dev, *vals, kind="uniform"):
    a = np.array(vals + (0,) * (-len(vals) % 4), dtype=np.uint32)
    b = dev.buffer(a.nbytes, kind)
    dev.write(b, a.tobytes())
    return b


@pytest.mark.parametrize("qtype", ["f32", "f16", "q8_0", "q4_0", "q5_1", "q4_k", "q6_k"])
def test_matmul(dev, qtype):
    rng = np.random.default_rng(100 + K.TYPE_IDS[qtype])
    qk = K.QUANTS[K.TYPE_IDS[qtype]][1]
    rows, t = 45, 19
    k = 256 if qk == 256 else 4 * 29 if qk == 4 else 32 * 5
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal((t, k))
    y = dev.buffer(4 * rows * t)
    plan = K.matmul(dev, qtype, k, rows, weight_buffer(dev, raw), f32(dev, x), y, u32(dev, t), n_tokens=t)
    dev.submit(plan)
    got = read_f32(dev, y, rows * t).reshape(t, rows)
    assert_close_dot(got, x, w, x @ w.T)
