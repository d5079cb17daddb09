"""Per-layer output scales that differ from layer to layer (issue 25, "fixtures must not hide bugs").

tools/make_fixtures.py leaves every Gemma 4 fixture's layer scale at its init, 1.0 (its `layer_scalar` branch
walks named_parameters, and transformers keeps layer_scalar as a buffer), and the toy models of
tools/make_bench_model.py give every layer 0.5: neither can tell one layer's scale from another's, nor 1.0
from a skipped multiply. Here the committed f32 fixtures get a different random scale in each layer (patched
into a copy of the file) and the GPU must follow the numpy reference on them, one token at a time (the decode
plans, whose residual adds fuse the scale into the next matvec's input) and in prefill chunks."""

from __future__ import annotations

import numpy as np
import pytest

from support.paths import ROOT
from pyapp.gguf import read_gguf

pytestmark = pytest.mark.gpu

FIXTURES = ROOT / "tests" / "fixtures"
TOKENS = [2, 17, 500, 33, 99, 4, 5, 6, 7, 8, 9, 10, 11, 300, 301, 302, 12, 13, 14, 15]
ATOL = 2e-3          # the fixtures' golden bound (tests/test_engine.py): f32, summation order only


def scaled_copy(src, dst, seed: int) -> list[float]:
    """dst = src with blk.N.layer_output_scale.weight (F32 [1]) set to a random value in [0.5, 1.5) per layer."""
    g = read_gguf(src)
    data = bytearray(src.read_bytes())
    rng = np.random.default_rng(seed)
    names = sorted((n for n in g.tensors if n.endswith(".layer_output_scale.weight")),
                   key=lambda n: int(n.split(".")[1]))
    scales = rng.uniform(0.5, 1.5, len(names)).astype(np.float32)
    for name, value in zip(names, scales):
        t = g.tensors[name]
        assert t.type_name == "F32" and t.nbytes == 4 and np.frombuffer(data, np.float32, 1, t.offset)[0] == 1.0
        data[t.offset:t.offset + 4] = value.tobytes()
    dst.write_bytes(bytes(data))
    return scales.tolist()


@pytest.mark.parametrize("stem", ["gemma4-dense-f32", "gemma4-moe-f32"])
def test_gpu_follows_per_layer_scales(dev, tmp_path, stem):
    from pyapp.engine import Engine
    from pyapp.reference.forward import ReferenceModel
    path = tmp_path / f"{stem}-scaled.gguf"
    scales = scaled_copy(FIXTURES / f"{stem}.gguf", path, seed=25)
    assert len(set(scales)) == len(scales) == 4
    g = read_gguf(path)
    want = np.asarray(ReferenceModel(g).forward(TOKENS))
    unscaled = np.asarray(ReferenceModel(read_gguf(FIXTURES / f"{stem}.gguf")).forward(TOKENS))
    assert np.abs(want - unscaled).max() > 0.5                        # the scales matter
    for chunk in (1, 7):                                              # decode plans, prefill chunks
        eng = Engine.open(g, device=dev, context_length=64, chunk=chunk, int8=False)
        got = np.asarray(eng.forward(TOKENS))
        assert np.abs(got - want).max() <= ATOL, f"chunk {chunk}: {np.abs(got - want).max():.2e}"
        np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
