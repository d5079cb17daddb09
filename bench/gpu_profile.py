"""Where a decode step's GPU time goes, by timestamp queries (both paths: native and the browser's).

    python bench/gpu_profile.py MODEL.gguf [--few N] [--prefill] [--prompt N] [--context N]      native
    node bench/node_bench.mjs --gpu-profile MODEL.gguf                  browser path (Pyodide + Dawn;
                                         FEW, PROFILE_PREFILL=1, PROFILE_PROMPT, PROFILE_CONTEXT for the same)

Each plan is profiled after a prefill of --prompt tokens (512) in a context of --context (2048): a long
prompt shows the prefill chunk (or decode step) at the end of a long context, where attention weighs most.

For each plan (the decode layers, the head + sampling; --few N: a speculative step of 1 + N tokens;
--prefill: a prefill chunk) it prints one JSON line with:
  wall_ms      a submit's share of 20 back-to-back submits, queue drained before and after
               (the token rate's bound: CPU encoding and GPU work overlap across submits)
  cpu_ms       encoding + submitting one submit on the CPU (median)
  gpu_ms       the GPU's time from the first pass's start to the last pass's end (median)
  sum_ms       the sum of every dispatch's own time, each in a pass of its own (median)
then one line per kernel family (shader:entry) with its dispatches and GPU us from the per-dispatch
stamps, and the 12 costliest kernels by shape (the family with its K, N, ... constants). gpu_ms - sum_ms is what the gaps between dispatches cost (barriers, launch); wall_ms above
gpu_ms means the CPU side is the bound.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


SHAPE_CONSTANTS = ("K", "N", "HD", "MODE", "PRO", "E", "KSEL")    # what tells one kernel's dispatches apart


def _families(plan) -> list[str]:
    return [":".join(op[1].key[:2]) for op in plan.ops if op[0] == "d"]


def _shapes(plan) -> list[str]:
    """Each dispatch's family with the constants that set its shape (SHAPE_CONSTANTS), or the values it reads
    its shape from at run time (the prefill matmuls: K, N, Y's row stride, slices)."""
    out = []
    for op in plan.ops:
        if op[0] == "d":
            consts = dict(op[1].key[3])
            shape = " ".join(f"{c}={consts[c]}" for c in SHAPE_CONSTANTS if c in consts)
            if op[2].values:
                shape += " values=" + ",".join(map(str, op[2].values))
            out.append(":".join(op[1].key[:2]) + " " + shape)
    return out


async def _wall_ms(dev, plan, repeat: int = 20) -> float:
    sync = dev.buffer(16, label="profile sync")
    await dev.read_async(sync, 0, 4)
    t = time.perf_counter()
    for _ in range(repeat):
        dev.submit(plan)
    await dev.read_async(sync, 0, 4)
    return (time.perf_counter() - t) * 1e3 / repeat


async def profile_plan_async(dev, name: str, plan, repeat: int = 5) -> list[dict]:
    """The JSON rows of one plan (module docstring)."""
    await dev.time_plan_gpu_async(plan, 2)            # warm-up: pipelines, caches
    whole = await dev.time_plan_gpu_async(plan, repeat)
    gpu = [(whole["ns"][2 * i + 1] - whole["ns"][2 * i]) / 1e6 for i in range(repeat)]
    fams = _families(plan)
    n = len(fams)
    each = await dev.time_plan_gpu_async(plan, repeat, per_dispatch=True)
    per = [[(each["ns"][2 * n * r + 2 * i + 1] - each["ns"][2 * n * r + 2 * i]) / 1e3 for i in range(n)]
           for r in range(repeat)]
    us = [statistics.median(p[i] for p in per) for i in range(n)]
    rows = [{"plan": name, "dispatches": n, "wall_ms": round(await _wall_ms(dev, plan), 3),
             "cpu_ms": round(statistics.median(whole["cpu_ms"]), 3), "gpu_ms": round(statistics.median(gpu), 3),
             "sum_ms": round(statistics.median(sum(p) for p in per) / 1e3, 3), "device": dev.describe()}]
    by = defaultdict(list)
    for f, u in zip(fams, us):
        by[f].append(u)
    for f, v in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        rows.append({"plan": name, "family": f, "dispatches": len(v), "us": round(sum(v), 1),
                     "us_each": round(sum(v) / len(v), 2), "us_max": round(max(v), 2)})
    by = defaultdict(list)
    for f, u in zip(_shapes(plan), us):
        by[f].append(u)
    for f, v in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:12]:
        rows.append({"plan": name, "kernel": f, "dispatches": len(v), "us": round(sum(v), 1),
                     "us_each": round(sum(v) / len(v), 2)})
    return rows


async def profile_async(eng, few: int = 0, prefill: bool = False, prompt: int = 512) -> list[dict]:
    """Rows for the decode plans of an open Engine after a `prompt`-token prefill."""
    from pyapp.engine import SamplingParams
    dev, g = eng.dev, eng.runner
    vocab = eng.config.vocab_size
    await eng.generate_async([2 + i % (vocab - 2) for i in range(prompt)], SamplingParams(temperature=0, max_tokens=2), stop_ids=())
    pos = len(eng.cached)
    g.write_step([5], pos)
    plans = {"decode layers": g.layers_plan(1), "head+sample": g.head_plan(0, sample=True)}
    if few:
        g.write_step(list(range(2, 3 + few)), pos)
        plans = {f"few-token layers ({few + 1} tokens)": g.layers_program(g.head_rows, few=True)[0],
                 f"greedy head ({few + 1} rows)": g.greedy_plan(0)}
    elif prefill:
        g.write_step(list(range(2, 2 + g.chunk)), pos)
        plans = {f"prefill layers ({g.chunk} tokens)": g.layers_plan(g.chunk)}
    rows = []
    for name, plan in plans.items():
        rows += await profile_plan_async(dev, name, plan)
    return rows


def main() -> int:
    import asyncio
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    def option(name: str, default: int) -> int:
        return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default
    few, prompt, context = option("--few", 0), option("--prompt", 512), option("--context", 2048)
    eng = Engine.open(read_gguf(sys.argv[1]), backend="native", context_length=context,
                      int8=os.environ.get("INT8") != "0")
    for r in asyncio.run(profile_async(eng, few=few, prefill="--prefill" in sys.argv, prompt=prompt)):
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
