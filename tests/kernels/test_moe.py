"""Parity of the mixture-of-experts kernels (pyapp.gpu.kernels' moe_route, moe_experts, moe_group,
moe_experts_grouped(_q8), moe_combine, moe_tail) against numpy: routing with ties, the expert matvec (GeGLU fused,
int8 blocks, W split over two buffers), the grouped matmul slot by slot, the layer's tail."""

from __future__ import annotations

import numpy as np
import pytest

from pyapp.gpu import kernels as K
from pyapp.reference.forward import gelu_tanh, rms_norm

from support.gpu import (assert_close_dot, dequantize, f32, int8_reference, random_tensor, read_f32, route_reference,
                         step_buffer, weight_buffer)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("e,ksel,t", [(11, 4, 3), (128, 8, 5), (300, 8, 2)], ids=["small", "26b-a4b", "odd-wide"])
def test_moe_route(dev, e, ksel, t):
    """Top-k of softmax, renormalized; ties go to the lowest expert id (the reference's stable sort)."""
    rng = np.random.default_rng(e)
    logits = rng.standard_normal((t, e)).astype(np.float32)
    logits[0, [3, 7, 9]] = 5.0                              # a three-way tie at the top
    ids, wts = dev.buffer(4 * t * ksel), dev.buffer(4 * t * ksel)
    dev.submit(K.moe_route(dev, e, ksel, f32(dev, logits), ids, wts, step_buffer(dev, t), t))
    top, want = route_reference(logits, ksel)
    got_ids = np.frombuffer(dev.read(ids, 0, 4 * t * ksel), np.uint32).reshape(t, ksel)
    np.testing.assert_array_equal(got_ids, top)
    assert list(got_ids[0, :3]) == [3, 7, 9]
    np.testing.assert_allclose(read_f32(dev, wts, t * ksel).reshape(t, ksel), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("qtype", ["f32", "q8_0", "q4_k"])
def test_moe_route_experts_combine(dev, qtype):
    rng = np.random.default_rng(21)
    t, e, ksel, hidden, ff = 3, 11, 4, 256, 64 if qtype != "q4_k" else 256
    logits = rng.standard_normal((t, e)).astype(np.float32)
    step = step_buffer(dev, t)
    ids, wts = dev.buffer(4 * t * ksel), dev.buffer(4 * t * ksel)
    plan = K.moe_route(dev, e, ksel, f32(dev, logits), ids, wts, step, t)
    # fused gate_up [e, 2ff, hidden] on the shared input, then down [e, hidden, ff] per slot
    raw_gu = random_tensor(qtype, e * 2 * ff, hidden, rng)
    raw_dn = random_tensor(qtype, e * hidden, ff, rng)
    gu_w = dequantize(qtype, raw_gu, e * 2 * ff, hidden).reshape(e, 2 * ff, hidden)
    dn_w = dequantize(qtype, raw_dn, e * hidden, ff).reshape(e, hidden, ff)
    scale = rng.uniform(0.5, 2, e).astype(np.float32)
    x = rng.standard_normal((t, hidden)).astype(np.float32)
    gu, act = dev.buffer(4 * t * ksel * 2 * ff), dev.buffer(4 * t * ksel * ff)
    ye, out = dev.buffer(4 * t * ksel * hidden), dev.buffer(4 * t * hidden)
    K.moe_experts(dev, qtype, hidden, 2 * ff, e, ksel, weight_buffer(dev, raw_gu), f32(dev, x), gu, ids, step, t, plan=plan)
    K.geglu_halves(dev, ff, ksel, gu, act, step, t, plan=plan)
    K.moe_experts(dev, qtype, ff, hidden, e, ksel, weight_buffer(dev, raw_dn), act, ye, ids, step, t,
                  per_slot_input=True, plan=plan)
    K.moe_combine(dev, hidden, ksel, ye, ids, wts, out, step, t, down_scale=f32(dev, scale), plan=plan)
    dev.submit(plan)

    top, w = route_reference(logits, ksel)
    assert (np.frombuffer(dev.read(ids, 0, 4 * t * ksel), np.uint32).reshape(t, ksel) == top).all()
    np.testing.assert_allclose(read_f32(dev, wts, t * ksel).reshape(t, ksel), w, rtol=1e-5)
    want = np.zeros((t, hidden))
    for i in range(t):
        for j, ex in enumerate(top[i]):
            g, up = gu_w[ex, :ff] @ x[i], gu_w[ex, ff:] @ x[i]
            want[i] += w[i, j] * scale[ex] * (dn_w[ex] @ (gelu_tanh(g) * up))
    got = read_f32(dev, out, t * hidden).reshape(t, hidden)
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())


