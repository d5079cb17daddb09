"""Benchmarks: engine prefill/decode speed and matvec bandwidth, against the memory-bandwidth bound.

    python bench/bench.py --models tests/fixtures/*.gguf            # committed fixtures
    python bench/bench.py --make e2b:Q4_K --workdir /tmp            # full-size random-weight E2B
    python bench/bench.py --kernels                                 # matvec GB/s per quant type
    python bench/bench.py --make diffusion:Q4_K --steps 48          # DiffusionGemma: denoising speed

Prints one JSON object per line. Decode reads every active weight once per token,
so tokens/s <= bandwidth / bytes_per_token; `bound_tok_s` states that bound for the
bandwidth given by --bandwidth (GB/s; default: the best matvec figure measured here).

Speculative decoding: `--speculate N` (greedy only) drafts up to N tokens per step by prompt lookup
and reports `drafted`, `accepted`, `decode_steps` and `tokens_per_step` beside decode tok/s, and
what a step costs alone (`one_token_step_ms`; `draft_step_ms`: a token and N drafts in the plan
speculation uses; `draft_step_tiles_ms`: the same in the prefill plan); compare `--prompt-kind
repeat` (a random block of 16 ids repeated) with `--prompt-kind random`, each with and without it:

    python bench/bench.py --make e2b:Q4_K --speculate 8 --prompt-kind repeat

A DiffusionGemma file (architecture `diffusion-gemma`) is measured by denoising instead
(bench/engine_bench.py's denoising): a random --prompt-tokens prompt (default 128), --gen-tokens new tokens
(default 256: one canvas), the model's sampler settings with at most --steps steps per block, seeded;
it reports step_ms (median time per denoising step), committed_tok_s, tokens_per_forward,
steps_taken per block (random weights rarely pass the confidence stop) and prompt_encode_s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def bytes_per_token(gguf) -> int:
    """Weight bytes one decode step reads: every matrix once (a tied embedding as the head),
    plus one row of the embedding and per-layer embedding tables; MoE: only the routed experts."""
    from pyapp.model.config import Gemma4Config
    from pyapp.model.weights import bind, names
    cfg = Gemma4Config.from_gguf(gguf)
    w = bind(cfg, gguf.tensors)
    total = 0
    for _, owner, field in names(cfg, w):
        t = getattr(owner, field)
        if field == "ple_token_embd":
            total += t.row_bytes
        elif field == "token_embd":
            total += t.row_bytes + (t.nbytes if w.output is None else 0)   # the lookup [+ the tied head]
        elif field.startswith("experts_") and len(t.shape) == 3:
            total += t.nbytes * cfg.n_experts_used // cfg.n_experts
        else:
            total += t.nbytes
    return total


# --prompt-tokens / --gen-tokens when not given: (autoregressive, DiffusionGemma)
DEFAULT_PROMPT_TOKENS = (256, 128)
DEFAULT_GEN_TOKENS = (64, 256)


def bench_model(path: str, args) -> dict:
    import engine_bench
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.model.config import DIFFUSION_ARCH
    g = read_gguf(path)
    diffusion = g.metadata.get("general.architecture") == DIFFUSION_ARCH
    t = time.perf_counter()
    eng = Engine.open(g, backend="native", context_length=args.context, chunk=args.chunk,
                      gpu_memory_mib=args.gpu_memory)
    args.chunk = eng.runner.chunk              # the engine's choice where none was given
    load_s = time.perf_counter() - t
    prompt = args.prompt_tokens or DEFAULT_PROMPT_TOKENS[diffusion]
    gen = args.gen_tokens or DEFAULT_GEN_TOKENS[diffusion]
    if diffusion:
        r = engine_bench.bench(eng, prompt_tokens=prompt, gen_tokens=gen, repeat=args.repeat, steps=args.steps)
        r.update(file=os.path.basename(path), file_gib=round(os.path.getsize(path) / 2**30, 3),
                 load_s=round(load_s, 2), chunk=args.chunk)
        return r
    r = engine_bench.bench(eng, prompt_tokens=prompt, gen_tokens=gen, repeat=args.repeat,
                           temperature=args.temperature, speculate=args.speculate, prompt=args.prompt_kind)
    bpt = bytes_per_token(g)
    r.update(file=os.path.basename(path), file_gib=round(os.path.getsize(path) / 2**30, 3), load_s=round(load_s, 2),
             bytes_per_token=bpt, chunk=args.chunk)
    if args.bandwidth:
        r["bound_tok_s"] = round(args.bandwidth * 1e9 / bpt, 1)
    return r


def bench_kernels(args) -> list[dict]:
    """Matvec over an E2B-sized FFN matrix per quant type, 50 dispatches per submit."""
    import numpy as np
    from pyapp import ggml
    from pyapp.gpu import get_device
    from pyapp.gpu import kernels as K
    dev = get_device("native")
    n, k = 6144, 1536
    out = []
    rng = np.random.default_rng(0)
    x = dev.buffer(4 * k)
    dev.write(x, rng.standard_normal(k).astype(np.float32).tobytes())
    y = dev.buffer(4 * n)
    for q in ("f32", "f16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"):
        nbytes = ggml.row_bytes(q, k) * n
        w = dev.buffer(nbytes + 4)
        dev.write(w, rng.integers(0, 255, nbytes, dtype=np.uint8).tobytes())   # speed only
        for sg in sorted({False, dev.has_subgroups}):
            plan = dev.plan()
            for _ in range(50):
                K.matvec(dev, q, k, n, w, x, y, plan=plan, subgroups=sg)
            s = dev.time_plan(plan, repeat=5) / 50
            out.append({"kernel": "matvec", "quant": q, "subgroups": sg, "rows": n, "cols": k,
                        "us": round(s * 1e6, 2), "gb_s": round(nbytes / s / 1e9, 1), "adapter": dev.describe()})
    # prefill matmul: a 512-token step through an E2B FFN matrix
    t_step = 512
    xm = dev.buffer(4 * t_step * k)
    dev.write(xm, rng.standard_normal(t_step * k).astype(np.float32).tobytes())
    ym = dev.buffer(4 * t_step * n)
    step = dev.buffer(K.STEP_BYTES, "uniform")
    K.write_step(dev, step, t_step, 0)
    for q in ("f16", "q8_0", "q4_k", "q6_k"):
        nbytes = ggml.row_bytes(q, k) * n
        w = dev.buffer(nbytes + 4)
        dev.write(w, rng.integers(0, 255, nbytes, dtype=np.uint8).tobytes())
        plan = dev.plan()
        for _ in range(10):
            K.matmul(dev, q, k, n, w, xm, ym, step, n_tokens=t_step, plan=plan)
        s = dev.time_plan(plan, repeat=3) / 10
        out.append({"kernel": "matmul", "quant": q, "tokens": t_step, "rows": n, "cols": k,
                    "us": round(s * 1e6, 1), "tflop_s": round(2 * t_step * n * k / s / 1e12, 2),
                    "adapter": dev.describe()})
    # the dispatch floor: an empty-ish elementwise op
    K.write_step(dev, step, 1, 0)
    plan = dev.plan()
    for _ in range(500):
        K.elementwise(dev, "add", 4, y, step, 1, b=x, plan=plan)
    s = dev.time_plan(plan, repeat=5) / 500
    out.append({"kernel": "tiny-dispatch", "us": round(s * 1e6, 2), "adapter": dev.describe()})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=[])
    ap.add_argument("--make", nargs="*", default=[], help="shape:QUANT for tools/make_bench_model.py, e.g. e2b:Q4_K")
    ap.add_argument("--workdir", default="/tmp")
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--prompt-tokens", type=int, default=None, help="default 256 (DiffusionGemma: 128)")
    ap.add_argument("--gen-tokens", type=int, default=None,
                    help="default 64 (DiffusionGemma: 256 new tokens, whole canvases)")
    ap.add_argument("--steps", type=int, default=None,
                    help="DiffusionGemma: at most this many denoising steps per block (default: the model's)")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs after a warm-up; medians are reported")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample decoded tokens (0: greedy, which repeats itself on random weights)")
    ap.add_argument("--speculate", type=int, default=0, metavar="N",
                    help="speculative decoding (greedy only): up to N prompt-lookup drafts checked per step; "
                         "reports drafted, accepted and tokens per step")
    ap.add_argument("--prompt-kind", choices=["random", "repeat"], default="random",
                    help="random token ids, or a random block of 16 ids repeated (text that repeats)")
    ap.add_argument("--gpu-memory", type=float, default=None, metavar="MIB",
                    help="GPU memory budget (experts stream from the file beyond it)")
    ap.add_argument("--chunk", type=int, default=None, help="most tokens per prefill step (default: the engine's)")
    ap.add_argument("--bandwidth", type=float, default=0.0, help="GB/s for the bound (0: best matvec measured)")
    args = ap.parse_args()
    if args.kernels:
        rows = bench_kernels(args)
        for r in rows:
            print(json.dumps(r), flush=True)
        if not args.bandwidth:
            args.bandwidth = max(r.get("gb_s", 0) for r in rows)
    models = list(args.models)
    for spec in args.make:
        shape, quant = spec.split(":")
        path = os.path.join(args.workdir, f"bench-{shape}-{quant}.gguf")
        if not os.path.exists(path):
            subprocess.run([sys.executable, str(ROOT / "tools" / "make_bench_model.py"), "--shape", shape,
                            "--quant", quant, "--out", path], check=True)
        models.append(path)
    for m in models:
        print(json.dumps(bench_model(m, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
