"""Fusion: rules over the recorded ops (pyapp.runtime.lowering), run by Ops.finish before lowering.

The model records one op per reference op (pyapp.model.gemma4); these rules rewrite that list so that a
step dispatches few kernels (the table in pyapp.runtime.ops says which kernel replaces which reference
ops). A rule looks only at the ops' kinds, the buffers they read and write, and the plan's shape
(`Rules`), so a LoRA delta, recorded as one more op after its projection, is just another reader of the
projection's x and y.

A rule that leaves a value unwritten (moe_tails: the experts' sum; epilogues: the [gate | up] outputs;
residual_inputs: the pre-norm output; quantized_geglu, unread_norm_outputs: f32 rows rounded to int8;
sums_in_norms: a projection's output left in slices of K) applies only when no later op of the plan reads it;
a tape (training's forward kept for its backward,
which reads every value) skips each of those that run on a chunk. Rules that move ops (route_tails) move
them only within one Plan (not across a streamed experts' round) and only past ops they are independent of.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..gpu import Buffer
from .lowering import (AddNorm, Attend, AttendCanvas, Combine, ExpertRoundsBegin, ExpertRoundsEnd, Experts, FromAdd,
                       FromSplits, GegluHalves, GeluTimes, Linear, MoeTail, Op, QuantizedInput, RmsNorm, RmsNormPair,
                       RoundedAsOneToken, RoundedInput, Route, Scale, buffer_of)

BARRIERS = (ExpertRoundsBegin, ExpertRoundsEnd)      # a plan boundary: nothing moves or merges across it


@dataclass(frozen=True)
class Rules:
    """Which rules a plan takes (pyapp.runtime.ops decides from its shape and the device)."""
    hidden: int
    stream: Buffer                 # state.x, the residual stream
    one_token: bool                # a decode step (T = 1)
    few: bool                      # speculative decoding's step of a token and its drafts
    tape: bool = False             # every value kept (training's forward for its backward)
    route_tails: bool = False      # the routing may ride on a matvec (the runner's decode fusions)
    residual_inputs: bool = False  # the adds into the stream may be built by their readers (needs 9 buffers)
    reads_rounded: object = None   # (qtype, k) -> whether a one-token matvec of qtype takes its k-long x as
                                   # int8 codes its producer stores (K.RoundedX); None: never (a few-token plan
                                   # then rounds those inputs as the one-token plan does)
    quantized_inputs: object = None   # (qtype, k) -> whether a chunk's matmul of qtype takes its k-long x as
                                      # int8 (K.int8_matmul); None: never (a tape, a few tokens, f32 only)
    combined_inputs: object = None    # (Attend, Linear) -> whether a one-token attention's output may be left as
                                      # its split's partials for that matvec reading it to combine; None: never


def fuse(ops: list, rules: Rules) -> list:
    ops = merge_adds(ops, rules)
    if not rules.tape:
        ops = moe_tails(ops)
    if rules.one_token or rules.few:
        ops = epilogues(ops, rules)
    if rules.one_token:
        ops = norm_inputs(ops)
        ops = route_tails(ops, rules.route_tails)
    if rules.residual_inputs:
        ops = residual_inputs(ops, rules)
    if rules.one_token and rules.combined_inputs is not None:
        ops = combined_inputs(ops, rules.combined_inputs)
    if rules.one_token and rules.reads_rounded is not None:
        ops = rounded_inputs(ops, rules.reads_rounded)
    if rules.few and rules.reads_rounded is not None:
        ops = rounded_as_one_token(ops, rules.reads_rounded)
    if not (rules.one_token or rules.few or rules.tape) and rules.quantized_inputs is not None:
        ops = quantized_geglu(ops, rules.quantized_inputs)
        ops = quantized_norms(ops, rules.quantized_inputs)
        ops = shared_quantized_inputs(ops, rules.quantized_inputs)
        ops = unread_norm_outputs(ops)
    if not (rules.one_token or rules.few or rules.tape):
        ops = sums_in_norms(ops)
    return ops


# -- what an op touches ----------------------------------------------------------------------------------

def reads(op: Op) -> set:
    return {id(buffer_of(b)) for b in op.reads() if b is not None}


def writes(op: Op) -> set:
    return {id(buffer_of(b)) for b in op.writes() if b is not None}


def matvec(op: Op) -> bool:
    """A projection that a one-token plan runs as one matvec dispatch (not split into row blocks)."""
    return isinstance(op, Linear) and len(op.w.parts) == 1


def plain_matvec(op: Op) -> bool:
    """One matvec reading its x from a buffer and writing y, nothing fused into it yet."""
    return matvec(op) and op.input is None and op.route is None and op.epilogue is None


def read_later(ops: list, i: int, buf) -> bool:
    """Whether an op after ops[i] reads buf's value before something writes buf again."""
    b = id(buffer_of(buf))
    for op in ops[i + 1:]:
        if b in reads(op):
            return True
        if b in writes(op):
            return False
    return False


