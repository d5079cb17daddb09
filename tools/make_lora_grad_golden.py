"""Golden LoRA gradients from torch autograd (tests/fixtures/lora/<model>-<type>.grad.npz).

    python tools/make_lora_grad_golden.py [--out tests/fixtures]

Needs what tools/make_lora_fixture.py needs (torch, transformers, peft) and the committed
fixtures. For each case: the HF fixture model (tools/make_fixtures.py's config and seed)
with the base GGUF's dequantized weights, wrapped with the same PEFT LoRA as
tools/make_lora_fixture.py (rank 4, alpha 8, same seed; checked equal to the committed
adapter GGUF's tensors), one forward on fixed token ids, the loss

    mean over i >= 1 with mask[i] of -log softmax(logits[i - 1])[tokens[i]]   (logits softcapped)

(the mask marks the "assistant" tokens: a prompt, then two answer spans), backward, and
every LoRA A/B gradient saved under its GGUF tensor name (`blk.0.attn_q.weight.lora_a`),
as float32. Autograd runs in float64 (the weights are float32 values, widened exactly;
transformers' Gemma 4 RMSNorm and RoPE tables still compute in float32, which leaves
~1e-6 relative differences); a float32 run's loss and its largest relative gradient
difference are printed for comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import make_fixtures as fx  # noqa: E402  (tools/ is not a package)
import make_lora_fixture as lf  # noqa: E402

CASES = [("gemma4-dense", "f32"), ("gemma4-dense", "q4_k"), ("gemma4-moe", "f32")]
N_TOKENS = 23            # more than the fixtures' sliding window (4): the window matters


def tokens_and_mask(vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = np.array([2] + rng.integers(5, vocab, N_TOKENS - 1).tolist(), np.int32)
    mask = np.zeros(N_TOKENS, bool)
    mask[7:13] = True        # first answer
    mask[16:] = True         # second answer, after a "user" span that does not count
    return tokens, mask


def lora_params(peft_model, gguf_names: dict[str, str]) -> dict[str, object]:
    """GGUF pair name (`<base>.lora_a` / `.lora_b`) -> the PEFT parameter."""
    hf_to_gguf = {h: g for g, h in gguf_names.items()}
    out = {}
    for name, p in peft_model.named_parameters():
        for peft_suffix, suffix in ((".lora_A.default.weight", ".lora_a"), (".lora_B.default.weight", ".lora_b")):
            if name.endswith(peft_suffix):
                hf = name[len("base_model.model."):-len(peft_suffix)] + ".weight"
                out[hf_to_gguf[hf] + suffix] = p
    return out


def loss_and_grads(peft_model, params: dict, tokens: np.ndarray, mask: np.ndarray):
    import torch
    peft_model.zero_grad(set_to_none=True)
    logits = peft_model(torch.tensor(tokens[None].astype(np.int64))).logits[0]
    logp = torch.log_softmax(logits[:-1], dim=-1)
    picked = logp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:].astype(np.int64))]
    m = torch.tensor(mask[1:], dtype=logits.dtype)
    loss = -(picked * m).sum() / m.sum()
    loss.backward()
    return float(loss.detach()), {n: p.grad.detach().double().numpy() for n, p in params.items()}


def make(name: str, qtype: str, out_dir: Path) -> None:
    from pyapp.gguf import read_gguf
    cfg_kw, vocab, seed, targets, _ = lf.ADAPTERS[name]
    model = fx.hf_model(cfg_kw, vocab, seed)
    model.config._experts_implementation = "eager"      # the grouped-mm path takes no float64
    names = fx.name_map(model, out_dir / f"{name}-f32.gguf")   # fails unless this is the committed model
    fx.load_gguf_weights(model, out_dir / f"{name}-{qtype}.gguf", names)
    peft_model = lf.add_lora(model, targets, seed + 5)
    params = lora_params(peft_model, names)
    adapter = read_gguf(out_dir / "lora" / f"{name}.gguf")
    assert set(params) == {n for n in adapter.tensors if n.endswith((".lora_a", ".lora_b"))}
    for n, p in params.items():             # the committed adapter is this LoRA, bit for bit
        want = np.frombuffer(adapter.read_tensor(n), np.float32).reshape(p.shape)
        assert np.array_equal(p.detach().numpy(), want), n

    tokens, mask = tokens_and_mask(vocab, seed + 3)
    loss, grads = loss_and_grads(peft_model.double(), params, tokens, mask)
    loss32, grads32 = loss_and_grads(peft_model.float(), params, tokens, mask)
    worst = max(np.abs(grads32[n] - g).max() / np.abs(g).max() for n, g in grads.items())
    dest = out_dir / "lora" / f"{name}-{qtype}.grad.npz"
    np.savez_compressed(dest, tokens=tokens, mask=mask, loss=np.float64(loss),
                        **{n: g.astype(np.float32) for n, g in grads.items()})
    print(f"{dest.name}: {dest.stat().st_size / 1024:.1f} KiB, {len(grads)} gradients, loss {loss:.9f} "
          f"(float32 torch: {loss32:.9f}, gradients within {worst:.1e} of float64, relative to each "
          "tensor's largest)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures"))
    args = ap.parse_args()
    for name, qtype in CASES:
        make(name, qtype, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
