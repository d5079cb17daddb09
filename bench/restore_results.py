"""Put llama.cpp results from an earlier device call back into bench/h100.sh's results folder.

    python3 bench/restore_results.py FROM_DIR RES_DIR

FROM_DIR holds what an earlier call brought back (llama.jsonl, ttft.jsonl, diffusion.jsonl; carried to the device
machine in an ignored folder such as .carry/results); RES_DIR is h100.sh's results folder
($H100_WORK/results, default /tmp/h100/results). llama-bench lines go to the per-model files the
`llama`, `ttft` and `table` steps read, so a later call measures ours only and still prints the
side-by-side table (llama.cpp's build takes ~6 of a call's 10 minutes). Our own lines are skipped
(measured again), except DiffusionGemma's and speculative decoding's (speculate.jsonl), which go back
to the `diffusion` and `speculate` steps' files so that those run only what is missing.
"""

from __future__ import annotations

import json
import os
import sys


def main(src: str, res: str) -> int:
    os.makedirs(res, exist_ok=True)
    restore_diffusion(src, res)
    restore_speculation(src, res)
    for name, prefix in (("llama.jsonl", "llama"), ("ttft.jsonl", "ttft-llama")):
        path = os.path.join(src, name)
        if not os.path.exists(path):
            continue
        for line in open(path):
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if "model_filename" not in record:          # ours
                continue
            model = os.path.splitext(os.path.basename(record["model_filename"]))[0]
            with open(os.path.join(res, f"{prefix}-{model}.jsonl"), "a") as f:
                f.write(line)
    return 0


def restore_diffusion(src: str, res: str) -> None:
    """DiffusionGemma runs (diffusion.jsonl) back into the `diffusion` step's per-run files, so that
    step only runs what is missing."""
    path = os.path.join(src, "diffusion.jsonl")
    if not os.path.exists(path):
        return
    for line in open(path):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        model = os.path.splitext(r["file"])[0]
        budget = f"-{r['budget_mib']}" if r.get("budget_mib") else ""
        with open(os.path.join(res, f"diffusion-{r['backend']}-{model}{budget}.jsonl"), "w") as f:
            f.write(line)


def restore_speculation(src: str, res: str) -> None:
    """Speculative decoding runs (speculate.jsonl) back into the `speculate` step's per-run files."""
    path = os.path.join(src, "speculate.jsonl")
    if not os.path.exists(path):
        return
    os.makedirs(os.path.join(res, "speculate"), exist_ok=True)
    for line in open(path):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        model = os.path.splitext(r["file"])[0]
        rt = "browser" if "runtime" in r else "native"
        with open(os.path.join(res, "speculate", f"{rt}-{model}-{r['prompt']}-{r['speculate']}.jsonl"), "w") as f:
            f.write(line)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
