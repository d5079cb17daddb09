"""Do two independent dispatches in one compute pass run at the same time on this GPU and backend?

    python bench/overlap_probe.py                 native (wgpu-native)
    node bench/node_bench.mjs --overlap           the browser path (Pyodide + Dawn)

A decode step is a chain of small dispatches (8-35 us each on the H100), most far from the GPU's
bandwidth. WebGPU implementations put a barrier before a dispatch only where it uses a buffer an
earlier one wrote; two dispatches that share no written buffer may overlap. This measures, by GPU
timestamps over a plan of `reps` repetitions, a26b decode matvec pairs (the q|k and v projections:
Q4_K 6144 x 2816 and Q6_K 2048 x 2816): each alone, both writing separate buffers, both writing one
buffer (its two halves). Prints one JSON line per variant, microseconds per repetition.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

K_IN = 2816
PAIRS = [("q4_k", 6144), ("q6_k", 2048)]      # (quant, rows): a26b sliding layers' q|k, v


async def probe_async(dev, reps: int = 40) -> list[dict]:
    import os
    import random
    import struct
    from pyapp import ggml
    from pyapp.gpu import kernels as K
    x = dev.buffer(4 * K_IN)                     # the standard library only: it runs in Pyodide too
    dev.write(x, struct.pack(f"<{K_IN}f", *(random.gauss(0, 1) for _ in range(K_IN))))
    mats = []
    for q, n in PAIRS:
        nbytes = ggml.row_bytes(q, K_IN) * n
        w = dev.buffer(nbytes + 4)
        dev.write(w, os.urandom(nbytes))           # speed only
        mats.append((q, n, w))
    (qa, na, wa), (qb, nb, wb) = mats
    own_a, own_b, shared = dev.buffer(4 * na), dev.buffer(4 * nb), dev.buffer(4 * (na + nb))

    def a(y):
        return lambda plan: K.matvec(dev, qa, K_IN, na, wa, x, y, plan=plan)

    def b(y):
        return lambda plan: K.matvec(dev, qb, K_IN, nb, wb, x, y, plan=plan)

    variants = {
        "a alone": [a(own_a)],
        "b alone": [b(own_b)],
        "a then b, separate outputs": [a(own_a), b(own_b)],
        "a then b, one output buffer": [a((shared, 0, 4 * na)), b((shared, 4 * na, 4 * nb))],
        "a then a, separate outputs": [a(own_a), a((shared, 0, 4 * na))],
    }
    rows = []
    for name, ops in variants.items():
        plan = dev.plan()
        for _ in range(reps):
            for op in ops:
                op(plan)
        await dev.time_plan_gpu_async(plan, 1)              # warm-up
        t = await dev.time_plan_gpu_async(plan, 5)
        ns = sorted(t["ns"][2 * i + 1] - t["ns"][2 * i] for i in range(5))[2]
        rows.append({"variant": name, "us": round(ns / 1e3 / reps, 2), "dispatches": len(ops),
                     "adapter": dev.describe()})
    return rows


def main() -> int:
    import asyncio
    from pyapp.gpu import get_device
    for r in asyncio.run(probe_async(get_device("native"))):
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
