"""A step of a few tokens (a token and speculative decoding's drafts): each weight read once for all of
them (shaders/matvec_tokens*.wgsl), and the head's greedy choices without writing the logits
(shaders/head_argmax.wgsl). Both reduce rows with row_dots.wgsl."""

from __future__ import annotations

from ... import ggml
from .. import Buffer, Device, Plan
from .matvec import int8_matvec
from .quants import B32_TYPES, q8_b32_prelude, quant_prelude, quant_type, row_bytes
from .shared import groups, pipeline

FEW_TOKENS = 17           # the most tokens matvec_tokens takes: a token and up to 16 drafts (speculative decoding)
FEW_GROUPS = 12           # matvec_tokens: at least this many 4-weight groups a thread (fewer: its reduction dominates)
FEW_ROW_THREADS = 32768   # and at least this many threads in all where rows are few (256 rows: 128 a row)
FEW_UNIT_THREADS = 16384  # the same for the kernels that read 32 weights a step (Q4_K's chunks, the int8 units)


def matvec_tokens(dev: Device, qtype, k: int, n: int, w, x: Buffer, y, params: Buffer, plan: Plan | None = None,
                  ldy: int = 0, tpr: int | None = None, wg: int | None = None) -> Plan:
    """Y[t, n] = X[t, k] @ W[n, k]^T for the step's t < params.n_tokens <= FEW_TOKENS, each weight read once
    (shaders/matvec_tokens.wgsl): a step of a few tokens, where matmul's 64-token tiles would be mostly
    padding. ldy: row stride of Y when W is one row block of a wider matrix (y bound at its column).
    tpr, wg: threads per row and per workgroup (default: few_tokens_threads)."""
    row_bytes(qtype, k)
    maxm = f"const MAXM: u32 = {FEW_TOKENS}u;\n"
    q4k = quant_type(qtype) == ggml.Q4_K
    tpr_, wg_ = few_tokens_threads(q4k, k, n)
    tpr, wg = tpr or tpr_, wg or wg_
    if q4k:       # its own kernel: each 16-byte chunk dequantized once (matvec_tokens_q4k)
        p = pipeline(dev, "matvec_tokens_q4k", prelude=maxm, constants={"K": k, "N": n, "LDY": ldy, "TPR": tpr, "WG": wg})
    else:
        p = pipeline(dev, "matvec_tokens", prelude=quant_prelude(qtype) + maxm,
                     constants={"K": k, "N": n, "LDY": ldy, "TPR": tpr, "WG": wg})
    bg = dev.bind_group(p, {"W": w, "X": x, "Y": y, "S": params})
    return (plan if plan is not None else dev.plan()).dispatch(p, bg, *groups(-(-n // (wg // tpr))))


def matvec_tokens_x8(dev: Device, qtype, k: int, n: int, w, xq: Buffer, xs: Buffer, y, params: Buffer,
                     plan: Plan | None = None, ldy: int = 0, tpr: int | None = None, wg: int | None = None) -> Plan:
    """matvec_tokens on activations rounded to int8 (xq, xs as kernels.quantize_q8 leaves them) for Q4_K
    (each 16-byte chunk's nibbles meet every token's codes: matvec_tokens_q4k_x8) and the 32-weight unit types
    of INT8_UNIT_TYPES (each unit's codes cut once: matvec_tokens_x8)."""
    row_bytes(qtype, k)
    if k % 32:
        raise ValueError(f"int8 activations need rows of a multiple of 32, not {k}")
    t = quant_type(qtype)
    maxm = f"const MAXM: u32 = {FEW_TOKENS}u;\n"
    tpr_, wg_ = few_tokens_threads(True, k, n)      # 32 weights a step, as Q4_K's chunks
    tpr, wg = tpr or tpr_, wg or wg_
    constants = {"K": k, "N": n, "LDY": ldy, "TPR": tpr, "WG": wg}
    if t == ggml.Q4_K:
        p = pipeline(dev, "matvec_tokens_q4k_x8", prelude=maxm, constants=constants)
    elif t in B32_TYPES:
        p = pipeline(dev, "matvec_tokens_x8", prelude=q8_b32_prelude(t) + maxm + "//!include unit8_b32\n",
                     constants=constants)
    elif t == ggml.Q6_K:
        p = pipeline(dev, "matvec_tokens_x8", prelude=quant_prelude(t) + maxm + "//!include unit8_q6k\n",
                     constants=constants)
    else:
        raise ValueError(f"no int8 few-token matvec for {ggml.name(t)}")
    bg = dev.bind_group(p, {"W": w, "XQ": xq, "XS": xs, "Y": y, "S": params})
    return (plan if plan is not None else dev.plan()).dispatch(p, bg, *groups(-(-n // (wg // tpr))))


FEW_INT8_ROWS = 512      # int8_few_tokens: from this many rows the rounding dispatch pays for itself
FEW_INT8_TYPES = frozenset({ggml.Q4_K, ggml.Q6_K, *B32_TYPES})     # those matvec_tokens_x8 takes


def int8_few_tokens(dev: Device, qtype, k: int, n: int) -> bool:
    """Whether a few-token matvec of n rows of qtype takes x rounded to int8 (quantize_q8 + matvec_tokens_x8):
    where the one-token matvec of those rows does (int8_matvec: Q4_K always, the 32-weight blocks where the
    backend runs their int8 units faster), so that a speculative step checks the tokens plain decoding would
    give, and from 512 rows (bench/matvec_sweep.py --few 5 on the H100, the rounding's dispatch included:
    E2B's Q4_K gate|up 151 -> 68 us, down 79 -> 37, q 55 -> 45; 256 rows 26 -> 38, so not there)."""
    t = quant_type(qtype)
    return t in FEW_INT8_TYPES and k % 32 == 0 and n >= FEW_INT8_ROWS and int8_matvec(dev, t, rows=n)


def few_tokens_threads(units32: bool, k: int, n: int) -> tuple[int, int]:
    """(threads per row, per workgroup) of matvec_tokens for n rows of k weights, from bench/matvec_sweep.py
    --few 5 on the H100 (bench/RESULTS.md): long rows want more threads a row (E2B's down projection, 12288
    long: 128 threads, 0.70x the time of 32), short ones fewer (the reduction over a row's threads costs
    a barrier a halving), and few rows more threads in all (256 rows of 1536: 128 threads, 0.45x).
    units32: a thread reads 32 weights a step (Q4_K's 16-byte chunks, the int8 kernels' units), else 4."""
    if units32:     # four rows a workgroup
        tpr = 16 if k < 2048 else 32
        while n * tpr < FEW_UNIT_THREADS and tpr < 64:
            tpr *= 2
        return tpr, max(4 * tpr, 64) if tpr < 64 else 128
    tpr = 16
    while tpr < 128 and k // (8 * tpr) >= FEW_GROUPS:
        tpr *= 2
    while n * tpr < FEW_ROW_THREADS and tpr < 128:
        tpr *= 2
    return tpr, 64 if tpr == 16 else 128


HEAD_ROWS = FEW_TOKENS   # rows head_argmax scores at once: those of a step of few tokens
HEAD_TPR, HEAD_WG = 8, 64       # its threads per vocabulary row and per workgroup (8 vocabulary rows a workgroup)


def head_argmax_partials(rows: list[int]) -> int:
    """Partials per scored row head_argmax keeps for a head whose row blocks hold these many rows."""
    return sum(-(-n // (HEAD_WG // HEAD_TPR)) for n in rows)


def head_argmax_scratch_bytes(rows: list[int]) -> int:
    """Bytes of the partials scratch head_argmax needs (rows: as head_argmax_partials)."""
    return HEAD_ROWS * head_argmax_partials(rows) * 8


def head_argmax(dev: Device, qtype, k: int, parts, x: Buffer, partials: Buffer, out: Buffer, step: Buffer,
                cap: float = 0.0, out0: int = 0, plan: Plan | None = None) -> Plan:
    """out[out0 + m] = argmax_v softcap(x[m] . W[v]) (lowest id on ties) for m < step.n_tokens <= HEAD_ROWS:
    the greedy choice after every row of a step, from x [m, k] (after the final norm) and the output matrix
    W [vocab, k] given as `parts` [(buffer or bound range, first id, rows)], its row blocks in id order
    (shaders/head_argmax.wgsl). Only the ids are written; partials: head_argmax_scratch_bytes of scratch."""
    row_bytes(qtype, k)
    plan = plan or dev.plan()
    np_ = head_argmax_partials([rows for _, _, rows in parts])
    prelude = quant_prelude(qtype) + f"const MAXM: u32 = {HEAD_ROWS}u;\n"
    p0 = 0
    for w, row0, rows in parts:
        p = pipeline(dev, "head_argmax", entry="rows", prelude=prelude,
                     constants={"K": k, "N": rows, "R0": row0, "P0": p0, "NP": np_, "TPR": HEAD_TPR, "WG": HEAD_WG,
                                "CAP": cap})
        n_groups = -(-rows // (HEAD_WG // HEAD_TPR))
        plan.dispatch(p, dev.bind_group(p, {"W": w, "X": x, "P": partials, "S": step}), *groups(n_groups))
        p0 += n_groups
    p = pipeline(dev, "head_argmax", entry="reduce", prelude=prelude, constants={"NP": np_, "OUT0": out0})
    return plan.dispatch(p, dev.bind_group(p, {"P": partials, "S": step, "OUT": out}), HEAD_ROWS)
