"""The ops the recorder keeps (pyapp.runtime.ops), and how each becomes kernels.

One record per op the model calls (a few for the ops that stand for several reference ops: `geglu`
records the projection and the GeGLU), each with the buffers it reads and writes, which is all the
fusion rules (pyapp.runtime.fusion) look at. A rule may fill a record's fusion slots:

  Linear.input      the one-token matvec builds its x itself: from an add into the residual stream
                    (`FromAdd`: K.ResidualInput) or by norming a row (`RmsNormPair`: K.NormInput)
  Linear.route      one workgroup more in the matvec's dispatch routes a MoE token (`Route`: K.RouteTail)
  Linear.epilogue   the matvec's outputs go through gelu(gate) * up (`GegluHalves`) or gelu(y) * b
                    (`GeluTimes`) before they are written
  Linear.rounds_out the matvec also writes its outputs rounded to int8 (K.RoundedX in state.act_q8), and
                    the matvec reading them takes those codes as its x (`RoundedInput`)
  Linear.sums_left  a chunk's matmul over slices of K leaves their partial sums for the AddNorm after it,
                    which adds them as it reads its y (no sum_slices dispatch)
  Experts.epilogue  the same GeGLU in the expert matvec
  AddNorm.built     (one token, into the residual stream) its consumers build it: no dispatch

`reads()`/`writes()` name the values an op consumes and produces; the scratch a kernel uses inside
(state.xq, expert_groups, the attention partials) is not listed: the rules move ops only in one-token
plans and only norms, matvecs, LoRA deltas and routings, which use none.

`lower(L)` records the kernels into L.plan, by the plan's shape (`Lowering`: one token, a few tokens,
or a chunk). The residual stream, state.x, lives in state.x or state.x_alt while adds are built by
their consumers (their first workgroup writes the new stream into the other buffer); `Lowering.now`
says where.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..gpu import Buffer
from ..gpu import kernels as K
from .experts import ExpertRounds
from .upload import GpuTensor


def buffer_of(r) -> Buffer:
    """The buffer of a binding: a Buffer or (Buffer, offset, size)."""
    return r[0] if isinstance(r, tuple) else r


def _buf(t: GpuTensor | None) -> Buffer | None:
    return t.buffer if t is not None else None


class Lowering:
    """What lowering needs: the device, the step's uniform, the plan's shape and where the stream lives."""

    def __init__(self, dev, cfg, state, plan, T: int, step: Buffer, few: bool, int8: bool, int8_x: bool,
                 f16: bool):
        self.dev, self.cfg, self.s, self.T, self.step, self.few = dev, cfg, state, T, step, few
        self.eps = cfg.eps
        self.int8 = int8                     # chunk matmuls on int8 activations (K.int8_matmul says where)
        self.int8_x = int8_x                 # one-token matvecs on x rounded to int8 (K.int8_matvec says where)
        self.f16 = f16
        self.plan = plan
        self.program: list = [plan]          # Plans and ExpertRounds, in order
        self.stream = state.x                # the buffer holding the residual stream now
        self.grouped_ids = None              # the ids state.expert_groups holds the grouping of (chunk experts)
        self.left_slices = None              # (y, slices): the last matmul's output left in slices of K (sums_left)

    def now(self, buf):
        """The buffer holding buf's value now (the residual stream may live in state.x_alt)."""
        return self.stream if buf is self.s.x else buf

    def other_stream(self) -> Buffer:
        return self.s.x_alt if self.stream is self.s.x else self.s.x

    def rounded(self) -> K.RoundedX:
        """Where a one-token matvec's outputs rounded to int8 live for the next matvec (Linear.rounds_out)."""
        return K.RoundedX(self.s.act_q8, self.s.act_q8_scales)

    def matvec_int8(self, qtype, experts: bool = False, rows: int = 0) -> bool:
        """Whether a one-token matvec of `rows` rows (experts: the expert matvec) takes x rounded to int8."""
        return self.int8_x and self.T == 1 and K.int8_matvec(self.dev, qtype, experts, rows)

    def matvec_tokens(self, qtype, k: int, x: Buffer, blocks: list, as_one_token: bool = False) -> None:
        """y[t, n] = x[t, k] @ W^T for a step of a few tokens, for each (W buffer, n, y, ldy) of blocks (as
        matmul's): on x rounded to int8 (quantized here, once for every block) where K.int8_few_tokens says
        so (where the one-token matvec rounds it too) or as_one_token (where the one-token matvec reads it
        rounded by its producer: RoundedAsOneToken), else on f32 x."""
        dev, s = self.dev, self.s
        int8 = self.int8_x and (as_one_token or K.int8_few_tokens(dev, qtype, k, sum(n for _, n, _, _ in blocks)))
        if int8:
            K.quantize_q8(dev, k, x, s.xq, s.xq_scales, self.step, self.T, plan=self.plan)
        for w, n, y, ldy in blocks:
            if int8:
                K.matvec_tokens_x8(dev, qtype, k, n, w, s.xq, s.xq_scales, y, self.step, plan=self.plan, ldy=ldy)
            else:
                K.matvec_tokens(dev, qtype, k, n, w, x, y, self.step, plan=self.plan, ldy=ldy)

    def int8_input(self, qtype, k: int, x: Buffer, quantized: bool, rows_per_token: int = 1) -> bool:
        """Whether a chunk's matmul of qtype (dense or the experts') takes its k-long rows of x as int8 (where
        K.int8_matmul says so); if it does, they are rounded into state.xq here, once for every block of W,
        unless their producer did (quantized: the op's QuantizedInput)."""
        int8 = self.int8 and K.int8_matmul(qtype, k, self.T)
        if quantized and not int8:
            raise AssertionError("x was rounded to int8 for a matmul that does not take it")
        if int8 and not quantized:
            K.quantize_q8(self.dev, k, x, self.s.xq, self.s.xq_scales, self.step, self.T, plan=self.plan,
                          rows_per_token=rows_per_token)
        return int8

    def matmul(self, qtype, k: int, x: Buffer, blocks: list, quantized: bool = False,
               sums_left: bool = False) -> None:
        """y[T, n] = x[T, k] @ W^T for a chunk, for each (W buffer, n, y, ldy) of blocks (a tensor's row
        blocks, each writing its columns of y; ldy 0: y is n wide): quantized weights on int8 activations
        (x quantized here, once for every block, unless its producer did: quantized) where K.int8_matmul
        says so, else the tile (in f16 where self.f16 and the device has shader-f16). sums_left (one block):
        a matmul over slices of K leaves its partial sums in state.matmul_partials for the next op to add
        (self.left_slices), y unwritten."""
        dev, s, T = self.dev, self.s, self.T
        self.check_no_slices_left()
        int8 = self.int8_input(qtype, k, x, quantized)
        room = s.matmul_partials.size // 4 if s.matmul_partials is not None else 0
        if sums_left and len(blocks) != 1:
            raise AssertionError("only a single matmul leaves its slices unsummed")
        for w, n, y, ldy in blocks:
            if int8:
                tile, split = K.q8_shape(dev, n, k, T, room)
                K.matmul_q8(dev, qtype, k, n, w, s.xq, s.xq_scales, y, self.step, T, plan=self.plan, ldy=ldy,
                            tile=tile, split=split, partials=s.matmul_partials, summed=not sums_left)
            else:
                tile, split = K.matmul_shape(dev, n, k, T, room, f16=self.f16)
                K.matmul(dev, qtype, k, n, w, x, y, self.step, n_tokens=T, plan=self.plan, ldy=ldy, tile=tile,
                         split=split, partials=s.matmul_partials, summed=not sums_left)
            if sums_left and split > 1:
                self.left_slices = (y, split)

    def slices_of(self, y: Buffer) -> tuple:
        """(buffer, slices) to read y from: state.matmul_partials where the matmul writing y left its slices
        of K unsummed (matmul's sums_left), else (y, 1)."""
        left = self.left_slices
        if left is not None and left[0] is y:
            self.left_slices = None
            return self.s.matmul_partials, left[1]
        self.check_no_slices_left()
        return y, 1

    def check_no_slices_left(self) -> None:
        """Slices a matmul left unsummed (matmul's sums_left) are read before another matmul or the plan's end."""
        if self.left_slices is not None:
            raise AssertionError("a matmul's unsummed slices were not read by the op after it")

    def finish(self) -> list:
        """The stream back in state.x, where the head plans read it; the program."""
        self.check_no_slices_left()
        if self.stream is not self.s.x:
            self.plan.copy(self.stream, 0, self.s.x, 0, 4 * self.cfg.hidden)
            self.stream = self.s.x
        return self.program


