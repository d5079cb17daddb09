"""LoRA training speed: tokens/s through forward + backward + update, and the GPU memory it holds.

    python bench/train_bench.py MODEL.gguf [--seq-len 256 --batch 4 --rank 8 --steps 6]
    node bench/node_bench.mjs --train MODEL.gguf          # the browser code path, same measure_async

Random-token sequences of exactly --seq-len tokens, every token a target (the loss over the whole
sequence), the default targets (q,k,v,o,gate,up,down), one update = --batch sequences. The first
update (plan recording, shader compilation) is reported apart; tok_s is the median of the others.
GPU memory: the bytes of every buffer our code created (weights, the engine's state, the trainer's
buffers), not what the driver adds; bench/h100.sh also samples nvidia-smi.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def random_dataset(vocab: int, seq_len: int, n: int, seed: int):
    from pyapp.train.data import Example, build_dataset
    rng = random.Random(seed)
    examples = [Example([2] + [rng.randrange(4, vocab) for _ in range(seq_len - 1)], [1] * seq_len, i + 1)
                for i in range(n)]
    return build_dataset("text", examples, seq_len, val_fraction=0.0, seed=seed)


def trainer(engine, seq_len: int, batch: int, rank: int, steps: int, seed: int = 0):
    from pyapp.train.trainer import TrainConfig, Trainer
    before = engine.dev.allocated_bytes
    t0 = time.perf_counter()
    tr = Trainer(engine, random_dataset(engine.config.vocab_size, seq_len, batch * steps, seed),
                 TrainConfig(rank=rank, alpha=2.0 * rank, steps=steps, batch=batch, seq_len=seq_len, lr=1e-4, seed=seed))
    return tr, engine.dev.allocated_bytes - before, time.perf_counter() - t0


def summary(engine, tr, trainer_bytes: int, setup_s: float, reports: list, seq_len: int, batch: int, rank: int):
    rest = [r.tokens_per_s for r in reports[1:]] or [reports[0].tokens_per_s]
    return {"kind": "train", "adapter": engine.dev.describe(), "backend": engine.dev.backend,
            "model": engine.config.describe(), "seq_len": seq_len, "batch": batch, "rank": rank,
            "trainable": tr.params.n_trainable, "updates": len(reports),
            "tok_s": round(statistics.median(rest), 1), "runs_tok_s": [round(r.tokens_per_s, 1) for r in reports],
            "update_s": round(batch * seq_len / statistics.median(rest), 3),
            "first_update_s": round(batch * seq_len / reports[0].tokens_per_s, 2), "setup_s": round(setup_s, 2),
            "losses": [round(r.loss, 4) for r in reports],
            "gpu_mib_model": round((engine.dev.allocated_bytes - trainer_bytes) / 2**20),
            "gpu_mib_trainer": round(trainer_bytes / 2**20),
            "gpu_mib_total": round(engine.dev.allocated_bytes / 2**20)}


def measure(engine, seq_len: int = 256, batch: int = 4, rank: int = 8, steps: int = 6) -> dict:
    tr, nbytes, setup_s = trainer(engine, seq_len, batch, rank, steps)
    try:
        reports = [tr.train_step() for _ in range(steps)]
    finally:
        tr.close()
    return summary(engine, tr, nbytes, setup_s, reports, seq_len, batch, rank)


async def measure_async(engine, seq_len: int = 256, batch: int = 4, rank: int = 8, steps: int = 6) -> dict:
    tr, nbytes, setup_s = trainer(engine, seq_len, batch, rank, steps)
    try:
        reports = [await tr.train_step_async() for _ in range(steps)]
    finally:
        tr.close()
    return summary(engine, tr, nbytes, setup_s, reports, seq_len, batch, rank)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    g = read_gguf(args.model)
    engine = Engine.open(g, context_length=max(256, args.seq_len), chunk=64)
    r = measure(engine, args.seq_len, args.batch, args.rank, args.steps)
    r["file"] = Path(args.model).name
    print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
