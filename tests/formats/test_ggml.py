"""pyapp.ggml: the one table of ggml types, against gguf-py's (independent) copy."""

import pytest

from pyapp import ggml


def test_table_matches_gguf_py():
    gguf = pytest.importorskip("gguf")
    for t in ggml.TYPES.values():
        if t.id == ggml.Q8_1:    # older gguf-py releases give it f32 scales (40 bytes); ggml's are f16
            continue
        qt = gguf.GGMLQuantizationType[t.name]
        assert qt.value == t.id
        assert gguf.GGML_QUANT_SIZES[qt] == (t.block, t.block_bytes), t.name


def test_named_ids_and_lookup():
    for name in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "MXFP4"):
        assert ggml.TYPES[getattr(ggml, name)].name == name
    q4k = ggml.lookup("q4_k")
    assert q4k is ggml.lookup("Q4_K") is ggml.lookup(12) is ggml.lookup(q4k)
    assert (q4k.block, q4k.block_bytes) == (256, 144)
    assert ggml.name(ggml.BF16) == "BF16"
    with pytest.raises(ValueError, match="unknown ggml type 99"):
        ggml.lookup(99)
    with pytest.raises(ValueError, match="Q9_9"):
        ggml.lookup("Q9_9")


def test_row_bytes():
    assert ggml.row_bytes(ggml.Q4_K, 2048) == 8 * 144
    assert ggml.row_bytes("f16", 3) == 6
    with pytest.raises(ValueError, match="not a multiple of the Q8_0 block"):
        ggml.row_bytes(ggml.Q8_0, 48)
