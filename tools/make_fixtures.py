"""Make the tiny Gemma 4 fixture models and their golden outputs (tests/fixtures/).

    python tools/make_fixtures.py [--out tests/fixtures] [--seed 0]

Needs the `tools` extra (torch, transformers) and `python3 build.py setup` (the
vendored llama.cpp converter, gguf-py and the real Gemma 4 vocabulary).

For each model: random weights in transformers' Gemma 4 classes (scaled so the
logits are well spread and argmax is stable), saved as an HF checkpoint with a
tokenizer cut from the real vocabulary, converted by llama.cpp's
convert_hf_to_gguf.py (F32, F16, Q8_0), and re-quantized by our own quantizer
(Q4_K, Q6_K). Golden logits and greedy generations come from transformers
(float32, eager attention) run on each file's own dequantized weights, so the
only differences a test sees are float rounding and summation order.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
VENDORED = Path(os.environ.get("GEMMA4_VENDORED", ROOT / ".cache" / "llama.cpp"))
VOCAB = VENDORED / "models" / "ggml-vocab-gemma-4.gguf"

S, G = "sliding_attention", "full_attention"

# E2B's structure in miniature: PLE, KV sharing (the shared S and G layers reuse the
# last non-shared layer of their kind), sliding + global layers with different head
# dims, partial rope on global layers, double-wide MLP on shared layers, softcap.
DENSE = dict(hidden_size=256, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, global_head_dim=64, sliding_window=4, layer_types=[S, G, S, G],
             final_logit_softcapping=30.0, hidden_size_per_layer_input=32, num_kv_shared_layers=2,
             use_double_wide_mlp=True)
# 26B-A4B's structure in miniature: a dense MLP plus a routed MoE block, global layers
# with one KV head and K = V (no v_proj), no PLE.
MOE = dict(hidden_size=128, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
           num_key_value_heads=2, head_dim=64, global_head_dim=128, num_global_key_value_heads=1,
           attention_k_eq_v=True, sliding_window=4, layer_types=[S, G, S, G], final_logit_softcapping=30.0,
           hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=4, top_k_experts=2,
           moe_intermediate_size=64)

# The dense structure at Gemma 4's real head widths (E2B / E4B: 256 sliding, 512 global), so the engine's golden
# path runs the kernels only heads that wide take (the wide attention tiles); a 99-token prompt besides.
WIDE = dict(DENSE, num_attention_heads=2, head_dim=256, global_head_dim=512)

# name -> (config, vocabulary size, GGUF types, golden prompt lengths after BOS)
MODELS = {
    "gemma4-dense": (DENSE, 512, ["F32", "F16", "Q8_0", "Q4_K", "Q6_K"], (23, 7, 39)),
    "gemma4-moe": (MOE, 512, ["F32", "Q8_0"], (23, 7, 39)),
    "gemma4-wide": (WIDE, 512, ["Q4_K"], (23, 7, 39, 99)),
}
DEMO = ("demo", DENSE, 4096, "Q8_0", (23, 7, 39))


def hf_model(cfg_kw: dict, vocab: int, seed: int):
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    cfg = Gemma4TextConfig(vocab_size=vocab, vocab_size_per_layer_input=vocab, max_position_embeddings=4096,
                           **cfg_kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(cfg).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:      # fan-in scaled: activations stay O(1) through the layers
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif "q_norm" in name or "k_norm" in name:   # tame q.k (attention scale is 1.0)
                p.copy_(0.35 + 0.05 * torch.randn(p.shape, generator=gen))
            elif "layer_scalar" in name:
                p.copy_(0.8 + 0.1 * torch.rand(p.shape, generator=gen))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
    return model


def write_checkpoint(model, vocab: int, out: Path) -> None:
    from hf_tokenizer import reduce_vocab, write_tokenizer
    from pyapp.gguf import read_gguf
    model.config.architectures = ["Gemma4ForCausalLM"]
    model.save_pretrained(out, safe_serialization=True)
    write_tokenizer(reduce_vocab(read_gguf(VOCAB).metadata, vocab), out)


def convert(ckpt: Path, outtype: str, dest: Path, name: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(VENDORED / "gguf-py"))   # the gguf-py the converter was written for
    subprocess.run([sys.executable, str(VENDORED / "convert_hf_to_gguf.py"), str(ckpt), "--outtype", outtype,
                    "--outfile", str(dest), "--model-name", name], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def requantize(src: Path, qtype: str, dest: Path) -> None:
    """A copy of an F32 GGUF with its matrices in qtype (rows that don't fit the block: Q8_0, else F32)."""
    import gguf
    from pyapp import ggml
    from pyapp.reference.quants import quantize
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dest), arch=reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == "general.file_type":
            value = int(gguf.LlamaFileType[f"MOSTLY_{qtype}_M" if qtype == "Q4_K" else f"MOSTLY_{qtype}"])
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type=sub)
    block = ggml.lookup(qtype).block
    for t in reader.tensors:
        data = np.asarray(t.data, dtype=np.float32)
        row = int(t.shape[0])
        target = qtype if row % block == 0 else "Q8_0" if row % 32 == 0 else "F32"
        if len(t.shape) < 2 or target == "F32":
            writer.add_tensor(t.name, data)
            continue
        raw = np.frombuffer(quantize(data, target), np.uint8)
        shape = tuple(int(d) for d in reversed(t.shape))
        writer.add_tensor(t.name, raw.reshape(*shape[:-1], -1), raw_dtype=gguf.GGMLQuantizationType[target])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def name_map(model, f32_gguf: Path) -> dict[str, str]:
    """GGUF tensor name -> HF parameter name, by exact equality of the F32 values."""
    from pyapp.gguf import read_gguf
    from pyapp.reference.quants import load_tensor
    g = read_gguf(f32_gguf)
    params = {n: p.detach().numpy().reshape(-1) for n, p in model.state_dict().items()}
    by_size: dict[int, list[str]] = {}
    for n, v in params.items():
        by_size.setdefault(v.size, []).append(n)
    out = {}
    for name in g.tensors:
        v = load_tensor(g, name).reshape(-1)
        match = [n for n in by_size.get(v.size, []) if np.array_equal(params[n], v)]
        if match:
            out[name] = match[0]
        elif name != "rope_freqs.weight":
            raise SystemExit(f"{f32_gguf.name}: no HF parameter equals {name}")
    return out