class Op:
    """A recorded op: the buffers (or bindings) it reads and writes; lower(L) records its kernels."""

    def reads(self) -> tuple:
        return ()

    def writes(self) -> tuple:
        return ()

    def lower(self, L: Lowering) -> None:
        raise NotImplementedError


# -- projections ------------------------------------------------------------------------------------

@dataclass(eq=False)
class FromAdd:
    """A one-token matvec's x built from an add into the residual stream (K.ResidualInput):
    the stream after the add, or (normed) its next pre-norm."""
    add: "AddNorm"
    normed: bool

    def kernel_input(self) -> K.ResidualInput:
        a = self.add
        return K.ResidualInput(a.y, a.resid_in, a.resid_out, a.weight.buffer, _buf(a.scale),
                               _buf(a.next_weight) if self.normed else None)


@dataclass(eq=False)
class FromSplits:
    """A one-token matvec's x combined from the partial softmax states of the attention before it (Attend with
    combined set: its split only), in every workgroup (K.CombineInput)."""
    attend: "Attend"

    def kernel_input(self, L: "Lowering") -> K.CombineInput:
        a = self.attend
        return K.combine_input(L.s.partials, L.step, L.cfg.n_heads, a.lc.head_dim, L.s.max_keys(a.lc),
                               window=a.window(L.cfg), keys_before=a.keys_before)


