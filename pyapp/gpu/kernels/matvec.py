"""The decode matvec: y = W x for one token, W quantized as in the file (shaders/matvec*.wgsl).

One kernel with its parts picked by prelude: how x arrives (as is, built from a pending residual add or a
norm: ResidualInput, NormInput), how a row is read (4-weight groups, 32-weight units, Q4_K's 16-byte
chunks), x in f32 or rounded to int8, and an optional last workgroup that routes a MoE token (RouteTail).
The shape choices (threads per row, workgroup) come from bench/matvec_sweep.py; the figures stand beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import ggml
from .. import Buffer, Device, Plan
from .quants import (B32_TYPES, DOT32_TYPES, INT8_UNIT_TYPES, UNIT_TYPES, quant_prelude, quant_type, row_bytes,
                     shader_block)
from .router import RouteTail, route_workgroup
from .shared import RESIDUAL_INPUT_ROUNDS, groups, pipeline


@dataclass(frozen=True)
class ResidualInput:
    """A post-norm's residual add that a decode matvec's workgroups compute into their input x
    (shaders/matvec_input_residual.wgsl) instead of a dispatch of its own (norm.wgsl add_normed):
    r = (resid_in + rms_norm(y) * weight) [* scale[0]], written to resid_out by workgroup 0;
    x = r, or rms_norm(r) * next_weight given next_weight."""
    y: Buffer
    resid_in: Buffer
    resid_out: Buffer
    weight: Buffer
    scale: Buffer | None = None
    next_weight: Buffer | None = None
    eps: float = 1e-6


@dataclass(frozen=True)
class NormInput:
    """A row a decode matvec's workgroups norm into their input x (shaders/matvec_input_norm.wgsl):
    x = rms_norm(src) [* weight] * scale, written to x_out by workgroup 0, which also writes
    rms_norm(src) * weight2 to out2 (norm.wgsl norm_pair's two outputs, without a dispatch)."""
    src: Buffer
    x_out: Buffer
    weight: Buffer | None
    weight2: Buffer
    out2: Buffer
    scale: float = 1.0
    eps: float = 1e-6


@dataclass(frozen=True)
class CombineInput:
    """The partial softmax states attention_decode's split left for one token (combine=False), combined by
    every workgroup of the matvec reading the attention output (shaders/matvec_input_combine.wgsl) instead
    of attend_combine's dispatch: x = that output, heads * head_dim floats. nsplit, window, keys_before:
    the split's (attention_decode's NSPLIT, WINDOW, KEYS_BEFORE); step: its per-step uniform."""
    partials: Buffer
    step: Buffer
    heads: int
    head_dim: int
    nsplit: int
    window: int = 0
    keys_before: int = 0


# A matvec combining an attention's partials (CombineInput) reads them all in every workgroup (E2B's sliding
# layers: 133 KB), so it takes them only where its shape has few workgroups. GPU timestamps of E2B's decode step
# on the browser path (H200, bench/RESULTS.md, seventeenth session), the o projection 1536 x 2048: in 96
# workgroups (Q4_K and Q4_0 with int8 x, 16 threads a row) it cost what attend_combine saved (2.600 -> 2.598 ms,
# 2.475 -> 2.482); in 192 (Q8_0, f32 x, 32 threads a row) 4% more (2.663 -> 2.780), and made 96 by 16 threads a
# row, 13% more (2.662 -> 3.006: Q8_0 rows want their 32 threads).
COMBINE_INPUT_WORKGROUPS = 96


# Storage buffers a matvec with a residual input binds (W, Y, B and the six of ResidualInput).
RESIDUAL_INPUT_BUFFERS = 9


def fuses_residual_input(dev: Device) -> bool:
    """Whether this device binds enough storage buffers per shader for ResidualInput matvecs
    (WebGPU guarantees 8; Dawn offered 16 on the H100 of bench/RESULTS.md)."""
    return dev.limits.get("max_storage_buffers_per_shader_stage", 8) >= RESIDUAL_INPUT_BUFFERS


@dataclass(frozen=True)
class RoundedX:
    """x as int8 codes per 32 with (d, sum) a block (quantize_q8's layout), written by the matvec that
    made x (its `round_out`: shaders/matvec_out_q8.wgsl) for the next one to read (`rounded_x`:
    shaders/x8_stored.wgsl) instead of rounding x in each of its workgroups."""
    codes: Buffer
    scales: Buffer


# Storage buffers a matvec rounding its rows binds beside a residual input's (YQ, YS).
ROUND_OUT_BUFFERS = RESIDUAL_INPUT_BUFFERS + 2


# Rows a matvec needs to round its output: at the 8 threads a row that whole blocks allow (_whole_blocks),
# 4096 rows make 128 workgroups. 26B-A4B's dense GeGLU (2112 rows: 66) took 28.8 us so on the H100's
# browser path and its decode lost (216 -> 199 tok/s); E2B's (6144 and 12288 rows) and E4B's (10240) gain.
ROUND_OUT_MIN_ROWS = 4096


def can_round_output(dev: Device, n: int) -> bool:
    """Whether a decode matvec of n rows can also write them rounded to int8 (RoundedX): whole blocks of 32,
    and storage buffers enough beside a residual input."""
    return n % 32 == 0 and dev.limits.get("max_storage_buffers_per_shader_stage", 8) >= ROUND_OUT_BUFFERS


def rounds_output(dev: Device, n: int) -> bool:
    """Whether a decode step's matvec of n rows writes them rounded to int8 for the next (can_round_output,
    and rows enough to fill the GPU at 8 threads a row: ROUND_OUT_MIN_ROWS)."""
    return can_round_output(dev, n) and n >= ROUND_OUT_MIN_ROWS


def x8_source(rounded: RoundedX | None) -> str:
    """Where an int8 kernel's x codes come from: rounded by each workgroup, or stored by x's producer."""
    return "x8_round" if rounded is None else "x8_stored"


def matvec_prelude(t, int8: bool = False, rounded: RoundedX | None = None) -> str:
    """quant_prelude plus matvec's dot32 (32-weight units) for this type and its x_prepare: none for f32
    x; int8: x rounded to int8 by each workgroup (x8_round.wgsl), or by its producer (rounded:
    x8_stored.wgsl), and the type's int8 unit."""
    name = shader_block(t)[0]
    if int8:
        return (quant_prelude(t) + f"//!include {x8_source(rounded)}\n//!include quants_dot_x8\n"
                f"fn dot32(rb: u32, u: u32) -> f32 {{ return dot32_{name}_x8(rb, u); }}\n")
    impl = f"dot32_{name}" if quant_type(t) in DOT32_TYPES else "dot32_generic"
    return (quant_prelude(t) + f"fn dot32(rb: u32, u: u32) -> f32 {{ return {impl}(rb, u); }}\n"
            "fn x_prepare(lid: u32) {}\n")


def _matvec_input(k: int, wg: int, x: Buffer, residual: ResidualInput | NormInput | CombineInput | None,
                  dev: Device, rounded: RoundedX | None = None) -> tuple[str, dict, dict]:
    """(prelude, constants, bindings) of a matvec's input: X, or built from a ResidualInput, NormInput or
    CombineInput, or its producer's int8 codes (rounded: x8_stored.wgsl, which the int8 prelude includes)."""
    if rounded is not None:
        return "", {}, {"XQS": rounded.codes, "XSS": rounded.scales}
    if residual is None:
        return "//!include matvec_input\n", {}, {"X": x}
    if isinstance(residual, CombineInput):
        c = residual
        if k != c.heads * c.head_dim or c.head_dim % 4:
            raise ValueError(f"a combined attention input of {c.heads} heads x {c.head_dim} is not a {k}-long x")
        consts = {"XS": k // 4, "AH": c.heads, "AHD": c.head_dim, "ANSPLIT": c.nsplit, "AWINDOW": c.window,
                  "AKEYS_BEFORE": c.keys_before, "AHS": c.heads * c.nsplit}
        return "//!include matvec_input_combine\n", consts, {"PART": c.partials, "AS": c.step}
    if k % 4 or k > 4 * RESIDUAL_INPUT_ROUNDS * wg:
        raise ValueError(f"an input built by the workgroups of {k} floats needs k % 4 == 0 and k <= "
                         f"{4 * RESIDUAL_INPUT_ROUNDS} x the workgroup ({wg})")
    r = residual
    if isinstance(r, NormInput):
        consts = {"XS": k // 4, "NEPS": r.eps, "HAS_NW": r.weight is not None, "NSCALE": r.scale}
        res = {"NX": r.src, "NXO": r.x_out, "NW": r.weight if r.weight is not None else dev.dummy,
               "NW2": r.weight2, "NYO": r.out2}
        return "//!include matvec_input_norm\n", consts, res
    consts = {"PRO": 2 if r.next_weight is not None else 1, "XS": k // 4, "PEPS": r.eps,
              "HAS_PSC": r.scale is not None}
    res = {"PY": r.y, "PR": r.resid_in, "RO": r.resid_out, "PW": r.weight,
           "PNW": r.next_weight if r.next_weight is not None else dev.dummy,
           "PSC": r.scale if r.scale is not None else dev.dummy}
    return "//!include matvec_input_residual\n", consts, res


def _matvec_output(round_out: RoundedX | None) -> tuple[str, dict]:
    """(prelude, bindings) of how a matvec stores its rows: Y, and rounded to int8 given round_out."""
    if round_out is None:
        return "//!include matvec_out_y\n", {}
    return "//!include matvec_out_q8\n", {"YQ": round_out.codes, "YS": round_out.scales}


def _matvec_tail(route: RouteTail | None, workgroups: int) -> tuple[str, dict, dict, int]:
    """(prelude, constants, bindings, workgroups) of a matvec dispatch of `workgroups` with or without
    one more that routes a MoE token (RouteTail)."""
    if route is None:
        return "//!include matvec_tail_none\n", {}, {}, workgroups
    route_workgroup(route.n_experts, route.k_used)
    return ("//!include matvec_tail_route\n", {"TAIL": workgroups, "E": route.n_experts, "KSEL": route.k_used},
            {"IDS": route.ids, "WTS": route.weights, "LOG": route.logits}, workgroups + 1)


def matvec_shape(qtype, k: int, n: int, *, chunks: bool, built: bool = False, int8: bool = False, rounded: bool = False,
                 round_out: bool = False, geglu: bool = False, tpr: int | None = None,
                 wg: int | None = None) -> tuple[int, int]:
    """(threads a row, threads a workgroup) of a decode matvec: tpr and wg where given, else the defaults for its
    kernel (chunks: Q4_K's 16-byte chunks; else 4-weight groups or 32-weight units), its input (built by the
    workgroups: ResidualInput, NormInput, CombineInput; int8; rounded: its producer's int8 codes), its epilogue
    (geglu: a gate and an up row a thread) and its output (round_out: whole blocks of 32 rows a workgroup)."""
    if chunks:
        if rounded:
            tpr, wg = tpr or ROUNDED_Q4K_THREADS[0], wg or ROUNDED_Q4K_THREADS[1]
        tpr = tpr or q4k_threads_per_row(k, n, int8)
        # a residual input and int8 x are built once per workgroup: wider workgroups build them fewer times
        wg = wg or (Q4K_RESIDUAL_WORKGROUP if built or int8 else Q4K_WORKGROUP)
    else:
        # 64 threads a row, 4 rows a workgroup: best or within 3% for the dense shapes of a decode step
        # (bench/matvec_sweep.py --gpu-time, 2026-11-26: Q6_K 2048 x 2816 11.0 us, Q5_0 2816 x 2112 9.7, F16
        # 1536 x 256 9.6). With an input built by the workgroups and many rows 32 (8 rows a workgroup: half
        # the workgroups build the input; a26b's Q6_K v 27.7 -> 20.7 us); few rows keep 64 (e2b's 256-row
        # PLE gate: 16.2 us at 32, 13.3 at 64), at most 128 rows take 128 (a26b's F16 router, 128 x 2816
        # with a NormInput: 6.5 us vs 7.2 at 64, 9.2 at 32; --norm-input, 2026-11-26)
        if rounded:      # (at least two units a thread: 2112-long rows take 32)
            tpr = tpr or min(ROUNDED_UNIT_THREADS[0], max(4, _floor_pow2(k // 64)))
            wg = wg or ROUNDED_UNIT_THREADS[1]
        if int8:             # units only
            tpr = tpr or (INT8_Q6K_TPR if quant_type(qtype) == ggml.Q6_K else int8_unit_threads_per_row(k, n, geglu))
        # At most K / 8 threads a row (two 4-weight groups a thread): short rows take fewer workgroups,
        # which CPU drivers (lavapipe, SwiftShader: the tests' GPUs) pay for one by one, ~20-100 us each
        # with barriers. Of Gemma 4's shapes only K = 256 (the PLE's projection) is that short.
        tpr = tpr or min(64 if not built else 32 if n >= 1024 else 128 if n <= 128 else 64, _floor_pow2(k // 8))
        wg = wg or 256
    if round_out:
        tpr, wg = _whole_blocks(tpr, wg)
    return tpr, wg


def _floor_pow2(x: int) -> int:
    """The largest power of two at most x (1 for x < 2): a thread count that divides a workgroup."""
    return 1 << max(0, x.bit_length() - 1)


def combines_into_matvec(qtype, k: int, n: int, int8: bool) -> bool:
    """Whether a decode matvec of W [n, k] takes a CombineInput: its default shape for an input built by the
    workgroups has at most COMBINE_INPUT_WORKGROUPS workgroups."""
    tpr, wg = matvec_shape(qtype, k, n, chunks=quant_type(qtype) == ggml.Q4_K, built=True, int8=int8)
    return -(-n // (wg // tpr)) <= COMBINE_INPUT_WORKGROUPS


def matvec(dev: Device, qtype, k: int, n: int, w: Buffer, x: Buffer | None, y, plan: Plan | None = None,
           tpr: int | None = None, wg: int | None = None, subgroups: bool | None = None, geglu: bool = False,
           gelu_times: Buffer | tuple | None = None, units: bool | None = None, chunks: bool | None = None,
           probe: int = 0, residual: ResidualInput | NormInput | CombineInput | None = None,
           route: RouteTail | None = None,
           int8: bool = False, rounded_x: RoundedX | None = None, round_out: RoundedX | None = None) -> Plan:
    """y[n] = W[n, k] @ x[k] for quantized W (raw GGUF bytes in w).

    geglu: W holds 2n rows (gate then up); y = gelu(gate x) * (up x).
    gelu_times: y = gelu(W x) * gelu_times[:n] (the PLE gate).
    residual: x (None here) is built by every workgroup from a pending residual add (ResidualInput),
    by norming a row (NormInput) or by combining an attention's split partials (CombineInput).
    route: one workgroup more routes a MoE token (RouteTail).
    subgroups: use the subgroup variant (default: when the device has the feature).
    chunks: Q4_K read in 16-byte chunks (matvec_q4k*.wgsl; default for Q4_K); tpr, wg: threads per
    row and per workgroup (defaults per kernel); probe: bench/matvec_sweep.py's bandwidth probe.
    int8: x rounded to int8 per 32 by each workgroup, integer dot products (the Q4_K chunk kernel and
    the Q6_K units; int8_matvec says where it is faster); rounded_x: x (None here) arrives so rounded
    (int8 implied; int8_rounded_matvec says where).
    round_out: the rows are also written rounded to int8, for the next matvec's rounded_x (can_round_output
    says where it can, rounds_output where a decode step does; a workgroup then holds whole blocks of 32 rows).
    """
    row_bytes(qtype, k)
    if rounded_x is not None:
        if x is not None or residual is not None:
            raise ValueError("a matvec reading rounded x reads it only")
        int8 = True
    if round_out is not None and not can_round_output(dev, n):
        raise ValueError(f"{n} rows rounded to int8 need n % 32 == 0 and {ROUND_OUT_BUFFERS} storage buffers")
    sg = dev.has_subgroups if subgroups is None else subgroups
    mode = 1 if geglu else 2 if gelu_times is not None else 0
    b = gelu_times if gelu_times is not None else dev.dummy
    plan = plan if plan is not None else dev.plan()
    if chunks is None:
        chunks = quant_type(qtype) == ggml.Q4_K
    if chunks:
        if quant_type(qtype) != ggml.Q4_K:
            raise ValueError("the 16-byte chunk matvec reads Q4_K only")
        tpr, wg = matvec_shape(qtype, k, n, chunks=True, built=residual is not None, int8=int8,
                               rounded=rounded_x is not None, round_out=round_out is not None, tpr=tpr, wg=wg)
        x_prelude, x_consts, x_res = _matvec_input(k, wg, x, residual, dev, rounded_x)
        t_prelude, t_consts, t_res, workgroups = _matvec_tail(route, -(-n // (wg // tpr)))
        o_prelude, o_res = _matvec_output(round_out)
        p = pipeline(dev, "matvec_q4k_sg" if sg else "matvec_q4k", enables=("subgroups",) if sg else (),
                     prelude=x_prelude + t_prelude + o_prelude + q4k_x_prelude(int8, rounded_x),
                     constants={"K": k, "N": n, "TPR": tpr, "WG": wg, "MODE": mode, "PROBE": probe,
                                **x_arrays(k, int8, rounded_x), **x_consts, **t_consts})
        bg = dev.bind_group(p, {"W": w, "Y": y, "B": b, **x_res, **t_res, **o_res})
        return plan.dispatch(p, bg, *groups(workgroups))
    if int8 and (quant_type(qtype) not in INT8_UNIT_TYPES or k % 32):
        raise ValueError("int8 x is for the Q4_K chunk matvec and the units of INT8_UNIT_TYPES only")
    tpr, wg = matvec_shape(qtype, k, n, chunks=False, built=residual is not None, int8=int8,
                           rounded=rounded_x is not None, round_out=round_out is not None, geglu=geglu, tpr=tpr, wg=wg)
    # 32-weight units pay off once every thread of a row gets several, and only for the K-quants
    # whose scales are costly to decode: on an H100 (bench/matvec_sweep.py, bench/RESULTS.md)
    # Q6_K rows of 4096-6144 gain 5-30%; Q4_K ties at 6144 and wins on E2B's 12288-long rows
    # (its whole decode step: 6.8 ms of matvecs in groups); Q8_0 loses everywhere (13.7 vs 17.9
    # us at 1536 x 6144): a thread reading a whole 34-byte block coalesces worse than neighbours
    # reading neighbouring words.
    if units is None:
        units = int8 or (k % 32 == 0 and k // 32 >= 2 * tpr and quant_type(qtype) in UNIT_TYPES)
    if int8 and not units:
        raise ValueError("int8 x needs the 32-weight units")
    x_prelude, x_consts, x_res = _matvec_input(k, wg, x, residual, dev, rounded_x)
    t_prelude, t_consts, t_res, workgroups = _matvec_tail(route, -(-n // (wg // tpr)))
    o_prelude, o_res = _matvec_output(round_out)
    p = pipeline(dev, "matvec_sg" if sg else "matvec", enables=("subgroups",) if sg else (),
                 prelude=matvec_prelude(qtype, int8, rounded_x) + x_prelude + t_prelude + o_prelude,
                 constants={"K": k, "N": n, "TPR": tpr, "WG": wg, "MODE": mode, "UNITS": units,
                            **(x_arrays(k, True, rounded_x) if int8 else {}), **x_consts, **t_consts})
    bg = dev.bind_group(p, {"W": w, "Y": y, "B": b, **x_res, **t_res, **o_res})
    return plan.dispatch(p, bg, *groups(workgroups))


# Q4_K chunk matvec shape (bench/matvec_sweep.py on an H100, bench/RESULTS.md, 2026-11-26): what
# counts is the matrix's rows times threads per row: ~32-96 K threads run best (24576 rows: 4
# threads a row, 22.6 us vs 29.0 at 8 and 105 at 32; 6144 x 2816: 8, 39.0 us vs 88.7 at 32; 1536 x
# 12288: 32, 49.0 us vs 102.6 at 8); at least two 32-weight chunks a thread. With int8 x each
# workgroup rounds x first: 256 threads and at most 16 a row, so that more rows share it (2026-11-26,
# GPU timestamps: 1536 x 6144 7.95 us at 16 x 256 against 44.4 at 32 x 64 and 12.6 for f32 x; 6144 x
# 2816 9.5 at 8 x 256 against 14.1-14.7 for f32 x).
Q4K_WORKGROUP = 64
Q4K_RESIDUAL_WORKGROUP = 256
Q4K_THREADS = 65536


# Q6_K's int8 units (quants_dot_x8.wgsl) pay off on the head only (bench/matvec_sweep.py --int8
# --gpu-time, H100, 2026-11-26): 262144 x 1536 355 us against 493 for f32 units; on the layers'
# matrices the rounding of x per workgroup costs more than the integer dots save (2048 x 2816: 14.1 us
# against 11.0; 1536 x 6144: 19.2 against 15.1; with a residual input 21.5 against 21.1).
INT8_Q6K_TPR = 8          # the head's best (16: 411 us, 32: 592)
# The matrices (by rows) where the int8 units beat f32 x, per type, on the browser path (natively none:
# Device.int8_block_units): Q4_0 every dense one (E2B's QAT-form decode 219 -> 323 tok/s on the H100,
# bench/RESULTS.md, eleventh session); Q8_0 from 2048 rows (E2B Q8_0's step, GPU timestamps, H100,
# 2026-11-28: gate|up 1536 x 24576 54.2 -> 30.4 us, the head 262144 rows 279 -> 192, q|k|v 2048-2560 rows
# 17.7 -> 16.2; its 1536-row o projection lost, 13.4 -> 14.7); Q5_0 from 2048 rows as Q8_0 (26B-A4B Q4_K_M's
# dense downs, 2816 x 2112, rounding x in each workgroup: 1818 -> 1424 us a step over 30 layers, GPU
# timestamps, H100, 2026-11-28; its decode 230.8 -> 231.5 tok/s, within the runs' spread).
INT8_UNIT_MIN_ROWS = {ggml.Q6_K: 65536, ggml.Q4_0: 0, ggml.Q8_0: 2048, ggml.Q5_0: 2048}


def int8_unit_threads_per_row(k: int, n: int, geglu: bool = False) -> int:
    """Threads per row of the 32-weight-block int8 units (a power of two, 4-64): enough threads in all
    for the GPU (a 1536 x 12288 matrix at 8 a row had 48 workgroups: 42.8 us on the H100's browser
    path, eleventh session), at most 16 so that a workgroup's rounding of x serves 16 rows or more;
    up to 64 for at most 512 rows, where 16 a row leaves most SMs idle (E4B's PLE gate, 256 x 2560 Q4_0:
    14.4 -> 12.3 us at 32 a row, the decode step 4.00 -> 3.91 ms; E2B's, 1536 long, 11.7 -> 12.0 us, its
    step unchanged; H200, nineteenth session). A GeGLU's rows of INT8_GEGLU_LONG_ROW weights or more get
    half the threads in all (INT8_GEGLU_LONG_THREADS): a thread's units go four to a round, so more of
    them a thread keep more loads in flight."""
    budget = INT8_GEGLU_LONG_THREADS if geglu and k >= INT8_GEGLU_LONG_ROW else INT8_UNIT_THREADS
    tpr = 4
    while tpr < (64 if n <= 512 else 16) and tpr * 2 * n <= budget and tpr * 2 <= k // 32:
        tpr *= 2
    return tpr


INT8_UNIT_THREADS = 131072     # e2b's 24576-row gate|up (1536 x 12288 x 2): 25.3 us at 8 a row, 31.4 at 4
# E4B's gate|up (2560 x 10240 x 2, Q4_0 units four to a round): the decode step 3,939 -> 3,693 us at 4 threads a
# row instead of 8 (that run also had its PLE model projection, 10752 rows once a step, at 4; this rule leaves it at
# 8), the gate|up 41.5 -> 34.2 us a layer; E2B's (1536 long) at 4: 2,327 -> 2,386 us (H200, browser path, GPU
# timestamps, twentieth session)
INT8_GEGLU_LONG_ROW = 2048
INT8_GEGLU_LONG_THREADS = 65536


def int8_matvec(dev: Device, qtype, experts: bool = False, rows: int = 0) -> bool:
    """Whether the decode matvec (experts: moe_experts) of `rows` rows of qtype takes x rounded to int8
    where it is faster: the Q4_K chunk kernels (the expert one needs subgroups), the expert matvec for
    32-weight blocks (moe_x8.wgsl: Q4_0, Q5_0, Q8_0, the gate|up's GeGLU too), Q6_K's units on a head's rows,
    and the dense 32-weight blocks' units where the backend runs them faster (dev.int8_block_units)."""
    t = quant_type(qtype)
    if t == ggml.Q4_K:
        return dev.has_subgroups or not experts
    if experts:
        return t in B32_TYPES
    if t in B32_TYPES and not dev.int8_block_units:
        return False
    return t in INT8_UNIT_MIN_ROWS and rows >= INT8_UNIT_MIN_ROWS[t]


# A down projection reading its x as codes the GeGLU stored (RoundedX), against today's kernel on f32 x or
# x rounded in each workgroup. In a decode step (H100, browser path, GPU timestamps, node_bench.mjs
# --gpu-profile, bench/RESULTS.md): E4B Q4_K_M's Q6_K down 2560 x 10240 45.6 -> 25.1 us, its Q4_K down
# 22.0 -> 18.5; E2B Q4_0's down 1536 x 12288 27.8 -> 15.3, 1536 x 6144 18.7 -> 12.3. Alone, 50 times
# over the same matrix (bench/matvec_sweep.py --rounded --cold-mib 0, node bench/node_bench.mjs
# --matvec-rounded, before the sweep cycled cold copies: weights and x warm in L2, so Q4_K's own rounding
# looked cheaper than it is in a step), by threads: units best at
# 64 a row in 256 or within 4% (Q6_K 2560 x 10240 15.6 us, 1536 x 12288 43.8; Q4_0 37.4 / 30.6), Q4_K
# chunks at 32 in 64 (21.7 / 29.6); natively Q6_K 22.8 against f32's 35.9, Q4_K 12.1 against 121 (naga
# runs Q4_K's own rounding slowly). E2B Q8_0's downs (2026-11-28, the same profile): 1536 x 12288 29.7 ->
# 17.9 us, 1536 x 6144 20.8 -> 14.1, against the units rounding x in each workgroup (their gate|up
# writing the codes: 22.0 -> 24.6 us); the step 3.03 -> 2.79 ms.
ROUNDED_UNIT_THREADS = (64, 256)
ROUNDED_Q4K_THREADS = (32, 64)


def int8_rounded_matvec(dev: Device, qtype) -> bool:
    """Whether a decode matvec of qtype whose x its producer can store rounded to int8
    (RoundedX) reads it so, where that measured faster (the figures above): the Q4_K chunks, Q6_K's units,
    and Q4_0's and Q8_0's where the backend runs int8 units faster (dev.int8_block_units: Dawn's, not
    naga's). Q5_0's too by their kernels (tests), not switched on: no file measured has a Q5_0 down whose
    GeGLU rounds its rows (26B-A4B's 2,112 are under K.ROUND_OUT_MIN_ROWS)."""
    t = quant_type(qtype)
    if t in (ggml.Q4_0, ggml.Q8_0):
        return dev.int8_block_units
    return t in (ggml.Q4_K, ggml.Q6_K)


def q4k_x_prelude(int8: bool, rounded: RoundedX | None = None) -> str:
    """How the Q4_K chunk kernels meet x: f32, or rounded to int8 per 32 (dot4I8Packed) by each workgroup
    or by x's producer (rounded)."""
    if not int8:
        return "//!include matvec_q4k_x32\n"
    return f"//!include {x8_source(rounded)}\n//!include matvec_q4k_x8\n"


def _whole_blocks(tpr: int, wg: int) -> tuple[int, int]:
    """Threads a row and a workgroup for a matvec rounding its rows (round_out): a workgroup's rows are
    whole blocks of 32, so at most 8 threads a row in a 256-thread workgroup."""
    tpr = min(tpr, 8)
    return tpr, max(wg, 32 * tpr)


def x_arrays(k: int, int8: bool, rounded: RoundedX | None = None) -> dict:
    """The sizes of the workgroup arrays x8_round.wgsl (int8) or matvec_q4k_x32.wgsl declare for rows of k
    (none for x rounded by its producer: x8_stored.wgsl reads it from storage)."""
    if rounded is not None:
        return {}
    return {"XB": k // 32, "XR": k // 16} if int8 else {"XR": k // 16}


def q4k_threads_per_row(k: int, n: int, int8: bool = False) -> int:
    """Threads per row (a power of two, 4-32; int8 x: at most 16) for n rows of k weights."""
    tpr = 4
    while tpr < (16 if int8 else 32) and tpr * 2 * n <= Q4K_THREADS and tpr * 2 <= k // 64:
        tpr *= 2
    return tpr
