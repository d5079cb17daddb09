"""Golden test: the numpy reference forward against transformers' outputs.

For every fixture GGUF (tools/make_fixtures.py) the committed golden file holds
token sequences and the logits transformers computed for them (for quantized
files: transformers run on the GGUF's own dequantized weights, so the only
differences left are float32 rounding and op order).
"""


import numpy as np
import pytest

from support.paths import FIXTURES

MODELS = sorted(p for p in FIXTURES.glob("*.gguf") if p.with_suffix(".golden.npz").exists())

# float32 through a handful of layers: differences come from summation order only.
ATOL = 1e-3


def sequences(golden):
    i = 0
    while f"tokens_{i}" in golden:
        yield i, golden[f"tokens_{i}"].astype(np.int64), golden[f"logits_{i}"]
        i += 1


@pytest.fixture(scope="module", params=MODELS, ids=lambda p: p.stem)
def model_and_golden(request):
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    path = request.param
    return ReferenceModel(read_gguf(path)), np.load(path.with_suffix(".golden.npz"))


def test_fixtures_present():
    assert len(MODELS) >= 2, f"expected committed fixture models with golden outputs in {FIXTURES}"


def test_logits_match_transformers(model_and_golden):
    model, golden = model_and_golden
    n = 0
    for i, tokens, want in sequences(golden):
        got = np.asarray(model.forward(tokens))
        assert got.shape == want.shape
        diff = np.abs(got - want).max()
        assert diff < ATOL, f"sequence {i}: max |ref - transformers| = {diff:.2e}"
        assert (got.argmax(-1) == want.argmax(-1)).all(), f"sequence {i}: argmax differs"
        n += 1
    assert n >= 2


def test_incremental_decode_matches_full_pass(model_and_golden):
    from pyapp.reference.forward import KVCache
    model, golden = model_and_golden
    tokens = max((t for _, t, _ in sequences(golden)), key=len)
    full = np.asarray(model.forward(tokens))
    cache = KVCache()
    split = len(tokens) // 3
    parts = [np.asarray(model.forward(tokens[:split], cache))] + \
        [np.asarray(model.forward(tokens[j:j + 1], cache)) for j in range(split, len(tokens))]
    np.testing.assert_allclose(np.concatenate(parts), full, atol=1e-4, rtol=0)


def test_greedy_generation_matches_transformers(model_and_golden):
    model, golden = model_and_golden
    checked = 0
    for i, tokens, _ in sequences(golden):
        key = f"generate_{i}"
        if key in golden:
            want = golden[key].astype(np.int64).tolist()
            assert model.generate_greedy(tokens, len(want)) == want
            checked += 1
    assert checked >= 1
