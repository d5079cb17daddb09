"""The GPU optimizer (shaders/adamw.wgsl through pyapp.train.gpu_optim.GpuAdamW) against its spec,
pyapp.train.optim (clip_grad_norm + AdamW.step, itself checked against torch in tests/test_optim.py), on
tensors of odd sizes placed in one flat buffer by flat_layout.

Tolerances (float32 kernels against the spec's double arithmetic with float32 storage; "seen" is the
worst over these tests on lavapipe): the gradient norm 5e-7 relative (f32 per-thread sums and trees
against math.fsum; seen 5.0e-8 over 3 million values) and the clip factor 5e-7 (seen 1.3e-7); m 1e-6
relative to the moment of |g| (its terms cancel where m is near 0; seen 3.0e-7); v 2e-6 relative (it is
quadratic in the clipped g, whose factor carries the norm's error; seen 6.8e-7); parameters 1e-6 relative
to max(|p|, 1) (seen 2.5e-7, 1-2 float32 ulps).
"""

from __future__ import annotations

import math
from array import array

import numpy as np
import pytest

from pyapp.gpu import GPUError
from pyapp.gpu import kernels as K
from pyapp.train.gpu_optim import FLAT_ALIGN, GpuAdamW, flat_layout, flatten, unflatten
from pyapp.train.optim import AdamW, WarmupCosine, clip_grad_norm, global_norm

pytestmark = pytest.mark.gpu

SIZES = [37, 1, 129, 64, 300, 5]                  # odd sizes: padding after all but the 64
GRAD_SCALES = [0.05, 1.0, 0.1, 2.0, 0.02]         # norms ~1.1, 22, 2.2, 45, 0.45 over the 536 values


def f32_array(a) -> array:
    return array("f", np.ascontiguousarray(a, np.float32).tobytes())


def read_flat(dev, buf, n) -> np.ndarray:
    return np.frombuffer(dev.read(buf, 0, 4 * n), np.float32).copy()


def padding_mask(sizes) -> np.ndarray:
    offsets, total = flat_layout(sizes)
    pad = np.ones(total, bool)
    for off, n in zip(offsets, sizes):
        pad[off:off + n] = False
    return pad


class Run:
    """One optimizer run on the GPU beside the spec on the same per-tensor arrays."""

    def __init__(self, dev, sizes, seed, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, zero_grads=False):
        self.dev, self.sizes, self.rng = dev, sizes, np.random.default_rng(seed)
        self.params = {f"t{i}": f32_array(self.rng.standard_normal(n)) for i, n in enumerate(sizes)}
        self.spec = AdamW(self.params, betas=betas, eps=eps, weight_decay=weight_decay)
        self.offsets, self.total = flat_layout(sizes)
        self.pb = dev.buffer(4 * self.total, label="params")
        self.gb = dev.buffer(4 * self.total, label="grads")
        dev.write(self.pb, flatten(list(self.params.values())))
        self.opt = GpuAdamW(dev, self.total, betas=betas, eps=eps, weight_decay=weight_decay)
        self.plan = self.opt.record(dev.plan(), self.pb, self.gb, zero_grads=zero_grads)
        self.m_scale = np.zeros(self.total)

    def grads(self, scale):
        return {name: f32_array(scale * self.rng.standard_normal(len(p))) for name, p in self.params.items()}

    def step(self, step, grads, lr, max_norm):
        """The update on the GPU, then in the spec; the spec's norm."""
        self.dev.write(self.gb, flatten(list(grads.values())))
        self.opt.prepare(step, lr, max_norm)
        self.dev.submit(self.plan)
        norm = clip_grad_norm(grads, max_norm) if max_norm else global_norm(grads)
        # the scale of m's rounding: the moment of |g| (m's terms cancel where m is near 0)
        b1 = self.spec.b1
        self.m_scale = b1 * self.m_scale + (1 - b1) * np.abs(self.want(grads))
        self.spec.step(grads, lr)
        return norm

    def gpu(self, buf) -> np.ndarray:
        return read_flat(self.dev, buf, self.total)

    def want(self, tensors) -> np.ndarray:
        return np.frombuffer(flatten(list(tensors.values())), np.float32)


