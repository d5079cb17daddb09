"""The training backward through the frozen model (shaders/*_backward.wgsl, matmul_dx.wgsl, cross_entropy.wgsl):
each kernel mirrors a function of pyapp.reference.backward and has a parity test against it
(tests/kernels/test_backward_kernels.py). LoRA's own gradients are lora.py's."""

from __future__ import annotations

import struct

from ... import ggml
from .. import Buffer, Device, Plan
from .matmul import MatmulTile
from .quants import quant_prelude, row_bytes
from .shared import MATMUL_TILE, groups, pipeline, thread_groups, workgroup_size


def matmul_dx(dev: Device, qtype, k: int, n: int, w: Buffer, dy: Buffer, dx: Buffer, params: Buffer,
              n_tokens: int, ldd: int = 0, col0: int = 0, accumulate: bool = False,
              plan: Plan | None = None) -> Plan:
    """dX[t, k] (+)= dY[t, col0:col0 + n] @ W[n, k]: the input gradient of a frozen quantized projection
    (W dequantized in the kernel). ldd: dY's row stride (default n); accumulate: add into dX.
    n_tokens sizes the dispatch (params.n_tokens, at most that, are computed)."""
    row_bytes(qtype, k)
    p = pipeline(dev, "matmul_dx", prelude=quant_prelude(qtype),
                 constants={"K": k, "N": n, "LDD": ldd, "COL0": col0, "ACC": accumulate})
    bg = dev.bind_group(p, {"W": w, "DY": dy, "DX": dx, "S": params})
    return (plan or dev.plan()).dispatch(p, bg, -(-k // MATMUL_TILE), -(-n_tokens // MATMUL_TILE))


def rms_norm_backward(dev: Device, d: int, x: Buffer, dy: Buffer, dx: Buffer, weight: Buffer | None, step: Buffer,
                      max_tokens: int, rows_per_token: int = 1, eps: float = 1e-6, accumulate: bool = False,
                      rope: tuple | None = None, freq_factors: Buffer | None = None, dy_ctx: int = 0,
                      scale: float = 1.0, plan: Plan | None = None) -> Plan:
    """dx (+)= the gradient of y = rms_norm(x) [* weight] * scale over rows of d floats, given dy; rows_per_token:
    heads for the per-head norms. rope = (rot_dims, base): dy is the gradient of rope(rms_norm(x) * weight)
    (norm_rope, the q/k norms), rotated back in the same pass. dy_ctx > 0: dy is in the KV cache's layout
    [rows_per_token heads, dy_ctx, d] (attention_backward's dk, dv), x and dx in the token-major one."""
    rot, base = rope or (0, 10000.0)
    p = pipeline(dev, "norm_backward", constants={"D": d, "RPT": rows_per_token, "EPS": eps, "ACC": accumulate,
                                                  "HAS_W": weight is not None, "SCALE": scale, "NROT": rot,
                                                  "BASE": base, "HAS_FF": freq_factors is not None, "DYC": dy_ctx})
    res = {"X": x, "DY": dy, "DX": dx, "S": step, "Wt": weight if weight is not None else dev.dummy,
           "FF": freq_factors if freq_factors is not None else dev.dummy}
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *groups(max_tokens * rows_per_token))


def rope_backward(dev: Device, dx: Buffer, step: Buffer, heads: int, head_dim: int, rot_dims: int, base: float,
                  max_tokens: int, freq_factors: Buffer | None = None, plan: Plan | None = None) -> Plan:
    """The gradient through NeoX RoPE, in place on dx [T, heads, head_dim]: the rotation by the opposite angle."""
    p = pipeline(dev, "norm_backward", entry="rope", constants={
        "D": head_dim, "RPT": heads, "NROT": rot_dims, "BASE": base, "HAS_FF": freq_factors is not None})
    res = {"DX": dx, "S": step, "FF": freq_factors if freq_factors is not None else dev.dummy}
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *thread_groups(max_tokens * heads * rot_dims // 2, 256))


def geglu_backward(dev: Device, ff: int, gate_up: Buffer, dy: Buffer, dgate_up: Buffer, step: Buffer,
                   max_tokens: int, rows_per_token: int = 1, plan: Plan | None = None) -> Plan:
    """dgate_up [rows, 2ff] = [dgate | dup] of y = gelu_tanh(gate) * up, gate_up [rows, 2ff] = [gate | up]."""
    p = pipeline(dev, "geglu_backward", entry="halves", constants={"D": ff, "RPT": rows_per_token})
    bg = dev.bind_group(p, {"GU": gate_up, "DY": dy, "DGU": dgate_up, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * rows_per_token * ff))


def gelu_times_backward(dev: Device, d: int, gate: Buffer, other: Buffer, dy: Buffer, dgate: Buffer, step: Buffer,
                        max_tokens: int, plan: Plan | None = None) -> Plan:
    """dgate = dy * other * gelu_tanh'(gate) of y = gelu_tanh(gate) * other (the PLE gate; other is constant)."""
    p = pipeline(dev, "geglu_backward", entry="times", constants={"D": d})
    bg = dev.bind_group(p, {"GU": gate, "M": other, "DY": dy, "DGU": dgate, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * d))


def cross_entropy_targets(tokens, mask) -> tuple[bytes, bytes]:
    """(TGT, WT) bytes for shaders/cross_entropy.wgsl: row t predicts tokens[t + 1] with weight
    mask[t + 1] / (targets counted), the last row nothing; as reference.backward.cross_entropy."""
    tokens, mask = list(tokens), [bool(m) for m in mask]
    n = sum(mask[1:])
    if len(tokens) != len(mask) or n == 0:
        raise ValueError("one mask entry per token, and at least one target after the first token")
    tgt = tokens[1:] + [0]
    wt = [1.0 / n if m else 0.0 for m in mask[1:]] + [0.0]
    return struct.pack(f"<{len(tgt)}I", *tgt), struct.pack(f"<{len(wt)}f", *wt)


CE_STAT_FLOATS = 4      # per row of cross_entropy's statistics buffer


def cross_entropy_stats(dev: Device, chunk: int, v0: int, z: Buffer, tgt: Buffer, wt: Buffer, stats: Buffer,
                        step: Buffer, max_tokens: int, cap: float = 0.0, first: bool = False,
                        plan: Plan | None = None) -> Plan:
    """Fold the logits chunk z [T, chunk] (pre-softcap; vocabulary ids v0 ..) into stats [T, CE_STAT_FLOATS]."""
    p = pipeline(dev, "cross_entropy", entry="stats",
                 constants={"VC": chunk, "V0": v0, "CAP": cap, "FIRST": first})
    bg = dev.bind_group(p, {"Z": z, "TGT": tgt, "ST": stats, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, *groups(max_tokens))


def cross_entropy_loss(dev: Device, stats: Buffer, wt: Buffer, loss: Buffer, step: Buffer,
                       plan: Plan | None = None) -> Plan:
    """loss[0] = the masked mean cross-entropy from the statistics of every chunk."""
    p = pipeline(dev, "cross_entropy", entry="loss", constants={"VC": 1})
    bg = dev.bind_group(p, {"WT": wt, "ST": stats, "LOSS": loss, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, 1)


def cross_entropy_grad(dev: Device, chunk: int, v0: int, z: Buffer, tgt: Buffer, wt: Buffer, stats: Buffer,
                       step: Buffer, max_tokens: int, cap: float = 0.0,
                       plan: Plan | None = None) -> Plan:
    """z = dloss/dz in place for the chunk z [T, chunk] (vocabulary ids v0 ..), through the softcap."""
    p = pipeline(dev, "cross_entropy", entry="grad", constants={"VC": chunk, "V0": v0, "CAP": cap})
    bg = dev.bind_group(p, {"Z": z, "TGT": tgt, "WT": wt, "ST": stats, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * chunk, 256))


_ATTN_BWD_BINDINGS = {"stats": ("Q", "K", "V", "DO", "ST", "S"), "dq": ("Q", "K", "V", "DO", "ST", "DQ", "S"),
                      "dkv": ("Q", "K", "V", "DO", "ST", "S", "DKVP"), "dkv_sum": ("DK", "DV", "S", "DKVP")}


def attention_backward_scratch_floats(heads: int, head_dim: int, ctx: int) -> int:
    """Floats of the scratch attention_backward needs: each query head's part of dK and dV."""
    return 2 * heads * ctx * head_dim


def attention_backward(dev: Device, q: Buffer, k: Buffer, v: Buffer, dout: Buffer, stats: Buffer, dq: Buffer,
                       dk: Buffer, dv: Buffer, step: Buffer, heads: int, kv_heads: int, head_dim: int, ctx: int,
                       max_tokens: int, scratch: Buffer, window: int = 0, scale: float = 1.0,
                       accumulate: bool = False, plan: Plan | None = None) -> Plan:
    """(dq, dk, dv) of out = softmax(scale q k^T, causal [+ window]) v for a whole sequence from position 0
    (shaders/attention_backward.wgsl): q, dout, dq [T, heads, head_dim]; k, v, dk, dv [kv_heads, ctx,
    head_dim], dk/dv summed over each KV head's query heads (added into with accumulate); stats: scratch
    of 2 * heads * max_tokens floats; scratch: attention_backward_scratch_floats floats."""
    if heads % kv_heads or head_dim > 8 * 64:
        raise ValueError(f"attention backward: {heads} heads over {kv_heads}, head_dim {head_dim} unsupported")
    c = {"H": heads, "HKV": kv_heads, "HD": head_dim, "CTX": ctx, "WINDOW": window, "SCALE": scale,
         "ACC": accumulate}
    res = {"Q": q, "K": k, "V": v, "DO": dout, "ST": stats, "DQ": dq, "DK": dk, "DV": dv, "S": step,
           "DKVP": scratch}
    plan = plan or dev.plan()
    for entry in ("stats", "dq", "dkv", "dkv_sum"):
        p = pipeline(dev, "attention_backward", entry=entry, constants=c)
        dispatch = thread_groups(kv_heads * ctx * head_dim) if entry == "dkv_sum" else (heads, max_tokens)
        plan.dispatch(p, dev.bind_group(p, {n: res[n] for n in _ATTN_BWD_BINDINGS[entry]}), *dispatch)
    return plan


# moe_experts_dx (training) reads a grouping in tiles of MATMUL_TILE slots: moe_group(..., tile=MOE_DX_GROUPS)
MOE_DX_GROUPS = MatmulTile(64, MATMUL_TILE, 16)


def moe_router_backward(dev: Device, n_experts: int, k_used: int, d: int, logits: Buffer, ids: Buffer,
                        dout: Buffer, expert_out: Buffer, dlogits: Buffer, step: Buffer, max_tokens: int,
                        down_scale: Buffer | None = None, plan: Plan | None = None) -> Plan:
    """dlogits [T, n_experts] = router_weights_backward of softmax(logits) with the chosen ids [T, k_used], given
    dloss/dweight[t, j] = dout[t] . expert_out[t*k_used + j] (* down_scale[ids]) (shaders/moe_backward.wgsl)."""
    p = pipeline(dev, "moe_backward", entry="router", prelude=quant_prelude(ggml.F32),
                 constants={"E": n_experts, "KSEL": k_used, "D": d, "HAS_SC": down_scale is not None,
                            "WG": workgroup_size(max(n_experts, d))})
    res = {"LOG": logits, "IDS": ids, "DO": dout, "YE": expert_out, "DLOG": dlogits, "S": step,
           "SC": down_scale if down_scale is not None else dev.dummy}
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *groups(max_tokens))


def moe_experts_dx(dev: Device, qtype, k: int, n: int, n_experts: int, k_used: int, w: Buffer, dy: Buffer,
                   dx: Buffer, grp: Buffer, max_tokens: int, per_slot_dy: bool = False, weights: Buffer | None = None,
                   down_scale: Buffer | None = None, ldd: int = 0, col0: int = 0, accumulate: bool = False,
                   first_expert: int = 0, experts_here: int | None = None, plan: Plan | None = None) -> Plan:
    """The experts' input gradient through frozen W [n_experts, n, k], slot by slot: dx[s] (+)= c(s) *
    dy[t or s, col0:col0 + n] @ W[ids[s]] (dy rows of ldd floats, default n), c(s) = weights[s] (*
    down_scale[ids[s]]) given weights, else 1; dx [T * k_used, k]. The slots as moe_group grouped them
    with tile=MOE_DX_GROUPS (grp), a tiled product per expert (shaders/moe_backward.wgsl `dx`); a W split over buffers: one call
    per buffer (first_expert, experts_here), each writing its experts' slots."""
    row_bytes(qtype, k)
    p = pipeline(dev, "moe_backward", entry="dx", prelude=quant_prelude(qtype),
                 constants={"E": n_experts, "KSEL": k_used, "K": k, "N": n, "LDD": ldd, "COL0": col0,
                            "XPER": k_used if per_slot_dy else 1, "SCALED": weights is not None,
                            "HAS_SC": down_scale is not None, "ACC": accumulate, "E0": first_expert,
                            "NE": n_experts - first_expert if experts_here is None else experts_here})
    res = {"W": w, "DY": dy, "DX": dx, "GRP": grp, "WTS": weights if weights is not None else dev.dummy,
           "SC": down_scale if down_scale is not None else dev.dummy}
    slots = max_tokens * k_used
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), -(-k // MATMUL_TILE),
                                         -(-slots // MATMUL_TILE) + min(n_experts, slots))


def moe_slot_sum(dev: Device, d: int, k_used: int, per_slot: Buffer, out: Buffer, step: Buffer, max_tokens: int,
                 plan: Plan | None = None) -> Plan:
    """out[t] = sum_j per_slot[t*k_used + j] over rows of d floats (a token's experts' input gradients)."""
    p = pipeline(dev, "moe_backward", entry="slot_sum", prelude=quant_prelude(ggml.F32),
                 constants={"KSEL": k_used, "D": d})
    bg = dev.bind_group(p, {"YS": per_slot, "OUT": out, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * d))
