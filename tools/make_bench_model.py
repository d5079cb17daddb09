#!/usr/bin/env python3
"""Write a full-size random-weight Gemma 4 GGUF for speed measurements.

    python tools/make_bench_model.py --shape e2b --quant Q4_K --out /tmp/e2b.gguf

The tensor names, shapes and metadata keys are those llama.cpp's converter
writes for Gemma 4 (see tools/GEMMA4_GGUF_NOTES.md); the weights are random
quantized blocks with small, sane scales (numerics are meaningless, bytes per
token are real). Needs numpy and the `gguf` package only (plus pyapp.ggml, standard
library, from this checkout), so it also runs on a bare GPU machine. Not committed
output: a Q4_K E2B is about 3 GB.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's pyapp, installed or not
from pyapp import ggml  # noqa: E402

# Gemma 4 E2B text model as its HF config describes it.
SHAPES = {
    "e2b": dict(hidden=1536, layers=35, ffn=6144, heads=8, kv_heads=1, head_dim=256, global_head_dim=512,
                vocab=262144, window=512, pattern=5, shared=20, ple=256, double_wide=True, softcap=30.0),
    "e4b": dict(hidden=2560, layers=42, ffn=10240, heads=8, kv_heads=2, head_dim=256, global_head_dim=512,
                vocab=262144, window=512, pattern=6, shared=18, ple=256, double_wide=False, softcap=30.0),
    # E2B's structure at toy size (SSG SSG + 2 KV-shared), for engine-vs-reference tests
    "tiny": dict(hidden=256, layers=8, ffn=512, heads=4, kv_heads=1, head_dim=64, global_head_dim=128,
                 vocab=1000, window=8, pattern=3, shared=2, ple=64, double_wide=True, softcap=30.0),
    # 26B-A4B's structure at toy size: dense MLP + 8 experts (2 used), no V on global layers
    "tiny-moe": dict(hidden=256, layers=6, ffn=256, heads=4, kv_heads=2, head_dim=64, global_head_dim=128,
                     vocab=1000, window=8, pattern=3, shared=0, ple=0, double_wide=False, softcap=30.0,
                     experts=8, experts_used=2, expert_ffn=256, global_kv_heads=1, k_eq_v=True),
}

# Matrices up to this many elements get quantized real-valued weights; bigger ones
# random quant blocks (fast to make; speed does not depend on the values).
SMALL = 1 << 22

# Types written as random blocks, and where the f16 scale(s) sit inside a block.
SCALE_OFFSETS = {T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def random_blocks(rng, n_elements: int, qtype) -> np.ndarray:
    t = ggml.lookup(qtype)
    elems, size = t.block, t.block_bytes
    assert n_elements % elems == 0, (n_elements, qtype)
    nb = n_elements // elems
    raw = np.frombuffer(rng.bytes(nb * size), dtype=np.uint8).reshape(nb, size).copy()
    scales = (rng.random(nb, dtype=np.float32) * 0.002 + 0.001).astype(np.float16).view(np.uint8).reshape(nb, 2)
    for off in SCALE_OFFSETS[qtype]:
        raw[:, off:off + 2] = scales
    return raw.reshape(-1)


def add_matrix(w: GGUFWriter, rng, name: str, ne0: int, ne1: int, qtype, n3: int = 1):
    shape = (n3, ne1, ne0) if n3 > 1 else (ne1, ne0)   # numpy order (reversed GGUF ne)
    n = ne0 * ne1 * n3
    if n <= SMALL:
        # toy sizes: real-valued weights (fan-in scaled, so activations stay O(1)), quantized
        from pyapp.reference.quants import quantize
        data = (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(ne0)).astype(np.float32)
        if qtype == T.F16:
            w.add_tensor(name, data.astype(np.float16))
            return
        raw = np.frombuffer(quantize(data, qtype.name), np.uint8)
        w.add_tensor(name, raw.reshape(*shape[:-1], -1), raw_dtype=qtype)
        return
    if qtype == T.F16:
        data = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(np.float16).reshape(shape)
        w.add_tensor(name, data)
        return
    raw = random_blocks(rng, n, qtype).reshape(*shape[:-1], ggml.row_bytes(qtype, ne0))
    w.add_tensor(name, raw, raw_dtype=qtype)   # gguf-py takes the byte shape of quantized rows


def add_vector(w: GGUFWriter, rng, name: str, n: int, value: float | None = None):
    data = np.full(n, value, np.float32) if value is not None else (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    w.add_tensor(name, data)


def write(shape: str, qtype, out: str, seed: int = 0) -> None:
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    n = s["layers"]
    pattern = [(i + 1) % s["pattern"] != 0 for i in range(n)]          # True = sliding
    first_shared = n - s["shared"]
    ffn = [s["ffn"] * (2 if s["double_wide"] and i >= first_shared else 1) for i in range(n)]
    arch = "gemma4"

    w = GGUFWriter(out, arch)
    w.add_name(f"bench-{shape}-{qtype.name}")
    w.add_block_count(n)
    w.add_context_length(131072)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(ffn)
    w.add_head_count(s["heads"])
    w.add_head_count_kv([s["kv_heads"] if sl else s.get("global_kv_heads", s["kv_heads"]) for sl in pattern])
    w.add_rope_freq_base(1_000_000.0)
    w.add_float32(f"{arch}.rope.freq_base_swa", 10_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(s["global_head_dim"])
    w.add_value_length(s["global_head_dim"])
    w.add_uint32(f"{arch}.attention.key_length_swa", s["head_dim"])
    w.add_uint32(f"{arch}.attention.value_length_swa", s["head_dim"])
    w.add_final_logit_softcapping(s["softcap"])
    w.add_sliding_window(s["window"])
    w.add_uint32(f"{arch}.attention.shared_kv_layers", s["shared"])
    w.add_uint32(f"{arch}.embedding_length_per_layer_input", s["ple"])
    experts = s.get("experts", 0)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(s["experts_used"])
        w.add_uint32(f"{arch}.expert_feed_forward_length", s["expert_ffn"])
    kv_heads = [s["kv_heads"] if sl else s.get("global_kv_heads", s["kv_heads"]) for sl in pattern]
    w.add_array(f"{arch}.attention.sliding_window_pattern", pattern)
    w.add_rope_dimension_count(s["global_head_dim"])
    w.add_uint32(f"{arch}.rope.dimension_count_swa", s["head_dim"])
    w.add_file_type(int(qtype))

    h, V, ple = s["hidden"], s["vocab"], s["ple"]
    add_matrix(w, rng, "token_embd.weight", h, V, qtype)
    if ple:
        add_matrix(w, rng, "per_layer_token_embd.weight", ple * n, V, qtype)
        add_matrix(w, rng, "per_layer_model_proj.weight", h, ple * n, T.F16)
        add_vector(w, rng, "per_layer_proj_norm.weight", ple)
    n_rot = s["global_head_dim"] // 8        # partial_rotary_factor 0.25 -> pairs rotated
    w.add_tensor("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (s["global_head_dim"] // 2 - n_rot), np.float32))
    add_vector(w, rng, "output_norm.weight", h)
    for i in range(n):
        p = f"blk.{i}."
        hd = s["head_dim"] if pattern[i] else s["global_head_dim"]
        add_vector(w, rng, p + "attn_norm.weight", h)
        add_matrix(w, rng, p + "attn_q.weight", h, s["heads"] * hd, qtype)
        add_vector(w, rng, p + "attn_q_norm.weight", hd)
        add_matrix(w, rng, p + "attn_k.weight", h, kv_heads[i] * hd, qtype)
        add_vector(w, rng, p + "attn_k_norm.weight", hd)
        if pattern[i] or not s.get("k_eq_v"):
            # like llama.cpp's Q4_K_M: V projections one step up, in Q6_K
            add_matrix(w, rng, p + "attn_v.weight", h, kv_heads[i] * hd, T.Q6_K if qtype == T.Q4_K else qtype)
        add_matrix(w, rng, p + "attn_output.weight", s["heads"] * hd, h, qtype)
        add_vector(w, rng, p + "post_attention_norm.weight", h)
        add_vector(w, rng, p + "ffn_norm.weight", h)
        add_matrix(w, rng, p + "ffn_gate.weight", h, ffn[i], qtype)
        add_matrix(w, rng, p + "ffn_up.weight", h, ffn[i], qtype)
        add_matrix(w, rng, p + "ffn_down.weight", ffn[i], h, qtype)
        add_vector(w, rng, p + "post_ffw_norm.weight", h)
        if experts:
            eff = s["expert_ffn"]
            add_matrix(w, rng, p + "ffn_gate_inp.weight", h, experts, T.F16)
            add_vector(w, rng, p + "ffn_gate_inp.scale", h)
            add_matrix(w, rng, p + "ffn_gate_up_exps.weight", h, 2 * eff, qtype, n3=experts)
            add_matrix(w, rng, p + "ffn_down_exps.weight", eff, h, qtype, n3=experts)
            add_vector(w, rng, p + "ffn_down_exps.scale", experts)
            for norm in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                add_vector(w, rng, p + norm + ".weight", h)
        if ple:
            add_matrix(w, rng, p + "inp_gate.weight", h, ple, T.F16)
            add_matrix(w, rng, p + "proj.weight", ple, h, T.F16)
            add_vector(w, rng, p + "post_norm.weight", h)
        add_vector(w, rng, p + "layer_output_scale.weight", 1, value=0.5)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="e2b")
    ap.add_argument("--quant", choices=[t.name for t in SCALE_OFFSETS] + ["Q4_1", "Q5_0", "Q5_1"], default="Q4_K")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.time()
    write(args.shape, T[args.quant], args.out, args.seed)
    print(f"wrote {args.out} in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
