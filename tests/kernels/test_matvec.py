"""Parity of the one-token matvec kernels (pyapp.gpu.kernels' matvec: shaders/matvec*.wgsl, quants_dot*.wgsl)
against numpy on odd sizes: every quant type in the 4-weight-group loop and the 32-weight units, the Q4_K
16-byte-chunk kernel, x rounded to int8, row splits, the GeGLU and gelu-times epilogues, and the inputs built in
the same dispatch (a pending residual add, a normed router input, a MoE route in one more workgroup)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyapp import ggml
from pyapp.gpu import kernels as K
from pyapp.reference.forward import gelu_tanh, rms_norm

from support.gpu import (QTYPES, assert_close_dot, dequantize, f32, int8_reference, random_tensor, read_f32,
                         route_reference, step_buffer, weight_buffer)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
@pytest.mark.parametrize("long", [False, True], ids=["groups", "units"])
def test_matvec(dev, qtype, subgroups, long):
    """The 4-weight-group loop, and on long rows (>= 128 units of 32) the dot32 units (forced: the
    engine picks them only for the types where they are faster)."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(ggml.lookup(qtype).id)
    qk = ggml.lookup(qtype).block
    rows = 37
    if long:
        k = qk * (17 if qk == 256 else 131) if qk > 1 else 4 * 1096
    else:
        k = qk * (3 if qk == 256 else 13) if qk > 1 else 4 * 97      # never a multiple of the workgroup
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal(k)
    y = dev.buffer(4 * rows)
    plan = K.matvec(dev, qtype, k, rows, weight_buffer(dev, raw), f32(dev, x), y, subgroups=subgroups,
                    units=long and k % 32 == 0, chunks=False)
    dev.submit(plan)
    assert_close_dot(read_f32(dev, y, rows), w, x, w @ x)


@pytest.mark.parametrize("blocks,tpr,wg", [(3, None, None), (17, 32, 64), (1, 4, 64), (6, 64, 128), (11, 8, 256),
                                           (50, 32, 64)])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_q4k_chunks(dev, blocks, tpr, wg, subgroups):
    """The Q4_K 16-byte-chunk matvec: rows of 1-50 blocks (50: longer than E2B's 12288-long down rows),
    row splits narrower and wider than a subgroup (its butterfly falls back to the tree below the
    subgroup width), all three epilogues."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(blocks)
    n, k = 37, 256 * blocks
    raw = random_tensor("q4_k", 2 * n, k, rng)
    w = dequantize("q4_k", raw, 2 * n, k)
    x, b = rng.standard_normal(k), rng.standard_normal(n)
    wb, xb = weight_buffer(dev, raw), f32(dev, x)
    y = dev.buffer(4 * 2 * n)
    opts = dict(subgroups=subgroups, tpr=tpr, wg=wg, chunks=True)
    dev.submit(K.matvec(dev, "q4_k", k, 2 * n, wb, xb, y, **opts))
    assert_close_dot(read_f32(dev, y, 2 * n), w, x, w @ x)
    gate, up = w[:n] @ x, w[n:] @ x
    dev.submit(K.matvec(dev, "q4_k", k, n, wb, xb, y, geglu=True, **opts))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * up, rtol=1e-4, atol=1e-4 * np.abs(up).max())
    dev.submit(K.matvec(dev, "q4_k", k, n, wb, xb, y, gelu_times=f32(dev, b), **opts))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


@pytest.mark.parametrize("blocks,tpr,wg", [(3, None, None), (17, 32, 64), (1, 4, 64), (6, 64, 128), (11, 8, 256)])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_q4k_int8(dev, blocks, tpr, wg, subgroups):
    """The Q4_K chunk matvec on x rounded to int8 per 32 in workgroup memory (matvec_q4k_x8.wgsl): the
    reference's integer sums on the same codes (float rounding only), and within int8's rounding of the
    f32 product; an all-zero block of x and one of a single outlier included; all three epilogues."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(100 + blocks)
    n, k = 37, 256 * blocks
    raw = random_tensor("q4_k", 2 * n, k, rng)
    w = dequantize("q4_k", raw, 2 * n, k)
    x, b = rng.standard_normal(k).astype(np.float32), rng.standard_normal(n)
    x[32:64] = 0.0
    x[64:96] = 0.0
    x[70] = -40.0
    wb, xb = weight_buffer(dev, raw), f32(dev, x)
    y = dev.buffer(4 * 2 * n)
    opts = dict(subgroups=subgroups, tpr=tpr, wg=wg, chunks=True, int8=True)
    dev.submit(K.matvec(dev, "q4_k", k, 2 * n, wb, xb, y, **opts))
    got, want = read_f32(dev, y, 2 * n), int8_reference(raw, 2 * n, x)
    assert_close_dot(got, w, x, want)
    assert_close_dot(got, w, x, w @ x, tol=1e-2)
    assert np.abs(got - w @ x).max() > 1e-4 * np.abs(w @ x).max()     # int8 rounding shows: not the f32 path
    gate, up = want[:n], want[n:]
    dev.submit(K.matvec(dev, "q4_k", k, n, wb, xb, y, geglu=True, **opts))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * up, rtol=1e-4, atol=1e-4 * np.abs(up).max())
    dev.submit(K.matvec(dev, "q4_k", k, n, wb, xb, y, gelu_times=f32(dev, b), **opts))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