@dataclass(eq=False)
class RoundedInput:
    """A one-token matvec's x read as the int8 codes that the matvec writing x stored beside it
    (its rounds_out): no rounding of x in this matvec's workgroups."""


@dataclass(eq=False)
class RoundedAsOneToken:
    """A few-token matvec's x rounded to int8 (quantize_q8, the rule the one-token GeGLU rounds by) because the
    one-token step's matvec of these rows reads it so (RoundedInput): a speculative step checks its drafts
    with the roundings plain decoding makes."""


@dataclass(eq=False)
class QuantizedInput:
    """A chunk's matmul x already rounded to int8 in state.xq by an earlier op (the GeGLU before a down
    projection, the dense one or the experts'; the residual add whose next pre-norm, or whose sum, is x; the
    first of the projections reading one x): no quantize_q8 of its own."""


@dataclass(eq=False)
class Linear(Op):
    """y[T, n] = x[T, k] @ W^T (reference: x @ w.T): a matvec for one token, matvec_tokens for a few,
    the tiled matmul for a chunk; row blocks of a split W each write their columns of y."""
    w: GpuTensor
    x: Buffer
    y: object
    input: object = None                 # FromAdd | FromSplits | RmsNormPair: the matvec builds x; RoundedInput: reads it as int8;
                                         # QuantizedInput: a chunk's x already in state.xq; RoundedAsOneToken: a
                                         # few tokens' x rounded to int8 where one token's is
    route: "Route | None" = None
    epilogue: object = None              # GegluHalves | GeluTimes: written instead of y
    rounds_out: bool = False             # also writes its outputs rounded to int8 (L.rounded())
    sums_left: bool = False              # a chunk's matmul over slices of K leaves their sums to the AddNorm after it

    def reads(self) -> tuple:
        x = (self.input.x,) if isinstance(self.input, RmsNormPair) else (self.x,)
        times = (self.epilogue.b,) if isinstance(self.epilogue, GeluTimes) else ()
        return x + times + (self.route.reads() if self.route else ())

    def writes(self) -> tuple:
        out = self.epilogue.writes() if self.epilogue else (self.y,)
        if isinstance(self.input, RmsNormPair):
            out += self.input.writes()
        return out + (self.route.writes() if self.route else ())

    def lower(self, L: Lowering) -> None:
        w, T, dev, plan = self.w, L.T, L.dev, L.plan
        k, n = w.shape[0], w.shape[1]
        x = L.now(self.x)
        quantized = isinstance(self.input, QuantizedInput)
        if len(w.parts) == 1 and T == 1:
            self._matvec(L, k, n, x)
        elif len(w.parts) == 1 and L.few:
            L.matvec_tokens(w.qtype, k, x, [(w.bound, n, self.y, 0)],
                            as_one_token=isinstance(self.input, RoundedAsOneToken))
        elif len(w.parts) == 1:
            L.matmul(w.qtype, k, x, [(w.bound, n, self.y, 0)], quantized=quantized, sums_left=self.sums_left)
        elif T > 1 and not L.few:
            y = self.y
            L.matmul(w.qtype, k, x, [(p.buffer, p.rows, (y, 4 * p.row0, y.size - 4 * p.row0), n) for p in w.parts],
                     quantized=quantized)
        elif T == 1:
            y = self.y
            for p in w.parts:
                K.matvec(dev, w.qtype, k, p.rows, p.buffer, x, (y, 4 * p.row0, 4 * p.rows), plan=plan,
                         int8=L.matvec_int8(w.qtype, rows=p.rows))
        else:
            y = self.y
            L.matvec_tokens(w.qtype, k, x, [(p.buffer, p.rows, (y, 4 * p.row0, y.size - 4 * p.row0), n)
                                            for p in w.parts])

    def _matvec(self, L: Lowering, k: int, n: int, x: Buffer) -> None:
        """One matvec dispatch, with what the rules fused into it."""
        y, geglu, times = self.y, False, None
        if isinstance(self.epilogue, GegluHalves):           # W holds gate then up rows: n outputs of 2n rows
            y, geglu, n = self.epilogue.out, True, n // 2
        elif isinstance(self.epilogue, GeluTimes):
            y, times = self.epilogue.out, self.epilogue.b
        built, int8, rounded = None, L.matvec_int8(self.w.qtype, rows=n), None
        if isinstance(self.input, FromAdd):
            x, built = None, self.input.kernel_input()
        elif isinstance(self.input, FromSplits):
            x, built = None, self.input.kernel_input(L)
        elif isinstance(self.input, RmsNormPair):           # the router's: its normed input stays f32
            x, built, int8 = None, self.input.kernel_input(L), False
        elif isinstance(self.input, RoundedInput):
            x, rounded = None, L.rounded()
        route = self.route.kernel_tail(L) if self.route is not None else None
        K.matvec(L.dev, self.w.qtype, k, n, self.w.bound, x, y, plan=L.plan, geglu=geglu, gelu_times=times,
                 residual=built, route=route, int8=int8, rounded_x=rounded,
                 round_out=L.rounded() if self.rounds_out else None)


