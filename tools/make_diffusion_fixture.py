#!/usr/bin/env python3
"""Make the tiny random DiffusionGemma checkpoints committed under tests/fixtures/.

    /tmp/tfenv/bin/python tools/make_diffusion_fixture.py [OUT_DIR]              # diffusion-tiny-hf/
    /tmp/tfenv/bin/python tools/make_diffusion_fixture.py --undamped [OUT_DIR]  # diffusion-undamped-hf/

Builds `DiffusionGemmaForBlockDiffusion` (transformers >= 5.23, models/diffusion_gemma) at toy size,
with the real model's structure: sliding and full layers (S,F,S,F; the last is full), K=V on full
layers, a different global head dim and KV head count, MoE beside the dense MLP in every layer, the
self-conditioning MLP, distinct encoder and decoder layer scalars, and a (tiny) vision tower whose
tensors the converter must skip. It saves the checkpoint as transformers does (bf16 safetensors,
config.json, generation_config.json), so the tests and tools/convert_diffusion_gemma.py need no
torch and no transformers.

The weights are conditioned as shared/notes/diffusion_gemma.md (e) recommends for a test model: final
norm gains x4 and the self-conditioning down projection x0.1, so that the self-conditioning loop is
contractive and a float32 forward can follow transformers' argmax and acceptance decisions. Norm
gains, router scales and layer scalars get random values (not their init's ones), so a converter
that mixes them up fails the tests. (The MoE branch's own norms, pre_feedforward_layernorm_2 and
post_feedforward_layernorm_1/_2, keep their init's ones in this fixture: its name rule predates them.
The undamped fixture randomizes them.)

--undamped (issue 25, "fixtures must not hide bugs") makes the same structure with nothing damped and
nothing left at its initial value: every weight matrix of the text stack (embedding, attention, MLPs,
router, experts, the self-conditioning MLP) drawn N(0, 1 / fan_in), so that each projection keeps its
input's size instead of shrinking it 50x as the 0.02 init does; every 1-D gain (all norms, the MoE
branch's included, router scales) 1 + 0.2 N(0, 1); layer scalars uniform [0.5, 1.5); no final-norm or
down-projection scaling. Its self-conditioning signal is as large as the token embedding it is added to
(it moves almost every argmax of a step), where the conditioned fixture's moves the logits by < 1.2.
Only single decoder steps are checked on it (tools/make_diffusion_golden.py --undamped): its
self-conditioning loop is not contractive, so generation traces stay on the conditioned fixture.

Needs torch and transformers, which the project's .venv does not have: install them into a throwaway
venv (python3 -m venv /tmp/tfenv; /tmp/tfenv/bin/pip install torch==2.13.0 'transformers>=5.23').
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "diffusion-tiny-hf"
UNDAMPED_OUT = ROOT / "tests" / "fixtures" / "diffusion-undamped-hf"

# A vocabulary past Gemma 4's byte tokens (ids 238..493), so a reduced real tokenizer fits it
# (tools/hf_tokenizer.reduce_vocab), and past the eos ids 1, 106, 50.
TEXT = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    global_head_dim=64, num_global_key_value_heads=1,
    num_experts=4, top_k_experts=2, moe_intermediate_size=32,
    sliding_window=8, max_position_embeddings=4096, rms_norm_eps=1e-6,
    final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
    use_bidirectional_attention="vision",
    pad_token_id=0, eos_token_id=1, bos_token_id=2,
)
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=2, head_dim=8, patch_size=4, position_embedding_size=64,
              pooling_kernel_size=2)
CANVAS = 16
# The real checkpoint's generation_config.json (shared/notes/diffusion_gemma.md (a)), max_new_tokens cut
# to two canvases; differing from HF's built-in defaults where a test can tell a default from a value
GENERATION = dict(max_new_tokens=32, max_denoising_steps=12, entropy_bound=0.25, t_min=0.3, t_max=0.9,
                  stability_threshold=2, confidence_threshold=0.01, eos_token_id=[1, 106, 50], pad_token_id=0,
                  bos_token_id=2)


def build(seed: int = 0, undamped: bool = False):
    """The model in float32; undamped: the --undamped fixture (module docstring)."""
    import math

    import torch
    from transformers.models.diffusion_gemma import (DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion,
                                                     DiffusionGemmaTextConfig)
    from transformers.models.gemma4 import Gemma4VisionConfig

    torch.manual_seed(seed)
    cfg = DiffusionGemmaConfig(text_config=DiffusionGemmaTextConfig(**TEXT),
                               vision_config=Gemma4VisionConfig(**VISION), canvas_length=CANVAS)
    model = DiffusionGemmaForBlockDiffusion(cfg).eval()
    g = torch.Generator().manual_seed(seed + 1)
    if undamped:
        with torch.no_grad():
            for name, p in model.named_parameters(remove_duplicate=True):
                if "vision" in name:
                    continue                        # the vision tower: skipped by the converter
                if p.ndim == 1:
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
                else:                               # [out, in] linears, [E, out, in] experts, [V, D] embedding
                    p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            for name, b in model.named_buffers():
                if name.endswith("layer_scalar"):
                    b.copy_(0.5 + torch.rand(b.shape, generator=g))
        return model
    with torch.no_grad():
        for name, p in model.named_parameters(remove_duplicate=True):
            if name.endswith("norm.weight") or name.endswith("router.scale") or name.endswith("per_expert_scale"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):       # encoder and decoder scalars differ (the only untied weights)
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
        dec = model.model.decoder
        dec.norm.weight.mul_(4.0)
        dec.self_conditioning.down_proj.weight.mul_(0.1)
    return model


def generation_config():
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (DiffusionGemmaGenerationConfig,
                                                                                EntropyBoundSamplerConfig)
    g = dict(GENERATION)
    return DiffusionGemmaGenerationConfig(sampler_config=EntropyBoundSamplerConfig(entropy_bound=g.pop("entropy_bound")),
                                          **g)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=None, help=f"default: {DEFAULT_OUT.relative_to(ROOT)} "
                    f"({UNDAMPED_OUT.relative_to(ROOT)} with --undamped)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--undamped", action="store_true", help="nothing damped or left at its init (docstring)")
    args = ap.parse_args()
    import torch
    model = build(args.seed, args.undamped).to(torch.bfloat16)
    model.generation_config = generation_config()
    out = Path(args.out or (UNDAMPED_OUT if args.undamped else DEFAULT_OUT))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    # check: the saved directory loads back into the same weights
    from transformers.models.diffusion_gemma import DiffusionGemmaForBlockDiffusion
    back = DiffusionGemmaForBlockDiffusion.from_pretrained(out, dtype=torch.bfloat16)
    sd, sd2 = model.state_dict(), back.state_dict()
    assert all(torch.equal(sd[k], sd2[k]) for k in sd), "reloaded weights differ"
    cfg = json.loads((out / "config.json").read_text())
    n = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out}: {n / 1024:.0f} KiB, architectures {cfg.get('architectures')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
