"""Decode matvec speed by threads per row (TPR), on the matrix shapes of a decode step.

    python bench/matvec_sweep.py [--quants q4_k q6_k q8_0] [--tpr 8 16 32 64]
    python bench/matvec_sweep.py --experts        the decode expert matvecs (GPU timestamps)
    python bench/matvec_sweep.py --few 5 [--few-threads 16x64 32x128 ...]
                                                  matvec_tokens (a step of 5 tokens: speculative decoding's
                                                  checking step) by threads per row x per workgroup (GPU timestamps)
    python bench/matvec_sweep.py --few 5 --head   the greedy head of such a step (head_argmax over E2B's 262144
                                                  rows of 1536) by threads per vocabulary row x per workgroup
    python bench/matvec_sweep.py --rounded [--shapes 2560x10240] [--quants q6_k q4_k]
                                                  a matvec reading x as int8 codes its producer stored
                                                  (K.RoundedX: the down projection after the GeGLU) by
                                                  threads per row x per workgroup, beside the engine's
                                                  matvec today and x rounded in each workgroup (GPU
                                                  timestamps; node bench/node_bench.mjs --matvec-rounded:
                                                  the browser path, SWEEP_SHAPES / SWEEP_QUANTS)
    python bench/matvec_sweep.py --norm-input --shapes 128x2816 --quants f16 --tpr 32 64 128 256
                                                  the matvec building its input by norming a row
                                                  in every workgroup (K.NormInput: the MoE router)

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
    ap.add_argument("--gpu-time", action="store_true", help="time by GPU timestamps (default: wall clock)")
    ap.add_argument("--norm-input", action="store_true",
                    help="the matvec with its input normed by every workgroup (K.NormInput), by --tpr")
    ap.add_argument("--residual-input", action="store_true",
                    help="the matvec with its input built from a pending residual add and the next pre-norm "
                         "(K.ResidualInput, as a decode step's first matvec after an add), by --tpr / --chunk-tpr "
                         "and --chunk-wg")
    ap.add_argument("--geglu", action="store_true", help="ROWS outputs of a gate|up matrix of 2 ROWS rows (GeGLU)")
    ap.add_argument("--int8", action="store_true",
                    help="the Q4_K chunk kernels and the int8 units (Q6_K, Q4_0, Q5_0, Q8_0) also on x rounded to int8")
    ap.add_argument("--rounded", action="store_true", help="x stored as int8 codes by its producer (K.RoundedX)")
    ap.add_argument("--cold-mib", type=int, default=COLD_BYTES >> 20,
                    help="--rounded: MiB of weight copies the dispatches cycle through (0: one matrix, L2-warm)")
    ap.add_argument("--experts", action="store_true",
                    help="the decode expert matvecs instead (26B-A4B shapes), timed by GPU timestamps")
    ap.add_argument("--few", type=int, default=0, help="matvec_tokens for a step of this many tokens instead")
    ap.add_argument("--few-threads", nargs="*", default=["16x64", "32x128", "64x256", "128x128", "128x256", "32x256"],
                    help="--few: TPRxWG variants")
    ap.add_argument("--head", action="store_true", help="--few: head_argmax instead of matvec_tokens")
    ap.add_argument("--head-cols", type=int, default=1536, help="--head: the rows' length (an assistant drafter's: 256)")
    args = ap.parse_args()
    dev = get_device("native")
    rng = np.random.default_rng(0)
    if args.experts:
        return expert_sweep(dev, rng, int8=args.int8)
    shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes] if args.shapes else SHAPES
    if args.rounded:
        import asyncio
        for row in asyncio.run(rounded_sweep_async(dev, shapes=args.shapes and shapes or ROUNDED_SHAPES,
                                                   quants=args.quants, cold_bytes=args.cold_mib << 20)):
            print(json.dumps(row), flush=True)
        return 0
    if args.few and args.head:
        return head_sweep(dev, rng, args.few, args.quants, [tuple(int(v) for v in t.split("x"))
                                                            for t in args.few_threads], k=args.head_cols)
    if args.few:
        return few_sweep(dev, rng, args.few, shapes, args.quants, [tuple(int(v) for v in t.split("x"))
                                                                   for t in args.few_threads])
    for n, k in shapes:
        x = dev.buffer(4 * k)
        dev.write(x, rng.standard_normal(k).astype(np.float32).tobytes())
        y = dev.buffer(4 * n)
        normed = None
        if args.residual_input:
            ones = dev.buffer(4 * k)
            dev.write(ones, np.ones(k, np.float32).tobytes())
            normed = K.ResidualInput(x, dev.buffer(4 * k), dev.buffer(4 * k), ones, next_weight=ones)
        if args.norm_input:
            ones = dev.buffer(4 * k)
            dev.write(ones, np.ones(k, np.float32).tobytes())
            normed = K.NormInput(x, dev.buffer(4 * k), ones, ones, dev.buffer(4 * k), scale=k ** -0.5)
        for q in args.quants:
            rows = 2 * n if args.geglu else n
            try:
                nbytes = ggml.row_bytes(q, k) * rows
            except ValueError:          # k not a multiple of the block (2112 for K-quants)
                continue
            w = dev.buffer(nbytes + 4)
            dev.write(w, rng.integers(0, 255, nbytes, dtype=np.uint8).tobytes())   # speed only
            variants = [dict(tpr=t, units=u, chunks=False) for t in args.tpr for u in (False, True)
                        if not u or k % 32 == 0]
            int8s = (False, True) if args.int8 else (False,)
            if normed is not None and q == "q4_k":     # the chunk kernel by threads per row and workgroup
                variants = [dict(tpr=t, wg=g, chunks=True, residual=normed, int8=i) for t in args.chunk_tpr
                            for g in args.chunk_wg if t <= g and k // 32 >= t and k <= 24 * g for i in int8s]
            elif normed is not None:     # the generic kernel, a workgroup of 256 (the engine's)
                variants = [dict(tpr=t, chunks=False, residual=normed) for t in args.tpr]
                if args.int8 and ggml.lookup(q).id in K.INT8_UNIT_TYPES:       # its int8 units
                    variants += [dict(tpr=t, chunks=False, residual=normed, int8=True) for t in args.tpr]
            elif args.int8 and ggml.lookup(q).id in K.INT8_UNIT_TYPES:
                variants += [dict(tpr=t, chunks=False, int8=True) for t in args.tpr]
            elif q == "q4_k":            # the 16-byte chunk kernel (matvec_q4k*.wgsl) by threads per row and workgroup
                variants += [dict(tpr=t, wg=g, chunks=True, probe=p, int8=i) for t in args.chunk_tpr
                             for g in args.chunk_wg for p in ((0, 1) if args.probe else (0,)) for i in int8s
                             if t <= g and k // 32 >= t]
            for v in variants:
                plan = dev.plan()
                reps = 50 if n < 100000 else 5
                for _ in range(reps):
                    K.matvec(dev, q, k, n, w, None if normed else x, y, plan=plan, geglu=args.geglu, **v)
                dev.time_plan(plan, repeat=1)          # warm-up: the first plan after setup runs slow
                s = (gpu_seconds(dev, plan) if args.gpu_time else dev.time_plan(plan, repeat=5)) / reps
                shown = {key: val for key, val in v.items() if key != "residual"}
                if normed is not None:
                    shown["input"] = "residual" if args.residual_input else "norm"
                if args.geglu:
                    shown["geglu"] = True
                print(json.dumps({"rows": n, "cols": k, "quant": q, **shown, "us": round(s * 1e6, 2),
                                  "gb_s": round(nbytes / s / 1e9, 1), "adapter": dev.describe()}), flush=True)
    return 0


def few_sweep(dev, rng, tokens: int, shapes, quants, threads, reps: int = 30) -> int:
    """matvec_tokens of a step of `tokens` tokens by (threads per row, workgroup), GPU timestamps; the
    engine's choice (few_tokens_threads) is marked."""
    import numpy as np
    from pyapp import ggml
    from pyapp.gpu import kernels as K
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, tokens, 0)
    for n, k in shapes:
        x = dev.buffer(4 * K.FEW_TOKENS * k)
        dev.write(x, rng.standard_normal(K.FEW_TOKENS * k).astype(np.float32).tobytes())
        y = dev.buffer(4 * K.FEW_TOKENS * n)
        for q in quants:
            try:
                nbytes = ggml.row_bytes(q, k) * n
            except ValueError:
                continue
            w = dev.buffer(nbytes + 4)
            dev.write(w, rng.integers(0, 255, nbytes, dtype=np.uint8).tobytes())   # speed only
            engine = K.few_tokens_threads(ggml.lookup(q).id == ggml.Q4_K, k, n)
            xq, xs = dev.buffer(K.FEW_TOKENS * k), dev.buffer(K.FEW_TOKENS * k // 4)
            # also on int8 x (quantize_q8 + the x8 kernel) where there is one
            int8s = (False, True) if q in ("q4_k", "q4_0", "q5_0", "q8_0", "q6_k") else (False,)
            for (tpr, wg), int8 in ((t, i) for t in dict.fromkeys([engine, *threads]) for i in int8s):
                if tpr > wg:
                    continue
                plan = dev.plan()
                for _ in range(reps if n < 100000 else 3):
                    if int8:
                        K.quantize_q8(dev, k, x, xq, xs, step, tokens, plan=plan)
                        K.matvec_tokens_x8(dev, q, k, n, w, xq, xs, y, step, plan=plan, tpr=tpr, wg=wg)
                    else:
                        K.matvec_tokens(dev, q, k, n, w, x, y, step, plan=plan, tpr=tpr, wg=wg)
                dev.time_plan(plan, repeat=1)
                s = gpu_seconds(dev, plan) / (reps if n < 100000 else 3)
                print(json.dumps({"rows": n, "cols": k, "quant": q, "tokens": tokens, "tpr": tpr, "wg": wg,
                                  "int8": int8, "engine": (tpr, wg) == engine and not int8, "us": round(s * 1e6, 2),
                                  "gb_s": round(nbytes / s / 1e9, 1), "adapter": dev.describe()}), flush=True)
    return 0


def head_sweep(dev, rng, tokens: int, quants, threads, k: int = 1536, n: int = 262144, reps: int = 3) -> int:
    """head_argmax (the greedy head of a step of `tokens` tokens) by (threads a vocabulary row, workgroup),
    GPU timestamps; the engine's (HEAD_TPR, HEAD_WG) is marked. Random bytes as weights: their f16 scales
    may be anything, so compare variants within a type."""
    import numpy as np
    from pyapp import ggml
    from pyapp.gpu import kernels as K
    from pyapp.gpu.kernels import few_tokens
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, tokens, 0)
    x = dev.buffer(4 * K.HEAD_ROWS * k)
    dev.write(x, rng.standard_normal(K.HEAD_ROWS * k).astype(np.float32).tobytes())
    out = dev.buffer(4 * (K.HEAD_ROWS + 1))
    engine = (few_tokens.HEAD_TPR, few_tokens.HEAD_WG)
    for q in quants:
        rb = ggml.row_bytes(q, k)
        per = dev.limits["max_storage_buffer_binding_size"] // rb // 256 * 256     # rows a binding holds
        parts = []
        for row0 in range(0, n, per):
            rows = min(per, n - row0)
            w = dev.buffer(rows * rb + 4)
            dev.write(w, rng.integers(0, 255, rows * rb, dtype=np.uint8).tobytes())
            parts.append((w, row0, rows))
        for tpr, wg in dict.fromkeys([engine, *threads]):
            few_tokens.HEAD_TPR, few_tokens.HEAD_WG = tpr, wg       # read by head_argmax and its scratch size
            try:
                scratch = dev.buffer(K.head_argmax_scratch_bytes([rows for _, _, rows in parts]))
                plan = dev.plan()
                for _ in range(reps):
                    K.head_argmax(dev, q, k, parts, x, scratch, out, step, plan=plan)
                dev.time_plan(plan, repeat=1)
                s = gpu_seconds(dev, plan) / reps
            finally:
                few_tokens.HEAD_TPR, few_tokens.HEAD_WG = engine
            print(json.dumps({"rows": n, "cols": k, "quant": q, "tokens": tokens, "head": True, "tpr": tpr, "wg": wg,
                              "engine": (tpr, wg) == engine, "us": round(s * 1e6, 2), "adapter": dev.describe()}),
                  flush=True)
    return 0


