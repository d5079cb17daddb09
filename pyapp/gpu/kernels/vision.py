"""Gemma 4's image encoder: pixels to patches, the 2-D position table and RoPE, the 3 x 3 pooling
(shaders/vision.wgsl). Its matmuls (with the clippable linears' bounds: matmul(clamp=...)), norms, attention
(every patch sees every patch: attention(all_keys=True)) and GeGLU are the text model's kernels."""

from __future__ import annotations

import struct

from ... import ggml
from .. import Buffer, Device, Plan
from .quants import quant_prelude, row_bytes
from .shared import pipeline, thread_groups

GRID_BYTES = 16


def _pipeline(dev: Device, entry: str, constants: dict, qtype=ggml.F32):
    """An entry of vision.wgsl; the module reads the position table through quants' dq4, of qtype."""
    return pipeline(dev, "vision", entry=entry, prelude=quant_prelude(qtype), constants=constants)


def pack_grid(across: int, down: int) -> bytes:
    """Bytes of the encoder's uniform (vision.wgsl Grid): the image's patches across and down."""
    return struct.pack("<4I", across * down, across, down, 0)


def patchify(dev: Device, patch: int, channel_first: bool, grid: Buffer, pixels: Buffer, x: Buffer,
             max_patches: int, signed: bool = True, plan: Plan | None = None) -> Plan:
    """x[t] = the patch t of the RGBA8 image in pixels, scaled to [-1, 1] (signed) or [0, 1], in the patch
    embedding's order: (c, y, x) for a conv weight [n, 3, p, p] (channel_first), else (y, x, c)."""
    p = _pipeline(dev, "patchify", {"P": patch, "CHANNEL_FIRST": channel_first, "SIGNED": signed})
    bg = dev.bind_group(p, {"G": grid, "X": x, "PX": pixels})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_patches * 3 * patch * patch))


def add_positions(dev: Device, qtype, d: int, n_positions: int, table: Buffer, grid: Buffer, x: Buffer,
                  max_patches: int, plan: Plan | None = None) -> Plan:
    """x[t] += table[0, px] + table[1, py]: the learned 2-D position table [2, n_positions, d]."""
    row_bytes(qtype, d)
    p = _pipeline(dev, "positions", {"D": d, "NPOS": n_positions}, qtype)
    bg = dev.bind_group(p, {"G": grid, "X": x, "W": table})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_patches * d // 4))


def rope_2d(dev: Device, heads: int, head_dim: int, theta: float, grid: Buffer, x: Buffer, max_patches: int,
            plan: Plan | None = None) -> Plan:
    """In place on x [patches, heads, head_dim]: the first half of each head rotated by the patch's x, the
    second by its y (NeoX pairs within each half)."""
    if head_dim % 4:
        raise ValueError(f"2-D RoPE needs a head_dim that is a multiple of 4, not {head_dim}")
    p = _pipeline(dev, "rope_2d", {"H": heads, "HD": head_dim, "THETA": theta})
    bg = dev.bind_group(p, {"G": grid, "X": x})
    return (plan or dev.plan()).dispatch(p, bg, *thread_groups(max_patches * heads * head_dim // 2))


def pool(dev: Device, d: int, k: int, scale: float, grid: Buffer, x: Buffer, out: Buffer, max_squares: int,
         std: tuple[Buffer, Buffer] | None = None, plan: Plan | None = None) -> Plan:
    """out[s] = the mean of square s's k x k patches * scale [then (out - std_bias) * std_scale]."""
    p = _pipeline(dev, "pool", {"D": d, "POOL": k, "SCALE": scale,
                                                        "HAS_STD": std is not None})
    sb, ss = std if std is not None else (dev.dummy, dev.dummy)
    res = {"G": grid, "A": x, "O": out, "SB": sb, "SS": ss}
    return (plan or dev.plan()).dispatch(p, dev.bind_group(p, res), *thread_groups(max_squares * d))
