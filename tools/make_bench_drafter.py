#!/usr/bin/env python3
"""Write a full-size random-weight Gemma 4 assistant drafter GGUF for speed measurements, beside a bench target
of tools/make_bench_model.py.

    python tools/make_bench_drafter.py --target e2b --quant F16 --out /tmp/e2b-assistant.gguf

The shape is gemma-4-E2B-it-assistant's config.json (hidden 256, 4 layers: 3 sliding and 1 full, 4 query
heads, intermediate 2048, the tied head over 262144 tokens, backbone 1536) with the target's K/V heads, head
widths and window; the keys and tensor names are those llama.cpp's converter writes for `gemma4-assistant`
(as in tests/fixtures/assistant/, which it converted). Weights are random (numerics meaningless, bytes per
drafted token real). --quant: the matrices' type (F16 as a BF16 checkpoint converts to with --outtype f16;
Q8_0 for --outtype q8_0). Needs numpy and the `gguf` package only, like make_bench_model.py.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

from make_bench_model import FILE_TYPES, SHAPES, add_matrix, add_rope_freqs, add_vector, write_attention_keys

ARCH = "gemma4-assistant"
# the drafters Google publishes, by target (gemma-4-E2B-it-assistant's config.json)
DRAFTERS = {"e2b": dict(hidden=256, layers=4, heads=4, ffn=2048, pattern=[True, True, True, False])}


def write(target: str, qtype, out: str, seed: int = 0) -> None:
    s, t = DRAFTERS[target], SHAPES[target]
    rng = np.random.default_rng(seed)
    n, h, pattern = s["layers"], s["hidden"], s["pattern"]
    w = GGUFWriter(out, ARCH)
    w.add_name(f"bench-{target}-assistant-{qtype.name}")
    w.add_block_count(n)
    w.add_context_length(131072)
    w.add_embedding_length(h)
    w.add_uint32(f"{ARCH}.embedding_length_out", t["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(t["kv_heads"])
    write_attention_keys(w, t, ARCH)             # the target's head widths: the drafter reads its K/V
    w.add_sliding_window(t["window"])
    w.add_uint32(f"{ARCH}.attention.shared_kv_layers", n)
    w.add_uint32(f"{ARCH}.embedding_length_per_layer_input", 0)
    w.add_array(f"{ARCH}.attention.sliding_window_pattern", pattern)
    w.add_uint32(f"{ARCH}.nextn_predict_layers", n)
    w.add_file_type(int(FILE_TYPES[qtype]))

    add_rope_freqs(w, t["global_head_dim"])
    add_matrix(w, rng, "token_embd.weight", h, t["vocab"], qtype)
    add_vector(w, rng, "output_norm.weight", h)
    add_matrix(w, rng, "nextn.pre_projection.weight", 2 * t["hidden"], h, qtype)
    add_matrix(w, rng, "nextn.post_projection.weight", h, t["hidden"], qtype)
    for i in range(n):
        p = f"blk.{i}."
        hd = t["head_dim"] if pattern[i] else t["global_head_dim"]
        add_vector(w, rng, p + "attn_norm.weight", h)
        add_matrix(w, rng, p + "attn_q.weight", h, s["heads"] * hd, qtype)
        add_vector(w, rng, p + "attn_q_norm.weight", hd)
        add_matrix(w, rng, p + "attn_output.weight", s["heads"] * hd, h, qtype)
        add_vector(w, rng, p + "post_attention_norm.weight", h)
        add_vector(w, rng, p + "ffn_norm.weight", h)
        add_matrix(w, rng, p + "ffn_gate.weight", h, s["ffn"], qtype)
        add_matrix(w, rng, p + "ffn_up.weight", h, s["ffn"], qtype)
        add_matrix(w, rng, p + "ffn_down.weight", s["ffn"], h, qtype)
        add_vector(w, rng, p + "post_ffw_norm.weight", h)
        add_vector(w, rng, p + "layer_output_scale.weight", 1, value=0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=sorted(DRAFTERS), default="e2b")
    ap.add_argument("--quant", choices=["F16", "Q8_0"], default="F16")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.time()
    write(args.target, T[args.quant], args.out, args.seed)
    print(f"wrote {args.out} in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
