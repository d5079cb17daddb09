"""The comparison for bench/train_bench.py: the same LoRA training with PyTorch + PEFT on the same GPU.

    python bench/train_torch.py --shape e2b [--seq-len 256 --batch 4 --rank 8 --steps 6 --dtype bfloat16]

transformers' Gemma4ForCausalLM built from the shape's hyperparameters (tools/make_bench_model.py's
SHAPES, the same numbers our GGUF bench files have) with random weights, PEFT LoRA on the same
targets (q,k,v,o,gate,up,down; alpha = 2 rank), AdamW on the adapter, random-token sequences whose
every token is a target. Base weights in --dtype (bfloat16: what PyTorch users run; our engine keeps
the file's Q4_K and computes in f32). tok_s is the median over the updates after the first; memory
is torch.cuda.max_memory_allocated. Needs torch, transformers (with gemma4) and peft. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# bench/profile.py would shadow the standard library's profile module, which torch imports
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT / "tools"))

S, G = "sliding_attention", "full_attention"


def hf_config(shape: dict):
    from transformers import Gemma4TextConfig
    n, p = shape["layers"], shape["pattern"]
    kw = dict(vocab_size=shape["vocab"], vocab_size_per_layer_input=shape["vocab"], hidden_size=shape["hidden"],
              intermediate_size=shape["ffn"], num_hidden_layers=n, num_attention_heads=shape["heads"],
              num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"],
              global_head_dim=shape["global_head_dim"], sliding_window=shape["window"],
              layer_types=[G if (i + 1) % p == 0 else S for i in range(n)],
              final_logit_softcapping=shape["softcap"], hidden_size_per_layer_input=shape["ple"],
              num_kv_shared_layers=shape["shared"], use_double_wide_mlp=shape["double_wide"],
              max_position_embeddings=4096)
    if shape.get("experts"):
        raise SystemExit("train_torch: dense shapes only (our trainer does not train MoE models yet)")
    return Gemma4TextConfig(**kw)


def main() -> int:
    import torch
    from make_bench_model import SHAPES
    from peft import LoraConfig, get_peft_model
    from transformers import Gemma4ForCausalLM

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="e2b", choices=sorted(SHAPES))
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--attn", default="sdpa", help="transformers attention implementation")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    cfg = hf_config(SHAPES[args.shape])
    cfg._attn_implementation = args.attn
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):
        model = Gemma4ForCausalLM(cfg).to(dtype)
    model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                             "gate_proj", "up_proj", "down_proj"]))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    setup_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    times, losses = [], []
    for _ in range(args.steps):
        ids = torch.randint(4, cfg.vocab_size, (args.batch, args.seq_len), generator=gen).to(device)
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))   # synchronizes
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    tokens = args.batch * args.seq_len
    rest = times[1:] or times
    print(json.dumps({
        "kind": "train", "runtime": f"pytorch {torch.__version__} + peft, {args.dtype}, attn {args.attn}",
        "adapter": torch.cuda.get_device_name() if device == "cuda" else "cpu", "shape": args.shape,
        "seq_len": args.seq_len, "batch": args.batch, "rank": args.rank, "trainable": trainable,
        "updates": args.steps, "tok_s": round(tokens / statistics.median(rest), 1),
        "runs_tok_s": [round(tokens / s, 1) for s in times], "update_s": round(statistics.median(rest), 3),
        "first_update_s": round(times[0], 2), "setup_s": round(setup_s, 2), "losses": [round(x, 4) for x in losses],
        "gpu_mib_peak": round(torch.cuda.max_memory_allocated() / 2**20) if device == "cuda" else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