def last_add(done: list, into, readers_ok: bool = True, untouched=None) -> AddNorm | None:
    """The last AddNorm into `into` among the ops done, if nothing since has written `into` (or read it,
    unless readers_ok) or touched `untouched`."""
    b = id(into)
    u = id(untouched) if untouched is not None else None
    for op in reversed(done):
        if isinstance(op, AddNorm) and op.into is into:
            return op
        if isinstance(op, BARRIERS):
            return None
        r, w = reads(op), writes(op)
        if b in w or (not readers_ok and b in r) or (u is not None and (u in r or u in w)):
            return None
    return None


# -- the rules -------------------------------------------------------------------------------------------

def merge_adds(ops: list, rules: Rules) -> list:
    """A layer scale right after an add (nothing reading the sum between) becomes the add's scale; a
    weighted rms_norm of an add's sum (nothing writing the sum or touching the norm's output between)
    becomes the add's second output: add_normed writes both, in one dispatch. So a layer's last add
    also writes the next layer's attn_norm input."""
    out: list = []
    for op in ops:
        if isinstance(op, Scale):
            add = last_add(out, op.x, readers_ok=False)
            if add is not None and add.scale is None and add.next_out is None:
                add.scale = op.factor
                continue
        elif (isinstance(op, RmsNorm) and op.weight is not None and op.dim in (None, rules.hidden)
              and op.rows_per_token == 1 and op.scale == 1.0):
            add = last_add(out, op.x, untouched=op.y)
            if add is not None and add.next_out is None:
                add.next_weight, add.next_out = op.weight, op.y
                continue
        out.append(op)
    return out


def moe_tails(ops: list) -> list:
    """A MoE layer's output, f = rms_norm(dense) * n1 + rms_norm(sum_j w_j y_j) * n2: the dense norm
    (recorded before the experts), the experts' weighted sum and the add of its norm into f become one
    moe_tail dispatch where the sum is written, when nothing else reads the sum."""
    out: list = []
    for i, op in enumerate(ops):
        if (isinstance(op, AddNorm) and out and isinstance(out[-1], Combine) and out[-1].out is op.y
                and op.scale is None and op.next_out is None and not read_later(ops, i, op.y)):
            norm = _dense_norm(out[:-1], op.into)
            if norm is not None:
                combine = out.pop()
                out.remove(norm)
                out.append(MoeTail(norm.x, norm.weight, combine.expert_out, combine.ids, combine.weights,
                                   combine.down_scale, op.weight, op.into))
                continue
        out.append(op)
    return out


def _dense_norm(done: list, f) -> RmsNorm | None:
    """The weighted rms_norm that wrote f last, if nothing since has read or written f or written its input.
    (Its work moves later, into the tail after the experts: streamed experts' rounds between are fine.)"""
    fb = id(f)
    for k in range(len(done) - 1, -1, -1):
        op = done[k]
        if isinstance(op, RmsNorm) and op.y is f:
            if op.weight is None or op.rows_per_token != 1 or op.scale != 1.0:
                return None
            x = id(op.x)
            return op if not any(x in writes(o) for o in done[k + 1:]) else None
        if fb in reads(op) or fb in writes(op):
            return None
    return None


