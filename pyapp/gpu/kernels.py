"""Kernel builders: WGSL preludes for quant types and pipeline + dispatch helpers.

Each helper returns what the engine records into a Plan; nothing here touches
a backend directly, so it runs the same in the browser and natively.
"""

from __future__ import annotations

from . import BindGroup, Buffer, Device, Pipeline, Plan

# GGML type id -> (name, elements per block, bytes per block); float types use 4-element pseudo blocks
QUANTS = {
    0: ("f32", 4, 16), 1: ("f16", 4, 8), 30: ("bf16", 4, 8),
    8: ("q8_0", 32, 34), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24),
    12: ("q4_k", 256, 144), 13: ("q5_k", 256, 176), 14: ("q6_k", 256, 210),
    39: ("mxfp4", 32, 17),
}
TYPE_IDS = {v[0]: k for k, v in QUANTS.items()}
MAX_GROUPS = 65535


def quant_type(t) -> int:
    """GGML type id from an id, a name ('Q4_K') or an enum with .value."""
    if isinstance(t, str):
        try:
            return TYPE_IDS[t.lower()]
        except KeyError:
            raise ValueError(f"quant type {t} has no GPU kernel (supported: {sorted(TYPE_IDS)})") from None
    t = int(getattr(t, "value", t))
    if t not in QUANTS:
        raise ValueError(f"GGML type {t} has no GPU kernel (supported: {sorted(n for n, _, _ in QUANTS.values())})")
    return t


def quant_prelude(t) -> str:
    name, qk, qb = QUANTS[quant_type(t)]
    return (f"const QK: u32 = {qk}u;\nconst QB: u32 = {qb}u;\n"
            f"fn dq4(bb: u32, i: u32) -> vec4<f32> {{ return dq4_{name}(bb, i); }}\n")


def row_bytes(t, k: int) -> int:
    _, qk, qb = QUANTS[quant_type(t)]
    if k % qk:
        raise ValueError(f"row length {k} is not a multiple of the {QUANTS[quant_type(t)][0]} block ({qk})")
    return k // qk * qb


def groups(n: int) -> tuple[int, int]:
    """Workgroup counts (x, y) for n workgroups, within the 65535-per-dimension limit."""
    if n <= MAX_GROUPS:
        return max(n, 1), 1
    y = -(-n // MAX_GROUPS)
    return -(-n // y), y


def matvec(dev: Device, qtype, k: int, n: int, w: Buffer, x: Buffer, y: Buffer,
           plan: Plan | None = None, tpr: int = 64, wg: int = 256) -> Plan:
    """y[n] = W[n, k] @ x[k] for quantized W (raw GGUF bytes in w)."""
    row_bytes(qtype, k)
    p = dev.pipeline("matvec", prelude=quant_prelude(qtype), constants={"K": k, "N": n, "TPR": tpr, "WG": wg})
    bg = dev.bind_group(p, [w, x, y])
    plan = plan if plan is not None else dev.plan()
    return plan.dispatch(p, bg, *groups(-(-n // (wg // tpr))))


def matmul(dev: Device, qtype, k: int, n: int, w: Buffer, x: Buffer, y: Buffer, params: Buffer,
           n_tokens: int, plan: Plan | None = None) -> Plan:
    """Y[t, n] = X[t, k] @ W[n, k]^T; params (uniform, u32 x4) must hold t in .x.

    n_tokens sizes the dispatch: the most tokens this plan will see.
    """
    row_bytes(qtype, k)
    p = dev.pipeline("matmul", prelude=quant_prelude(qtype), constants={"K": k, "N": n})
    bg = dev.bind_group(p, [w, x, y, params])
    plan = plan if plan is not None else dev.plan()
    return plan.dispatch(p, bg, -(-n // 32), -(-n_tokens // 32))