@dataclass(eq=False)
class Lora(Op):
    """y[t, col0 + i] += scale * B (A x[t]) for each (GpuLora, col0) of an adapted projection whose base
    output is already in y (rows of ldy floats)."""
    deltas: list
    x: Buffer
    y: object
    ldy: int

    def reads(self) -> tuple:
        return (self.x, self.y)

    def writes(self) -> tuple:
        return (self.y,)

    def lower(self, L: Lowering) -> None:
        x = L.now(self.x)
        for g, col0 in self.deltas:
            K.lora(L.dev, g.k, g.n, g.rank, g.a, g.b, x, self.y, g.scale, L.step, L.T, ldy=self.ldy, col0=col0,
                   plan=L.plan, bounds=g.bounds)


@dataclass(eq=False)
class GegluHalves(Op):
    """out[r] = gelu(src[r, :ff]) * src[r, ff:] for rows_per_token rows a token ([gate | up] outputs);
    quantizes: also rounded to int8 into state.xq for the matmul after it (its QuantizedInput), out written
    only where keep (another op reads it)."""
    src: Buffer
    out: Buffer
    ff: int
    rows_per_token: int = 1
    quantizes: bool = False
    keep: bool = True

    def reads(self) -> tuple:
        return (self.src,)

    def writes(self) -> tuple:
        return (self.out,)

    def lower(self, L: Lowering) -> None:
        if self.quantizes:
            K.quantize_q8(L.dev, self.ff, self.src, L.s.xq, L.s.xq_scales, L.step, L.T, plan=L.plan,
                          rows_per_token=self.rows_per_token, geglu=True, out=self.out if self.keep else None)
        else:
            K.geglu_halves(L.dev, self.ff, self.rows_per_token, self.src, self.out, L.step, L.T, plan=L.plan)


@dataclass(eq=False)
class GeluTimes(Op):
    """out = gelu(a) * b over rows of n floats."""
    a: Buffer
    b: object
    out: Buffer
    n: int

    def reads(self) -> tuple:
        return (self.a, self.b)

    def writes(self) -> tuple:
        return (self.out,)

    def lower(self, L: Lowering) -> None:
        K.elementwise(L.dev, "geglu", self.n, self.a, L.step, L.T, b=self.b, out=self.out, plan=L.plan)


# -- norms and the residual stream ---------------------------------------------------------------------

@dataclass(eq=False)
class RmsNorm(Op):
    """y = rms_norm(x) [* weight] * scale over rows of `dim` (default hidden) floats."""
    x: Buffer
    y: Buffer
    weight: GpuTensor | None
    dim: int | None = None
    rows_per_token: int = 1
    scale: float = 1.0

    def reads(self) -> tuple:
        return (self.x,)

    def writes(self) -> tuple:
        return (self.y,)

    def lower(self, L: Lowering) -> None:
        K.rms_norm(L.dev, self.dim or L.cfg.hidden, L.now(self.x), self.y, _buf(self.weight), L.step, max_tokens=L.T,
                   rows_per_token=self.rows_per_token, eps=L.eps, scale=self.scale, plan=L.plan)
        if self.y is L.s.x:
            L.stream = L.s.x


@dataclass(eq=False)
class RmsNormPair(Op):
    """y = rms_norm(x) [* weight] * scale and y2 = rms_norm(x) * weight2 (two norms of one x)."""
    x: Buffer
    y: Buffer
    weight: GpuTensor | None
    y2: Buffer
    weight2: GpuTensor
    scale: float = 1.0

    def reads(self) -> tuple:
        return (self.x,)

    def writes(self) -> tuple:
        return (self.y, self.y2)

    def kernel_input(self, L: Lowering) -> K.NormInput:
        """Both norms built by a one-token matvec's workgroups, its x the first (the first workgroup
        writes both outputs)."""
        return K.NormInput(L.now(self.x), self.y, _buf(self.weight), self.weight2.buffer, self.y2, scale=self.scale,
                           eps=L.eps)

    def lower(self, L: Lowering) -> None:
        K.rms_norm_pair(L.dev, L.cfg.hidden, L.now(self.x), self.y, _buf(self.weight), self.y2, self.weight2.buffer,
                        L.step, L.T, eps=L.eps, scale=self.scale, plan=L.plan)


