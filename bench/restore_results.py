"""Put llama.cpp results from an earlier device call back into bench/h100.sh's results folder.

    python3 bench/restore_results.py FROM_DIR RES_DIR

FROM_DIR holds what an earlier call brought back (llama.jsonl, ttft.jsonl; carried to the device
machine in an ignored folder such as .carry/results); RES_DIR is h100.sh's results folder
($H100_WORK/results, default /tmp/h100/results). llama-bench lines go to the per-model files the
`llama`, `ttft` and `table` steps read, so a later call measures ours only and still prints the
side-by-side table (llama.cpp's build takes ~6 of a call's 10 minutes). Our own lines are skipped:
they are measured again.
"""

from __future__ import annotations

import json
import os
import sys


def main(src: str, res: str) -> int:
    os.makedirs(res, exist_ok=True)
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


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
