"""pyapp.reference.quants against gguf-py's own (independent) dequantization."""

import numpy as np
import pytest

from pyapp import ggml
from pyapp.reference.quants import QUANTIZABLE, SUPPORTED, dequantize, quantize

gguf = pytest.importorskip("gguf")

BLOCK_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4"]


def random_blocks(name: str, n_blocks: int, rng) -> bytes:
    """Random bytes with every f16 scale replaced by a sane value (no inf/nan)."""
    raw = rng.integers(0, 256, size=(n_blocks, ggml.lookup(name).block_bytes), dtype=np.uint8)
    f16_at = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}.get(name, [])
    for at in f16_at:
        raw[:, at:at + 2] = rng.uniform(-0.1, 0.1, n_blocks).astype(np.float16).reshape(-1, 1).view(np.uint8)
    if name == "MXFP4":
        raw[:, 0] = rng.integers(110, 140, n_blocks)
    return raw.tobytes()


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_dequantize_matches_gguf_py(name):
    rng = np.random.default_rng(ggml.lookup(name).id)
    qk = ggml.lookup(name).block
    raw = random_blocks(name, 37, rng)
    qt = gguf.GGMLQuantizationType[name]
    want = gguf.quants.dequantize(np.frombuffer(raw, np.uint8).reshape(1, -1), qt).reshape(-1)
    got = dequantize(raw, name, (37 * qk,))
    assert got.shape == want.shape == (37 * qk,)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert np.abs(got).max() > 0


@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
def test_float_types(name):
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    raw = quantize(x, name)
    want = gguf.quants.dequantize(np.frombuffer(raw, np.uint8).reshape(3, -1), gguf.GGMLQuantizationType[name])
    np.testing.assert_array_equal(dequantize(raw, name, (3, 64)), want)
    tol = {"F32": 0, "F16": 1e-3, "BF16": 1e-2}[name]
    np.testing.assert_allclose(dequantize(raw, name, (3, 64)), x, atol=tol * 4, rtol=tol)


# Worst-case round-to-nearest error, relative to the largest |x| of a row of N(0,1) values.
REL_ERR = {"Q8_0": 0.01, "Q4_0": 0.1, "Q4_1": 0.07, "Q5_0": 0.05, "Q5_1": 0.035,
           "Q4_K": 0.1, "Q5_K": 0.05, "Q6_K": 0.025}


@pytest.mark.parametrize("name", [q for q in QUANTIZABLE if q in REL_ERR])
def test_quantize_round_trip(name):
    x = np.random.default_rng(2).standard_normal((4, 512)).astype(np.float32)
    raw = quantize(x, name)
    assert len(raw) == ggml.row_bytes(name, x.size)
    got = dequantize(raw, name, x.shape)
    err = np.abs(got - x).max() / np.abs(x).max()
    assert err < REL_ERR[name], f"{name}: max error {err:.4f} of max |x|"
    # gguf-py reads our bytes the same way
    want = gguf.quants.dequantize(np.frombuffer(raw, np.uint8).reshape(4, -1), gguf.GGMLQuantizationType[name])
    np.testing.assert_array_equal(got, want)


def test_q8_0_quantize_matches_gguf_py():
    x = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32)
    want = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0).tobytes()
    assert quantize(x, "Q8_0") == want


def test_unsupported_type_is_a_clear_error():
    with pytest.raises(ValueError, match="IQ2_XXS"):
        dequantize(b"\0" * 66, "IQ2_XXS", (256,))
    assert "Q6_K" in SUPPORTED and "MXFP4" in SUPPORTED
