"""The numpy LoRA gradient oracle (pyapp.reference.backward): each op's backward against central finite
differences (float64, odd sizes), the whole model's gradients against finite differences, and against torch
autograd through transformers + PEFT (tests/fixtures/lora/*.grad.npz, tools/make_lora_grad_golden.py).

Tolerances. Per op: relative error (max |ours - FD| / max |FD|) <= 1e-6 (seen 6e-10). Whole model vs FD:
<= 1e-5 per sampled entry (seen 1.9e-7). Against torch (float64 autograd, goldens stored as float32): per
tensor, max |ours - torch| / max |torch| <= 1e-5 (seen <= 1.7e-6: transformers' Gemma 4 RMSNorm and RoPE
tables compute in float32 even in a float64 model), loss within 1e-6 (seen 1e-7). For scale: float32 torch
itself differs from float64 torch by up to 2.9e-6 on these gradients (printed by the tool).
"""

from __future__ import annotations


import numpy as np
import pytest

from pyapp.reference import backward as bw
from pyapp.reference.forward import gelu_tanh, rms_norm, rope_neox, softcap

from support.paths import ROOT

FIX = ROOT / "tests" / "fixtures"
CASES = [("gemma4-dense", "f32"), ("gemma4-dense", "q4_k"), ("gemma4-moe", "f32")]
OP_RTOL, MODEL_FD_RTOL, TORCH_RTOL, LOSS_ATOL = 1e-6, 1e-5, 1e-5, 1e-6


def rng(seed=0):
    return np.random.default_rng(seed)


def fd_grad(f, x: np.ndarray, eps=1e-6) -> np.ndarray:
    """Central differences of the scalar f() with respect to every entry of x (changed in place)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        hi = f()
        x[i] = old - eps
        lo = f()
        x[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


def assert_close(got, want, rtol=OP_RTOL, what=""):
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-12)
    assert err <= rtol, f"{what}: relative error {err:.2e}"


def check_op(forward, inputs: list, backward, seed=1):
    """backward(dy) returns d(sum(forward() * dy))/d(input) for each of `inputs` (arrays forward reads)."""
    dy = rng(seed).standard_normal(forward().shape)
    got = backward(dy)
    for i, (x, g) in enumerate(zip(inputs, got)):
        assert_close(g, fd_grad(lambda: float(np.sum(forward() * dy)), x), what=f"input {i}")


# ---- one op at a time ------------------------------------------------------------------------------------

def test_lora_backward():
    r = rng()
    x, a, b = r.standard_normal((5, 7)), r.standard_normal((3, 7)), r.standard_normal((9, 3))
    w = r.standard_normal((9, 7))
    fwd = lambda: x @ w.T + 1.7 * (x @ a.T) @ b.T      # noqa: E731
    check_op(fwd, [x, a, b], lambda dy: (lambda dx, da, db: (dx + bw.linear_backward(w, dy), da, db))(
        *bw.lora_backward(x, a, b, 1.7, dy)))


@pytest.mark.parametrize("weighted", [True, False])
def test_rms_norm_backward(weighted):
    r = rng()
    x, w = r.standard_normal((3, 2, 13)), (1 + 0.3 * r.standard_normal(13)) if weighted else None
    check_op(lambda: rms_norm(x, w, 1e-6), [x], lambda dy: [bw.rms_norm_backward(x, w, 1e-6, dy)])


def test_gelu_and_geglu_backward():
    r = rng()
    x, up = 2 * r.standard_normal((5, 11)), r.standard_normal((5, 11))
    check_op(lambda: gelu_tanh(x), [x], lambda dy: [bw.gelu_tanh_backward(x, dy)])
    check_op(lambda: gelu_tanh(x) * up, [x, up], lambda dy: bw.geglu_backward(x, up, dy))


@pytest.mark.parametrize("cap", [30.0, 0.0])
def test_softcap_backward(cap):
    x = 25 * rng().standard_normal((3, 17))          # well into the tanh's curve
    check_op(lambda: softcap(x, cap), [x], lambda dy: [bw.softcap_backward(x, cap, dy)])


@pytest.mark.parametrize("global_layer", [False, True])
def test_rope_neox_backward(global_layer):
    """Partial rotation (6 of 10 dims); a global layer's frequency factors (1e30: pair left alone)."""
    r = rng()
    x, pos = r.standard_normal((5, 3, 10)), np.array([0, 1, 2, 7, 11])
    ff = np.array([1.0, 1.0, 1e30]) if global_layer else None
    check_op(lambda: rope_neox(x, pos, 6, 10000.0, ff), [x],
             lambda dy: [bw.rope_neox_backward(dy, pos, 6, 10000.0, ff)])