@dataclass(eq=False)
class AddNorm(Op):
    """into = (into + rms_norm(y) * weight) [* scale]; given next_weight, next_out = rms_norm(into) *
    next_weight (norm.wgsl add_normed: both in one dispatch). built: its consumers build it (one token).
    quantizes: the rows the chunk's next matmul reads (next_out; without one, the sum `into`) also rounded to
    int8 into state.xq (the matmul's QuantizedInput), next_out written only where keep (another op reads it)."""
    y: Buffer
    weight: GpuTensor
    into: Buffer
    scale: GpuTensor | None = None
    next_weight: GpuTensor | None = None
    next_out: Buffer | None = None
    built: bool = False
    resid_in: Buffer | None = None       # built: where the stream is read from, and written to
    resid_out: Buffer | None = None
    quantizes: bool = False
    keep: bool = True

    def reads(self) -> tuple:
        return (self.y, self.into)

    def writes(self) -> tuple:
        return (self.into,) + ((self.next_out,) if self.next_out is not None else ())

    def lower(self, L: Lowering) -> None:
        if self.built:
            self.resid_in, self.resid_out = L.stream, L.other_stream()
            L.stream = self.resid_out
            return
        y, slices = L.slices_of(self.y)
        K.add_normed(L.dev, L.cfg.hidden, y, L.now(self.into), self.weight.buffer, L.step, L.T, eps=L.eps,
                     scale=_buf(self.scale), next_out=self.next_out, next_weight=_buf(self.next_weight), plan=L.plan,
                     rounded=(L.s.xq, L.s.xq_scales) if self.quantizes else None, keep=self.keep, x_slices=slices)


@dataclass(eq=False)
class Scale(Op):
    """x *= factor[0] over rows of hidden floats (a layer's output scale)."""
    x: Buffer
    factor: GpuTensor

    def reads(self) -> tuple:
        return (self.x,)

    def writes(self) -> tuple:
        return (self.x,)

    def lower(self, L: Lowering) -> None:
        K.elementwise(L.dev, "scale", L.cfg.hidden, L.now(self.x), L.step, L.T, b=self.factor.buffer, plan=L.plan)


# -- embeddings ----------------------------------------------------------------------------------------

@dataclass(eq=False)
class Embed(Op):
    """out[t] = table[ids[t]] * scale, block by block of rows."""
    table: GpuTensor
    ids: Buffer
    out: Buffer
    scale: float

    def reads(self) -> tuple:
        return (self.ids,)

    def writes(self) -> tuple:
        return (self.out,)

    def lower(self, L: Lowering) -> None:
        t = self.table
        for p in t.parts:
            K.embed(L.dev, t.qtype, t.shape[0], p.buffer, self.ids, self.out, L.step, L.T, scale=self.scale,
                    row0=p.row0, nrows=p.rows, plan=L.plan)
        if self.out is L.s.x:
            L.stream = L.s.x


@dataclass(eq=False)
class SoftTokens(Op):
    """out[t] = rows[t] where at[t] != 0: an encoder's soft tokens over the step's embeddings. A step of
    one token never holds one (the engine checks: an image's run ends with its end marker), so a
    one-token plan records nothing."""
    rows: Buffer
    at: Buffer
    out: Buffer

    def reads(self) -> tuple:
        return (self.rows, self.at, self.out)

    def writes(self) -> tuple:
        return (self.out,)

    def lower(self, L: Lowering) -> None:
        if L.T > 1:
            K.soft_tokens(L.dev, L.cfg.hidden, self.rows, self.at, L.now(self.out), L.step, L.T, plan=L.plan)


@dataclass(eq=False)
class SoftEmbed(Op):
    """out[t] = softmax(logits[t]) @ table * scale over the whole vocabulary."""
    table: GpuTensor
    logits: Buffer
    out: Buffer
    scale: float

    def reads(self) -> tuple:
        return (self.logits,)

    def writes(self) -> tuple:
        return (self.out,)

    def lower(self, L: Lowering) -> None:
        t = self.table
        K.soft_embed(L.dev, t.qtype, t.shape[1], t.shape[0], self.logits, L.s.soft_stats,
                     [(p.buffer, p.row0, p.rows) for p in t.parts], self.out, L.step, L.T, scale=self.scale,
                     plan=L.plan)