@pytest.mark.parametrize("qtype", ["f32", "q8_0", "q4_k"])
@pytest.mark.parametrize("t,e,ksel,per_slot", [(70, 11, 4, False), (37, 128, 8, True), (5, 3, 2, False)],
                         ids=["tiles-over-64", "26b-a4b-down", "few"])
@pytest.mark.parametrize("tile", [None, K.MatmulTile(64, 64, 32, 8)], ids=["default-tile", "64x64-t8"])
def test_moe_grouped_experts_match_slot_by_slot(dev, qtype, t, e, ksel, per_slot, tile):
    """The grouped matmul (slots sorted by expert, a tile per tile.tokens slots) against the reference
    products, with ids the cache leaves out (NOT_HERE) and W split into two buffers of experts."""
    tile = tile or K.fit_tile(dev, K.MOE_MATMUL)
    rng = np.random.default_rng(t * e)
    k, n = (256, 67) if qtype != "q4_k" else (256, 130)
    raw = random_tensor(qtype, e * n, k, rng)
    w = dequantize(qtype, raw, e * n, k).reshape(e, n, k)
    ids = rng.integers(0, e, (t, ksel)).astype(np.uint32)
    ids[0, 0] = 0xFFFFFFFF                   # a slot this round does not serve: left unwritten
    rows = t * ksel if per_slot else t
    x = rng.standard_normal((rows, k)).astype(np.float32)
    step = step_buffer(dev, t)
    grp = dev.buffer(4 * K.moe_group_rows(e, ksel, t))
    y = dev.buffer(4 * t * ksel * n)
    dev.write(y, np.full(t * ksel * n, 7.0, np.float32).tobytes())
    ids_buf = dev.buffer(ids.nbytes)
    dev.write(ids_buf, ids.tobytes())
    plan = K.moe_group(dev, e, ksel, ids_buf, grp, step, tile=tile)
    split = e // 2 + 1                       # experts 0..split-1 in one buffer, the rest in another
    rb = len(raw) // (e * n)
    for first, here in ((0, split), (split, e - split)):
        part = weight_buffer(dev, raw[first * n * rb:(first + here) * n * rb])
        K.moe_experts_grouped(dev, qtype, k, n, e, ksel, part, f32(dev, x), y, grp, t,
                              per_slot_input=per_slot, plan=plan, first_expert=first, experts_here=here, tile=tile)
    dev.submit(plan)
    got = read_f32(dev, y, t * ksel * n).reshape(t * ksel, n)
    flat = ids.reshape(-1)
    for s, ex in enumerate(flat):
        if ex == 0xFFFFFFFF:
            assert (got[s] == 7.0).all()
            continue
        want = w[ex] @ x[s if per_slot else s // ksel]
        np.testing.assert_allclose(got[s], want, atol=1e-3 * max(1.0, np.abs(want).max()), err_msg=f"slot {s}")
    g = np.frombuffer(dev.read(grp, 0, 4 * K.moe_group_rows(e, ksel, t)), np.uint32)
    counts = np.bincount(flat[flat < e], minlength=e)
    np.testing.assert_array_equal(g[:e + 1], np.concatenate([[0], np.cumsum(counts)]))
    assert g[2 * e + 1] == sum(-(-c // tile.tokens) for c in counts)


@pytest.mark.parametrize("qtype,t,e,ksel,per_slot", [("q4_k", 70, 11, 4, False), ("q4_k", 37, 128, 8, True),
                                                     ("q4_k", 5, 3, 2, False), ("q5_0", 37, 128, 8, True),
                                                     ("q8_0", 70, 11, 4, False), ("q6_k", 37, 11, 4, True)],
                         ids=["tiles-over-64", "26b-a4b-per-slot", "few", "q5_0-down", "q8_0", "q6_k"])
def test_moe_grouped_experts_q8(dev, qtype, t, e, ksel, per_slot):
    """The grouped int8 expert matmul (moe_grouped_q8, after moe_group with the device's MoE tile)
    against pyapp.reference.quants' exact integer sums for each slot's expert and input row, with ids
    the cache leaves out (NOT_HERE: unwritten) and W split into two buffers of experts."""
    from pyapp.reference.quants import matmul_int8
    rng = np.random.default_rng(5 * t + e)
    k, n = (512, 130) if qtype in ("q4_k", "q6_k") else (704, 67)
    raw = random_tensor(qtype, e * n, k, rng)
    w = dequantize(qtype, raw, e * n, k).reshape(e, n, k)
    ids = rng.integers(0, e, (t, ksel)).astype(np.uint32)
    ids[0, 0] = 0xFFFFFFFF
    rows = t * ksel if per_slot else t
    x = rng.standard_normal((rows, k)).astype(np.float32)
    step = step_buffer(dev, t)
    grp = dev.buffer(4 * K.moe_group_rows(e, ksel, t))
    y = f32(dev, np.full(t * ksel * n, 7.0))
    ids_buf = dev.buffer(ids.nbytes)
    dev.write(ids_buf, ids.tobytes())
    xq_bytes, xs_bytes = K.q8_bytes(rows, k)
    xq, xs = dev.buffer(xq_bytes), dev.buffer(xs_bytes)
    plan = K.quantize_q8(dev, k, f32(dev, x), xq, xs, step, t, rows_per_token=ksel if per_slot else 1)
    K.moe_group(dev, e, ksel, ids_buf, grp, step, plan=plan)
    split = e // 2 + 1
    rb = len(raw) // (e * n)
    for first, here in ((0, split), (split, e - split)):
        part = weight_buffer(dev, raw[first * n * rb:(first + here) * n * rb])
        K.moe_experts_grouped_q8(dev, qtype, k, n, e, ksel, part, xq, xs, y, grp, t, per_slot_input=per_slot, plan=plan,
                                 first_expert=first, experts_here=here)
    dev.submit(plan)
    got = read_f32(dev, y, t * ksel * n).reshape(t * ksel, n)
    q = np.frombuffer(dev.read(xq, 0, xq_bytes), np.int8).reshape(rows, k)
    ds = read_f32(dev, xs, xs_bytes // 4).reshape(rows, k // 32, 2)
    blocks = len(raw) // e
    for slot, ex in enumerate(ids.reshape(-1)):
        if ex == 0xFFFFFFFF:
            assert (got[slot] == 7.0).all()
            continue
        r = slot if per_slot else slot // ksel
        want = matmul_int8(raw[ex * blocks:(ex + 1) * blocks], qtype, n, q[r:r + 1], ds[r:r + 1, :, 0], ds[r:r + 1, :, 1])
        assert_close_dot(got[slot:slot + 1], x[r:r + 1], w[ex], want, tol=2e-5)


@pytest.mark.parametrize("qtype,k,n,tpr", [("q5_0", 704, 75, None), ("q8_0", 704, 37, None), ("q4_0", 96, 130, None),
                                          ("q5_0", 704, 75, 8)])
@pytest.mark.parametrize("per_slot", [False, True], ids=["token-input", "slot-input"])
def test_moe_experts_int8_blocks(dev, qtype, k, n, tpr, per_slot):
    """The decode expert matvec for 32-weight blocks on x rounded to int8 (moe_x8.wgsl: the 26B-A4B's
    704-long down rows), W split into two buffers of experts: each slot against the reference's integer
    sums on its x (float rounding only) and within int8's rounding of the f32 product."""
    rng = np.random.default_rng(k + n + per_slot)
    t, e, ksel = 2, 5, 3
    raw = random_tensor(qtype, e * n, k, rng)
    w = dequantize(qtype, raw, e * n, k).reshape(e, n, k)
    ids = rng.integers(0, e, (t, ksel)).astype(np.uint32)
    x = rng.standard_normal((t * ksel if per_slot else t, k)).astype(np.float32)
    x[0, 32:64] = 0.0                                  # an all-zero block of x
    ids_buf = dev.buffer(ids.nbytes)
    dev.write(ids_buf, ids.tobytes())
    y = f32(dev, np.full((t * ksel, n), 7.0))
    step = step_buffer(dev, t)
    plan = dev.plan()
    rb = len(raw) // (e * n)
    for first, here in ((0, 2), (2, 3)):
        part = weight_buffer(dev, raw[first * n * rb:(first + here) * n * rb])
        K.moe_experts(dev, qtype, k, n, e, ksel, part, f32(dev, x), y, ids_buf, step, t, plan=plan,
                      per_slot_input=per_slot, first_expert=first, experts_here=here, int8=True, tpr=tpr)
    dev.submit(plan)
    got = read_f32(dev, y, t * ksel * n).reshape(t * ksel, n)
    for s, ex in enumerate(ids.reshape(-1)):
        xs = x[s if per_slot else s // ksel]
        want = int8_reference(raw[ex * n * rb:(ex + 1) * n * rb], n, xs, qtype)
        assert_close_dot(got[s], w[ex], xs, want)
        assert_close_dot(got[s], w[ex], xs, w[ex] @ xs, tol=1e-2)


@pytest.mark.parametrize("qtype,chunks,hidden,int8", [("f32", False, 256, False), ("q8_0", False, 256, False),
                                                      ("q4_k", False, 256, False), ("q4_k", True, 256, False),
                                                      ("q4_k", True, 2816, False), ("q4_k", True, 2816, True),
                                                      ("q4_0", False, 2816, True), ("q5_0", False, 352, True),
                                                      ("q8_0", False, 2816, True)])
def test_moe_experts_geglu_fused(dev, qtype, chunks, hidden, int8):
    """The decode expert matvec with the GeGLU fused (gate rows then up rows per expert), W split
    into two buffers of experts: gelu(gate x) * (up x) per slot; Q4_K also in 16-byte chunks
    (moe_q4k.wgsl, the default where the device has subgroups), there also with x rounded to int8, and the
    32-weight blocks on int8 x (moe_x8.wgsl: 2816-long rows at 8 threads a row, 352-long at 2; 37 rows an
    expert), against the reference's integer sums."""
    if chunks and not dev.has_subgroups:
        pytest.skip("device has no subgroups feature")
    assert K.expert_x8_threads_per_row(2816) == 8 and K.expert_x8_threads_per_row(704) == 2 \
        and K.expert_x8_threads_per_row(352) == 2
    rng = np.random.default_rng(33)
    t, e, ksel, ff = 2, 5, 3, 256 if qtype == "q4_k" else 37 if int8 else 64
    raw = random_tensor(qtype, e * 2 * ff, hidden, rng)
    w = dequantize(qtype, raw, e * 2 * ff, hidden).reshape(e, 2 * ff, hidden)
    ids = rng.integers(0, e, (t, ksel)).astype(np.uint32)
    x = rng.standard_normal((t, hidden)).astype(np.float32)
    ids_buf = dev.buffer(ids.nbytes)
    dev.write(ids_buf, ids.tobytes())
    act = dev.buffer(4 * t * ksel * ff)
    step = step_buffer(dev, t)
    plan = dev.plan()
    rb = len(raw) // (e * 2 * ff)
    for first, here in ((0, 2), (2, 3)):
        part = weight_buffer(dev, raw[first * 2 * ff * rb:(first + here) * 2 * ff * rb])
        K.moe_experts(dev, qtype, hidden, ff, e, ksel, part, f32(dev, x), act, ids_buf, step, t, plan=plan,
                      first_expert=first, experts_here=here, geglu=True, chunks=chunks, int8=int8)
    dev.submit(plan)
    got = read_f32(dev, act, t * ksel * ff).reshape(t * ksel, ff)
    for s, ex in enumerate(ids.reshape(-1)):
        xs = x[s // ksel]
        ref = int8_reference(raw[ex * 2 * ff * rb:(ex + 1) * 2 * ff * rb], 2 * ff, xs, qtype) if int8 else w[ex] @ xs
        want = gelu_tanh(ref[:ff]) * ref[ff:]
        np.testing.assert_allclose(got[s], want, atol=2e-3 * max(1.0, np.abs(want).max()), err_msg=f"slot {s}")


@pytest.mark.parametrize("d,ksel,t,scaled", [(2816, 8, 1, True), (300, 3, 5, False), (36, 1, 2, True)])
def test_moe_tail(dev, d, ksel, t, scaled):
    """A MoE layer's output in one dispatch: rms_norm(dense) * w1 + rms_norm(sum_j weights_j y_j [* scale]) * w2."""
    rng = np.random.default_rng(d + ksel + t)
    e = 11
    ye = rng.standard_normal((t * ksel, d)).astype(np.float32)
    dense = rng.standard_normal((t, d)).astype(np.float32)
    ids = rng.integers(0, e, size=t * ksel).astype(np.uint32)
    wts = rng.uniform(0.1, 1.0, size=t * ksel).astype(np.float32)
    w1, w2 = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    sc = rng.uniform(0.5, 2.0, size=e).astype(np.float32)
    idsb = dev.buffer(ids.nbytes)
    dev.write(idsb, ids.tobytes())
    out = f32(dev, np.full((t + 1, d), 7.0, np.float32))
    dev.submit(K.moe_tail(dev, d, ksel, f32(dev, dense), f32(dev, w1), f32(dev, ye), idsb, f32(dev, wts), f32(dev, w2),
                          out, step_buffer(dev, t, 0), t + 1, down_scale=f32(dev, sc) if scaled else None))
    w = wts * (sc[ids] if scaled else 1.0)
    moe = (w.reshape(t, ksel, 1) * ye.reshape(t, ksel, d)).sum(1)
    want = rms_norm(dense, w1, 1e-6) + rms_norm(moe, w2, 1e-6)
    got = read_f32(dev, out, (t + 1) * d).reshape(t + 1, d)
    np.testing.assert_allclose(got[:t], want, rtol=1e-4, atol=1e-4)
    assert (got[t] == 7.0).all()                 # past the step's tokens: not written