def epilogues(ops: list, rules: Rules) -> list:
    """A one-token projection followed by the product of its outputs: gelu(gate) * up of a [gate | up]
    projection (the dense MLP; the experts', for a few tokens too) or gelu(y) * b (the PLE gate) is done
    by the matvec before it writes, when nothing else reads the projection's outputs."""
    out: list = []
    for i, op in enumerate(ops):
        prev = out[-1] if out else None
        if isinstance(op, GegluHalves) and not read_later(ops, i, op.src):
            if (rules.one_token and matvec(prev) and prev.epilogue is None and prev.y is op.src
                    and op.rows_per_token == 1):
                prev.epilogue = op
                continue
            if isinstance(prev, Experts) and prev.epilogue is None and prev.y is op.src:
                prev.epilogue = op
                continue
        if (isinstance(op, GeluTimes) and rules.one_token and matvec(prev) and prev.epilogue is None
                and prev.y is op.a and op.b is not prev.y and not read_later(ops, i, op.a)):
            prev.epilogue = op
            continue
        out.append(op)
    return out


def norm_inputs(ops: list) -> list:
    """A one-token matvec right after the two norms of its input (the MoE router: its input, and the
    experts' beside it) builds them in its workgroups, the first writing both outputs."""
    out: list = []
    for op in ops:
        prev = out[-1] if out else None
        if isinstance(prev, RmsNormPair) and matvec(op) and op.x is prev.y and op.input is None:
            op.input = out.pop()
        out.append(op)
    return out


def route_tails(ops: list, ride: bool) -> list:
    """A one-token routing (softmax, top-k, renormalize) rides as one workgroup more on a plain matvec's
    dispatch: the nearest one before the router that the router does not depend on (the dense MLP's
    down projection). The router's ops move ahead of that matvec, and so does the routing where it may
    not ride (ride False): a plan without the fusion is the plan with it, the routing dispatched apart.
    Where there is no such matvec, nothing moves."""
    for route in [op for op in ops if isinstance(op, Route)]:
        ops = _ride(ops, ops.index(route), ride) or ops
    return ops


def _ride(ops: list, i: int, ride: bool) -> list | None:
    """ops with the routing at i (and the ops it depends on) moved ahead of its carrier, or None."""
    route = ops[i]
    need, j = reads(route), i          # the ops right before the routing that it depends on
    while j > 0 and not isinstance(ops[j - 1], BARRIERS) and writes(ops[j - 1]) & need:
        j -= 1
        need |= reads(ops[j])
    block = ops[j:i] + [route]
    block_reads = set().union(*(reads(o) for o in block))
    block_writes = set().union(*(writes(o) for o in block))
    for k in range(j - 1, -1, -1):
        op = ops[k]
        if isinstance(op, BARRIERS):
            return None
        if block_writes & (reads(op) | writes(op)) or block_reads & writes(op):
            return None
        if plain_matvec(op):
            if ride:
                op.route = block.pop()
            return ops[:k] + block + ops[k:j] + ops[i + 1:]
    return None


def residual_inputs(ops: list, rules: Rules) -> list:
    """An add into the residual stream (and its pre-norm output) dispatches nothing when its first reader,
    and every reader of the pre-norm output, is a one-token matvec reading that value whole: each builds it
    in every workgroup. Readers of the stream after the first then read the stream's other buffer."""
    for i, add in enumerate(ops):
        if not (isinstance(add, AddNorm) and add.into is rules.stream):
            continue
        readers = _readers(ops, i)
        if not readers or not _builds(*readers[0], add):
            continue
        normed = [(op, n) for op, n in readers if n]
        if not all(_builds(op, n, add) for op, n in normed):
            continue
        add.built = True
        for op, n in [readers[0]] + normed:
            op.input = FromAdd(add, n)
    return ops


def combined_inputs(ops: list, combines) -> list:
    """A one-token attention dispatches no combine when the only reader of its output (before anything writes it
    again) is a plain matvec reading it whole, with no other attention between them (they share the partials'
    scratch): the o projection, whose workgroups combine the split's partials into their x."""
    for i, att in enumerate(ops):
        if not isinstance(att, Attend):
            continue
        out, readers, crossed = id(buffer_of(att.out)), [], False
        for op in ops[i + 1:]:
            if out in reads(op):
                readers.append((op, crossed))
            if out in writes(op):
                break
            crossed = crossed or isinstance(op, (Attend, AttendCanvas, *BARRIERS))
        if len(readers) != 1 or readers[0][1]:
            continue
        reader = readers[0][0]
        if plain_matvec(reader) and reader.x is att.out and combines(att, reader):
            att.combined = True
            reader.input = FromSplits(att)
    return ops


