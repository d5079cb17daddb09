"""RMS norms (alone, in pairs, fused with the residual add or with RoPE), LayerNorm, RoPE, and the
per-layer embeddings' combine (shaders/norm.wgsl, rope.wgsl, ple.wgsl)."""

from __future__ import annotations

from .. import Buffer, Device, Plan
from .matmul import check_q8_rows
from .shared import groups, pipeline, thread_groups


def rms_norm(dev: Device, d: int, x: Buffer, y: Buffer, weight: Buffer | None, step: Buffer,
             max_tokens: int, rows_per_token: int = 1, eps: float = 1e-6, plan: Plan | None = None,
             scale: float = 1.0) -> Plan:
    """y = rms_norm(x) [* weight] * scale over rows of d floats; step.n_tokens = tokens."""
    p = pipeline(dev, "norm", constants={"D": d, "RPT": rows_per_token, "EPS": eps,
                                         "HAS_W": weight is not None, "SCALE": scale})
    bg = dev.bind_group(p, {"X": x, "Y": y, "Wt": weight if weight is not None else dev.dummy, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, *groups(max_tokens * rows_per_token))


def layer_norm(dev: Device, d: int, x: Buffer, y: Buffer, weight: Buffer, bias: Buffer, step: Buffer,
               max_tokens: int, eps: float = 1e-5, plan: Plan | None = None) -> Plan:
    """y = (x - mean) / sqrt(variance + eps) * weight + bias over rows of d floats (PyTorch's LayerNorm)."""
    p = pipeline(dev, "norm", entry="layer_norm", constants={"D": d, "EPS": eps})
    bg = dev.bind_group(p, {"X": x, "Y": y, "Wt": weight, "LB": bias, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, *groups(max_tokens))


def rms_norm_pair(dev: Device, d: int, x: Buffer, y: Buffer, weight: Buffer | None, y2: Buffer, weight2: Buffer,
                  step: Buffer, max_tokens: int, eps: float = 1e-6, scale: float = 1.0,
                  plan: Plan | None = None) -> Plan:
    """y = rms_norm(x) [* weight] * scale and y2 = rms_norm(x) * weight2, rows of d floats, one dispatch."""
    p = pipeline(dev, "norm", entry="norm_pair", constants={"D": d, "EPS": eps, "HAS_W": weight is not None,
                                                           "SCALE": scale})
    res = {"X": x, "Y": y, "Wt": weight if weight is not None else dev.dummy, "S": step, "A": y2, "W2": weight2}
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *groups(max_tokens))


def add_normed(dev: Device, d: int, x: Buffer, acc: Buffer, weight: Buffer, step: Buffer, max_tokens: int,
               eps: float = 1e-6, scale: Buffer | None = None, next_out: Buffer | None = None,
               next_weight: Buffer | None = None, plan: Plan | None = None, rounded: tuple | None = None,
               keep: bool = True, x_slices: int = 1) -> Plan:
    """acc = (acc + rms_norm(x) * weight) [* scale[0]]: a post-norm's residual add (+ layer output scale);
    with next_out: also next_out = rms_norm(acc) * next_weight (the following pre-norm). rounded = (xq, xs):
    that pre-norm's rows (without next_out: acc's) also rounded to int8 as quantize_q8 rounds them (for the
    int8 matmul after it), next_out written only where keep. x_slices > 1: x holds that many partial sums of
    the rows (f32 [x_slices, T, d]: a matmul's slices of K left unsummed), added here."""
    nxt = next_out is not None
    constants = {"D": d, "EPS": eps, "HAS_SC": scale is not None, "XSPLIT": x_slices}
    res = {"X": x, "Wt": weight, "S": step, "A": acc, "SC": scale if scale is not None else dev.dummy}
    if rounded is not None:
        check_q8_rows(d)
        res.update({"XQ": rounded[0], "XS": rounded[1]})
        if nxt:
            p = pipeline(dev, "norm", entry="add_normed_q8", constants={**constants, "KEEP": keep})
            res.update({"Y": next_out if keep else dev.dummy_out, "W2": next_weight})
        else:
            p = pipeline(dev, "norm", entry="add_q8", constants=constants)
            res.update({"Y": dev.dummy_out, "W2": dev.dummy})
    else:
        p = pipeline(dev, "norm", entry="add_normed", constants={**constants, "HAS_NEXT": nxt})
        res.update({"Y": next_out, "W2": next_weight} if nxt else {"Y": dev.dummy_out, "W2": dev.dummy})
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *groups(max_tokens))


def norm_rope(dev: Device, x: Buffer, y: Buffer, weight: Buffer, step: Buffer, heads: int, head_dim: int,
              rot_dims: int, base: float, max_tokens: int, eps: float = 1e-6, freq_factors: Buffer | None = None,
              plan: Plan | None = None) -> Plan:
    """y = rope(rms_norm(x) * weight) per head of x [T, heads, head_dim] (q/k norm + RoPE in one pass)."""
    p = pipeline(dev, "norm", entry="norm_rope", constants={
        "D": head_dim, "RPT": heads, "EPS": eps, "NROT": rot_dims, "BASE": base, "HAS_FF": freq_factors is not None})
    res = {"X": x, "Y": y, "Wt": weight, "S": step, "FF": freq_factors if freq_factors is not None else dev.dummy}
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *groups(max_tokens * heads))


def rope(dev: Device, x: Buffer, step: Buffer, heads: int, head_dim: int, rot_dims: int, base: float,
         max_tokens: int, freq_factors: Buffer | None = None, plan: Plan | None = None) -> Plan:
    """NeoX RoPE in place on x [T, heads, head_dim]; positions step.pos0 + t."""
    p = pipeline(dev, "rope", constants={"H": heads, "HD": head_dim, "NROT": rot_dims, "BASE": base,
                                         "HAS_FF": freq_factors is not None})
    bg = dev.bind_group(p, {"X": x, "FF": freq_factors if freq_factors is not None else dev.dummy, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_tokens * heads * rot_dims // 2))


def ple_combine(dev: Device, n_layers: int, ple_dim: int, max_tokens: int, proj: Buffer, emb: Buffer,
                norm_w: Buffer, out: Buffer, step: Buffer, hidden: int, eps: float,
                plan: Plan | None = None) -> Plan:
    """out [L, max_tokens, ple_dim] = (rms_norm(proj / sqrt(hidden)) * norm_w + emb) / sqrt(2)."""
    p = pipeline(dev, "ple", constants={"L": n_layers, "PD": ple_dim, "TMAX": max_tokens,
                                        "PSCALE": hidden ** -0.5, "EPS": eps})
    bg = dev.bind_group(p, {"P": proj, "EMB": emb, "NW": norm_w, "O": out, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, n_layers, max_tokens)
