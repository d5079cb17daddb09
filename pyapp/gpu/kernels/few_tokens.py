"""A step of a few tokens (a token and speculative decoding's drafts): each weight read once for all of
them (shaders/matvec_tokens*.wgsl), and the head's greedy choices without writing the logits
(shaders/head_argmax.wgsl). Both reduce rows with row_dots.wgsl."""

from __future__ import annotations

from ... import ggml
from .. import Buffer, Device, Plan
from .quants import quant_prelude, quant_type, row_bytes
from .shared import groups, pipeline

FEW_TOKENS = 17           # the most tokens matvec_tokens takes: a token and up to 16 drafts (speculative decoding)
FEW_TPR, FEW_WG = 32, 128     # its threads per row (>= FEW_TOKENS: thread t writes token t) and per workgroup
FEW_Q4K_TPR, FEW_Q4K_WG = 16, 64   # matvec_tokens_q4k: threads per row (each writes tokens t, t + 16) and per workgroup


def matvec_tokens(dev: Device, qtype, k: int, n: int, w, x: Buffer, y, params: Buffer, plan: Plan | None = None,
                  ldy: int = 0) -> Plan:
    """Y[t, n] = X[t, k] @ W[n, k]^T for the step's t < params.n_tokens <= FEW_TOKENS, each weight read once
    (shaders/matvec_tokens.wgsl): a step of a few tokens, where matmul's 64-token tiles would be mostly
    padding. ldy: row stride of Y when W is one row block of a wider matrix (y bound at its column)."""
    row_bytes(qtype, k)
    maxm = f"const MAXM: u32 = {FEW_TOKENS}u;\n"
    if quant_type(qtype) == ggml.Q4_K:       # its own kernel: each 16-byte chunk dequantized once (matvec_tokens_q4k)
        p = pipeline(dev, "matvec_tokens_q4k", prelude=maxm,
                     constants={"K": k, "N": n, "LDY": ldy, "TPR": FEW_Q4K_TPR, "WG": FEW_Q4K_WG})
        rows_per_group = FEW_Q4K_WG // FEW_Q4K_TPR
    else:
        p = pipeline(dev, "matvec_tokens", prelude=quant_prelude(qtype) + maxm,
                     constants={"K": k, "N": n, "LDY": ldy, "TPR": FEW_TPR, "WG": FEW_WG})
        rows_per_group = FEW_WG // FEW_TPR
    bg = dev.bind_group(p, {"W": w, "X": x, "Y": y, "S": params})
    return (plan if plan is not None else dev.plan()).dispatch(p, bg, *groups(-(-n // rows_per_group)))


HEAD_ROWS = FEW_TOKENS   # rows head_argmax scores at once: those of a step of few tokens
HEAD_TPR, HEAD_WG = 32, 128     # its threads per vocabulary row and per workgroup (4 vocabulary rows a workgroup)


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
