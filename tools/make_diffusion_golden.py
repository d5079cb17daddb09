#!/usr/bin/env python3
"""Golden decoder-step logits of the tiny DiffusionGemma fixture, from transformers.

    /tmp/tfenv/bin/python tools/make_diffusion_golden.py [HF_DIR] [OUT.npz]
    /tmp/tfenv/bin/python tools/make_diffusion_golden.py --undamped      # the undamped fixture's

Loads tests/fixtures/diffusion-tiny-hf (made by tools/make_diffusion_fixture.py) in float32 (its bf16
weights widen exactly, as tools/convert_diffusion_gemma.py --outtype f32 writes them) with eager
attention, and saves, for each case i, what one `DiffusionGemmaForBlockDiffusion` call returns: the
causal encoder pass over the prompt (and, in case 3, a committed block encoded after it into the same
DynamicCache), then one decoder step over the canvas:

  prompt_i  int32 [n]           the prompt, BOS first
  block_i   int32 [0 or C]      a committed block, encoded after the prompt (empty: none)
  canvas_i  int32 [C]           the canvas ids (uniform random over the vocabulary, as generate draws them)
  prev_i    float32 [C, V]      self-conditioning logits (the previous step's processed logits), or [0, V]
  logits_i  float32 [C, V]      the decoder step's logits, softcap applied

Cases: 0 step 0 (no self-conditioning), prompt shorter than the window; 1 the same prompt and another
canvas, self-conditioned on case 0's logits / t_max (as generate's second step is); 2 a prompt longer
than the sliding window, step 0; 3 a prompt longer than the window and a committed block, self-
conditioned. Output: tests/fixtures/diffusion-tiny.golden.npz. With --undamped, the same cases of
tests/fixtures/diffusion-undamped-hf (tools/make_diffusion_fixture.py --undamped: nothing damped, so
the self-conditioning signal is as large as the embedding and cases 1 and 3 check it) into
tests/fixtures/diffusion-undamped.golden.npz. Needs torch and transformers (see
tools/make_diffusion_fixture.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_HF = ROOT / "tests" / "fixtures" / "diffusion-tiny-hf"
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "diffusion-tiny.golden.npz"
UNDAMPED_HF = ROOT / "tests" / "fixtures" / "diffusion-undamped-hf"
UNDAMPED_OUT = ROOT / "tests" / "fixtures" / "diffusion-undamped.golden.npz"


def step(model, prompt, canvas, prev=None, block=()):
    """One model call as generate makes it: encode (prompt, then the block), decode the canvas."""
    import torch
    ids = lambda a: torch.tensor([list(a)], dtype=torch.long)        # noqa: E731
    pos = lambda a, b: torch.arange(a, b, dtype=torch.long)[None]     # noqa: E731
    C, P = len(canvas), len(prompt)
    with torch.no_grad():
        out = model(input_ids=ids(prompt), position_ids=pos(0, P), decoder_input_ids=ids(canvas),
                    decoder_position_ids=pos(P, P + C),
                    self_conditioning_logits=None if len(block) else prev)
        if len(block):
            n = len(block)
            out = model(input_ids=ids(block), position_ids=pos(P, P + n), past_key_values=out.past_key_values,
                        decoder_input_ids=ids(canvas), decoder_position_ids=pos(P + n, P + n + C),
                        self_conditioning_logits=prev)
    return out.logits[0].float().numpy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir", nargs="?", default=None)
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--undamped", action="store_true",
                    help=f"defaults {UNDAMPED_HF.relative_to(ROOT)} and {UNDAMPED_OUT.relative_to(ROOT)}")
    args = ap.parse_args()
    args.hf_dir = args.hf_dir or str(UNDAMPED_HF if args.undamped else DEFAULT_HF)
    args.out = args.out or str(UNDAMPED_OUT if args.undamped else DEFAULT_OUT)
    import torch
    from transformers.models.diffusion_gemma import DiffusionGemmaForBlockDiffusion
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.hf_dir, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    tc = model.config.text_config
    V, C, W = tc.vocab_size, model.config.canvas_length, tc.sliding_window
    t_max = float(model.generation_config.t_max)
    rng = np.random.default_rng(args.seed)
    draw = lambda n, lo=3: rng.integers(lo, V, n).astype(np.int32)    # noqa: E731  (no BOS/EOS/pad inside)
    short = np.concatenate([[2], draw(4)]).astype(np.int32)
    long = np.concatenate([[2], draw(2 * W + 3)]).astype(np.int32)
    assert len(short) < W < len(long)
    cases = []
    c0 = rng.integers(0, V, C).astype(np.int32)
    l0 = step(model, short, c0)
    cases.append((short, (), c0, None, l0))
    c1 = rng.integers(0, V, C).astype(np.int32)
    prev1 = (torch.from_numpy(l0) / t_max).numpy()       # f32 tensor arithmetic, as generate does
    cases.append((short, (), c1, prev1, step(model, short, c1, torch.from_numpy(prev1)[None])))
    c2 = rng.integers(0, V, C).astype(np.int32)
    cases.append((long, (), c2, None, step(model, long, c2)))
    block = draw(C)
    c3 = rng.integers(0, V, C).astype(np.int32)
    l3a = step(model, long, c3, block=block)
    prev3 = (torch.from_numpy(l3a) / t_max).numpy()
    cases.append((long, block, c3, prev3, step(model, long, c3, torch.from_numpy(prev3)[None], block=block)))

    arrays = {}
    for i, (prompt, blk, canvas, prev, logits) in enumerate(cases):
        arrays[f"prompt_{i}"] = np.asarray(prompt, np.int32)
        arrays[f"block_{i}"] = np.asarray(blk, np.int32)
        arrays[f"canvas_{i}"] = canvas
        arrays[f"prev_{i}"] = (np.zeros((0, V), np.float32) if prev is None else prev.astype(np.float32))
        arrays[f"logits_{i}"] = logits.astype(np.float32)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out}: {len(cases)} cases, {Path(args.out).stat().st_size / 1024:.0f} KiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
