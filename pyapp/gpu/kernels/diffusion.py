"""DiffusionGemma's kernels: the soft embedding of a canvas's logits (shaders/soft_embed.wgsl), attention
of the canvas over the cached prefix and itself (attention_canvas.wgsl), and a denoising step's sampler
(denoise.wgsl)."""

from __future__ import annotations

import struct

from ... import ggml
from .. import Buffer, Device, Plan
from .attention import attention_constants
from .quants import quant_prelude, row_bytes
from .shared import MATMUL_TILE, groups, pipeline


def soft_embed(dev: Device, qtype, v: int, d: int, logits: Buffer, stats: Buffer, parts, out: Buffer,
               step: Buffer, max_tokens: int, scale: float = 1.0, plan: Plan | None = None) -> Plan:
    """out[t] = softmax(logits[t, :v]) @ E * scale for T = step.n_tokens rows, E the [v, d] table given
    as `parts` [(buffer, row0, rows)] (row blocks, each within one binding); stats: scratch [T, 2]."""
    row_bytes(qtype, d)
    plan = plan or dev.plan()
    p = pipeline(dev, "soft_embed", entry="row_stats", prelude=quant_prelude(ggml.F32), constants={"V": v, "D": d})
    plan.dispatch(p, dev.bind_group(p, {"L": logits, "ST": stats, "S": step}), *groups(max_tokens))
    for i, (buf, row0, rows) in enumerate(parts):
        p = pipeline(dev, "soft_embed", entry="mix", prelude=quant_prelude(qtype),
                     constants={"V": v, "D": d, "R0": row0, "RN": rows, "SCALE": scale, "ACC": i > 0})
        bg = dev.bind_group(p, {"L": logits, "STR": stats, "S": step, "W": buf, "O": out})
        plan.dispatch(p, bg, -(-d // MATMUL_TILE), -(-max_tokens // MATMUL_TILE))
    return plan


def attention_canvas(dev: Device, q: Buffer, kc: Buffer, vc: Buffer, k: Buffer, v: Buffer, out: Buffer,
                     step: Buffer, heads: int, kv_heads: int, head_dim: int, ctx: int, max_tokens: int,
                     keep: int = 0, scale: float = 1.0, plan: Plan | None = None) -> Plan:
    """out[t, h] = softmax(scale q k^T) v over the cached prefix (its last `keep` positions before
    step.pos0; 0: all of it) and the T = step.n_tokens canvas keys k, v [T, kv_heads, head_dim], unmasked;
    the cache is only read."""
    c = dict(attention_constants(heads, kv_heads, head_dim, ctx), KEEP=keep)
    del c["WINDOW"]
    p = pipeline(dev, "attention_canvas", entry="attend_canvas", constants=c)
    bg = dev.bind_group(p, {"Q": q, "KC": kc, "VC": vc, "Kn": k, "Vn": v, "O": out, "S": step})
    return (plan or dev.plan()).dispatch(p, bg, heads, max_tokens)


DENOISE_HEADER = 8       # u32 words before the draws in a denoising step's parameters (shaders/denoise.wgsl)


def denoise_param_words(canvas: int) -> int:
    """u32 words of a denoising step's parameters for a canvas of this length."""
    return DENOISE_HEADER + 2 * canvas


def pack_denoise_step(canvas: int, temperature: float, entropy_bound: float, confidence: float, stability: int,
                      first: bool, noise, uniforms=None, forced=None) -> bytes:
    """Bytes of shaders/denoise.wgsl's DP: the step's settings, then per position a uniform (or, given
    `forced`, the sampled id) and the renoise id; len(noise) = the step's canvas tokens."""
    n = len(noise)
    draws = struct.pack(f"<{n}I", *forced) if forced is not None else struct.pack(f"<{n}f", *uniforms)
    pad = bytes(4 * (canvas - n))
    return (struct.pack("<fIffIII", temperature, forced is not None, entropy_bound, confidence, stability,
                        bool(first), n) + bytes(4) + draws + pad + struct.pack(f"<{n}I", *noise) + pad)


def denoise(dev: Device, v: int, canvas: int, logits: Buffer, params: Buffer, ent: Buffer, am: Buffer,
            smp: Buffer, ids: Buffer, prev: Buffer, out: Buffer, plan: Plan | None = None) -> Plan:
    """One denoising step's sampler (shaders/denoise.wgsl): `rows` per canvas position, then `accept`.
    logits [n, v] become the processed logits; ids the next step's canvas; out the step's small results."""
    plan = plan or dev.plan()
    c = {"V": v, "C": canvas}
    p = pipeline(dev, "denoise", entry="rows", constants=c)
    plan.dispatch(p, dev.bind_group(p, {"L": logits, "DP": params, "ENT": ent, "AM": am, "SMP": smp}), *groups(canvas))
    p = pipeline(dev, "denoise", entry="accept", constants=c)
    bg = dev.bind_group(p, {"DP": params, "ENTR": ent, "AMR": am, "SMPR": smp, "IDS": ids, "PREV": prev, "OUT": out})
    return plan.dispatch(p, bg, 1)