@pytest.mark.parametrize("qtype,blocks,tpr", [("q6_k", 1, None), ("q6_k", 3, 8), ("q6_k", 11, None), ("q6_k", 11, 64),
                                               ("q4_0", 1, None), ("q4_0", 7, 16), ("q5_0", 3, None), ("q5_0", 11, 64),
                                               ("q8_0", 1, 4), ("q8_0", 7, None)])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_int8_units(dev, qtype, blocks, tpr, subgroups):
    """The 32-weight units on x rounded to int8 (quants_dot_x8.wgsl: Q6_K, and Q4_0 / Q5_0 / Q8_0 a block a
    unit): W dequantized times x as rounded to int8 (float rounding only: these types have no min term),
    within int8's rounding of the f32 product; GeGLU; and with the input built from a pending residual
    add (K.ResidualInput). Rows of 256 x blocks weights (odd counts of 32-weight blocks: 8 x blocks)."""
    from pyapp.reference.quants import quantize_activations_q8
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(300 + blocks)
    n, k = 37, 256 * blocks
    if qtype != "q6_k":
        k -= 32 * (blocks % 2)                  # an odd number of blocks of 32
    raw = random_tensor(qtype, 2 * n, k, rng)
    w = dequantize(qtype, raw, 2 * n, k)

    def rounded(v):
        q, d, _ = quantize_activations_q8(np.asarray(v, np.float32)[None])
        return (q.reshape(-1, 32).astype(np.float64) * d.reshape(-1, 1)).reshape(-1)
    x = rng.standard_normal(k).astype(np.float32)
    x[:32] = 0.0
    y = dev.buffer(4 * 2 * n)
    opts = dict(subgroups=subgroups, tpr=tpr, int8=True)
    dev.submit(K.matvec(dev, qtype, k, 2 * n, weight_buffer(dev, raw), f32(dev, x), y, **opts))
    got = read_f32(dev, y, 2 * n)
    assert_close_dot(got, w, x, w @ rounded(x))
    assert_close_dot(got, w, x, w @ x, tol=1e-2)
    assert np.abs(got - w @ x).max() > 1e-4 * np.abs(w @ x).max()
    want = w @ rounded(x)
    dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), f32(dev, x), y, geglu=True, **opts))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(want[:n]) * want[n:], rtol=1e-4,
                               atol=1e-4 * np.abs(want[n:]).max())
    if k <= 24 * 256:
        ysub, resid, pw = (rng.standard_normal(k).astype(np.float32) for _ in range(3))
        r = resid + rms_norm(ysub[None], pw, 1e-6)[0]
        res = K.ResidualInput(f32(dev, ysub), f32(dev, resid), dev.buffer(4 * k), f32(dev, pw))
        dev.submit(K.matvec(dev, qtype, k, 2 * n, weight_buffer(dev, raw), None, y, residual=res, **opts))
        assert_close_dot(read_f32(dev, y, 2 * n), w, r, w @ rounded(r), tol=1e-4)


