"""Prefill matmul speed by tile shape (pyapp.gpu.kernels.MatmulTile), on a 512-token step's shapes.

    python bench/matmul_sweep.py [--quants q4_k] [--tokens 512]          # native (wgpu)
    node bench/node_bench.mjs --sweep                                    # browser path (Pyodide + Dawn)

Prints one JSON line per (shape, quant, tile): microseconds per dispatch (10 per submit, wall
clock over 20 submits after a warm-up, so a dispatch's ~10 us overhead is included) and TFLOP/s.
The engine's tile (kernels.MATMUL) comes from these figures. Standard library only, so the same
code runs in Pyodide.
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

# (rows, row length): E2B q, o, gate|up, down; a26b q, dense gate|up, dense down
SHAPES = [(2048, 1536), (1536, 2048), (6144, 1536), (1536, 6144), (4096, 2816), (2112, 2816)]


def tiles():
    from pyapp.gpu.kernels import MATMUL, MatmulTile
    shapes = [(64, 64, 32), (64, 128, 32), (32, 128, 32), (128, 64, 32), (32, 64, 32), (64, 128, 16),
              (64, 64, 32, 8), (64, 128, 32, 8), (128, 128, 32, 8), (32, 128, 16, 8), (64, 256, 32, 8),
              (128, 64, 32, 8), (64, 128, 16, 8)]
    out = [MatmulTile(*s) for s in shapes] + [MatmulTile(legacy=True)]
    return [MATMUL] + [t for t in out if t != MATMUL]


async def sweep_async(dev, quants=("q4_k",), n_tokens=512, shapes=SHAPES, tile_list=None, repeat=20, per_submit=10):
    from pyapp import ggml
    from pyapp.gpu import kernels as K
    out = []
    step = dev.buffer(K.STEP_BYTES, "uniform")
    dev.write(step, K.pack_step(n_tokens, 0))
    pattern = struct.pack("<1024f", *[((i * 7919) % 1000) / 500.0 - 1.0 for i in range(1024)])
    for n, k in shapes:
        x = dev.buffer(4 * n_tokens * k)
        dev.write(x, (pattern * (n_tokens * k // 1024 + 1))[:4 * n_tokens * k])
        y = dev.buffer(4 * n_tokens * n)
        for q in quants:
            try:
                nbytes = ggml.row_bytes(q, k) * n
            except ValueError:          # k not a multiple of the block
                continue
            w = dev.buffer(nbytes + 4)
            dev.write(w, os.urandom(nbytes))   # speed only
            for tile in tile_list or tiles():
                plan = dev.plan()
                for _ in range(per_submit):
                    K.matmul(dev, q, k, n, w, x, y, step, n_tokens=n_tokens, plan=plan, tile=tile)
                dev.submit(plan)                   # warm-up (pipeline creation, caches)
                await dev.read_async(y, 0, 16)
                t = time.perf_counter()
                for _ in range(repeat):
                    dev.submit(plan)
                await dev.read_async(y, 0, 16)
                s = (time.perf_counter() - t) / (repeat * per_submit)
                out.append({"kernel": "matmul", "quant": q, "tokens": n_tokens, "rows": n, "cols": k,
                            "tile": "legacy" if tile.legacy else f"{tile.rows}x{tile.tokens} k{tile.k} t{tile.thread_tokens}",
                            "threads": tile.threads, "us": round(s * 1e6, 1),
                            "tflop_s": round(2 * n_tokens * n * k / s / 1e12, 2), "adapter": dev.describe()})
    return out


def main() -> int:
    import asyncio
    from pyapp.gpu import get_device
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quants", nargs="*", default=["q4_k"])
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()
    for r in asyncio.run(sweep_async(get_device("native"), tuple(args.quants), args.tokens)):
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