def test_softmax_backward():
    s = rng().standard_normal((3, 7))
    softmax = lambda: np.exp(s) / np.exp(s).sum(-1, keepdims=True)     # noqa: E731
    check_op(softmax, [s], lambda dy: [bw.softmax_backward(softmax(), dy)])


@pytest.mark.parametrize("window", [0, 3])
def test_attention_backward(window):
    """GQA (6 query heads on 3 KV heads... and on 1), causal, optionally a sliding window of 3."""
    r = rng()
    n, hd = 7, 5
    pos = np.arange(n)
    allowed = pos[None, :] <= pos[:, None]
    if window:
        allowed &= pos[:, None] - pos[None, :] < window
    for kv_heads in (3, 1):
        q = r.standard_normal((n, 6, hd))
        keys, values = r.standard_normal((kv_heads, n, hd)), r.standard_normal((kv_heads, n, hd))

        def fwd():
            p = bw.attention_probs(q, keys, allowed)
            return np.einsum("hnt,htd->nhd", p, np.repeat(values, 6 // kv_heads, axis=0))
        check_op(fwd, [q, keys, values], lambda dy: bw.attention_backward(q, keys, values, allowed, dy))


def test_cross_entropy_backward():
    r = rng()
    logits, tokens = 3 * r.standard_normal((7, 11)), r.integers(0, 11, 7)
    mask = np.array([0, 0, 1, 1, 0, 1, 1], bool)
    got = bw.cross_entropy_backward(logits, tokens, mask)
    assert_close(got, fd_grad(lambda: bw.cross_entropy(logits, tokens, mask), logits))
    assert not got[-1].any() and not got[np.flatnonzero(~mask[1:])].any()     # rows that predict nothing counted
    # the value: -log p of each counted next token, averaged
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = -np.mean([logp[i - 1, tokens[i]] for i in range(1, 7) if mask[i]])
    assert abs(bw.cross_entropy(logits, tokens, mask) - want) < 1e-12


def test_router_weights_backward():
    """Softmax over 7 experts, top 3, renormalized; the choice does not move under the small steps."""
    logits = rng().standard_normal((5, 7))
    probs, top, _ = bw.router_weights(logits, 3)
    fwd = lambda: bw.router_weights(logits, 3)[2]       # noqa: E731
    check_op(fwd, [logits], lambda dy: [bw.router_weights_backward(probs, top, dy)])
    assert (bw.router_weights(logits, 3)[1] == top).all()


@pytest.mark.parametrize("scaled", [True, False])
def test_experts_backward(scaled):
    r = rng()
    n, hidden, ff, n_exp = 3, 5, 6, 4
    x, weights = r.standard_normal((n, hidden)), r.random((n, 2))
    top = np.array([[0, 3], [2, 1], [3, 2]])
    gate_w, up_w = r.standard_normal((n_exp, ff, hidden)), r.standard_normal((n_exp, ff, hidden))
    down_w, scale = r.standard_normal((n_exp, hidden, ff)), (r.random(n_exp) + 0.5) if scaled else None

    def fwd():
        out = np.zeros_like(x)
        for t in range(n):
            for j, e in enumerate(top[t]):
                s = scale[e] if scaled else 1.0
                out[t] += weights[t, j] * s * (down_w[e] @ (gelu_tanh(gate_w[e] @ x[t]) * (up_w[e] @ x[t])))
        return out
    check_op(fwd, [x, weights], lambda dy: bw.experts_backward(x, top, weights, gate_w, up_w, down_w, scale, dy))


# ---- the whole model ---------------------------------------------------------------------------------------

def oracle(model: str, qtype: str):
    from pyapp.gguf import read_gguf
    return bw.LoraGradients(read_gguf(FIX / f"{model}-{qtype}.gguf"), [(str(FIX / "lora" / f"{model}.gguf"), 1.0)])


def grad_golden(model: str, qtype: str):
    return np.load(FIX / "lora" / f"{model}-{qtype}.grad.npz")


@pytest.mark.parametrize("model,qtype", CASES)
def test_gradients_match_torch_autograd(model, qtype):
    """transformers + PEFT, the same LoRA, tokens and mask: the loss and every A and B gradient."""
    golden = grad_golden(model, qtype)
    loss, grads = oracle(model, qtype).loss_and_grads(golden["tokens"], golden["mask"])
    assert abs(loss - float(golden["loss"])) <= LOSS_ATOL, (loss, float(golden["loss"]))
    assert set(grads) == set(golden.files) - {"tokens", "mask", "loss"}
    assert len(grads) == (64 if model == "gemma4-dense" else 60)
    for name, g in grads.items():
        assert g.shape == golden[name].shape, name
        assert np.abs(golden[name]).max() > 0, name                 # every pair is reached by the loss
        assert_close(g, golden[name], TORCH_RTOL, name)


@pytest.mark.parametrize("model", ["gemma4-dense", "gemma4-moe"])
def test_gradients_match_finite_differences(model):
    """One random entry per adapted projection, of A and B in turn (every kind of target in every layer)."""
    o = oracle(model, "f32")
    golden = grad_golden(model, "f32")
    tokens, mask = golden["tokens"], golden["mask"]
    _, grads = o.loss_and_grads(tokens, mask)
    r = rng(3)
    worst = 0.0
    for k, pair in enumerate(o.pairs.values()):
        for arr, suffix in [((pair.a, ".lora_a"), (pair.b, ".lora_b"))[k % 2]]:
            i = tuple(int(r.integers(0, s)) for s in arr.shape)
            old, eps = arr[i], 1e-5
            arr[i] = old + eps
            hi = o.loss(tokens, mask)
            arr[i] = old - eps
            lo = o.loss(tokens, mask)
            arr[i] = old
            fd, got = (hi - lo) / (2 * eps), grads[pair.name + suffix][i]
            worst = max(worst, abs(got - fd) / max(abs(fd), 1e-4))
            assert abs(got - fd) <= MODEL_FD_RTOL * max(abs(fd), 1e-4), (pair.name + suffix, i, got, fd)
    print(f"{model}: worst relative error against finite differences {worst:.1e}")


@pytest.mark.parametrize("model,qtype", CASES)
def test_oracle_forward_is_the_reference_forward(model, qtype):
    """LoRA unmerged in float64 = the reference's merged float32 forward = transformers + PEFT's logits."""
    golden = np.load(FIX / "lora" / f"{model}-{qtype}.golden.npz")
    tokens = golden["tokens_0"]
    logits = oracle(model, qtype).forward_logits(tokens, bw.Tape())
    assert np.abs(logits - golden["logits_0"]).max() < 2e-5


def test_mask_must_count_something():
    o = oracle("gemma4-dense", "f32")
    with pytest.raises(ValueError, match="at least one target"):
        o.loss_and_grads([2, 5, 6], [True, False, False])
    with pytest.raises(ValueError, match="one mask entry per token"):
        o.loss_and_grads([2, 5, 6], [True, True])