def test_int8_matvec_where_it_exists(dev, monkeypatch):
    """int8 x exists for the Q4_K chunk kernels and the expert matvec of 32-weight blocks (with or without
    GeGLU): asking it of another kernel fails loudly, and K.int8_matvec says so beforehand."""
    raw = random_tensor("q5_k", 4, 256, np.random.default_rng(0))
    with pytest.raises(ValueError, match="int8"):
        K.matvec(dev, "q5_k", 256, 4, weight_buffer(dev, raw), f32(dev, np.ones(256)), dev.buffer(16), int8=True)
    assert not K.int8_matvec(dev, "q5_k") and not K.int8_matvec(dev, "f16")
    raw = random_tensor("q5_k", 8, 256, np.random.default_rng(0))
    with pytest.raises(ValueError, match="int8"):
        K.moe_experts(dev, "q5_k", 256, 2, 2, 1, weight_buffer(dev, raw), f32(dev, np.ones(256)), dev.buffer(16),
                      f32(dev, [0.0]), step_buffer(dev, 1), 1, geglu=True, chunks=False, int8=True)
    assert K.int8_matvec(dev, "q4_k") and not K.int8_matvec(dev, "q6_k")
    # the dense 32-weight blocks' units: where the backend's compiler runs them faster (the browser path)
    assert K.int8_matvec(dev, "q4_0") == dev.int8_block_units == (dev.backend == "browser")
    # Q8_0's and Q5_0's from 2048 rows (Q8_0's 1536-row o projection measured slower on them)
    assert K.int8_matvec(dev, "q8_0", rows=2048) == dev.int8_block_units and not K.int8_matvec(dev, "q8_0", rows=1536)
    assert K.int8_matvec(dev, "q5_0", rows=2816) == dev.int8_block_units and not K.int8_matvec(dev, "q5_0", rows=1536)
    assert K.int8_matvec(dev, "q6_k", rows=262144) and not K.int8_matvec(dev, "q6_k", experts=True, rows=262144)
    assert K.int8_matvec(dev, "q5_0", experts=True) and not K.int8_matvec(dev, "q5_k", experts=True)
    monkeypatch.setattr(dev, "int8_block_units", True)               # the browser path's rules, on any backend
    assert K.int8_matvec(dev, "q4_0", rows=256) and K.int8_matvec(dev, "q8_0", rows=2048)
    assert not K.int8_matvec(dev, "q8_0", rows=1536) and K.int8_matvec(dev, "q5_0", rows=2816)
    assert all(K.int8_rounded_matvec(dev, q) for q in ("q4_0", "q8_0")) and not K.int8_rounded_matvec(dev, "q5_0")