def _readers(ops: list, i: int) -> list:
    """[(op, normed)] of the ops that read ops[i]'s sum (normed False) or its pre-norm output (True)."""
    add = ops[i]
    raw, normed = id(add.into), id(add.next_out) if add.next_out is not None else None
    out = []
    for op in ops[i + 1:]:
        r, w = reads(op), writes(op)
        if raw is not None and raw in r:
            out.append((op, False))
        elif normed is not None and normed in r:
            out.append((op, True))
        if raw is not None and raw in w:
            raw = None
        if normed is not None and normed in w:
            normed = None
        if raw is None and normed is None:
            break
    return out


def _builds(op: Op, normed: bool, add: AddNorm) -> bool:
    """Whether op is a one-token matvec reading the add's sum (or pre-norm output) whole as its x."""
    return matvec(op) and op.input is None and op.route is None and op.x is (add.next_out if normed else add.into)


def rounded_down(later: list, geglu: GegluHalves, reads_rounded) -> Linear | None:
    """The first op of `later` that reads the GeGLU's output, where it is a one-dispatch down projection of a
    type that takes those rows as int8 codes stored by their producer (reads_rounded): the reader that
    rounded_inputs and rounded_as_one_token mark."""
    reader = next((o for o in later if id(buffer_of(geglu.out)) in reads(o)), None)
    if (matvec(reader) and reader.input is None and reader.epilogue is None and reader.x is geglu.out
            and reads_rounded(reader.w.qtype, geglu.ff)):
        return reader
    return None


def rounded_inputs(ops: list, reads_rounded) -> list:
    """The GeGLU's output of a one-token MLP, read first by a matvec (the down projection) that takes x
    rounded to int8 (reads_rounded): the GeGLU's matvec also writes it so rounded (its workgroups hold
    whole blocks of 32 rows), and the reader takes those codes instead of rounding x in each of its
    workgroups. The f32 output is still written: a LoRA delta on the down projection reads it."""
    for i, op in enumerate(ops):
        if not (matvec(op) and isinstance(op.epilogue, GegluHalves)):
            continue
        reader = rounded_down(ops[i + 1:], op.epilogue, reads_rounded)
        if reader is not None:
            op.rounds_out = True
            reader.input = RoundedInput()
    return ops


def rounded_as_one_token(ops: list, reads_rounded) -> list:
    """A few-token step's MLP whose one-token plan has the down projection read the GeGLU's rows as int8 codes
    (rounded_inputs: a one-dispatch [gate | up] matvec, then a one-dispatch down of a type that reads them):
    the down rounds those rows too (RoundedAsOneToken; quantize_q8's rule is the GeGLU's), so that a speculative
    step's check and plain decoding round the same values."""
    for i, op in enumerate(ops):
        if not (isinstance(op, GegluHalves) and op.rows_per_token == 1 and i > 0 and matvec(ops[i - 1])
                and ops[i - 1].y is op.src and not read_later(ops, i, op.src)):
            continue
        reader = rounded_down(ops[i + 1:], op, reads_rounded)
        if reader is not None:
            reader.input = RoundedAsOneToken()
    return ops


def quantized_geglu(ops: list, quantized_inputs) -> list:
    """A chunk's GeGLU whose output the next op (the down projection: a token's row, or the chosen experts'
    rows of each token) takes as int8 (quantized_inputs): the GeGLU rounds its rows into state.xq in the same
    kernel (quantize_q8's geglu) and the matmul reads them (QuantizedInput) instead of rounding them again. The
    f32 output is written only where a later op reads it too (a LoRA delta on the down projection)."""
    def reads_its_rows(reader, geglu) -> bool:
        if isinstance(reader, Linear):
            return geglu.rows_per_token == 1 and reader.epilogue is None
        return (isinstance(reader, Experts) and reader.per_slot_input and geglu.rows_per_token > 1
                and reader.epilogue is None)
    for i, op in enumerate(ops[:-1]):
        reader = ops[i + 1]
        if not (isinstance(op, GegluHalves) and reads_its_rows(reader, op) and reader.x is op.out
                and reader.input is None and quantized_inputs(reader.w.qtype, op.ff)):
            continue
        op.quantizes = True
        reader.input = QuantizedInput()
        op.keep = reads_f32_rows(ops[i + 1:], op.out)
    return ops


