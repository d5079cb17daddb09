"""The fusion rules (pyapp.runtime.fusion) on recorded ops, without a GPU: what each rule fuses, and what
stops it (a reader between, a LoRA delta, a tape). The plans they make on the fixture models are compared
with the recorder's earlier plans by tools/plan_listing.py; the logits, by tests/test_engine.py."""

from __future__ import annotations

from pyapp.gpu import Buffer
from pyapp.runtime.fusion import Rules, fuse, merge_adds, moe_tails, residual_inputs, rounded_inputs, route_tails
from pyapp.runtime.lowering import (AddNorm, Combine, Copy, Experts, FromAdd, GegluHalves, GeluTimes, Linear, Lora,
                                    MoeTail, QuantizedInput, RmsNorm, RmsNormPair, RoundedInput, Route, Scale)
from pyapp.runtime.upload import GpuTensor, Part

D = 64


def buf(label: str) -> Buffer:
    return Buffer(None, 4 * D, "storage", label)


def tensor(name: str, rows: int = D, parts: int = 1) -> GpuTensor:
    per = rows // parts
    return GpuTensor(name, 0, (D, rows), [Part(buf(name), i * per, per) for i in range(parts)])


X, XN, Y = buf("x"), buf("xn"), buf("y")
W, W2 = tensor("norm"), tensor("next norm")


def rules(**kw) -> Rules:
    return Rules(D, X, **{"one_token": True, "few": False, **kw})


def test_an_add_takes_the_layer_scale_and_the_next_norm():
    scale = tensor("layer scale", 1)
    add = AddNorm(Y, W, X)
    out = merge_adds([add, Scale(X, scale), RmsNorm(X, XN, W2)], rules())
    assert out == [add] and add.scale is scale and (add.next_weight, add.next_out) == (W2, XN)


def test_an_add_keeps_what_a_reader_between_needs():
    """A reader of the sum between the add and the scale needs it unscaled; the norm's output read or
    written between, or the sum written, keeps the norm apart. A reader of the sum is no obstacle to the norm."""
    scale, other = tensor("layer scale", 1), buf("other")
    add = AddNorm(Y, W, X)
    copy = Copy(X, 0, other, 0, 4 * D)
    out = merge_adds([add, copy, Scale(X, scale)], rules())
    assert len(out) == 3 and isinstance(out[2], Scale) and add.scale is None
    add = AddNorm(Y, W, X)
    assert merge_adds([add, copy, RmsNorm(X, XN, W2)], rules()) == [add, copy] and add.next_out is XN
    for between in (Copy(XN, 0, other, 0, 4), Copy(other, 0, XN, 0, 4), Copy(other, 0, X, 0, 4)):
        add = AddNorm(Y, W, X)
        assert len(merge_adds([add, between, RmsNorm(X, XN, W2)], rules())) == 3 and add.next_out is None


def decode_layer_start(*lora_on: str):
    """A one-token layer's start: the previous add with its next norm, then q|k|v and v apart reading xn
    (LoRA deltas on the named projections)."""
    qkv, v = Linear(tensor("qkv"), XN, buf("qkv out")), Linear(tensor("v"), XN, buf("v out"))
    ops = [AddNorm(Y, W, X, next_weight=W2, next_out=XN), qkv, v]
    for name, lin in (("qkv", qkv), ("v", v)):
        if name in lora_on:
            ops.insert(ops.index(lin) + 1, Lora([], XN, lin.y, D))
    return ops


def test_an_add_is_built_by_every_matvec_reading_its_result():
    ops = residual_inputs(decode_layer_start(), rules(residual_inputs=True))
    add, qkv, v = ops
    assert add.built and isinstance(qkv.input, FromAdd) and qkv.input.normed and v.input.add is add


def test_a_lora_delta_reading_the_normed_input_keeps_the_add():
    ops = residual_inputs(decode_layer_start("v"), rules(residual_inputs=True))
    assert not ops[0].built and all(op.input is None for op in ops if isinstance(op, Linear))


