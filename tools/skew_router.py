"""Make a random-weight MoE bench model route unevenly, in place: for measuring an expert cache.

Random router weights spread tokens over the experts nearly uniformly, the worst case for a
cache of experts. Trained models favor some experts. This scales the router rows of HOT
experts per layer (chosen at random, seeded) by FACTOR: their logits spread wider, so they
win the top-k more often (with 16 of 128 scaled by 4, about half of all choices land on them).
Only the F16/F32 router tensors (`blk.N.ffn_gate_inp.weight`) change; run it on a copy if the
uniform file is still needed.

    python tools/skew_router.py bench-a26b-Q4_K.gguf [--hot 16] [--factor 4] [--seed 0]

Needs numpy and the gguf package only (runs on a bare GPU machine).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from gguf import GGUFReader


def skew(path: str, hot: int, factor: float, seed: int) -> int:
    reader = GGUFReader(path, "r+")
    rng = np.random.default_rng(seed)
    done = 0
    for t in reader.tensors:
        if not t.name.endswith("ffn_gate_inp.weight"):
            continue
        rows = t.data                                   # [experts, hidden], a writable memmap
        if rows.dtype not in (np.float16, np.float32):
            raise SystemExit(f"{t.name} is {t.tensor_type.name}: only F16/F32 routers are supported")
        chosen = rng.choice(rows.shape[0], size=min(hot, rows.shape[0]), replace=False)
        rows[chosen] = (rows[chosen].astype(np.float32) * factor).astype(rows.dtype)
        done += 1
    reader.data.flush()
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--hot", type=int, default=16, help="experts per layer made popular")
    ap.add_argument("--factor", type=float, default=4.0, help="how much their router rows are scaled")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n = skew(args.model, args.hot, args.factor, args.seed)
    if not n:
        print(f"{args.model}: no router tensors (not a mixture-of-experts model)", file=sys.stderr)
        return 1
    print(f"{args.model}: {n} routers skewed ({args.hot} experts per layer scaled by {args.factor})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
