"""Parity of the few-token kernels of speculative decoding (pyapp.gpu.kernels' matvec_tokens and head_argmax:
shaders/matvec_tokens.wgsl, head_argmax.wgsl, sharing row_dots) against numpy on odd sizes."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp import ggml
from pyapp.gpu import kernels as K
from pyapp.reference.forward import softcap

from support.gpu import assert_close_dot, dequantize, f32, random_tensor, read_f32, step_buffer, u32, weight_buffer

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("qtype", ["f32", "f16", "bf16", "q8_0", "q4_0", "q5_1", "q4_k", "q5_k", "q6_k", "mxfp4"])
@pytest.mark.parametrize("t", [1, 5, 17])
def test_matvec_tokens(dev, qtype, t):
    """A step of 1-17 tokens, each weight read once: 150 rows (not a whole number of workgroups), also
    as two row blocks writing their columns of the wider Y (ldy); Y's rows past the step's tokens and
    the columns outside a block are left alone."""
    rng = np.random.default_rng(200 + 3 * t + ggml.lookup(qtype).id)
    qk = ggml.lookup(qtype).block
    rows, k = 150, 256 if qk == 256 else 4 * 29 if qk == 1 else 32 * 5
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal((K.FEW_TOKENS, k))
    want = x[:t] @ w.T
    xb, step = f32(dev, x), step_buffer(dev, t)
    y = f32(dev, np.full((K.FEW_TOKENS, rows), 7.0))
    dev.submit(K.matvec_tokens(dev, qtype, k, rows, weight_buffer(dev, raw), xb, y, step))
    got = read_f32(dev, y, K.FEW_TOKENS * rows).reshape(K.FEW_TOKENS, rows)
    assert_close_dot(got[:t], x[:t], w, want)
    assert (got[t:] == 7.0).all()
    split = 64                                     # a row block boundary at a bindable column
    rb = len(raw) // rows
    y = f32(dev, np.full((K.FEW_TOKENS, rows), 7.0))
    plan = dev.plan()
    for a, b in ((0, split), (split, rows)):
        K.matvec_tokens(dev, qtype, k, b - a, weight_buffer(dev, raw[a * rb:b * rb]), xb, (y, 4 * a, y.size - 4 * a),
                        step, plan=plan, ldy=rows)
    dev.submit(plan)
    got2 = read_f32(dev, y, K.FEW_TOKENS * rows).reshape(K.FEW_TOKENS, rows)
    np.testing.assert_array_equal(got2, got)


@pytest.mark.parametrize("qtype,k,rows,threads", [
    ("q4_0", 4128, 37, None), ("q6_k", 3072, 41, None), ("q4_k", 2560, 37, None), ("q4_k", 1024, 9, None),
    ("q8_0", 160, 150, (16, 64)), ("q4_k", 256, 150, (128, 128)), ("q5_0", 4128, 37, (64, 256))])
def test_matvec_tokens_threads(dev, qtype, k, rows, threads):
    """The threads a row and a workgroup: long rows (the rule's 64-128 threads a row), few rows (more
    threads in all), and fewer threads a row than tokens (each thread writes tokens t, t + TPR, ...)."""
    rng = np.random.default_rng(k + rows)
    t = K.FEW_TOKENS
    raw = random_tensor(qtype, rows, k, rng)
    w = dequantize(qtype, raw, rows, k)
    x = rng.standard_normal((t, k))
    tpr, wg = threads or K.few_tokens_threads(qtype == "q4_k", k, rows)
    if threads is None:
        assert tpr >= 32                          # the rule gives these shapes more than the old 16 / 32
    y = f32(dev, np.full((t, rows), 7.0))
    dev.submit(K.matvec_tokens(dev, qtype, k, rows, weight_buffer(dev, raw), f32(dev, x), y, step_buffer(dev, t),
                               tpr=tpr, wg=wg))
    got = read_f32(dev, y, t * rows).reshape(t, rows)
    assert_close_dot(got, x, w, x @ w.T)


@pytest.mark.parametrize("qtype,k,rows,t,threads", [
    ("q4_k", 256, 150, 5, None), ("q4_k", 1536, 37, 17, None), ("q4_k", 2560, 9, 3, (32, 128)),
    ("q4_k", 512, 70, 17, (16, 64)), ("q4_0", 160, 150, 5, None), ("q5_0", 4128, 37, 17, None),
    ("q8_0", 96, 70, 3, (16, 64)), ("q6_k", 512, 150, 9, None), ("q6_k", 3072, 9, 17, (128, 128))])
def test_matvec_tokens_x8(dev, qtype, k, rows, t, threads):
    """Q4_K and the 32-weight unit types on activations rounded to int8 by quantize_q8 (the prefill's
    rounding): numpy's integer sums of the same codes (float64), tokens past the step's left alone,
    also as two row blocks writing their columns."""
    from pyapp.reference.quants import matmul_int8, quantize_activations_q8
    rng = np.random.default_rng(k + t + ggml.lookup(qtype).id)
    raw = random_tensor(qtype, rows, k, rng)
    x = rng.standard_normal((K.FEW_TOKENS, k)).astype(np.float32)
    q, d, sums = quantize_activations_q8(x[:t])
    want = matmul_int8(raw, qtype, rows, q, d, sums)
    step = step_buffer(dev, t)
    xq = dev.buffer(K.FEW_TOKENS * k)
    xs = dev.buffer(K.FEW_TOKENS * k // 32 * 8)
    plan = K.quantize_q8(dev, k, f32(dev, x), xq, xs, step, t)
    y = f32(dev, np.full((K.FEW_TOKENS, rows), 7.0))
    tpr, wg = threads or (None, None)
    K.matvec_tokens_x8(dev, qtype, k, rows, weight_buffer(dev, raw), xq, xs, y, step, plan=plan, tpr=tpr, wg=wg)
    dev.submit(plan)
    got = read_f32(dev, y, K.FEW_TOKENS * rows).reshape(K.FEW_TOKENS, rows)
    w = dequantize(qtype, raw, rows, k)
    assert_close_dot(got[:t], x[:t], w, want)
    assert (got[t:] == 7.0).all()
    if rows <= 64:
        return
    rb = len(raw) // rows
    y2 = f32(dev, np.full((K.FEW_TOKENS, rows), 7.0))
    plan = dev.plan()
    for a, b in ((0, 64), (64, rows)):                 # a row block boundary at a bindable column
        K.matvec_tokens_x8(dev, qtype, k, b - a, weight_buffer(dev, raw[a * rb:b * rb]), xq, xs,
                           (y2, 4 * a, y2.size - 4 * a), step, plan=plan, ldy=rows)
    dev.submit(plan)
    np.testing.assert_array_equal(read_f32(dev, y2, K.FEW_TOKENS * rows).reshape(K.FEW_TOKENS, rows), got)


def test_few_tokens_threads_rule():
    """More threads a row for long rows and for few rows, never more than a workgroup's."""
    assert K.few_tokens_threads(False, 12288, 1536) == (128, 128)       # E2B's down projection
    assert K.few_tokens_threads(False, 1536, 24576) == (32, 128)        # its gate|up
    assert K.few_tokens_threads(False, 1536, 256) == (128, 128)         # 256 rows: few
    assert K.few_tokens_threads(True, 12288, 1536) == (32, 128)
    assert K.few_tokens_threads(True, 1536, 24576) == (16, 64)
    assert K.few_tokens_threads(True, 1536, 256) == (64, 128)
    for q4k in (False, True):
        for k in (32, 256, 1536, 4096, 12288, 65536):
            for n in (1, 256, 1536, 262144):
                tpr, wg = K.few_tokens_threads(q4k, k, n)
                assert tpr & (tpr - 1) == 0 and 16 <= tpr <= wg <= 128


