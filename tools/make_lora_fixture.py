"""Make the tiny LoRA adapter fixtures and their golden outputs (tests/fixtures/lora/).

    python tools/make_lora_fixture.py [--out tests/fixtures]

Needs the `tools` extra (torch, transformers), `pip install peft` and `python3 build.py
setup` (the vendored llama.cpp converters and gguf-py).

For each fixture model of tools/make_fixtures.py (same config and seed, so the same
random weights; checked against the committed F32 GGUF): a PEFT LoRA (rank 4, alpha 8)
with random non-zero A and B on the projections llama.cpp adapts for Gemma 4, saved by
PEFT and converted by llama.cpp's convert_lora_to_gguf.py (F32) into `lora/<model>.gguf`.
Golden logits and a greedy generation come from transformers + PEFT (float32, eager),
on each listed base file's own dequantized weights, as the fixtures' goldens do:
`lora/<model>-<type>.golden.npz`, same keys and sequences as `<model>-<type>.golden.npz`.

The expert tensors are 3-D parameters in transformers (no nn.Linear for PEFT's LoRA),
so the MoE adapter adapts the router and the shared MLP, not the experts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import make_fixtures as fx  # noqa: E402  (tools/ is not a package)

RANK, ALPHA = 4, 8
ATTN_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# model -> (config, vocabulary, seed of make_fixtures, PEFT target modules, base types with a golden)
ADAPTERS = {
    "gemma4-dense": (fx.DENSE, 512, 0, ATTN_MLP + ["per_layer_input_gate", "per_layer_projection"],
                     ["F32", "Q4_K"]),
    "gemma4-moe": (fx.MOE, 512, 10, ATTN_MLP + ["router.proj"], ["F32"]),
}


def add_lora(model, targets: list[str], seed: int):
    """The model wrapped by PEFT with random, non-zero A and B (PEFT starts B at zero)."""
    import torch
    from peft import LoraConfig, get_peft_model
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets,
                                                  lora_dropout=0.0, bias="none"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name:          # [r, in]: A x is O(1) per rank
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            elif "lora_B" in name:        # [out, r]: the delta is a fraction of the base output
                p.copy_(0.1 * torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
    return peft_model.eval()


def convert_lora(base_ckpt: Path, lora_dir: Path, dest: Path) -> None:
    """llama.cpp's convert_lora_to_gguf.py, F32, with the gguf-py it was written for."""
    env = dict(os.environ, PYTHONPATH=f"{fx.VENDORED / 'gguf-py'}{os.pathsep}{fx.VENDORED}")
    subprocess.run([sys.executable, str(fx.VENDORED / "convert_lora_to_gguf.py"), "--base", str(base_ckpt),
                    "--outtype", "f32", "--outfile", str(dest), str(lora_dir)], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make(name: str, out_dir: Path) -> None:
    from peft import PeftModel
    cfg_kw, vocab, seed, targets, types = ADAPTERS[name]
    f32_gguf = out_dir / f"{name}-f32.gguf"
    model = fx.hf_model(cfg_kw, vocab, seed)
    names = fx.name_map(model, f32_gguf)        # fails unless this is the committed fixture's model
    lora = add_lora(model, targets, seed + 5)
    lora_out = out_dir / "lora"          # apart from the models: tests glob the fixtures' *.gguf as models
    lora_out.mkdir(exist_ok=True)
    dest = lora_out / f"{name}.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, lora_dir = Path(tmp) / "hf", Path(tmp) / "lora"
        fx.write_checkpoint(fx.hf_model(cfg_kw, vocab, seed), vocab, ckpt)
        lora.save_pretrained(lora_dir)
        convert_lora(ckpt, lora_dir, dest)
        for qtype in types:
            stem = f"{name}-{qtype.lower()}"
            base = fx.hf_model(cfg_kw, vocab, seed)
            fx.load_gguf_weights(base, out_dir / f"{stem}.gguf", names)
            tuned = PeftModel.from_pretrained(base, lora_dir).eval()
            np.savez_compressed(lora_out / f"{stem}.golden.npz", **fx.golden(tuned, vocab, seed + 1))
    print(f"{dest.name}: {dest.stat().st_size / 1024:.1f} KiB", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures"))
    ap.add_argument("--only", nargs="*", help="model names (default: all)")
    args = ap.parse_args()
    if not (fx.VENDORED / "convert_lora_to_gguf.py").exists():
        raise SystemExit(f"{fx.VENDORED / 'convert_lora_to_gguf.py'} missing: run `python3 build.py setup` first")
    for name in ADAPTERS:
        if not args.only or name in args.only:
            make(name, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
