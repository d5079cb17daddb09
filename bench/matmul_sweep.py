"""Prefill matmul speed by tile shape (pyapp.gpu.kernels.MatmulTile), on a 512-token step's shapes,
the grouped MoE expert matmul (a26b's experts) by tile, and the prefill attention by variant.

    python bench/matmul_sweep.py [--quants q4_k] [--tokens 512]          # native (wgpu)
    python bench/matmul_sweep.py --f16 --quants q4_k q6_k --tokens 64     # the f16 tiles (shader-f16)
    node bench/node_bench.mjs --sweep                                    # browser path (Pyodide + Dawn)
    python bench/matmul_sweep.py --attention-at 15872                    # the attention of a chunk late in a
    ATTENTION_AT=15872 node bench/node_bench.mjs --sweep                 # 16k prompt (LONG_ATTENTION_SHAPES)

Prints one JSON line per (shape, quant, tile): microseconds per dispatch (10 per submit, wall
clock over 20 submits after a warm-up, so a dispatch's ~10 us overhead is included) and TFLOP/s.
The engine's tile (kernels.MATMUL) comes from these figures (--all-tiles: every f32 tile; default the
engine's). Shapes of an int8 weight type (kernels.INT8_TYPES) are also timed on the int8 path
(kernels.quantize_q8 + matmul_q8 by Q8Tile, tile "int8 ROWSxTOKENS tTHREAD_ROWS[xTHREAD_TOKENS]"; the grouped experts,
"int8"): the activations' quantization included. Standard library only, so
the same code runs in Pyodide.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (rows, row length): E2B q, o, gate, down; a26b q, 2112 x 2816, dense down (rows of 2112: Q5_0 in the
# bench files, llama.cpp's fallback for Q4_K, and so here)
SHAPES = [(2048, 1536), (1536, 2048), (6144, 1536), (1536, 6144), (4096, 2816), (2112, 2816), (2816, 2112)]
# the long-K ones the int8 tile splits over K (E2B's wide layers' down, E4B's down): SWEEP_SHAPES="1536x12288 2560x10240"


# a26b's grouped experts for a 512-token chunk: (rows, row length) of gate|up and down; 128 experts, 8 a token
MOE_SHAPES = [(1408, 2816), (2816, 704)]


def _pattern(scale: float = 1.0) -> bytes:
    """1024 floats in [-scale, scale): a buffer's repeating fill (values, not their speed, don't matter)."""
    return struct.pack("<1024f", *[scale * (((i * 7919) % 1000) / 500.0 - 1.0) for i in range(1024)])


def _filled(dev, floats: int, pattern: bytes):
    b = dev.buffer(4 * floats)
    dev.write(b, (pattern * (floats // 1024 + 1))[:4 * floats])
    return b


async def _seconds_per_dispatch(dev, plan, probe, repeat: int, per_submit: int) -> float:
    """Wall time of one of the plan's per_submit dispatches: a warm-up submit (pipeline creation,
    caches), then repeat submits, each awaited through a small read of probe."""
    dev.submit(plan)
    await dev.read_async(probe, 0, 16)
    t = time.perf_counter()
    for _ in range(repeat):
        dev.submit(plan)
    await dev.read_async(probe, 0, 16)
    return (time.perf_counter() - t) / (repeat * per_submit)


def tiles():
    from pyapp.gpu.kernels import MATMUL, MatmulTile
    shapes = [(64, 128, 32), (64, 128, 32, 8), (64, 64, 32), (128, 64, 32, 8), (128, 128, 32, 8)]
    out = [MatmulTile(*s) for s in shapes]
    out += [MatmulTile(64, 128, 16)]
    out += [MatmulTile(*s) for s in ((64, 32, 32), (32, 64, 32), (32, 32, 32))]    # more workgroups for few rows
    return [MATMUL] + [t for t in out if t != MATMUL]


def moe_tiles():
    from pyapp.gpu.kernels import MOE_MATMUL, MatmulTile
    out = [MatmulTile(*s) for s in ((128, 32, 32), (64, 32, 32), (64, 64, 32, 8))]
    out += [MatmulTile(128, 32, 16, 8), MatmulTile(64, 32, 16)]
    return [MOE_MATMUL] + [t for t in out if t != MOE_MATMUL]


def _q8_tiles():
    from pyapp.gpu.kernels import Q8Tile
    return [Q8Tile(64, 64), Q8Tile(64, 128), Q8Tile(128, 64, 8), Q8Tile(128, 128, 8), Q8Tile(128, 64), Q8Tile(64, 32),
            Q8Tile(128, 64, 8, 8), Q8Tile(128, 128, 8, 8), Q8Tile(256, 64, 8, 8)]


Q8_TILES = _q8_tiles()


def q8_name(t) -> str:
    """ROWSxTOKENS tTHREAD_ROWS[xTHREAD_TOKENS] (the latter where not 4)."""
    return f"{t.rows}x{t.tokens} t{t.thread_rows}" + (f"x{t.thread_tokens}" if t.thread_tokens != 4 else "")


def f16_tiles(tile, dev):
    """tile in f32, with f16 shared tiles, and with f16 multiply-adds too (where the device has shader-f16)."""
    from dataclasses import replace
    return [tile] + ([replace(tile, f16=True), replace(tile, f16=True, f16_math=True)] if dev.has_f16 else [])


def tile_name(t) -> str:
    f16 = " f16 math" if t.f16_math else " f16" if t.f16 else ""
    return f"{t.rows}x{t.tokens} k{t.k} t{t.thread_tokens}{f16}"


async def moe_sweep_async(dev, n_tokens=512, n_experts=128, k_used=8, shapes=MOE_SHAPES, repeat=20, per_submit=10,
                          tile_list=None):
    """The grouped expert matmul (moe_group + moe_experts_grouped) by tile, slots routed uniformly at random."""
    import random
    from pyapp.gpu import kernels as K
    from pyapp import ggml
    out = []
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, n_tokens, 0)
    rnd = random.Random(0)
    ids = []
    for _ in range(n_tokens):
        ids += rnd.sample(range(n_experts), k_used)
    idb = dev.buffer(4 * len(ids))
    dev.write(idb, struct.pack(f"<{len(ids)}I", *ids))
    grp = dev.buffer(4 * K.moe_group_rows(n_experts, k_used, n_tokens))
    pattern = _pattern()
    for n, k in shapes:
        per_slot = k < n          # down: one input row per slot; gate|up: one per token
        rows_in = n_tokens * k_used if per_slot else n_tokens
        x = _filled(dev, rows_in * k, pattern)
        y = dev.buffer(4 * n_tokens * k_used * n)
        q = "q4_k" if k % 256 == 0 else "q5_0"          # as the bench file's rows of 704 fall back
        nbytes = ggml.row_bytes(q, k) * n * n_experts
        w = dev.buffer(nbytes + 4)
        dev.write(w, os.urandom(nbytes))
        variants = [(tile_name(t), lambda plan, t=t: (
            K.moe_group(dev, n_experts, k_used, idb, grp, step, plan=plan, tile=t),
            K.moe_experts_grouped(dev, q, k, n, n_experts, k_used, w, x, y, grp, n_tokens,
                                  per_slot_input=per_slot, plan=plan, tile=t))) for t in tile_list or [K.MOE_MATMUL]]
        if K.int8_matmul(q, k, n_tokens):
            xq, xs = (dev.buffer(b) for b in K.q8_bytes(rows_in, k))
            variants.append(("int8", lambda plan: (
                K.quantize_q8(dev, k, x, xq, xs, step, n_tokens, plan=plan, rows_per_token=rows_in // n_tokens),
                K.moe_group(dev, n_experts, k_used, idb, grp, step, plan=plan),
                K.moe_experts_grouped_q8(dev, q, k, n, n_experts, k_used, w, xq, xs, y, grp, n_tokens,
                                         per_slot_input=per_slot, plan=plan))))
        for name, record in variants:
            plan = dev.plan()
            for _ in range(per_submit):
                record(plan)
            s = await _seconds_per_dispatch(dev, plan, y, repeat, per_submit)
            out.append({"kernel": "moe_grouped", "quant": q, "tokens": n_tokens, "experts": n_experts,
                        "used": k_used, "rows": n, "cols": k,
                        "tile": name, "us": round(s * 1e6, 1),
                        "tflop_s": round(2 * n_tokens * k_used * n * k / s / 1e12, 2), "adapter": dev.describe()})
    return out


async def sweep_async(dev, quants=("q4_k",), n_tokens=512, shapes=SHAPES, tile_list=None, repeat=20, per_submit=10):
    from pyapp import ggml
    from pyapp.gpu import kernels as K
    tile_list = tile_list or [K.MATMUL]
    out = []
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, n_tokens, 0)
    pattern = _pattern()
    for n, k in shapes:
        x = _filled(dev, n_tokens * k, pattern)
        y = dev.buffer(4 * n_tokens * n)
        for q in quants:
            if q == "q4_k" and k % 256:
                q = "q5_0"              # as the bench files' rows that Q4_K cannot hold
            try:
                nbytes = ggml.row_bytes(q, k) * n
            except ValueError:          # k not a multiple of the block
                continue
            w = dev.buffer(nbytes + 4)
            dev.write(w, os.urandom(nbytes))   # speed only
            partials = dev.buffer(4 * max(K.Q8_SPLIT_MAX, K.MATMUL_SPLIT_MAX) * n_tokens * n)
            variants = [(tile_name(t), t.threads, lambda plan, t=t: K.matmul(
                dev, q, k, n, w, x, y, step, n_tokens=n_tokens, plan=plan, tile=t, split=1)) for t in tile_list]
            # the engine's f32 tile for this shape over slices of K (matmul.wgsl's SPLIT, their sum included)
            engine_tile = K.matmul_tile_for(n, n_tokens)
            for split in range(1, K.MATMUL_SPLIT_MAX + 1):
                if k % (engine_tile.k * split) or n % 4 or split == 1 and engine_tile in tile_list:
                    continue
                variants.append((f"{tile_name(engine_tile)} k/{split}", engine_tile.threads,
                                 lambda plan, split=split: K.matmul(dev, q, k, n, w, x, y, step, n_tokens=n_tokens,
                                                                    plan=plan, tile=engine_tile, partials=partials,
                                                                    split=split)))
            if K.int8_matmul(q, k, n_tokens):
                xq, xs = (dev.buffer(b) for b in K.q8_bytes(n_tokens, k))
                for t in Q8_TILES:
                    def int8(plan, t=t):
                        K.quantize_q8(dev, k, x, xq, xs, step, n_tokens, plan=plan)
                        K.matmul_q8(dev, q, k, n, w, xq, xs, y, step, n_tokens, plan=plan, tile=t)
                    variants.append((f"int8 {q8_name(t)}", t.threads, int8))
                # both tiles over slices of K (matmul_q8's SPLIT, their sum included)
                four = K.Q8Tile(128, 64, 8)              # the large tile before it took 8 tokens a thread
                for t in dict.fromkeys((K.Q8_MATMUL, K.Q8_SMALL, four)):
                    for split in range(2, K.Q8_SPLIT_MAX + 1):
                        if k % (64 * split) or n % 4:
                            continue
                        def sliced(plan, split=split, t=t):
                            K.quantize_q8(dev, k, x, xq, xs, step, n_tokens, plan=plan)
                            K.matmul_q8(dev, q, k, n, w, xq, xs, y, step, n_tokens, plan=plan, tile=t,
                                        partials=partials, split=split)
                        variants.append((f"int8 {q8_name(t)} k/{split}", t.threads, sliced))
            for name, threads, record in variants:
                plan = dev.plan()
                for _ in range(per_submit):
                    record(plan)
                s = await _seconds_per_dispatch(dev, plan, y, repeat, per_submit)
                out.append({"kernel": "matmul", "quant": q, "tokens": n_tokens, "rows": n, "cols": k,
                            "tile": name, "threads": threads, "us": round(s * 1e6, 1),
                            "tflop_s": round(2 * n_tokens * n * k / s / 1e12, 2), "adapter": dev.describe()})
    return out


# (heads, kv heads, head dim, window): e2b sliding and global layers, a26b sliding and global layers
ATTENTION_SHAPES = [(8, 1, 256, 512), (8, 1, 512, 0), (16, 8, 256, 1024), (16, 2, 512, 0)]
# (heads, kv heads, head_dim, window) late in a long prompt (--attention-at): E2B's sliding and global
# layers, E4B's and a26b's global ones
LONG_ATTENTION_SHAPES = [(8, 1, 256, 512), (8, 1, 512, 0), (8, 2, 512, 0), (16, 2, 512, 0)]


async def attention_sweep_async(dev, n_tokens=512, shapes=ATTENTION_SHAPES, repeat=20, per_submit=10, pos0=0):
    """Prefill attention of a chunk of n_tokens at position pos0 (causal, over pos0 + n_tokens keys): tiled
    with 32 or 16 query rows a workgroup, the per-token kernel (first chunks only: it is slow at length),
    and the register-blocked tiles of wide heads."""
    from pyapp.gpu import kernels as K
    out = []
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, n_tokens, pos0)
    pattern = _pattern(0.1)
    for h, hkv, hd, window in shapes:
        ctx = pos0 + n_tokens
        q, kc, vc = (_filled(dev, n, pattern) for n in (n_tokens * h * hd, hkv * ctx * hd, hkv * ctx * hd))
        o = dev.buffer(4 * n_tokens * h * hd)
        variants = [("per-token", dict(tiled=False))] if pos0 == 0 else []
        for rows in (32, 16):
            if (rows == 16 or hd <= 256) and rows % (h // hkv) == 0 and K.attention_tile_rows(dev, h // hkv, hd):
                variants.append((f"tiled {rows} rows", dict(tiled=True, tile_rows=rows, wide=False)))
        if K.wide_tile_fits(dev, h // hkv, hd):
            variants.append(("wide", dict(wide=True)))
        for name, kw in variants:
            plan = dev.plan()
            for _ in range(per_submit):
                K.attention(dev, q, kc, vc, o, step, h, hkv, hd, ctx, n_tokens, window=window, plan=plan, **kw)
            s = await _seconds_per_dispatch(dev, plan, o, repeat, per_submit)
            keys = sum(min(p + 1, window or p + 1) for p in range(pos0, pos0 + n_tokens))
            out.append({"kernel": "attention", "tokens": n_tokens, "pos0": pos0, "heads": h, "kv_heads": hkv,
                        "head_dim": hd, "window": window, "variant": name, "us": round(s * 1e6, 1),
                        "tflop_s": round(4 * h * hd * keys / s / 1e12, 2), "adapter": dev.describe()})
    return out


def main() -> int:
    import asyncio
    from pyapp.gpu import get_device
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quants", nargs="*", default=["q4_k"])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--all-tiles", action="store_true", help="every f32 tile of tiles() and moe_tiles()")
    ap.add_argument("--attention-at", type=int, metavar="POS",
                    help="only the attention, a chunk at this position (E2B's and E4B's global layers)")
    ap.add_argument("--f16", action="store_true",
                    help="the engine's tiles in f32, f16 and f16 math (shader-f16), no attention")
    args = ap.parse_args()
    dev = get_device("native")
    if args.attention_at is not None:
        for r in asyncio.run(attention_sweep_async(dev, args.tokens, LONG_ATTENTION_SHAPES, pos0=args.attention_at)):
            print(json.dumps(r), flush=True)
        return 0
    if args.f16:
        from pyapp.gpu import kernels as K
        tile = K.MATMUL if args.tokens > K.MATMUL_SHORT.tokens else K.MATMUL_SHORT
        rows = asyncio.run(sweep_async(dev, tuple(args.quants), args.tokens, tile_list=f16_tiles(tile, dev)))
        rows += asyncio.run(moe_sweep_async(dev, n_tokens=args.tokens, tile_list=f16_tiles(K.MOE_MATMUL, dev)))
        for r in rows:
            print(json.dumps(r), flush=True)
        return 0
    rows = asyncio.run(attention_sweep_async(dev))
    rows += asyncio.run(sweep_async(dev, tuple(args.quants), args.tokens, tile_list=args.all_tiles and tiles()))
    rows += asyncio.run(moe_sweep_async(dev, tile_list=args.all_tiles and moe_tiles()))
    for r in rows:
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