def within(errs, p_err) -> bool:
    """The tolerances of the module docstring: (norm, factor, m, v) errors and the parameters'."""
    return errs[0] < 5e-7 and errs[1] < 5e-7 and errs[2] < 1e-6 and errs[3] < 2e-6 and p_err < 1e-6


def rel(got, want, scale=None):
    scale = np.abs(want) if scale is None else scale
    return float(np.max(np.abs(got.astype(np.float64) - want) / np.maximum(scale, 1e-30)))


@pytest.mark.parametrize("max_norm,weight_decay,betas,eps", [
    (3.0, 0.1, (0.9, 0.95), 1e-6),       # clips on the updates with the large gradients, not the others
    (None, 0.0, (0.9, 0.999), 1e-8),     # no clipping (factor 1), no decay
    (1e4, 0.01, (0.9, 0.999), 1e-8)])    # a max_norm never reached: factor 1
def test_updates_match_the_spec(dev, max_norm, weight_decay, betas, eps):
    """Five updates under a warmup + cosine schedule (the first with lr 0): parameters, moments and the
    norm readback as optim's clip_grad_norm + AdamW.step on the same per-tensor arrays; padding stays 0."""
    run = Run(dev, SIZES, 11, betas=betas, eps=eps, weight_decay=weight_decay)
    sched = WarmupCosine(0.05, 2, 5)
    pad = padding_mask(SIZES)
    clipped = 0
    for step, scale in enumerate(GRAD_SCALES):
        norm = run.step(step, run.grads(scale), sched.lr(step), max_norm)
        got_norm, factor = run.opt.read_norm()
        want_factor = min(1.0, max_norm / (norm + 1e-6)) if max_norm else 1.0
        clipped += want_factor < 1
        p, m, v = run.gpu(run.pb), run.gpu(run.opt.m), run.gpu(run.opt.v)
        errs = (abs(got_norm / norm - 1), abs(factor / want_factor - 1),
                rel(m[~pad], run.want(run.spec.m)[~pad], run.m_scale[~pad]),
                rel(v[~pad], run.want(run.spec.v)[~pad]))
        want_p = run.want(run.params)
        p_err = rel(p[~pad], want_p[~pad], np.maximum(np.abs(want_p[~pad]), 1.0))
        assert within(errs, p_err), (step, errs, p_err)
        assert not p[pad].any() and not m[pad].any() and not v[pad].any()
    assert run.opt.t == run.spec.t == 5
    assert clipped == (2 if max_norm == 3.0 else 0)


def test_large_buffer_many_partials(dev):
    """3 million values over 733 sumsq workgroups: the norm as optim.global_norm (math.fsum), one clipped,
    decayed update as the spec's."""
    sizes = [1_000_003, 2_000_001, 17]
    assert K.adamw_partials(flat_layout(sizes)[1]) == 733
    run = Run(dev, sizes, 5, weight_decay=0.01)
    norm = run.step(0, run.grads(1e-3), 2e-4, 1.0)            # norm ~1.7: clipped
    got_norm, factor = run.opt.read_norm()
    pad = padding_mask(sizes)
    p, m, v = run.gpu(run.pb), run.gpu(run.opt.m), run.gpu(run.opt.v)
    errs = (abs(got_norm / norm - 1), abs(factor * (norm + 1e-6) - 1), rel(m[~pad], run.want(run.spec.m)[~pad]),
            rel(v[~pad], run.want(run.spec.v)[~pad]))
    want_p = run.want(run.params)
    p_err = rel(p[~pad], want_p[~pad], np.maximum(np.abs(want_p[~pad]), 1.0))
    assert 1.5 < norm < 2.0
    assert within(errs, p_err), (errs, p_err)
    assert not p[pad].any() and not m[pad].any() and not v[pad].any()


