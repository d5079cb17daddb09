"""LoRA adapters: a projection's delta in the forward (shaders/lora.wgsl) and its backward, the gradients
of A and B (shaders/lora_backward.wgsl, mirroring pyapp.reference.backward)."""

from __future__ import annotations

from .. import Buffer, Device, Plan
from .shared import groups, pipeline, thread_groups

LORA_OUTPUTS_PER_GROUP = 256     # shaders/lora.wgsl's OPW
LORA_SCALE_STRIDE = 256          # bytes between scale slots: each slot is bindable on its own


def lora(dev: Device, k: int, n: int, rank: int, a: Buffer, b: Buffer, x: Buffer, y, scale, step: Buffer,
         max_tokens: int, ldy: int | None = None, col0: int = 0, plan: Plan | None = None,
         bounds: tuple = ()) -> Plan:
    """y[t, col0 + i] += scale[0] * (B [n, rank] @ (A [rank, k] @ x[t]))[i] for the step's tokens: the
    LoRA delta of one projection (shaders/lora.wgsl). scale: the target's slot (Buffer, offset, 4);
    ldy: y's row stride (default n). bounds: the first outputs of a group's second and third
    projections (A then holds len(bounds) + 1 A's of this rank one after the other)."""
    if len(bounds) > 2:
        raise ValueError("a LoRA group holds at most 3 projections")
    segs = len(bounds) + 1
    bnd = list(bounds) + [n] * (2 - len(bounds))
    p = pipeline(dev, "lora", constants={"K": k, "N": n, "R": rank, "LDY": ldy or n, "COL0": col0,
                                         "OPW": LORA_OUTPUTS_PER_GROUP, "RT": segs * rank,
                                         "BND1": bnd[0], "BND2": bnd[1]})
    bg = dev.bind_group(p, {"A": a, "B": b, "X": x, "Y": y, "SC": scale, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, -(-n // LORA_OUTPUTS_PER_GROUP), max_tokens)


LORA_MAX_RANK = 16     # shaders/lora_backward.wgsl's RMAX
_LORA_BWD_BINDINGS = {"rank": ("A", "B", "X", "DY", "DX", "UD", "SC", "S"),     # what each entry point binds
                      "grads": ("X", "DY", "DA", "DB", "UD", "S")}


def lora_ud_floats(rank: int, max_tokens: int) -> int:
    """Floats of the scratch lora_backward needs (s u and du per token)."""
    return 2 * rank * max_tokens


def lora_backward(dev: Device, k: int, n: int, rank: int, a: Buffer, b: Buffer, x: Buffer, dy: Buffer, dx: Buffer,
                  da: Buffer, db: Buffer, ud: Buffer, scale, step: Buffer, max_tokens: int, ldd: int = 0,
                  col0: int = 0, plan: Plan | None = None) -> Plan:
    """The LoRA part of one projection's backward (shaders/lora_backward.wgsl): dX += s (dY B) A,
    dA += s (dY B)^T x, dB += s dY^T (x A^T), for dY = dy[:, col0:col0 + n] (row stride ldd, default n).
    scale: the target's slot (Buffer, offset, 4) as for `lora`; ud: scratch of lora_ud_floats floats."""
    if not 1 <= rank <= LORA_MAX_RANK:
        raise ValueError(f"LoRA backward supports ranks 1..{LORA_MAX_RANK}, got {rank}")
    plan = plan or dev.plan()
    c = {"K": k, "N": n, "R": rank, "LDD": ldd, "COL0": col0}
    res = {"A": a, "B": b, "X": x, "DY": dy, "DX": dx, "DA": da, "DB": db, "UD": ud, "SC": scale, "S": step}
    for entry, dispatch in (("rank", groups(max_tokens)), ("grads", thread_groups(k + n))):
        p = pipeline(dev, "lora_backward", entry=entry, constants=c)
        plan.dispatch(p, dev.bind_group(p, {name: res[name] for name in _LORA_BWD_BINDINGS[entry]}), *dispatch)
    return plan
