"""Per-element ops: GeGLU, softcap, add, mul, scale (shaders/elementwise.wgsl) and the token embedding
lookup with an encoder's soft tokens over it (shaders/embed.wgsl)."""

from __future__ import annotations

from ... import ggml
from .. import Buffer, Device, Plan
from .quants import quant_prelude, row_bytes
from .shared import pipeline, thread_groups


def elementwise(dev: Device, op: str, d: int, a: Buffer, step: Buffer, max_tokens: int,
                b: Buffer | None = None, out: Buffer | None = None, cap: float = 30.0,
                scale: float = 1.0, plan: Plan | None = None) -> Plan:
    """op in geglu (out = gelu(a) * b), softcap (a), add / mul (a op= b), add_bias (a[t] += b, b of d floats),
    scale (a *= scale [* b[0]])."""
    consts = {"D": d}
    res = {"A": a, "S": step}
    if op == "softcap":
        consts["CAP"] = cap
    elif op == "scale":
        consts["SCALE"] = scale
        consts["SCALE_BY_B"] = b is not None
        res["B"] = b if b is not None else dev.dummy
    else:
        res["B"] = b
    if op == "geglu":
        res["O"] = out
    p = pipeline(dev, "elementwise", entry=op, constants=consts)
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *thread_groups(max_tokens * d))


def geglu_halves(dev: Device, ff: int, rows_per_token: int, gate_up: Buffer, out: Buffer, step: Buffer,
                 max_tokens: int, plan: Plan | None = None) -> Plan:
    """out[r, f] = gelu(gate_up[r, f]) * gate_up[r, ff + f] for the T * rows_per_token rows of a fused
    [gate | up] projection (dense MLP prefill: 1 row per token; experts: one per chosen expert)."""
    p = pipeline(dev, "elementwise", entry="geglu_halves", constants={"D": ff, "RPT": rows_per_token})
    bg = dev.bind_group(p, {"A": gate_up, "S": step, "O": out})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * rows_per_token * ff))


def embed(dev: Device, qtype, d: int, table: Buffer, ids: Buffer, out: Buffer, step: Buffer,
          max_tokens: int, scale: float = 1.0, row0: int = 0, nrows: int = 0xFFFFFFFF,
          plan: Plan | None = None) -> Plan:
    """out[t] = table[ids[t]] * scale for the table rows [row0, row0 + nrows) held by `table`."""
    row_bytes(qtype, d)
    p = pipeline(dev, "embed", prelude=quant_prelude(qtype),
                 constants={"D": d, "R0": row0, "RN": nrows, "SCALE": scale})
    bg = dev.bind_group(p, {"W": table, "IDS": ids, "O": out, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * d // 4))


def soft_tokens(dev: Device, d: int, rows: Buffer, at: Buffer, out: Buffer, step: Buffer, max_tokens: int,
                plan: Plan | None = None) -> Plan:
    """out[t] = rows[t] where at[t] != 0 (u32 flags): an encoder's soft tokens over the embeddings."""
    p = pipeline(dev, "embed", entry="soft_tokens", prelude=quant_prelude(ggml.F32), constants={"D": d})
    bg = dev.bind_group(p, {"ROWS": rows, "AT": at, "O": out, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * d // 4))
