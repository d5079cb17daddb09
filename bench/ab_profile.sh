#!/usr/bin/env bash
# Before / after by GPU timestamps on the browser path, on the device machine: bench/node_bench.mjs
# --gpu-profile from an older tree (BEFORE: a `git archive` of the commit to compare with) and from this one,
# on each file, alternating ROUNDS times so that both see the machine in the same state. GPU time is the
# steadier comparison where end-to-end rates spread (the browser path's decode). One line per run: tree, file,
# plan, gpu_ms, dispatches, then the kernel families and the kernel shapes (a family at one K, N, ...) whose
# time differs most between the trees, each within its plan.
#
#   BEFORE=/tmp/before PROFILE_PREFILL=1 bash bench/ab_profile.sh /tmp/bench-e2b-lq-Q4_K_M.gguf [...]
# Env as node_bench.mjs --gpu-profile (PROFILE_PREFILL=1: a prefill chunk; FEW=N; PROFILE_PROMPT,
# PROFILE_CONTEXT); ROUNDS (2); H100 defaults: PYODIDE_DIR, WEBGPU_DIR, NODE under /tmp/h100.
set -u
BEFORE=${BEFORE:-/tmp/before}
NODE=${NODE:-/tmp/h100/bin/node}
ROUNDS=${ROUNDS:-2}
export PYODIDE_DIR=${PYODIDE_DIR:-/tmp/h100/pyodide} WEBGPU_DIR=${WEBGPU_DIR:-/tmp/h100/webgpu}
HERE=$(pwd)
OUT=$(mktemp -d)
for f in "$@"; do
  for round in $(seq "$ROUNDS"); do
    for tree in "$BEFORE" "$HERE"; do
      name=$( [ "$tree" = "$HERE" ] && echo after || echo before )
      (cd "$tree" && "$NODE" bench/node_bench.mjs --gpu-profile "$f" 2>/dev/null) | grep '^{' > "$OUT/$name-$round.jsonl"
    done
  done
  python3 - "$OUT" "$f" "$ROUNDS" <<'EOF'
import json, sys
from collections import defaultdict
out, f, rounds = sys.argv[1], sys.argv[2].rsplit("/", 1)[-1], int(sys.argv[3])
# per tree, the fastest round's us of each (plan, kernel family) and (plan, kernel shape): a family's name
# alone would mix plans (the head's matvec with the layers')
families, kernels = {}, {}
for tree in ("before", "after"):
    fam, ker = defaultdict(list), defaultdict(list)
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{tree}-{r}.jsonl"):
            row = json.loads(line)
            if "gpu_ms" in row:
                print(tree, f, row["plan"], "gpu_ms", row["gpu_ms"], "dispatches", row["dispatches"], flush=True)
            elif "family" in row:
                fam[(row["plan"], row["family"])].append(row["us"])
            elif "kernel" in row:
                ker[(row["plan"], row["kernel"])].append(row["us"])
    families[tree] = {k: min(v) for k, v in fam.items()}
    kernels[tree] = {k: min(v) for k, v in ker.items()}

def moved(table, most):
    keys = set(table["before"]) | set(table["after"])
    for k in sorted(keys, key=lambda k: -abs(table["after"].get(k, 0) - table["before"].get(k, 0)))[:most]:
        print("  ", k[0] + ":", k[1], "us before", table["before"].get(k, 0), "after", table["after"].get(k, 0))
print(" families that moved most:")
moved(families, 8)
print(" kernel shapes that moved most:")
moved(kernels, 8)
EOF
done
rm -rf "$OUT"