def reads_f32_rows(later: list, out: Buffer) -> bool:
    """Whether an op of `later` reads the f32 rows of `out` (that an op rounded into state.xq) other than as
    those codes (a matmul's QuantizedInput of x = out): a LoRA delta, a projection rounding its own; up to the
    next op that writes out."""
    for op in later:
        if (id(buffer_of(out)) in reads(op)
                and not (isinstance(getattr(op, "input", None), QuantizedInput) and op.x is out)):
            return True
        if id(buffer_of(out)) in writes(op):
            return False
    return False


def takes_int8(op, quantized_inputs) -> bool:
    """A chunk's projection that would round its own x to int8 (state.xq) before its int8 matmul."""
    return (isinstance(op, Linear) and op.input is None and op.epilogue is None
            and quantized_inputs(op.w.qtype, op.w.shape[0]))


def rounds_into_xq(op) -> bool:
    """Whether op may write state.xq (a projection rounding its x, the experts', a GeGLU or a residual add
    that rounds): where one x's codes stop being there for a later reader."""
    return (isinstance(op, (Linear, Experts, GegluHalves) + BARRIERS)
            or isinstance(op, AddNorm) and op.quantizes)


def quantized_norms(ops: list, quantized_inputs) -> list:
    """A chunk's residual add whose result is first read by a projection that takes it as int8
    (quantized_inputs) — its next pre-norm (next_out), or without one the sum itself (the stream, which
    Gemma 4's per-layer-input gate reads) — rounds those rows into state.xq too (norm.wgsl's add_normed_q8,
    add_q8) and the projection reads them (QuantizedInput) instead of rounding them again; the projections
    after it of the same x share them (shared_quantized_inputs), and unread_norm_outputs drops a next_out's
    f32 rows where no other op reads them."""
    for i, op in enumerate(ops):
        if not (isinstance(op, AddNorm) and not op.built):
            continue
        result = op.next_out if op.next_out is not None else op.into
        out = id(buffer_of(result))
        for reader in ops[i + 1:]:
            if out in reads(reader):
                if takes_int8(reader, quantized_inputs) and reader.x is result:
                    op.quantizes = True
                    reader.input = QuantizedInput()
                break
            if rounds_into_xq(reader) or isinstance(reader, AddNorm) or out in writes(reader):
                break           # another add may yet be made to round into state.xq: codes do not pass one
    return ops


def unread_norm_outputs(ops: list) -> list:
    """A residual add that rounds its next pre-norm into state.xq writes the f32 rows only where an op reads
    them other than as those codes (reads_f32_rows)."""
    for i, op in enumerate(ops):
        if isinstance(op, AddNorm) and op.quantizes and op.next_out is not None:
            op.keep = reads_f32_rows(ops[i + 1:], op.next_out)
    return ops


def shared_quantized_inputs(ops: list, quantized_inputs) -> list:
    """Chunk matmuls reading one x (a layer's q, k and v projections of the normed x): the first rounds x to
    int8 into state.xq (or an earlier op did: quantized_norms), the later ones read it there (QuantizedInput),
    as long as no op between writes x or state.xq (rounds_into_xq; a norm of q or a LoRA delta does not)."""
    for i, first in enumerate(ops):
        if not (takes_int8(first, quantized_inputs)
                or isinstance(first, Linear) and isinstance(first.input, QuantizedInput)):
            continue
        for op in ops[i + 1:]:
            if id(buffer_of(first.x)) in writes(op):
                break
            if takes_int8(op, quantized_inputs) and op.x is first.x and op.w.shape[0] == first.w.shape[0]:
                op.input = QuantizedInput()
            elif rounds_into_xq(op):
                break
    return ops


def sums_in_norms(ops: list) -> list:
    """A chunk's projection whose only reader is the residual add right after it (the o and down projections
    into their post-norms) leaves a matmul's slices of K unsummed: the add sums them as it reads (no
    sum_slices dispatch). Not a tensor of row blocks (each would leave its own slices), nor a projection a
    LoRA delta adds to (that delta is the op after it), nor y read again later."""
    for i, op in enumerate(ops[:-1]):
        add = ops[i + 1]
        if isinstance(op, Linear) and len(op.w.parts) == 1 and op.epilogue is None \
                and isinstance(add, AddNorm) and not add.built and add.y is op.y and not read_later(ops, i + 1, op.y):
            op.sums_left = True
    return ops