@pytest.mark.parametrize("tpr", [4, 32, 256])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_threads_per_row(dev, tpr, subgroups):
    """Row splits narrower and wider than a subgroup (the subgroup kernel falls back below its width)."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(11)
    rows, k = 70, 32 * 9
    raw = random_tensor("q5_0", rows, k, rng)
    w = dequantize("q5_0", raw, rows, k)
    x = rng.standard_normal(k)
    y = dev.buffer(4 * rows)
    dev.submit(K.matvec(dev, "q5_0", k, rows, weight_buffer(dev, raw), f32(dev, x), y, tpr=tpr, subgroups=subgroups))
    assert_close_dot(read_f32(dev, y, rows), w, x, w @ x)


def rounded_buffers(dev, k: int) -> K.RoundedX:
    codes, scales = K.q8_bytes(1, k)
    return K.RoundedX(dev.buffer(codes), dev.buffer(scales))


def read_rounded(dev, r: K.RoundedX, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes int8 [k], (d, sum) float32 [k / 32, 2]) of a RoundedX."""
    codes = np.frombuffer(dev.read(r.codes, 0, k), np.int8)
    return codes, np.frombuffer(dev.read(r.scales, 0, 8 * (k // 32)), np.float32).reshape(-1, 2)


@pytest.mark.parametrize("qtype,k,opts", [("q4_k", 512, dict(chunks=True)), ("q4_k", 768, dict(chunks=True, int8=True)),
                                          ("q4_k", 256, dict(chunks=True, tpr=32, wg=64)),
                                          ("q4_0", 352, dict(int8=True)), ("q8_0", 512, {}),
                                          ("q8_0", 448, dict(int8=True)), ("f16", 96, dict(tpr=64))])
@pytest.mark.parametrize("residual", [False, True], ids=["x", "residual-input"])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_round_out(dev, qtype, k, opts, residual, subgroups):
    """A GeGLU matvec that also writes its rows rounded to int8 (round_out: matvec_out_q8.wgsl): the same
    rows in Y as without, and codes and (d, sum) per 32 as quantize_q8's rule gives for those rows, with
    96 rows (a workgroup of 64 rows and one whose second block lies past the end) and 160 (whole
    workgroups); its threads a row capped so that a workgroup holds whole blocks (tpr 32 asked: 8)."""
    from pyapp.reference.quants import quantize_activations_q8
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(k + 7 * residual)
    for n in (96, 160):
        raw = random_tensor(qtype, 2 * n, k, rng)
        x = rng.standard_normal(k).astype(np.float32)
        res = None
        if residual:
            ysub, resid, pw = (rng.standard_normal(k).astype(np.float32) for _ in range(3))
            res = K.ResidualInput(f32(dev, ysub), f32(dev, resid), dev.buffer(4 * k), f32(dev, pw))
        xb = None if residual else f32(dev, x)
        plain, y, out = dev.buffer(4 * n), dev.buffer(4 * n), rounded_buffers(dev, n)
        common = dict(subgroups=subgroups, geglu=True, residual=res, **opts)
        dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), xb, plain, **common))
        dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), xb, y, round_out=out, **common))
        rows = read_f32(dev, y, n)
        # (the same sums, but in another order where the threads a row were capped)
        np.testing.assert_allclose(rows, read_f32(dev, plain, n), rtol=1e-5, atol=1e-5 * np.abs(rows).max())
        q, d, sums = quantize_activations_q8(rows[None])
        codes, ds = read_rounded(dev, out, n)
        np.testing.assert_allclose(ds[:, 0], d[0], rtol=1e-6)
        np.testing.assert_allclose(ds[:, 1], sums[0], rtol=1e-5, atol=1e-5 * np.abs(rows).max())
        assert np.abs(codes.astype(int) - q[0]).max() <= 1 and (codes == q[0]).mean() > 0.98   # ties may round apart
        assert np.abs(codes).max() == 127


def test_matvec_round_out_where_it_fits(dev, monkeypatch):
    """Rows rounded to int8 come in whole blocks of 32 (other row counts are refused beforehand), with storage
    buffers enough beside a residual input; the types that read them: Q4_K, Q6_K, Q4_0 and Q8_0 where the
    backend's int8 units are the faster (the browser's), none else."""
    assert K.can_round_output(dev, 64) and not K.can_round_output(dev, 48)
    assert K.rounds_output(dev, 4096) and not K.rounds_output(dev, 2112)     # a decode step: rows to fill the GPU
    assert K.int8_rounded_matvec(dev, "q4_k") and K.int8_rounded_matvec(dev, "q6_k")
    assert K.int8_rounded_matvec(dev, "q4_0") == K.int8_rounded_matvec(dev, "q8_0") == dev.int8_block_units
    assert not any(K.int8_rounded_matvec(dev, q) for q in ("q5_0", "f16", "f32", "q5_k"))
    monkeypatch.setitem(dev.limits, "max_storage_buffers_per_shader_stage", 10)
    assert not K.can_round_output(dev, 64) and not K.rounds_output(dev, 4096)
    monkeypatch.undo()
    raw = random_tensor("q4_k", 96, 256, np.random.default_rng(1))
    with pytest.raises(ValueError, match="rows rounded to int8"):
        K.matvec(dev, "q4_k", 256, 48, weight_buffer(dev, raw), f32(dev, np.ones(256)), dev.buffer(4 * 48),
                 geglu=True, round_out=rounded_buffers(dev, 48))