def test_readers_of_the_sum_after_its_first_builder_read_the_new_stream():
    """The PLE gate builds the sum (no next norm); its LoRA delta and a later add read the stream as it is."""
    add, later = AddNorm(Y, W, X), AddNorm(buf("ple out"), W, X)
    gate = Linear(tensor("ple gate"), X, buf("ple gate out"))
    residual_inputs([add, gate, Lora([], X, gate.y, D), later], rules(residual_inputs=True))
    assert add.built and gate.input.add is add and not gate.input.normed
    assert not later.built       # nothing reads it: dispatched


def test_a_split_or_routed_matvec_builds_nothing():
    split = Linear(tensor("split", parts=2), XN, buf("out"))
    ops = residual_inputs([AddNorm(Y, W, X, next_weight=W2, next_out=XN), split], rules(residual_inputs=True))
    assert not ops[0].built and split.input is None


def moe_block(lora: bool):
    """A one-token MoE layer's dense down projection, then the router (its norms, matvec, routing)."""
    act, dense, router_in, logits, ids, wts = (buf(n) for n in ("act", "dense", "router in", "logits", "ids", "wts"))
    down = Linear(tensor("down"), act, dense)
    router = Linear(tensor("router", 4), router_in, logits)
    ops = [down] + ([Lora([], act, dense, D)] if lora else []) + [
        RmsNormPair(X, router_in, None, XN, W2), router] + ([Lora([], router_in, logits, 4)] if lora else []) + [
        Route(logits, ids, wts)]
    return ops, down, router


def test_the_routing_rides_on_the_down_projection_the_router_moved_ahead():
    for lora in (False, True):
        ops, down, router = moe_block(lora)
        route = ops[-1]
        out = route_tails(ops, ride=True)
        assert down.route is route and route not in out
        assert out.index(router) < out.index(down) and isinstance(out[0], RmsNormPair)
        ops, down, router = moe_block(lora)
        route = ops[-1]
        out = route_tails(ops, ride=False)       # the same order, the routing its own dispatch
        assert down.route is None and out.index(route) == out.index(down) - 1


def test_the_router_matvec_norms_its_input_and_the_routing_rides_after_fuse():
    ops, down, router = moe_block(lora=False)
    out = fuse(ops, rules(route_tails=True))
    assert out == [router, down] and isinstance(router.input, RmsNormPair) and down.route is not None


def moe_tail_ops():
    dense, f, eo, ids, wts, m = (buf(n) for n in ("dense", "f", "eo", "ids", "wts", "moe"))
    w1, w2 = tensor("post_ffw_norm_1"), tensor("post_ffw_norm_2")
    experts = GpuTensor("experts", 0, (D, D, 4), [])
    return [RmsNorm(dense, f, w1), Experts(experts, buf("a"), eo, ids), Combine(eo, ids, wts, m, None),
            AddNorm(m, w2, f)]


def test_a_moe_layers_tail_is_one_op_unless_taped():
    out = moe_tails(moe_tail_ops())
    assert len(out) == 2 and isinstance(out[1], MoeTail) and out[1].dense_norm.name == "post_ffw_norm_1"
    taped = fuse(moe_tail_ops(), rules(one_token=False, tape=True))
    assert [type(op) for op in taped] == [RmsNorm, Experts, Combine, AddNorm]


def test_a_products_epilogue_waits_for_a_lora_delta():
    gate_up, gu, act = tensor("gate_up", 2 * D), buf("gate_up out"), buf("act")
    lin = Linear(gate_up, XN, gu)
    assert fuse([lin, GegluHalves(gu, act, D)], rules()) == [lin] and lin.epilogue is not None
    lin = Linear(gate_up, XN, gu)
    assert len(fuse([lin, Lora([], XN, gu, 2 * D), GegluHalves(gu, act, D)], rules())) == 3
    gate, times, out = Linear(tensor("ple gate"), X, buf("g")), buf("times"), buf("out")
    assert fuse([gate, GeluTimes(gate.y, times, out, D)], rules()) == [gate] and gate.epilogue.b is times
    chunk = Linear(tensor("ple gate"), X, buf("g"))
    assert len(fuse([chunk, GeluTimes(chunk.y, times, out, D)], rules(one_token=False))) == 2