@dataclass(eq=False)
class PleCombine(Op):
    """out[l, t] = (rms_norm(proj / sqrt(d)) * norm + emb) / sqrt(2)."""
    proj: Buffer
    emb: Buffer
    norm: GpuTensor
    out: Buffer

    def reads(self) -> tuple:
        return (self.proj, self.emb)

    def writes(self) -> tuple:
        return (self.out,)

    def lower(self, L: Lowering) -> None:
        cfg = L.cfg
        K.ple_combine(L.dev, cfg.n_layers, cfg.ple_dim, L.s.ple_stride(L.T), self.proj, self.emb, self.norm.buffer,
                      self.out, L.step, cfg.hidden, L.eps, plan=L.plan)


# -- attention -------------------------------------------------------------------------------------------

@dataclass(eq=False)
class NormRope(Op):
    """dst = rope(rms_norm(src) * weight) for `heads` heads of head_dim."""
    src: Buffer
    dst: Buffer
    weight: GpuTensor
    heads: int
    head_dim: int
    rope_dims: int
    rope_base: float
    freq_factors: GpuTensor | None

    def reads(self) -> tuple:
        return (self.src,)

    def writes(self) -> tuple:
        return (self.dst,)

    def lower(self, L: Lowering) -> None:
        K.norm_rope(L.dev, self.src, self.dst, self.weight.buffer, L.step, self.heads, self.head_dim, self.rope_dims,
                    self.rope_base, L.T, eps=L.eps, freq_factors=_buf(self.freq_factors), plan=L.plan)


@dataclass(eq=False)
class KvStore(Op):
    """The step's k, v into the cache at its positions."""
    k: Buffer
    v: Buffer
    cache: object
    kv_heads: int
    head_dim: int

    def reads(self) -> tuple:
        return (self.k, self.v)

    def writes(self) -> tuple:
        return (self.cache.k, self.cache.v)

    def lower(self, L: Lowering) -> None:
        c = self.cache
        K.kv_store(L.dev, self.k, self.v, c.k, c.v, L.step, self.kv_heads, self.head_dim, c.slots, L.T, plan=L.plan)


@dataclass(eq=False)
class Attend(Op):
    """out = softmax(q k^T, causal [+ sliding window]) v over the cache. prep (one token): q (and k, v)
    are raw projections that the decode attention's split kernel norms, ropes (and stores) itself.
    keys_before = 1 (one token): the keys before the query's position only, and on sliding layers the
    last `sliding_keys` of them (None: cfg.sliding_window): an assistant drafter's query over its target's cache."""
    lc: object
    q: Buffer
    cache: object
    out: Buffer
    prep: K.QueryPrep | None = None
    keys_before: int = 0
    sliding_keys: int | None = None
    combined: bool = False               # one token: the split only; the matvec reading `out` combines (FromSplits)

    def reads(self) -> tuple:
        return (self.q, self.cache.k, self.cache.v)

    def writes(self) -> tuple:
        return (self.out,) + ((self.cache.k, self.cache.v) if self.prep is not None and self.prep.mode == 2 else ())

    def window(self, cfg) -> int:
        """The keys a query sees back from its position: the layer's sliding window (or sliding_keys); 0: all."""
        return (cfg.sliding_window if self.sliding_keys is None else self.sliding_keys) if self.lc.sliding else 0

    def combines_in_matvec(self, cfg, state) -> bool:
        """Whether one token's output may be left as the split's partials for its reader to combine."""
        return K.combines_in_matvec(cfg.n_heads, self.lc.head_dim, state.max_keys(self.lc))

    def lower(self, L: Lowering) -> None:
        s, lc, c, cfg = L.s, self.lc, self.cache, L.cfg
        H, hd, kvh = cfg.n_heads, lc.head_dim, lc.n_kv_heads
        window = self.window(cfg)
        if self.keys_before and L.T != 1:
            raise AssertionError("a query that sees only earlier keys is one token's (the drafter's)")
        if L.T == 1:
            K.attention_decode(L.dev, self.q, c.k, c.v, self.out, s.partials, L.step, H, kvh, hd, c.slots,
                               s.max_keys(lc), window=window, plan=L.plan, prep=self.prep, keys_before=self.keys_before,
                               combine=not self.combined)
        elif L.few and s.few_partials() is not None:     # a few queries: each split over the keys too
            K.attention_decode(L.dev, self.q, c.k, c.v, self.out, s.few_partials(), L.step, H, kvh, hd, c.slots,
                               s.max_keys(lc), window=window, plan=L.plan, max_tokens=L.T)
        else:
            K.attention(L.dev, self.q, c.k, c.v, self.out, L.step, H, kvh, hd, c.slots, L.T, window=window,
                        plan=L.plan, keys_ahead=s.keys_ahead if lc.sliding else None)


