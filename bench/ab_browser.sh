#!/usr/bin/env bash
# Before / after on the browser path, on the device machine: bench/node_bench.mjs from an older tree
# (BEFORE, e.g. /tmp/before: a `git archive` of the commit to compare with) and from this one, on each
# file, alternating so that both see the machine in the same state. One line per run: tree, file, the
# prompt's tokens (node_bench reads at most half of CONTEXT) and the prompt step, decode and prefill
# tok/s (medians of node_bench's REPEAT runs) and the runs themselves.
# ROUNDS (1) processes of each tree a file, the order flipped every round (before first in odd rounds):
# one Node process can run at its own pace throughout (the eleventh session saw a decode nothing changed
# read 264 against 365 tok/s between two), so with ROUNDS > 1 a last line per file and tree gives the
# medians over its processes.
#
#   BEFORE=/tmp/before [ROUNDS=3] bash bench/ab_browser.sh /tmp/bench-e2b-Q4_K.gguf [...]
# Env as node_bench.mjs (PROMPT_TOKENS, GEN_TOKENS, ...); H100 defaults: PYODIDE_DIR, WEBGPU_DIR, NODE under /tmp/h100.
set -u
BEFORE=${BEFORE:-/tmp/before}
NODE=${NODE:-/tmp/h100/bin/node}
ROUNDS=${ROUNDS:-1}
export PYODIDE_DIR=${PYODIDE_DIR:-/tmp/h100/pyodide} WEBGPU_DIR=${WEBGPU_DIR:-/tmp/h100/webgpu}
HERE=$(pwd)
OUT=$(mktemp)
for f in "$@"; do
  for round in $(seq "$ROUNDS"); do
    trees=("$BEFORE" "$HERE")
    [ $((round % 2)) = 0 ] && trees=("$HERE" "$BEFORE")
    for tree in "${trees[@]}"; do
      (cd "$tree" && "$NODE" bench/node_bench.mjs "$f" 2>/dev/null) | python3 -c '
import json, sys
tree, f = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    if line.startswith("{"):
        r = json.loads(line)
        print(tree, f.rsplit("/", 1)[-1], "prompt", r["prompt_tokens"], "step", r.get("chunk"),
              "decode", round(r["decode_tok_s"], 1), "prefill", round(r["prefill_tok_s"], 1),
              r.get("runs", {}).get("decode_tok_s"), flush=True)' "$tree" "$f" | tee -a "$OUT"
    done
  done
done
if [ "$ROUNDS" -gt 1 ]; then
  python3 - "$OUT" <<'EOF'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    words = line.split()
    tree, f = words[:2]
    runs[tree, f].append((float(words[words.index("decode") + 1]), float(words[words.index("prefill") + 1])))
for (tree, f), v in runs.items():
    print(tree, f, "median of", len(v), "processes: decode", statistics.median(d for d, _ in v),
          "prefill", statistics.median(p for _, p in v))
EOF
fi
rm -f "$OUT"