def mlp(lora_on_down: bool = False, down_qtype: str = "q4_k"):
    """A one-token MLP as recorded: gate|up, the GeGLU, down (a LoRA delta on it if asked)."""
    gate_up, gu, act = tensor("gate_up", 2 * D), buf("gate_up out"), buf("act")
    down = Linear(tensor("down"), act, buf("ffn out"))
    down.w.qtype = down_qtype
    ops = [Linear(gate_up, XN, gu), GegluHalves(gu, act, D), down]
    return ops + ([Lora([], act, down.y, D)] if lora_on_down else [])


def test_the_down_projection_reads_the_geglu_output_rounded_by_its_writer():
    """Where the down projection's type takes rounded x (reads_rounded, asked with its type and the GeGLU's
    width), the gate|up matvec writes its output rounded too and down reads those codes; a LoRA delta on
    down still reads the f32 output, which is still written; another type, or no rule, leaves both plain."""
    asked = []

    def reads_rounded(qtype, k):
        asked.append((qtype, k))
        return qtype == "q4_k"
    for lora in (False, True):
        gate_up, down = fuse(mlp(lora), rules(reads_rounded=reads_rounded))[:2]
        assert gate_up.rounds_out and isinstance(gate_up.epilogue, GegluHalves) and isinstance(down.input, RoundedInput)
    assert asked == [("q4_k", D)] * 2
    gate_up, down = fuse(mlp(down_qtype="f16"), rules(reads_rounded=reads_rounded))
    assert not gate_up.rounds_out and down.input is None
    gate_up, down = fuse(mlp(), rules())
    assert not gate_up.rounds_out and down.input is None
    unfused = rounded_inputs(mlp(), reads_rounded)      # no GeGLU epilogue (a chunk): nothing to round
    assert not unfused[0].rounds_out and unfused[2].input is None


def test_a_chunk_geglu_rounds_the_down_projections_input():
    """A chunk's GeGLU followed by a down projection that takes int8 activations (quantized_inputs, asked
    with its type and the GeGLU's width) rounds its rows into state.xq itself and down reads them; the f32
    rows are written only for a LoRA delta on down; another type, a tape, a one-token step or no rule
    leave both as they were."""
    asked = []

    def quantized(qtype, k):
        asked.append((qtype, k))
        return qtype == "q4_k"
    chunk = dict(one_token=False, quantized_inputs=quantized)
    for lora in (False, True):
        _, geglu, down = fuse(mlp(lora), rules(**chunk))[:3]
        assert geglu.quantizes and geglu.keep == lora and isinstance(down.input, QuantizedInput)
    assert asked.count(("q4_k", D)) == 2           # down's type and the GeGLU's width (gate|up asked too)
    for plain in (fuse(mlp(down_qtype="f16"), rules(**chunk)), fuse(mlp(), rules(**chunk, tape=True)),
                  fuse(mlp(), rules(one_token=False))):
        _, geglu, down = plain[:3]
        assert not geglu.quantizes and down.input is None
    gate_up, down = fuse(mlp(), rules(quantized_inputs=quantized))[:2]     # one token: the GeGLU rides on gate|up
    assert isinstance(gate_up.epilogue, GegluHalves) and not gate_up.epilogue.quantizes


def test_chunk_projections_of_one_x_share_its_rounding():
    """A chunk's q, k and v projections of one normed x: the first rounds x to int8, the others read those
    codes (QuantizedInput), a LoRA delta and q's norm between them included; a projection of another x
    (it rounds its own into state.xq), and one of the same x after it or after an op that writes x, round
    their own; no rule (a tape, f32 only) leaves them all plain."""
    xn2 = buf("other x")
    q, k, v, o, o2 = (Linear(tensor(n), XN, buf(n + " out")) for n in ("q", "k", "v", "o", "o2"))
    other = Linear(tensor("other"), xn2, buf("other out"))
    ops = [q, Lora([], XN, q.y, D), RmsNorm(q.y, q.y, W), k, v, other, o, RmsNorm(X, XN, W), o2]
    fuse(ops, rules(one_token=False, quantized_inputs=lambda qtype, k: True))
    assert q.input is None and isinstance(k.input, QuantizedInput) and isinstance(v.input, QuantizedInput)
    assert other.input is None and o.input is None and o2.input is None
    q, k = (Linear(tensor(n), XN, buf(n + " out")) for n in ("q", "k"))
    fuse([q, k], rules(one_token=False, tape=True, quantized_inputs=lambda qtype, k: True))
    assert k.input is None
    fuse([q, k], rules(one_token=False))
    assert k.input is None