# (rows, row length): the down projections that read the GeGLU's output: E4B, E2B (double-wide FFN), E2B
ROUNDED_SHAPES = [(2560, 10240), (1536, 12288), (1536, 6144)]
ROUNDED_THREADS = [(t, g) for t in (4, 8, 16, 32, 64) for g in (64, 128, 256) if t <= g]


# Bytes of weights a rounded sweep cycles through: more than an H100's 50 MB L2, so that each dispatch reads
# its matrix from memory as a decode step does (one matrix 50 times over ran from L2 and favoured kernels
# that read x from workgroup memory: bench/RESULTS.md, 2026-11-27, sixth session).
COLD_BYTES = 256 << 20


async def rounded_sweep_async(dev, shapes=ROUNDED_SHAPES, quants=("q6_k", "q4_k", "q4_0"), threads=ROUNDED_THREADS,
                              reps: int = 50, cold_bytes: int = COLD_BYTES) -> list[dict]:
    """GPU us a dispatch (timestamps around a plan of `reps`) of the decode matvec of each shape and quant:
    the engine's today ("engine": f32 x or x rounded in its workgroups, as K.int8_matvec says), x rounded
    in each workgroup at the kernel's default threads ("round"), and x read as stored codes ("rounded")
    by threads a row x a workgroup. The dispatches cycle through copies of the matrix, cold_bytes in all
    (at most reps copies), so that each reads its weights from memory (0: one matrix, L2-warm)."""
    import random
    from array import array
    from pyapp import ggml
    from pyapp.gpu import kernels as K
    rng = random.Random(0)             # the standard library only: this runs in Pyodide too
    rows = []
    for n, k in shapes:
        x, y = dev.buffer(4 * k), dev.buffer(4 * n)
        dev.write(x, array("f", (rng.gauss(0, 1) for _ in range(k))).tobytes())
        codes, scales = K.q8_bytes(1, k)
        stored = K.RoundedX(dev.buffer(codes), dev.buffer(scales))
        dev.submit(K.quantize_q8(dev, k, x, stored.codes, stored.scales, _step(dev), 1))
        for q in quants:
            nbytes = ggml.row_bytes(q, k) * n
            copies = max(1, min(reps, cold_bytes // nbytes))
            ws = [dev.buffer(nbytes + 4) for _ in range(copies)]
            for w in ws:
                dev.write(w, rng.randbytes(nbytes))   # speed only
            t = ggml.lookup(q).id
            variants = [("engine", dict(x=x, int8=K.int8_matvec(dev, q, rows=n)))]
            if t == ggml.Q4_K or t in K.INT8_UNIT_TYPES:
                variants.append(("round", dict(x=x, int8=True)))
                variants += [("rounded", dict(x=None, rounded_x=stored, tpr=tp, wg=g)) for tp, g in threads
                             if k // 32 >= tp]
            for name, v in variants:
                plan = dev.plan()
                for i in range(reps):
                    K.matvec(dev, q, k, n, ws[i % copies], v["x"], y, plan=plan,
                             **{key: val for key, val in v.items() if key != "x"})
                await dev.time_plan_gpu_async(plan, 1)          # warm-up
                t3 = await dev.time_plan_gpu_async(plan, 3)
                s = sorted(t3["ns"][2 * i + 1] - t3["ns"][2 * i] for i in range(3))[1] / 1e9 / reps
                rows.append({"rows": n, "cols": k, "quant": q, "x": name, "int8": bool(v.get("int8") or v.get("rounded_x")),
                             "tpr": v.get("tpr"), "wg": v.get("wg"), "copies": copies, "us": round(s * 1e6, 2),
                             "adapter": dev.describe()})
    return rows


def _step(dev):
    """A step uniform of one token at position 0."""
    from pyapp.gpu import kernels as K
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, 1, 0)
    return step


def gpu_seconds(dev, plan, repeat: int = 3) -> float:
    """Median GPU seconds of a plan, by timestamps at its first pass's start and last pass's end."""
    t = dev.time_plan_gpu(plan, repeat)
    return sorted(t["ns"][2 * i + 1] - t["ns"][2 * i] for i in range(repeat))[repeat // 2] / 1e9


# (qtype, k, n, geglu): the 26B-A4B's expert gate|up (Q4_K, 2 x 704 rows of 2816) and down (704
# long rows: Q5_0 / Q8_0, llama.cpp's fallbacks for rows that are not a multiple of 256)
EXPERT_SHAPES = [("q4_k", 2816, 704, True), ("q5_0", 704, 2816, False), ("q8_0", 704, 2816, False)]


def expert_sweep(dev, rng, n_experts: int = 128, k_used: int = 8, reps: int = 30, int8: bool = False) -> int:
    """One token's decode expert matvec (K.moe_experts) by kernel and threads per row: GPU us a
    dispatch from timestamp queries around a plan of `reps`."""
    import numpy as np
    from pyapp import ggml
    from pyapp.gpu import kernels as K
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, 1, 0)
    ids = dev.buffer(4 * k_used)
    dev.write(ids, (np.arange(k_used, dtype=np.uint32) * 3 + 1).tobytes())
    for q, k, n, geglu in EXPERT_SHAPES:
        per_expert = ggml.row_bytes(q, k) * (2 * n if geglu else n)
        n_experts = min(n_experts, dev.limits["max_storage_buffer_binding_size"] // per_expert)   # lavapipe: 128 MiB
        rows = n_experts * (2 * n if geglu else n)
        nbytes = ggml.row_bytes(q, k) * rows
        w = dev.buffer(nbytes)
        dev.write(w, rng.integers(0, 255, nbytes, dtype=np.uint8).tobytes())
        x = dev.buffer(4 * k * k_used)
        dev.write(x, rng.standard_normal(k * k_used).astype(np.float32).tobytes())
        y = dev.buffer(4 * n * k_used)
        variants = [dict(chunks=False, tpr=t, wg=g) for t in (8, 16, 32, 64) for g in (64, 128, 256) if t <= g]
        if q == "q4_k" and dev.has_subgroups:
            variants += [dict(chunks=True, tpr=t, wg=g, int8=i) for t in (8, 16, 32) for g in (64, 128, 256)
                         for i in ((False, True) if int8 else (False,))]
        elif int8 and not geglu:        # moe_x8.wgsl: 32-weight blocks on int8 x
            variants += [dict(tpr=t, wg=g, int8=True) for t in (2, 4, 8) for g in (64, 128, 256)]
        for v in variants:
            plan = dev.plan()
            for _ in range(reps):
                K.moe_experts(dev, q, k, n, n_experts, k_used, w, x, y, ids, step, 1, plan=plan, geglu=geglu,
                              per_slot_input=not geglu, **v)
            dev.time_plan_gpu(plan, 1)
            us = gpu_seconds(dev, plan) * 1e6 / reps
            read = ggml.row_bytes(q, k) * k_used * (2 * n if geglu else n)
            print(json.dumps({"experts": f"{q} {k}x{n}{' geglu' if geglu else ''}", **v, "us": round(us, 2),
                              "gb_s": round(read / us / 1e3, 1), "adapter": dev.describe()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
