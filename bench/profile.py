"""Where a decode step's time goes: the step's plan timed whole and per kernel family.

    python bench/profile.py MODEL.gguf [--prefill | --train | --few N]

--few N: speculative decoding's step of a token and N drafts (the few-token layers plan, then the
greedy head over its rows).
--train: a LoRA training sequence of 256 tokens (bench/train_bench.py's settings): its forward plan
and its backward plan (each layer recomputed, then its backward).

Each family's dispatches (grouped by shader:entry point) are replayed alone, in
their order, as one submit; the sum over families vs the whole plan shows how much
is GPU work and how much is per-dispatch overhead. Prints JSON lines.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))


def main() -> int:
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    path = sys.argv[1]
    eng = Engine.open(read_gguf(path), backend="native", context_length=1024)
    dev, g = eng.dev, eng.runner
    eng.generate(list(range(2, 258)), SamplingParams(temperature=0, max_tokens=4), stop_ids=())
    g.write_step([5], len(eng.cached))
    plans = {"decode layers": g.layers_plan(1), "head+sample": g.head_plan(0, sample=True)}
    if "--few" in sys.argv:
        n = 1 + int(sys.argv[sys.argv.index("--few") + 1])
        g.write_step(list(range(2, 2 + n)), len(eng.cached))
        plans = {f"few-token layers ({n} tokens)": g.layers_program(g.head_rows, few=True)[0],
                 f"greedy head ({n} rows)": g.greedy_plan(0)}
    elif "--train" in sys.argv:
        from train_bench import trainer
        tr, _, _ = trainer(eng, seq_len=256, batch=1, rank=8, steps=1)
        seq = tr.data.train[0]
        tr.state.write_sequence(seq.ids, seq.mask, seq.n_targets, g.source)
        plans = {"train forward (256 tokens)": tr._forward, "train backward (256 tokens)": tr._backward}
    elif "--prefill" in sys.argv:
        g.write_step(list(range(2, 2 + g.chunk)), len(eng.cached))
        plans = {f"prefill layers ({g.chunk} tokens)": g.layers_plan(g.chunk)}
    for name, plan in plans.items():
        total = dev.time_plan(plan, repeat=20)
        print(json.dumps({"plan": name, "dispatches": sum(op[0] == "d" for op in plan.ops),
                          "ms": round(total * 1e3, 3)}), flush=True)
        families = defaultdict(list)
        for op in plan.ops:
            families[op[1].key[:2] if op[0] == "d" else ("copy",)].append(op)
        rows = []
        for fam, ops in families.items():
            sub = dev.plan()
            sub.ops = list(ops)
            rows.append((dev.time_plan(sub, repeat=20), ":".join(fam), len(ops)))
        for t, fam, n in sorted(rows, reverse=True):
            print(json.dumps({"plan": name, "family": fam, "dispatches": n, "ms": round(t * 1e3, 3),
                              "us_each": round(t * 1e6 / n, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
