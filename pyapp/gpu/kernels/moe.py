"""A MoE layer's experts: per-slot matvecs for a few tokens (shaders/moe.wgsl, moe_q4k.wgsl, moe_x8.wgsl),
grouped by expert into matmul tiles for a chunk (moe_grouped.wgsl, moe_grouped_q8.wgsl), and the
weighted combine (moe.wgsl combine, moe_tail.wgsl). The router is router.py."""

from __future__ import annotations

from ... import ggml
from .. import Buffer, Device, Plan
from .matmul import MOE_MATMUL, MatmulTile, Q8Tile, fit_q8_tile, fit_tile, matmul_prelude
from .matvec import Q4K_RESIDUAL_WORKGROUP, Q4K_WORKGROUP, q4k_threads_per_row, q4k_x_prelude, x_arrays
from .quants import B32_TYPES, q8_b32_prelude, quant_prelude, quant_type, row_bytes
from .shared import MOE_TAIL_ROUNDS, MOE_TAIL_WORKGROUP, groups, pipeline, thread_groups


def expert_threads_per_row(k: int) -> int:
    """Threads per row of the 4-weight-group expert matvec: a power of two 8-64, about 16 groups a
    thread (bench/matvec_sweep.py --experts on an H100, 2026-11-26: the 26B-A4B's 704-long Q5_0
    down rows took 93 us a dispatch at 8 threads, 155 at 64; Q8_0 58.5 and 108.7)."""
    tpr = 8
    while tpr < 64 and k // 4 // (2 * tpr) >= 16:
        tpr *= 2
    return tpr


# moe_x8.wgsl's threads per row and workgroup: 26B-A4B's 704-long down rows (22 blocks) took 49.7 us a
# dispatch (8 slots) at 2 x 128 against 59.6 at 4 x 256 and 69.7 at 8 x 256 (Q5_0; the f32 kernel at
# its best 101.7; Q8_0 53.8 against 58.6): bench/matvec_sweep.py --experts --int8, H100, 2026-11-26.
# Longer rows keep about as many blocks a thread (11 there): the gate|up's 2816-long rows (88 blocks)
# take 8 threads, as the Q4_K experts' gate|up on int8 x measured best (8 x 128: bench/matvec_sweep.py
# --int8 --gpu-time, 2026-11-26); not yet timed for these types.
EXPERT_X8_WG = 128


def expert_x8_threads_per_row(k: int) -> int:
    """Threads per row of moe_x8.wgsl: 2, or more (a power of two up to 16) while each keeps 8 blocks of 32
    or more."""
    tpr = 2
    while tpr < 16 and k // 32 // (2 * tpr) >= 8:
        tpr *= 2
    return tpr