def test_split_dispatches_give_the_same_bits(dev, monkeypatch):
    """Dispatches split over y (as above 65535 workgroups) give exactly the unsplit result: forced here by
    a 3-workgroup limit on 5 sumsq workgroups and 79 update workgroups."""
    sizes = [19_999]
    results = []
    for limit in (K.MAX_GROUPS, 3):
        monkeypatch.setattr(K.shared, "MAX_GROUPS", limit)   # the grid groups() reads
        run = Run(dev, sizes, 3, weight_decay=0.1)
        assert K.adamw_partials(run.total) == 5
        for step in range(2):
            run.step(step, run.grads(0.1), 1e-2, 1.0)
        ops = [op[3:5] for op in run.plan.ops]
        results.append((ops, run.opt.read_norm(), run.gpu(run.pb), run.gpu(run.opt.m), run.gpu(run.opt.v)))
    (ops1, *r1), (ops2, *r2) = results
    assert ops1 == [(5, 1), (1, 1), (79, 1)] and ops2 == [(3, 2), (1, 1), (3, 27)]
    assert r1[0] == r2[0]
    for a, b in zip(r1[1:], r2[1:]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_non_finite_gradients_skip_the_update(dev, bad):
    """An inf or NaN gradient: the norm readback shows it, the factor is 0, parameters and moments stay
    exactly as they were; the next finite update proceeds."""
    run = Run(dev, SIZES, 8, weight_decay=0.1)
    run.step(0, run.grads(0.5), 1e-2, 1.0)
    before = [run.gpu(b) for b in (run.pb, run.opt.m, run.opt.v)]
    grads = run.grads(0.5)
    grads["t2"][7] = bad
    run.dev.write(run.gb, flatten(list(grads.values())))
    run.opt.prepare(1, 1e-2, 1.0)
    run.dev.submit(run.plan)
    norm, factor = run.opt.read_norm()
    assert (math.isinf(norm) if bad == math.inf else math.isnan(norm)) and factor == 0.0
    for b, old in zip((run.pb, run.opt.m, run.opt.v), before):
        assert np.array_equal(run.gpu(b), old)
    run.step(1, run.grads(0.5), 1e-2, 1.0)          # the spec never saw the bad gradients
    norm, factor = run.opt.read_norm()
    assert math.isfinite(norm) and 0 < factor <= 1
    assert rel(run.gpu(run.opt.v), run.want(run.spec.v), np.abs(run.want(run.spec.v)) + 1e-30) < 2e-6


def test_zero_grads_clears_the_gradients(dev):
    """zero_grads: the update reads the gradients, then clears them for the next accumulation."""
    run = Run(dev, SIZES, 9, weight_decay=0.01, zero_grads=True)
    for step in range(2):
        norm = run.step(step, run.grads(1.0), 1e-2, 5.0)
        assert not run.gpu(run.gb).any()
        assert abs(run.opt.read_norm()[0] / norm - 1) < 5e-7
    pad = padding_mask(SIZES)
    want_p = run.want(run.params)
    assert rel(run.gpu(run.pb)[~pad], want_p[~pad], np.maximum(np.abs(want_p[~pad]), 1.0)) < 1e-6


def test_grad_scale_divides_summed_gradients(dev):
    """grad_scale 1/4 on gradients summed over 4 micro-batches: the norm, the clipping and the update are
    those of the mean gradients (scaled in float32 here, exactly: a power of two)."""
    run = Run(dev, SIZES, 12, weight_decay=0.1)
    for step in range(3):
        grads = run.grads(0.5)
        summed = flatten([array("f", [4.0 * x for x in g]) for g in grads.values()])
        run.dev.write(run.gb, summed)
        run.opt.prepare(step, 1e-2, 1.0, grad_scale=0.25)
        run.dev.submit(run.plan)
        norm = clip_grad_norm(grads, 1.0)                 # the spec sees the mean gradients
        run.spec.step(grads, 1e-2)
        got_norm, factor = run.opt.read_norm()
        assert 2.0 < norm and abs(got_norm / norm - 1) < 5e-7 and abs(factor * (norm + 1e-6) - 1) < 5e-7
    want_p, want_v = run.want(run.params), run.want(run.spec.v)
    pad = padding_mask(SIZES)
    assert rel(run.gpu(run.pb)[~pad], want_p[~pad], np.maximum(np.abs(want_p[~pad]), 1.0)) < 1e-6
    assert rel(run.gpu(run.opt.v)[~pad], want_v[~pad]) < 2e-6


def test_state_round_trip_resumes_exactly(dev):
    """state_bytes after two updates, unflattened, are the spec's moments; a fresh optimizer that loads them
    continues bit for bit as the uninterrupted one."""
    run = Run(dev, SIZES, 4, weight_decay=0.05)
    for step in range(2):
        run.step(step, run.grads(0.3), 1e-2, 1.0)
    m, v, t = run.opt.state_bytes()
    assert t == 2 and len(m) == len(v) == 4 * run.total
    for got, want in zip(unflatten(m, SIZES), run.spec.m.values()):
        assert rel(np.array(got), np.array(want), np.abs(np.array(want)) + 1e-3) < 1e-6
    for got, want in zip(unflatten(v, SIZES), run.spec.v.values()):
        assert rel(np.array(got), np.array(want)) < 2e-6

    resumed = GpuAdamW(dev, run.total, weight_decay=0.05)
    pb2 = dev.buffer(4 * run.total)
    dev.write(pb2, dev.read(run.pb, 0, 4 * run.total))
    resumed.load_state(m, v, t)
    plan2 = resumed.record(dev.plan(), pb2, run.gb)
    grads = flatten(list(run.grads(0.3).values()))
    for opt, plan in ((run.opt, run.plan), (resumed, plan2)):
        dev.write(run.gb, grads)
        opt.prepare(t, 5e-3, 1.0)
        dev.submit(plan)
    assert np.array_equal(run.gpu(run.pb), read_flat(dev, pb2, run.total))
    assert np.array_equal(run.gpu(run.opt.v), read_flat(dev, resumed.v, run.total))
    with pytest.raises(ValueError, match="checkpoint m has 8 bytes"):
        resumed.load_state(bytes(8), v, t)


def test_flat_layout_and_packing(dev):
    assert FLAT_ALIGN == 64
    assert flat_layout([37, 1, 64, 65, 300]) == ([0, 64, 128, 192, 320], 640)
    assert flat_layout([64]) == ([0], 64) and flat_layout([]) == ([], 0)
    with pytest.raises(ValueError, match="tensor 1 of the flat layout has 0 values"):
        flat_layout([3, 0])
    data = flatten([[1.5, 2.0], array("f", [3.0])])
    assert np.array_equal(np.frombuffer(data, np.float32), [1.5, 2.0] + [0.0] * 62 + [3.0] + [0.0] * 63)
    assert [list(a) for a in unflatten(data, [2, 1])] == [[1.5, 2.0], [3.0]]
    with pytest.raises(ValueError, match="shorter than the layout"):
        unflatten(data[:-4], [2, 1])

    # OptParams: update 3 at lr 0.01, betas (0.9, 0.99), eps 1e-7, decay 0.1; the complements in double
    got = np.frombuffer(K.pack_opt_params(3, 0.01, 2.0, (0.9, 0.99), 1e-7, 0.1), np.float32)
    want = [0.01 / (1 - 0.9 ** 3), math.sqrt(1 - 0.99 ** 3), 1 - 0.01 * 0.1, 2.0, 0.9, 0.1, 0.99, 0.01, 1e-7, 1, 0, 0]
    assert np.array_equal(got, np.float32(want)) and K.OPT_PARAMS_BYTES == 48
    assert "struct OptParams {\n    step_size: f32," in K._OPT_PRELUDE
    assert np.frombuffer(K.pack_opt_params(1, 0.01, None), np.float32)[3] == 0.0     # no clipping
    with pytest.raises(ValueError, match="starts at 1"):
        K.pack_opt_params(0, 0.01, 1.0)
    with pytest.raises(ValueError, match="grad_scale must be positive"):
        K.pack_opt_params(1, 0.01, 1.0, grad_scale=0.0)
    assert [K.adamw_partials(n) for n in (1, 4096, 4097, 10 ** 9)] == [1, 1, 2, 1024]

    opt = GpuAdamW(dev, 100)
    with pytest.raises(ValueError, match="the gradient buffer holds 64 floats, the optimizer 100"):
        opt.record(dev.plan(), dev.buffer(400), dev.buffer(256))
    too_many = dev.limits["max_storage_buffer_binding_size"] // 4 + 1
    with pytest.raises(GPUError, match="exceed the device's maxStorageBufferBindingSize"):
        GpuAdamW(dev, too_many)
