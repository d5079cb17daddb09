#!/usr/bin/env bash
# Before / after on the browser path, on the device machine: bench/node_bench.mjs from an older tree
# (BEFORE, e.g. /tmp/before: a `git archive` of the commit to compare with) and from this one, on each
# file, alternating so that both see the machine in the same state. One line per run: tree, file,
# decode and prefill tok/s (medians of node_bench's REPEAT runs) and the runs themselves.
#
#   BEFORE=/tmp/before bash bench/ab_browser.sh /tmp/bench-e2b-Q4_K.gguf [...]
# Env as node_bench.mjs (PROMPT_TOKENS, GEN_TOKENS, ...); H100 defaults: PYODIDE_DIR, WEBGPU_DIR, NODE under /tmp/h100.
set -u
BEFORE=${BEFORE:-/tmp/before}
NODE=${NODE:-/tmp/h100/bin/node}
export PYODIDE_DIR=${PYODIDE_DIR:-/tmp/h100/pyodide} WEBGPU_DIR=${WEBGPU_DIR:-/tmp/h100/webgpu}
HERE=$(pwd)
for f in "$@"; do
  for tree in "$BEFORE" "$HERE"; do
    (cd "$tree" && "$NODE" bench/node_bench.mjs "$f" 2>/dev/null) | python3 -c '
import json, sys
tree, f = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    if line.startswith("{"):
        r = json.loads(line)
        print(tree, f.rsplit("/", 1)[-1], "decode", round(r["decode_tok_s"], 1), "prefill", round(r["prefill_tok_s"], 1),
              r.get("runs", {}).get("decode_tok_s"), flush=True)' "$tree" "$f"
  done
done