@pytest.mark.parametrize("qtype,blocks,opts", [("q4_k", 3, {}), ("q4_k", 11, dict(tpr=32, wg=64)),
                                               ("q6_k", 5, {}), ("q6_k", 11, dict(tpr=64, wg=128)),
                                               ("q4_0", 7, {}), ("q5_0", 3, dict(tpr=16)), ("q8_0", 5, {})])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_rounded_x(dev, qtype, blocks, opts, subgroups):
    """A matvec reading x as the int8 codes its producer stored (rounded_x: x8_stored.wgsl) gives what the
    same kernel gives rounding the same x in its workgroups (x8_round.wgsl): the same codes, the same sums;
    and the reference's integer sums. x rounded here by quantize_q8, and by a producer's round_out in
    the same plan (GeGLU rows into the down projection, as a decode step's MLP)."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(500 + blocks)
    n, k = 37, 256 * blocks
    raw = random_tensor(qtype, n, k, rng)
    x = rng.standard_normal(k).astype(np.float32)
    x[:32] = 0.0
    wb = weight_buffer(dev, raw)
    rounded, y = rounded_buffers(dev, k), dev.buffer(4 * n)
    got, own = rounded_x_and_own(dev, qtype, raw, x, rounded, subgroups=subgroups, **opts)
    np.testing.assert_allclose(got, own, rtol=1e-6, atol=1e-6 * np.abs(got).max())
    np.testing.assert_allclose(got, rounded_reference(qtype, raw, n, x), rtol=1e-4, atol=1e-4 * np.abs(got).max())
    # the rows of a GeGLU matvec (Q4_K, 2 k rows of 256), rounded by it, into this one
    up_raw = random_tensor("q4_k", 2 * k, 256, rng)
    u = rng.standard_normal(256).astype(np.float32)
    act = dev.buffer(4 * k)
    plan = K.matvec(dev, "q4_k", 256, k, weight_buffer(dev, up_raw), f32(dev, u), act, geglu=True, round_out=rounded)
    K.matvec(dev, qtype, k, n, wb, None, y, plan=plan, subgroups=subgroups, rounded_x=rounded, **opts)
    dev.submit(plan)
    np.testing.assert_allclose(read_f32(dev, y, n), rounded_reference(qtype, raw, n, read_f32(dev, act, k)),
                               rtol=1e-3, atol=1e-3 * np.abs(got).max())


@pytest.mark.parametrize("k", [32, 64, 96])
def test_matvec_rounded_x_short_rows(dev, k):
    """Rows of one to three blocks of 32 (the threads a row the kernel picks for rounded x: at least 4)."""
    rng = np.random.default_rng(k)
    n = 5
    raw = random_tensor("q8_0", n, k, rng)
    x = rng.standard_normal(k).astype(np.float32)
    got, own = rounded_x_and_own(dev, "q8_0", raw, x, rounded_buffers(dev, k))
    np.testing.assert_allclose(got, own, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, rounded_reference("q8_0", raw, n, x), rtol=1e-4, atol=1e-4)


def rounded_x_and_own(dev, qtype, raw, x, rounded: K.RoundedX, **opts) -> tuple[np.ndarray, np.ndarray]:
    """x rounded into `rounded` by quantize_q8 in one plan with (rows of the matvec of raw's rows reading those
    codes: rounded_x, rows of the same kernel rounding x in its workgroups: int8)."""
    k = len(x)
    n = len(raw) // ggml.row_bytes(qtype, k)
    xb, wb, y, own = f32(dev, x), weight_buffer(dev, raw), dev.buffer(4 * n), dev.buffer(4 * n)
    plan = K.quantize_q8(dev, k, xb, rounded.codes, rounded.scales, step_buffer(dev, 1), 1)
    K.matvec(dev, qtype, k, n, wb, None, y, plan=plan, rounded_x=rounded, **opts)
    K.matvec(dev, qtype, k, n, wb, xb, own, plan=plan, int8=True, **opts)
    dev.submit(plan)
    return read_f32(dev, y, n), read_f32(dev, own, n)


def rounded_reference(qtype, raw, n: int, x) -> np.ndarray:
    """W x with x rounded to int8 per 32: Q4_K's min terms on the blocks' exact sums (int8_reference),
    the other types' W dequantized times the rounded x."""
    from pyapp.reference.quants import quantize_activations_q8
    if qtype == "q4_k":
        return int8_reference(raw, n, x)
    k = len(x)
    q, d, _ = quantize_activations_q8(np.asarray(x, np.float32)[None])
    return dequantize(qtype, raw, n, k) @ (q.reshape(-1, 32).astype(np.float64) * d.reshape(-1, 1)).reshape(-1)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k", "f16"])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_epilogues(dev, qtype, subgroups):
    """geglu: one matvec over [gate; up] rows; gelu_times: gelu(Wx) * b (the PLE gate)."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(25)
    n, k = 45, 512
    raw = random_tensor(qtype, 2 * n, k, rng)
    w = dequantize(qtype, raw, 2 * n, k)
    x, b = rng.standard_normal(k), rng.standard_normal(n)
    wb, xb = weight_buffer(dev, raw), f32(dev, x)
    y = dev.buffer(4 * n)
    dev.submit(K.matvec(dev, qtype, k, n, wb, xb, y, subgroups=subgroups, geglu=True))
    gate, up = w[:n] @ x, w[n:] @ x
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * up, rtol=1e-4, atol=1e-4 * np.abs(up).max())
    dev.submit(K.matvec(dev, qtype, k, n, wb, xb, y, subgroups=subgroups, gelu_times=f32(dev, b)))
    np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * b, rtol=1e-4, atol=1e-4 * np.abs(b).max())


@pytest.mark.parametrize("qtype,k,chunks,int8", [("q4_k", 768, True, False), ("q4_k", 2816, True, False),
                                                 ("q4_k", 2816, True, True), ("q6_k", 512, False, False),
                                                 ("f16", 1100, False, False)])
@pytest.mark.parametrize("mode", ["next-norm", "raw", "geglu", "gelu-times"])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_residual_input(dev, qtype, k, chunks, int8, mode, subgroups):
    """A post-norm's residual add computed by every workgroup into the matvec's input
    (K.ResidualInput): r = (R + rms_norm(Y) * w) [* scale], x = r or rms_norm(r) * w2; workgroup 0
    writes r (the reference: norm.wgsl's add_normed, then the matvec). int8: the built x rounded to
    int8 (the reference's integer sums on numpy's x)."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(k + len(mode))
    n = 41
    raw = random_tensor(qtype, 2 * n, k, rng)
    w = dequantize(qtype, raw, 2 * n, k)
    ysub, resid, pw, nw, b = (rng.standard_normal(k) for _ in range(5))
    b = b[:n]
    scale = np.float32(0.7) if mode in ("raw", "geglu") else None
    r = (resid + rms_norm(ysub[None], pw, 1e-6)[0]) * (scale if scale is not None else 1.0)
    x = rms_norm(r[None], nw, 1e-6)[0] if mode != "raw" else r
    res = K.ResidualInput(f32(dev, ysub), f32(dev, resid), dev.buffer(4 * k), f32(dev, pw),
                          scale=f32(dev, [scale]) if scale is not None else None,
                          next_weight=f32(dev, nw) if mode != "raw" else None)
    y = dev.buffer(4 * 2 * n)
    opts = dict(subgroups=subgroups, chunks=chunks, residual=res, int8=int8)
    ref = int8_reference(raw, 2 * n, x) if int8 else w @ x
    tol = 1e-3 if int8 else 1e-4          # int8: an x within float rounding of a rounding tie may round either way
    gate, up = ref[:n], ref[n:]
    if mode == "geglu":
        dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), None, y, geglu=True, **opts))
        np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * up, rtol=tol, atol=tol * np.abs(up).max())
    elif mode == "gelu-times":
        dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), None, y, gelu_times=f32(dev, b), **opts))
        np.testing.assert_allclose(read_f32(dev, y, n), gelu_tanh(gate) * b, rtol=tol, atol=tol * np.abs(b).max())
    else:
        dev.submit(K.matvec(dev, qtype, k, 2 * n, weight_buffer(dev, raw), None, y, **opts))
        assert_close_dot(read_f32(dev, y, 2 * n), w, x, ref, tol=1e-4 if int8 else 2e-5)
    np.testing.assert_allclose(read_f32(dev, res.resid_out, k), r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qtype,k,n,weighted", [("f16", 2816, 128, True), ("f32", 1100, 37, False),
                                                ("q8_0", 352, 11, True), ("q4_k", 768, 41, True)])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_norm_input(dev, qtype, k, n, weighted, subgroups):
    """A row normed by every workgroup into the matvec's input (K.NormInput, a MoE router): x =
    rms_norm(src) [* w] * scale; workgroup 0 writes x and rms_norm(src) * w2 (norm_pair's outputs)."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(k + n)
    raw = random_tensor(qtype, n, k, rng)
    w = dequantize(qtype, raw, n, k)
    src = rng.standard_normal(k) * 3
    nw, w2 = rng.uniform(0.5, 1.5, k), rng.standard_normal(k)
    scale = 1 / math.sqrt(k)
    x = rms_norm(src[None], nw if weighted else None, 1e-6)[0] * scale
    normed = K.NormInput(f32(dev, src), dev.buffer(4 * k), f32(dev, nw) if weighted else None, f32(dev, w2),
                         dev.buffer(4 * k), scale=scale)
    y = dev.buffer(4 * n)
    dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), None, y, subgroups=subgroups, residual=normed))
    assert_close_dot(read_f32(dev, y, n), w, x, w @ x)
    np.testing.assert_allclose(read_f32(dev, normed.x_out, k), x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(read_f32(dev, normed.out2, k), rms_norm(src[None], w2, 1e-6)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("qtype,k,n,chunks,e,ksel", [("q5_0", 2112, 2816, False, 128, 8), ("q8_0", 96, 37, False, 11, 4),
                                                    ("q4_k", 768, 41, True, 300, 8), ("f16", 44, 5, False, 1, 1)])
@pytest.mark.parametrize("subgroups", [False, True], ids=["shared", "subgroup"])
def test_matvec_route_tail(dev, qtype, k, n, chunks, e, ksel, subgroups):
    """A one-token matvec with one workgroup more that routes a MoE token (K.RouteTail): y = W x as
    without it, and the top-k of softmax(logits), renormalized, ties to the lowest id."""
    if subgroups and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    rng = np.random.default_rng(k + e)
    raw = random_tensor(qtype, n, k, rng)
    w = dequantize(qtype, raw, n, k)
    x = rng.standard_normal(k)
    logits = rng.standard_normal((1, e)).astype(np.float32)
    logits[0, [min(2, e - 1), e - 1]] = 4.0                # a tie at the top
    route = K.RouteTail(e, ksel, f32(dev, logits), dev.buffer(4 * ksel), dev.buffer(4 * ksel))
    y = dev.buffer(4 * n)
    dev.submit(K.matvec(dev, qtype, k, n, weight_buffer(dev, raw), f32(dev, x), y, subgroups=subgroups,
                        chunks=chunks, route=route))
    assert_close_dot(read_f32(dev, y, n), w, x, w @ x)
    top, want = route_reference(logits, ksel)
    np.testing.assert_array_equal(np.frombuffer(dev.read(route.ids, 0, 4 * ksel), np.uint32), top[0])
    np.testing.assert_allclose(read_f32(dev, route.weights, ksel), want[0], rtol=1e-5, atol=1e-6)


def test_rounded_sweep_cycles_through_cold_copies(dev):
    """bench/matvec_sweep.py --rounded: a row per variant with a time; the dispatches cycle through copies of
    the matrix (as many as cold_bytes holds, at most one a dispatch) so that none reads its weights from L2."""
    import asyncio
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("matvec_sweep", Path(__file__).resolve().parents[2] / "bench" / "matvec_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    k, n = 256, 64
    rows = asyncio.run(sweep.rounded_sweep_async(dev, shapes=[(n, k)], quants=("q6_k",), threads=[(4, 64), (8, 256), (64, 256)],
                                                 reps=4, cold_bytes=3 * ggml.row_bytes("q6_k", k) * n))
    assert [r["x"] for r in rows] == ["engine", "round", "rounded", "rounded"]
    assert all(r["copies"] == 3 and r["us"] > 0 for r in rows)
    assert [(r["tpr"], r["wg"]) for r in rows[2:]] == [(4, 64), (8, 256)] and rows[2]["int8"]   # 64 a row: rows of 8 units, left out