def moe_experts(dev: Device, qtype, k: int, n: int, n_experts: int, k_used: int, w: Buffer, x: Buffer,
                y: Buffer, ids: Buffer, step: Buffer, max_tokens: int, per_slot_input: bool = False,
                plan: Plan | None = None, tpr: int | None = None, wg: int | None = None, first_expert: int = 0,
                experts_here: int | None = None, geglu: bool = False, chunks: bool | None = None,
                int8: bool = False) -> Plan:
    """y[t*k_used + j] = W[ids[t, j]] [n, k] @ x[t or t*k_used + j] for W [n_experts, n, k].
    A W split over buffers: w holds experts first_expert .. first_expert + experts_here - 1, and
    only the slots routed to those are written. geglu: W is [n_experts, 2n, k] (gate rows, then
    up rows) and y = gelu(gate x) * (up x). chunks: Q4_K read in 16-byte chunks (moe_q4k.wgsl;
    default for Q4_K where the device has subgroups); int8: their x rounded to int8 per 32."""
    row_bytes(qtype, k)
    ne = n_experts - first_expert if experts_here is None else experts_here
    if chunks is None:
        chunks = quant_type(qtype) == ggml.Q4_K and dev.has_subgroups
    if chunks:
        tpr = tpr or q4k_threads_per_row(k, n, int8)     # an expert's rows (the sweep: 32 for a26b's)
        wg = wg or (Q4K_RESIDUAL_WORKGROUP if int8 else Q4K_WORKGROUP)
        p = pipeline(dev, "moe_q4k", enables=("subgroups",), prelude=q4k_x_prelude(int8),
                     constants={"K": k, "N": n, "TPR": tpr, "WG": wg, "MODE": 1 if geglu else 0, "KSEL": k_used,
                                "XPER": k_used if per_slot_input else 1, "E0": first_expert, "NE": ne,
                                **x_arrays(k, int8)})
        bg = dev.bind_group(p, {"W": w, "X": x, "Y": y, "B": dev.dummy, "S": step, "IDS": ids})
        return (plan or dev.plan()).dispatch(p, bg, -(-n // (wg // tpr)), max_tokens * k_used)
    if int8:
        if quant_type(qtype) not in B32_TYPES:
            raise ValueError("int8 x is for the Q4_K chunk expert matvec and Q4_0 / Q5_0 / Q8_0")
        tpr, wg = tpr or expert_x8_threads_per_row(k), wg or EXPERT_X8_WG
        p = pipeline(dev, "moe_x8", prelude=q8_b32_prelude(qtype),
                     constants={"KSEL": k_used, "K": k, "N": n, "TPR": tpr, "WG": wg, **x_arrays(k, True),
                                "XPER": k_used if per_slot_input else 1, "E0": first_expert, "NE": ne,
                                "GEGLU": geglu})
        bg = dev.bind_group(p, {"W": w, "X": x, "Y": y, "S": step, "IDS": ids})
        return (plan or dev.plan()).dispatch(p, bg, -(-n // (wg // tpr)), max_tokens * k_used)
    tpr, wg = tpr or expert_threads_per_row(k), wg or 256
    p = pipeline(dev, "moe", entry="experts", prelude=quant_prelude(qtype),
                 constants={"KSEL": k_used, "K": k, "N": n, "TPR": tpr, "WG": wg,
                            "XPER": k_used if per_slot_input else 1, "E0": first_expert, "GEGLU": geglu,
                            "NE": ne})
    bg = dev.bind_group(p, {"W": w, "X": x, "Y": y, "S": step, "IDS": ids})
    return (plan or dev.plan()).dispatch(p, bg, -(-n // (wg // tpr)), max_tokens * k_used)


def moe_group_rows(n_experts: int, k_used: int, max_tokens: int) -> int:
    """u32s of the buffer moe_group fills: first rows, first tiles, the grouped slots."""
    return 2 * (n_experts + 1) + max_tokens * k_used


def moe_group(dev: Device, n_experts: int, k_used: int, ids: Buffer, grp: Buffer, step: Buffer,
              plan: Plan | None = None, tile: MatmulTile | None = None) -> Plan:
    """grp = the step's slots grouped by their expert ids[s] (ids >= n_experts left out), with each
    expert's first row and first matmul tile (layout: shaders/moe_grouped.wgsl). tile: the one
    moe_experts_grouped will use (default MOE_MATMUL, or what fits the device)."""
    tile = tile or fit_tile(dev, MOE_MATMUL)
    p = pipeline(dev, "moe_grouped", entry="group", prelude=matmul_prelude(ggml.F32, tile), enables=tile.enables,
                 constants={"E": n_experts, "KSEL": k_used})
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, {"S": step, "IDS": ids, "GRP": grp}), 1)


def moe_experts_grouped(dev: Device, qtype, k: int, n: int, n_experts: int, k_used: int, w: Buffer, x: Buffer,
                        y: Buffer, grp: Buffer, max_tokens: int, per_slot_input: bool = False,
                        plan: Plan | None = None, first_expert: int = 0, experts_here: int | None = None,
                        tile: MatmulTile | None = None, f16: bool = False) -> Plan:
    """moe_experts for a chunk, from moe_group's grouping (made with the same tile, or its f16 form:
    f16 where the device has shader-f16): a tiled matmul per expert, each expert's weights read once per
    tile of slots instead of once per slot."""
    row_bytes(qtype, k)
    tile = tile or fit_tile(dev, MOE_MATMUL, f16)
    p = pipeline(dev, "moe_grouped", entry="matmul", prelude=matmul_prelude(qtype, tile), enables=tile.enables,
                 constants={"E": n_experts, "KSEL": k_used, "K": k, "N": n,
                            "XPER": k_used if per_slot_input else 1, "E0": first_expert,
                            "NE": n_experts - first_expert if experts_here is None else experts_here})
    bg = dev.bind_group(p, {"W": w, "X": x, "Y": y, "GRP": grp})     # the step's size is in grp
    slots = max_tokens * k_used
    return (plan or dev.plan()).dispatch(p, bg, -(-n // tile.rows), -(-slots // tile.tokens) + min(n_experts, slots))


def moe_experts_grouped_q8(dev: Device, qtype, k: int, n: int, n_experts: int, k_used: int, w: Buffer,
                           xq: Buffer, xs: Buffer, y: Buffer, grp: Buffer, max_tokens: int, per_slot_input: bool = False,
                           plan: Plan | None = None, first_expert: int = 0, experts_here: int | None = None) -> Plan:
    """moe_experts_grouped for experts of an INT8_TYPES type on int8 activations (xq, xs from quantize_q8
    over x's rows), from moe_group's grouping made with the device's MoE tile (its slots a tile: the same here)."""
    bn = fit_tile(dev, MOE_MATMUL).tokens
    tile = fit_q8_tile(dev, Q8Tile(128, bn))
    if tile.tokens != bn:
        tile = Q8Tile(64, bn)
    bm = tile.rows
    p = pipeline(dev, "moe_grouped_q8", entry="matmul", prelude=tile.prelude(qtype, k),
                 constants={"E": n_experts, "KSEL": k_used, "K": k, "N": n,
                            "XPER": k_used if per_slot_input else 1, "E0": first_expert,
                            "NE": n_experts - first_expert if experts_here is None else experts_here})
    bg = dev.bind_group(p, {"W": w, "XQ": xq, "XS": xs, "Y": y, "GRP": grp})
    slots = max_tokens * k_used
    return (plan or dev.plan()).dispatch(p, bg, -(-n // bm), -(-slots // bn) + min(n_experts, slots))


def moe_combine(dev: Device, d: int, k_used: int, expert_out: Buffer, ids: Buffer, weights: Buffer,
                out: Buffer, step: Buffer, max_tokens: int, down_scale: Buffer | None = None,
                plan: Plan | None = None) -> Plan:
    """out[t] = sum_j weights[t, j] * expert_out[t*k_used + j] (* down_scale[ids[t, j]])."""
    p = pipeline(dev, "moe", entry="combine", prelude=quant_prelude(ggml.F32),
                 constants={"KSEL": k_used, "D": d, "HAS_SC": down_scale is not None})
    res = {"Y": out, "S": step, "IDS": ids, "WTS": weights, "YE": expert_out,
           "SC": down_scale if down_scale is not None else dev.dummy}
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *thread_groups(max_tokens * d))


def moe_tail(dev: Device, d: int, k_used: int, dense: Buffer, dense_norm: Buffer, expert_out: Buffer, ids: Buffer,
             weights: Buffer, moe_norm: Buffer, out: Buffer, step: Buffer, max_tokens: int, eps: float = 1e-6,
             down_scale: Buffer | None = None, plan: Plan | None = None) -> Plan:
    """out[t] = rms_norm(dense[t]) * dense_norm + rms_norm(moe[t]) * moe_norm, moe[t] = sum_j weights[t, j] *
    expert_out[t*k_used + j] (* down_scale[ids[t, j]]): a MoE layer's output (shaders/moe_tail.wgsl)."""
    most = 4 * MOE_TAIL_WORKGROUP * MOE_TAIL_ROUNDS
    if k_used > 16 or d % 4 or d > most:
        raise ValueError(f"moe_tail takes at most 16 experts a token and rows of at most {most} floats, a multiple "
                         f"of 4 (shaders/moe_tail.wgsl), not {k_used} experts of {d}")
    p = pipeline(dev, "moe_tail", constants={"KSEL": k_used, "D": d, "HAS_SC": down_scale is not None, "TEPS": eps})
    res = {"Y": out, "S": step, "IDS": ids, "WTS": weights, "YE": expert_out, "DN": dense, "W1": dense_norm,
           "W2": moe_norm, "SC": down_scale if down_scale is not None else dev.dummy}
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *groups(max_tokens))
