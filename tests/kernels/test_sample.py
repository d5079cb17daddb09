"""Parity of the sampling kernels (pyapp.gpu.kernels' argmax and sample: shaders/sample.wgsl) against numpy and
pyapp.reference.sampling."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp.gpu import kernels as K

from support.gpu import f32

pytestmark = pytest.mark.gpu


def test_argmax(dev):
    rng = np.random.default_rng(9)
    v = 262_147
    logits = rng.standard_normal(v).astype(np.float32)
    logits[[1000, 200_000]] = 9.0                          # tie: lowest index wins
    logits[5] = np.nan
    out = dev.buffer(16)
    dev.submit(K.argmax(dev, v, f32(dev, logits), out))
    assert np.frombuffer(dev.read(out, 0, 4), np.uint32)[0] == 1000


SAMPLE_CASES = [  # (temperature, top_k, top_p, min_p, repeat_penalty)
    (0.0, 40, 0.9, 0.0, 1.0), (0.0, 40, 0.9, 0.0, 1.3), (1.0, 40, 0.95, 0.0, 1.0), (0.7, 5, 1.0, 0.0, 1.1),
    (1.3, 0, 0.5, 0.05, 1.0), (1.0, 300, 1.0, 0.0, 1.0), (0.8, 64, 0.95, 0.1, 1.2), (1.0, 40, 0.0, 0.0, 1.0),
    (1.0, 1, 0.9, 0.0, 1.2),       # top_k 1: the greedy scan (as temperature 0), no radix rounds
]


@pytest.mark.parametrize("v", [3001, 20011], ids=["one-stage", "two-stage"])
@pytest.mark.parametrize("case", SAMPLE_CASES, ids=lambda c: "t{}-k{}-p{}-m{}-r{}".format(*c))
def test_sample_matches_reference(dev, case, v):
    from pyapp.reference.sampling import sample as ref_sample
    temperature, top_k, top_p, min_p, rp = case
    rng = np.random.default_rng(hash(case) % 2**32)
    for trial in range(6):
        logits = (rng.standard_normal(v) * 3).astype(np.float32)
        recent = [int(i) for i in np.argsort(-logits)[:3]] + [int(i) for i in rng.integers(0, v, 10)]
        recent += recent[:2]                                          # duplicates count once
        u = float(rng.uniform())
        want = ref_sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repeat_penalty=rp, recent=recent, u=u)
        lb, out = f32(dev, logits), dev.buffer(16)
        params = dev.buffer(K.SAMPLE_PARAMS_BYTES)
        dev.write(params, K.pack_sample_params(temperature, top_k, top_p, min_p, rp, recent, u))
        scratch = dev.buffer(max(16, K.sample_scratch_bytes(v)))
        dev.submit(K.sample(dev, v, lb, out, params, scratch))
        got = int(np.frombuffer(dev.read(out, 0, 4), np.uint32)[0])
        assert got == want, f"trial {trial}: gpu {got} vs reference {want}"


def test_sample_follows_the_distribution(dev):
    """Many draws with spread-out u land on each candidate in proportion to its probability."""
    logits = np.full(1000, -20.0, np.float32)
    logits[[7, 500, 999]] = [2.0, 1.0, 0.0]
    p = np.exp([2.0, 1.0, 0.0]) / np.exp([2.0, 1.0, 0.0]).sum()
    counts = {7: 0, 500: 0, 999: 0}
    lb, out, params = f32(dev, logits), dev.buffer(16), dev.buffer(K.SAMPLE_PARAMS_BYTES)
    n = 60
    for i in range(n):
        dev.write(params, K.pack_sample_params(1.0, 3, 1.0, 0.0, 1.0, [], (i + 0.5) / n))
        dev.submit(K.sample(dev, 1000, lb, out, params))
        counts[int(np.frombuffer(dev.read(out, 0, 4), np.uint32)[0])] += 1
    assert abs(counts[7] / n - p[0]) < 0.03 and abs(counts[999] / n - p[2]) < 0.03
