"""Golden optimizer steps from torch (tests/fixtures/train/adamw.golden.npz) for pyapp/train/optim.py.

    python tools/make_optim_golden.py [--out tests/fixtures]

Needs torch and transformers (the `tools` extra, or /tmp/tfenv). Three parameters of odd
sizes, 7 updates with fixed random gradients (some large, so that clipping acts on some steps
and not others), torch.nn.utils.clip_grad_norm_, torch.optim.AdamW and transformers'
get_cosine_schedule_with_warmup, all float32; saved: the starting parameters, each step's
gradients, the learning rate, the norm before clipping and the parameters after the update.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(3, 5), (7,), (2, 3)]
STEPS, PEAK_LR, WARMUP, MAX_NORM, WEIGHT_DECAY, BETAS, EPS = 7, 0.05, 2, 1.0, 0.1, (0.9, 0.95), 1e-6
GRAD_SCALES = [0.1, 2.0, 0.05, 1.5, 0.2, 0.3, 3.0]      # the global norm is above MAX_NORM on some steps only


def main() -> int:
    import torch
    from transformers import get_cosine_schedule_with_warmup
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures"))
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    start = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in start]
    opt = torch.optim.AdamW(params, lr=PEAK_LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    sched = get_cosine_schedule_with_warmup(opt, WARMUP, STEPS)
    out = {f"start_{i}": p for i, p in enumerate(start)}
    lrs, norms = [], []
    for step in range(STEPS):
        for i, p in enumerate(params):
            g = (GRAD_SCALES[step] * rng.standard_normal(p.shape)).astype(np.float32)
            out[f"grad_{step}_{i}"] = g
            p.grad = torch.from_numpy(g.copy())
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, MAX_NORM)))
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        for i, p in enumerate(params):
            out[f"after_{step}_{i}"] = p.detach().numpy().copy()
    dest = Path(args.out) / "train" / "adamw.golden.npz"
    dest.parent.mkdir(exist_ok=True)
    np.savez_compressed(dest, lr=np.array(lrs), norm=np.array(norms), **out)
    print(f"{dest}: lr {np.round(lrs, 5).tolist()}, norms {np.round(norms, 3).tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