@dataclass(eq=False)
class AttendCanvas(Op):
    """out = softmax(q k^T) v, unmasked, over the cached prefix (its last `keep` positions; 0: all) and the
    step's own k, v (DiffusionGemma's decoder); the cache is only read."""
    lc: object
    q: Buffer
    cache: object
    k: Buffer
    v: Buffer
    out: Buffer
    keep: int

    def reads(self) -> tuple:
        return (self.q, self.cache.k, self.cache.v, self.k, self.v)

    def writes(self) -> tuple:
        return (self.out,)

    def lower(self, L: Lowering) -> None:
        c, lc = self.cache, self.lc
        K.attention_canvas(L.dev, self.q, c.k, c.v, self.k, self.v, self.out, L.step, L.cfg.n_heads, lc.n_kv_heads,
                           lc.head_dim, c.slots, L.T, keep=self.keep, plan=L.plan)


# -- mixture of experts -------------------------------------------------------------------------------------

@dataclass(eq=False)
class Route(Op):
    """ids, weights = top-k of softmax(logits), renormalized over the chosen."""
    logits: Buffer
    ids: Buffer
    weights: Buffer

    def reads(self) -> tuple:
        return (self.logits,)

    def writes(self) -> tuple:
        return (self.ids, self.weights)

    def kernel_tail(self, L: Lowering) -> K.RouteTail:
        """The routing as one workgroup more in a one-token matvec's dispatch."""
        L.grouped_ids = None
        return K.RouteTail(L.cfg.n_experts, L.cfg.n_experts_used, self.logits, self.ids, self.weights)

    def lower(self, L: Lowering) -> None:
        L.grouped_ids = None                 # new ids: the next chunk's expert products group them again
        K.moe_route(L.dev, L.cfg.n_experts, L.cfg.n_experts_used, self.logits, self.ids, self.weights, L.step, L.T,
                    plan=L.plan)