def test_a_chunk_residual_add_rounds_its_next_pre_norm():
    """A chunk's residual add whose next pre-norm is first read by a projection that takes int8 rounds those
    rows into state.xq itself (AddNorm.quantizes): that projection and the later ones of the same x read the
    codes; the f32 rows are written only for a reader of them (a LoRA delta). A reader of the f32 rows first,
    an op between that rounds into state.xq, a type without int8, a tape or no rule: the add does not round."""
    def layer_start(*between, lora=False):
        add = AddNorm(Y, W, X, next_weight=W2, next_out=XN)
        q, k, v = (Linear(tensor(n), XN, buf(n + " out")) for n in ("q", "k", "v"))
        return add, q, k, v, [add, *between, q] + ([Lora([], XN, q.y, D)] if lora else []) + [k, v]
    int8 = lambda qtype, k: qtype != "f16"          # noqa: E731
    chunk = dict(one_token=False, quantized_inputs=int8)
    for lora in (False, True):
        add, q, k, v, ops = layer_start(lora=lora)
        fuse(ops, rules(**chunk))
        assert add.quantizes and add.keep == lora
        assert all(isinstance(p.input, QuantizedInput) for p in (q, k, v))
    add, q, k, v, ops = layer_start(RmsNorm(XN, buf("normed"), W))          # the f32 rows read first
    fuse(ops, rules(**chunk))
    assert not add.quantizes and q.input is None and isinstance(k.input, QuantizedInput)
    other = Linear(tensor("other"), buf("other x"), buf("other out"))      # rounds its own x into state.xq
    add, q, k, v, ops = layer_start(other)
    fuse(ops, rules(**chunk))
    assert not add.quantizes and q.input is None and other.input is None
    add, q, k, v, ops = layer_start()
    q.w.qtype = "f16"
    fuse(ops, rules(**chunk))
    assert not add.quantizes and q.input is None and isinstance(v.input, QuantizedInput)   # k rounds, v shares
    for plain in (rules(**chunk, tape=True), rules(one_token=False), rules(quantized_inputs=int8)):
        add, q, k, v, ops = layer_start()
        fuse(ops, plain)
        assert not add.quantizes and q.input is None


def test_a_quantizing_add_ends_the_sharing_of_another_x():
    """Projections of one x share its codes only until an op writes state.xq: a residual add that rounds
    another x there is such an op, so a projection of the first x after it rounds its own again."""
    xa = buf("first x")
    a1, a2 = (Linear(tensor(n), xa, buf(n + " out")) for n in ("a1", "a2"))
    add = AddNorm(Y, W, X, next_weight=W2, next_out=XN)
    q = Linear(tensor("q"), XN, buf("q out"))
    fuse([a1, add, q, a2], rules(one_token=False, quantized_inputs=lambda qtype, k: True))
    assert add.quantizes and isinstance(q.input, QuantizedInput) and a1.input is None and a2.input is None


def test_a_chunk_residual_add_rounds_the_stream_for_the_gate_reading_it():
    """A residual add without a next pre-norm whose sum (the stream) is first read by a projection taking int8
    (Gemma 4's per-layer-input gate) rounds the sum into state.xq (AddNorm.quantizes, no f32 rows to drop: the
    stream stays written); a reader of the stream first, or a type without int8, leaves the projection its own
    rounding."""
    int8 = lambda qtype, k: qtype != "f16"          # noqa: E731
    add, gate = AddNorm(Y, W, X), Linear(tensor("ple gate", 16), X, buf("gate out"))
    fuse([add, gate, GeluTimes(gate.y, buf("ple"), buf("act"), 16)], rules(one_token=False, quantized_inputs=int8))
    assert add.quantizes and add.keep and isinstance(gate.input, QuantizedInput)
    add, gate = AddNorm(Y, W, X), Linear(tensor("ple gate", 16), X, buf("gate out"))
    fuse([add, Copy(X, 0, buf("other"), 0, 4), gate], rules(one_token=False, quantized_inputs=int8))
    assert not add.quantizes and gate.input is None
    add, gate = AddNorm(Y, W, X), Linear(tensor("ple gate", 16), X, buf("gate out"))
    gate.w.qtype = "f16"
    fuse([add, gate], rules(one_token=False, quantized_inputs=int8))
    assert not add.quantizes and gate.input is None