def load_gguf_weights(model, gguf_path: Path, names: dict[str, str]) -> None:
    """Overwrite the HF parameters with a GGUF's dequantized tensors."""
    import torch
    from pyapp.gguf import read_gguf
    from pyapp.reference.quants import load_tensor
    g = read_gguf(gguf_path)
    state = model.state_dict()
    with torch.no_grad():
        for gname, hname in names.items():
            state[hname].copy_(torch.from_numpy(load_tensor(g, gname)).reshape(state[hname].shape))


def golden(model, vocab: int, seed: int, lengths=(23, 7, 39)) -> dict[str, np.ndarray]:
    import torch
    rng = np.random.default_rng(seed)
    seqs = [[2] + rng.integers(5, vocab, n).tolist() for n in lengths]
    out = {}
    with torch.no_grad():
        for i, s in enumerate(seqs):
            logits = model(torch.tensor([s])).logits[0].float().numpy()
            out[f"tokens_{i}"] = np.array(s, np.int32)
            out[f"logits_{i}"] = logits.astype(np.float32)
        ids = list(seqs[0])
        for _ in range(32):      # greedy, full recompute each step: no cache code involved
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        out["generate_0"] = np.array(ids[len(seqs[0]):], np.int32)
    return out


def make(name: str, cfg_kw: dict, vocab: int, types: list[str], lengths, out_dir: Path, seed: int,
         stems=None) -> None:
    model = hf_model(cfg_kw, vocab, seed)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "hf"
        write_checkpoint(model, vocab, ckpt)
        f32 = Path(tmp) / "f32.gguf"
        title = f"{name} (random weights, test model)"
        convert(ckpt, "f32", f32, title)
        names = name_map(model, f32)
        for qtype in types:
            stem = (stems or {}).get(qtype, f"{name}-{qtype.lower()}")
            dest = out_dir / f"{stem}.gguf"
            if qtype == "F32":
                shutil.copy(f32, dest)
            elif qtype in ("F16", "Q8_0"):
                convert(ckpt, qtype.lower(), dest, title)
            else:
                requantize(f32, qtype, dest)
            q = hf_model(cfg_kw, vocab, seed)
            load_gguf_weights(q, dest, names)
            np.savez_compressed(out_dir / f"{stem}.golden.npz", **golden(q, vocab, seed + 1, lengths))
            print(f"{dest.name}: {dest.stat().st_size / 2**20:.2f} MiB", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", help="model names to make (default: all, and the demo)")
    args = ap.parse_args()
    if not VOCAB.exists():
        raise SystemExit(f"{VOCAB} missing: run `python3 build.py setup` first")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for i, (name, (cfg, vocab, types, lengths)) in enumerate(MODELS.items()):
        if not args.only or name in args.only:
            make(name, cfg, vocab, types, lengths, out, args.seed + 10 * i)
    if not args.only or "demo" in args.only:
        stem, cfg, vocab, qtype, lengths = DEMO
        make(stem, cfg, vocab, [qtype], lengths, out, args.seed + 100, stems={qtype: stem})
    manifest = {p.name: p.stat().st_size for p in sorted(out.glob("*.gguf"))}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