@pytest.mark.parametrize("qtype,m,cap,splits,out0", [
    ("f32", 1, 0.0, (), 0), ("f32", 17, 30.0, (400, 733), 1), ("q8_0", 5, 30.0, (), 0),
    ("q4_k", 17, 0.0, (333,), 0), ("q6_k", 3, 30.0, (1, 502), 1), ("q5_0", 16, 0.0, (), 0)])
def test_head_argmax(dev, qtype, m, cap, splits, out0):
    """The greedy verification head: argmax_v softcap(x[i] . W[v]) per row i < step.n_tokens, over a
    vocabulary of 1003 (not a whole number of workgroups) in one or several row blocks; a duplicate of a
    row's winner at a higher id (in a later block) loses the tie; a NaN row is never chosen; ids past
    the step's rows are left alone."""
    rng = np.random.default_rng(31 + m)
    qk = ggml.lookup(qtype).block
    v, k = 1003, 256 if qk == 256 else 4 * 29 if qk == 1 else 32 * 5
    raw = bytearray(random_tensor(qtype, v, k, rng))
    rb = len(raw) // v
    x = rng.standard_normal((K.HEAD_ROWS, k)).astype(np.float32)
    w = dequantize(qtype, bytes(raw), v, k)
    x *= 20 / np.abs(x @ w.T).max()                    # logits within +-20: the softcap does not saturate
    win = int(np.argmax(w @ x[0]))
    dup = v - 2 if win < v - 2 else 0                  # a copy of row 0's winner, at a higher id if it can be
    raw[dup * rb:(dup + 1) * rb] = raw[win * rb:(win + 1) * rb]
    if qtype == "f32":
        raw[7 * rb:8 * rb] = np.full(k, np.nan, np.float32).tobytes()
    w = dequantize(qtype, bytes(raw), v, k)
    bounds = [0, *splits, v]
    parts = [(weight_buffer(dev, bytes(raw[a * rb:b * rb])), a, b - a) for a, b in zip(bounds, bounds[1:])]
    scratch = dev.buffer(K.head_argmax_scratch_bytes([n for _, _, n in parts]))
    out = u32(dev, *([0xDEAD] * (K.HEAD_ROWS + 1)), kind="storage")
    dev.submit(K.head_argmax(dev, qtype, k, parts, f32(dev, x), scratch, out, step_buffer(dev, m), cap=cap,
                             out0=out0))
    got = np.frombuffer(dev.read(out, 0, 4 * (K.HEAD_ROWS + 1)), np.uint32)
    logits = x[:m].astype(np.float64) @ np.nan_to_num(w).T
    if cap:
        logits = softcap(logits, cap)
    logits[:, np.isnan(w).any(1)] = -np.inf          # NaN logits count as the lowest
    assert (got[:out0] == 0xDEAD).all() and (got[out0 + m:] == 0xDEAD).all()
    ids = got[out0:out0 + m]
    best = logits.max(-1)
    top2 = np.sort(logits, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-3
    assert (ids[clear] == logits.argmax(-1)[clear]).all()
    assert (logits[np.arange(m), ids] >= best - 1e-3).all()
    if qtype == "f32":
        assert 7 not in ids
    assert ids[0] == min(win, dup)                     # the tie with its copy: the lower id