def test_a_chunk_experts_geglu_rounds_the_experts_down_input():
    """The experts' GeGLU (a row for each chosen expert of a token) before the experts' down projection, which
    reads those rows (per_slot_input) as int8: the GeGLU rounds them into state.xq and the down reads the codes;
    an experts' projection of the tokens' rows (not per slot), or a type without int8, rounds its own."""
    int8 = lambda qtype, k: qtype != "f16"          # noqa: E731
    ids, act = buf("ids"), buf("act")

    def experts_mlp(per_slot=True):
        gate_up = Experts(tensor("experts gate_up", 2 * D), XN, buf("gate_up out"), ids)
        geglu = GegluHalves(gate_up.y, act, D, 4)
        down = Experts(tensor("experts down"), act, buf("experts out"), ids, per_slot_input=per_slot)
        return [gate_up, geglu, down]
    _, geglu, down = fuse(experts_mlp(), rules(one_token=False, quantized_inputs=int8))
    assert geglu.quantizes and not geglu.keep and isinstance(down.input, QuantizedInput)
    _, geglu, down = fuse(experts_mlp(per_slot=False), rules(one_token=False, quantized_inputs=int8))
    assert not geglu.quantizes and down.input is None
    ops = experts_mlp()
    ops[2].w.qtype = "f16"
    _, geglu, down = fuse(ops, rules(one_token=False, quantized_inputs=int8))
    assert not geglu.quantizes and down.input is None


def test_a_chunk_geglu_keeps_its_rows_only_for_a_reader_before_the_next_geglu():
    """Two layers' MLPs sharing the GeGLU's output buffer: each GeGLU writes its f32 rows only for a reader of
    them before the next layer's GeGLU writes that buffer again (a LoRA delta on its own down projection), not
    for the next layer's down projection, which reads the next GeGLU's codes."""
    def layers(lora_on_second: bool):
        act, gu = buf("act"), buf("gate_up out")
        ops = []
        for layer in range(2):
            down = Linear(tensor(f"down {layer}"), act, buf(f"ffn out {layer}"))
            ops += [Linear(tensor(f"gate_up {layer}", 2 * D), XN, gu), GegluHalves(gu, act, D), down]
            if layer == 1 and lora_on_second:
                ops.append(Lora([], act, down.y, D))
        return ops
    for lora in (False, True):
        ops = fuse(layers(lora), rules(one_token=False, quantized_inputs=lambda qtype, k: True))
        first, second = (op for op in ops if isinstance(op, GegluHalves))
        assert first.quantizes and second.quantizes and not first.keep and second.keep == lora


def test_a_chunk_projection_leaves_its_slices_to_the_add_right_after_it():
    """sums_in_norms: a chunk's projection whose output the residual add right after it reads (and nothing later)
    leaves its slices of K unsummed for that add (Linear.sums_left). Not with a LoRA delta between, a tensor
    of row blocks, its output read again later, a tape, one token or a few."""
    def o_proj(parts=1, lora=False, read_later=False):
        lin = Linear(tensor("o", parts=parts), buf("attn"), buf("o out"))
        add = AddNorm(lin.y, W, X, next_weight=W2, next_out=XN)
        ops = [lin] + ([Lora([], lin.x, lin.y, D)] if lora else []) + [add]
        return lin, ops + ([RmsNorm(lin.y, buf("again"), W)] if read_later else [])
    lin, ops = o_proj()
    fuse(ops, rules(one_token=False))
    assert lin.sums_left
    for kw in (dict(lora=True), dict(parts=2), dict(read_later=True)):
        lin, ops = o_proj(**kw)
        fuse(ops, rules(one_token=False))
        assert not lin.sums_left, kw
    for plan in (rules(one_token=False, tape=True), rules(), rules(one_token=False, few=True)):
        lin, ops = o_proj()
        fuse(ops, plan)
        assert not lin.sums_left
