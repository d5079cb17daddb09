"""Decode matvec speed by threads per row (TPR), on the matrix shapes of a decode step.

    python bench/matvec_sweep.py [--quants q4_k q6_k q8_0] [--tpr 8 16 32 64]

Prints one JSON line per (shape, quant, TPR): microseconds per dispatch (50 per submit) and
GB/s (matrices under ~40 MB stay in the H100's 50 MB L2 across the 50 repeats: their GB/s are
L2's; the 262144-row head streams from memory). TPR decides how a row's dot product is split: with K = 1536 and TPR = 64 a thread gets
six 4-weight groups (each decoding its block's scales again); with TPR = 16 it gets three
32-weight units (scales decoded once per 32). The engine's choice (pyapp.gpu.kernels.matvec)
comes from these figures. Q4_K also runs the 16-byte chunk kernel (matvec_q4k*.wgsl) by
threads per row (--chunk-tpr) and workgroup size (--chunk-wg).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (rows, row length): E2B gate|up, down, q|k|v, the 262144-row head; a26b dense down, attn output
SHAPES = [(12288, 1536), (1536, 6144), (2560, 1536), (262144, 1536), (2816, 2112), (2816, 4096)]


def main() -> int:
    import numpy as np
    from pyapp import ggml
    from pyapp.gpu import get_device
    from pyapp.gpu import kernels as K
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quants", nargs="*", default=["q4_k", "q6_k", "q8_0"])
    ap.add_argument("--tpr", nargs="*", type=int, default=[8, 16, 32, 64])
    ap.add_argument("--chunk-tpr", nargs="*", type=int, default=[8, 16, 32])
    ap.add_argument("--chunk-wg", nargs="*", type=int, default=[64, 128, 256])
    ap.add_argument("--shapes", nargs="*", default=None, help="ROWSxCOLS (default: a decode step's shapes)")
    ap.add_argument("--probe", action="store_true", help="also the chunk kernel's loads alone (PROBE 1)")
    args = ap.parse_args()
    dev = get_device("native")
    rng = np.random.default_rng(0)
    shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes] if args.shapes else SHAPES
    for n, k in shapes:
        x = dev.buffer(4 * k)
        dev.write(x, rng.standard_normal(k).astype(np.float32).tobytes())
        y = dev.buffer(4 * n)
        for q in args.quants:
            try:
                nbytes = ggml.row_bytes(q, k) * n
            except ValueError:          # k not a multiple of the block (2112 for K-quants)
                continue
            w = dev.buffer(nbytes + 4)
            dev.write(w, rng.integers(0, 255, nbytes, dtype=np.uint8).tobytes())   # speed only
            variants = [dict(tpr=t, units=u, chunks=False) for t in args.tpr for u in (False, True)
                        if not u or k % 32 == 0]
            if q == "q4_k":            # the 16-byte chunk kernel (matvec_q4k*.wgsl) by threads per row and workgroup
                variants += [dict(tpr=t, wg=g, chunks=True, probe=p) for t in args.chunk_tpr for g in args.chunk_wg
                             for p in ((0, 1) if args.probe else (0,)) if t <= g and k // 32 >= t]
            for v in variants:
                plan = dev.plan()
                reps = 50 if n < 100000 else 5
                for _ in range(reps):
                    K.matvec(dev, q, k, n, w, x, y, plan=plan, **v)
                dev.time_plan(plan, repeat=1)          # warm-up: the first plan after setup runs slow
                s = dev.time_plan(plan, repeat=5) / reps
                print(json.dumps({"rows": n, "cols": k, "quant": q, **v, "us": round(s * 1e6, 2),
                                  "gb_s": round(nbytes / s / 1e9, 1), "adapter": dev.describe()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