@dataclass(eq=False)
class Experts(Op):
    """y[t, j] = x[t (or t, j)] @ W[ids[t, j]]^T for the chosen experts of every token, one dispatch per buffer
    of a split W. A chunk groups its slots by expert first (once per ids), then runs a tiled matmul per
    expert; one token or a few run the decode kernel for each slot. epilogue (GegluHalves): W holds gate
    then up rows per expert, the kernel writes gelu(gate) * up."""
    w: GpuTensor
    x: Buffer
    y: Buffer
    ids: Buffer
    per_slot_input: bool = False
    epilogue: GegluHalves | None = None
    input: QuantizedInput | None = None      # a chunk's rows already rounded to int8 in state.xq (the GeGLU's)

    def reads(self) -> tuple:
        return (self.x, self.ids)

    def writes(self) -> tuple:
        return self.epilogue.writes() if self.epilogue else (self.y,)

    def lower(self, L: Lowering) -> None:
        dev, cfg, s, w, ids = L.dev, L.cfg, L.s, self.w, self.ids
        k, n, E, KS = w.shape[0], w.shape[1], w.shape[2], cfg.n_experts_used   # E: experts W holds (or cache slots)
        x = L.now(self.x)
        if L.T > 1 and not L.few:
            if L.grouped_ids is not ids:
                K.moe_group(dev, E, KS, ids, s.expert_groups, L.step, plan=L.plan)
                L.grouped_ids = ids
            int8 = L.int8_input(w.qtype, k, x, isinstance(self.input, QuantizedInput),   # a token's rows or each slot's
                                rows_per_token=KS if self.per_slot_input else 1)
            for p in w.parts:
                where = dict(plan=L.plan, first_expert=p.row0 // n, experts_here=p.rows // n)
                if int8:
                    K.moe_experts_grouped_q8(dev, w.qtype, k, n, E, KS, p.buffer, s.xq, s.xq_scales, self.y,
                                             s.expert_groups, L.T, per_slot_input=self.per_slot_input, **where)
                else:
                    K.moe_experts_grouped(dev, w.qtype, k, n, E, KS, p.buffer, x, self.y, s.expert_groups, L.T,
                                          per_slot_input=self.per_slot_input, f16=L.f16, **where)
            return
        geglu = self.epilogue is not None
        y = self.epilogue.out if geglu else self.y
        for p in w.parts:
            K.moe_experts(dev, w.qtype, k, n // 2 if geglu else n, E, KS, p.buffer, x, y, ids, L.step, L.T,
                          per_slot_input=self.per_slot_input, plan=L.plan, first_expert=p.row0 // n,
                          experts_here=p.rows // n, geglu=geglu, int8=L.matvec_int8(w.qtype, experts=True))


@dataclass(eq=False)
class Combine(Op):
    """out[t] = sum_j weights[t, j] * expert_out[t, j] [* down_scale[ids[t, j]]]."""
    expert_out: Buffer
    ids: Buffer
    weights: Buffer
    out: Buffer
    down_scale: GpuTensor | None

    def reads(self) -> tuple:
        return (self.expert_out, self.ids, self.weights)

    def writes(self) -> tuple:
        return (self.out,)

    def lower(self, L: Lowering) -> None:
        K.moe_combine(L.dev, L.cfg.hidden, L.cfg.n_experts_used, self.expert_out, self.ids, self.weights, self.out,
                      L.step, L.T, down_scale=_buf(self.down_scale), plan=L.plan)


@dataclass(eq=False)
class MoeTail(Op):
    """out[t] = rms_norm(dense[t]) * dense_norm + rms_norm(sum_j weights[t, j] * expert_out[t, j]
    [* down_scale[ids[t, j]]]) * moe_norm (shaders/moe_tail.wgsl: one workgroup a token)."""
    dense: Buffer
    dense_norm: GpuTensor
    expert_out: Buffer
    ids: Buffer
    weights: Buffer
    down_scale: GpuTensor | None
    moe_norm: GpuTensor
    out: Buffer

    def reads(self) -> tuple:
        return (self.dense, self.expert_out, self.ids, self.weights)

    def writes(self) -> tuple:
        return (self.out,)

    def lower(self, L: Lowering) -> None:
        K.moe_tail(L.dev, L.cfg.hidden, L.cfg.n_experts_used, self.dense, self.dense_norm.buffer, self.expert_out,
                   self.ids, self.weights, self.moe_norm.buffer, self.out, L.step, L.T, eps=L.eps,
                   down_scale=_buf(self.down_scale), plan=L.plan)


@dataclass(eq=False)
class ExpertRoundsBegin(Op):
    """The ops up to ExpertRoundsEnd run once per round of experts fetched into the cache (their own plan)."""
    layer: int

    def lower(self, L: Lowering) -> None:
        L.plan = L.dev.plan()


@dataclass(eq=False)
class ExpertRoundsEnd(Op):
    layer: int

    def lower(self, L: Lowering) -> None:
        L.program.append(ExpertRounds(self.layer, L.plan))
        L.plan = L.dev.plan()
        L.program.append(L.plan)


# -- the rest ---------------------------------------------------------------------------------------------------

@dataclass(eq=False)
class Copy(Op):
    """dst[dst_offset ..] = src[src_offset ..], size bytes."""
    src: Buffer
    src_offset: int
    dst: Buffer
    dst_offset: int
    size: int

    def reads(self) -> tuple:
        return (self.src,)

    def writes(self) -> tuple:
        return (self.dst,)

    def lower(self, L: Lowering) -> None:
        L.plan.copy(L.now(self.src), self.src_offset, self.dst, self.dst_offset, self.size)
        if self.dst is L.s.x:
            L.stream = L.s.x


@dataclass(eq=False)
class Elementwise(Op):
    """x = op(x [, b]) over rows of n floats: softcap (tanh(x / cap) * cap), add (x + b)."""
    op: str
    x: Buffer
    n: int
    b: Buffer | None = None
    cap: float = 0.0

    def reads(self) -> tuple:
        return (self.x,) + ((self.b,) if self.b is not None else ())

    def writes(self) -> tuple:
        return (self.x,)

    def lower(self, L: Lowering) -> None:
        kw = dict(cap=self.cap) if self.op == "softcap" else dict(b=self.b)
        K.elementwise(L.dev, self.op, self.n, L.now(self.x), L.step, L.T, plan=L.plan, **kw)


@dataclass(eq=False)
class ArgmaxRows(Op):
    """ids[first + t] = argmax(softcap(x[t] @ W^T)) for each of the step's rows, no logits written."""
    w: GpuTensor
    x: Buffer
    ids: Buffer
    first: int
    cap: float

    def reads(self) -> tuple:
        return (self.x,)

    def writes(self) -> tuple:
        return (self.ids,)

    def lower(self, L: Lowering) -> None:
        w = self.w
        parts = [(w.bound, 0, w.shape[1])] if len(w.parts) == 1 else [(p.buffer, p.row0, p.rows) for p in w.parts]
        K.head_argmax(L.dev, w.qtype, w.shape[0], parts, self.x, L.s.head_partials, self.ids, L.step, cap=self.cap,
                      out0=self.first, plan=L.plan)


@dataclass(eq=False)
class Sample(Op):
    """token = a draw from logits under state.sample_params."""
    logits: Buffer
    n: int
    token: Buffer

    def reads(self) -> tuple:
        return (self.logits,)

    def writes(self) -> tuple:
        return (self.token,)

    def lower(self, L: Lowering) -> None:
        K.sample(L.dev, self.n, self.logits, self.token, L.s.sample_params, L.s.sample_scratch, plan=L.plan)
