#!/usr/bin/env python3
"""Golden DiffusionGemma generations of the tiny fixture, from transformers' `generate`, every random draw recorded.

    /tmp/tfenv/bin/python tools/make_diffusion_generate_golden.py [HF_DIR] [OUT.npz]

Runs `DiffusionGemmaForBlockDiffusion.generate` (transformers 5.23, float32, eager attention) on
tests/fixtures/diffusion-tiny-hf with torch's CPU generator seeded, and records what torch drew and what the
sampler decided, so that another implementation fed the same draws must make every decision the same way
(shared/notes/diffusion_gemma.md (d), (e)). For case i (S = all denoising steps of all blocks, in order):

  prompt_i     int32 [n]        the prompt
  settings_i   str (json)       the generation settings that differ from the checkpoint's generation_config
  init_i       int32 [B, C]     each block's initial canvas (torch.randint: the sampler's initialize_canvas)
  steps_i      int32 [B]        denoising steps each block took (the stop step)
  sample_i     int32 [S, C]     torch.multinomial's draw at each step
  renoise_i    int32 [S, C]     the uniform ids renoise_canvas drew at each step
  accepted_i   bool [S, C]      the entropy-bound sampler's acceptance mask at each step
  argmax_i     int32 [S, C]     the argmax of each step's processed logits (the streamer's draft)
  sequences_i  int32 [n + B*C]  generate's output, prompt included (pad after an eos)
  tpf_i        float32 []       generate's tokens_per_forward

Cases: 0 the checkpoint's settings (two blocks, every step of each: one acceptance a step on this random
model); 1 low temperatures, a wide entropy bound, stability 1 and a loose confidence threshold (many
acceptances a step, early stops); 2 case 1's draws with an eos id that case 1 commits in its first block
(truncated to pad after it, then stop); 3 a prompt longer than the sliding window, 40 new tokens (three
blocks: the output grows by whole canvases), stability 0 (confident stops); 4 case 3's settings, 32 tokens
and stability 1 (a stop also waits for the argmax to repeat). Output: tests/fixtures/diffusion-tiny.generate.npz.
Needs torch and transformers (see tools/make_diffusion_fixture.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_HF = ROOT / "tests" / "fixtures" / "diffusion-tiny-hf"
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "diffusion-tiny.generate.npz"


class Recorder:
    """Hooks on the sampler and torch.multinomial, and a draft streamer, recording one generate call."""

    def __init__(self):
        self.init, self.sample, self.renoise, self.accepted, self.argmax, self.blocks = [], [], [], [], [], []
        self.steps = []
        self._in_renoise = False
        self._prompt_seen = False

    # streamer
    def put(self, value):
        if not self._prompt_seen:           # generate puts the prompt first
            self._prompt_seen = True
            return
        self.blocks.append(value[0].numpy().copy())

    def put_draft(self, value):
        self.argmax.append(value[0].numpy().copy())

    def end(self):
        pass

    def run(self, model, prompt, seed, **settings):
        import torch
        from transformers.models.diffusion_gemma import generation_diffusion_gemma as gen
        sampler_cls = gen.EntropyBoundSampler
        orig_init, orig_renoise, orig_multinomial = (sampler_cls.initialize_canvas, sampler_cls.renoise_canvas,
                                                     torch.multinomial)
        rec = self

        def initialize_canvas(sampler, batch_size, device):
            out = orig_init(sampler, batch_size, device)
            (rec.renoise if rec._in_renoise else rec.init).append(out[0].numpy().copy())
            return out

        def renoise_canvas(sampler, accepted_canvas, cur_step):
            rec.accepted.append(sampler.accepted_token_mask[0].numpy().copy())
            rec._in_renoise = True
            try:
                return orig_renoise(sampler, accepted_canvas, cur_step)
            finally:
                rec._in_renoise = False

        def multinomial(probs, num_samples, *a, **k):
            out = orig_multinomial(probs, num_samples, *a, **k)
            rec.sample.append(out[:, 0].numpy().copy())
            return out

        sampler_cls.initialize_canvas, sampler_cls.renoise_canvas, gen.torch.multinomial = (
            initialize_canvas, renoise_canvas, multinomial)
        try:
            torch.manual_seed(seed)
            with torch.no_grad():
                out = model.generate(input_ids=torch.tensor([list(prompt)], dtype=torch.long), streamer=self,
                                     **settings)
        finally:
            sampler_cls.initialize_canvas, sampler_cls.renoise_canvas = orig_init, orig_renoise
            gen.torch.multinomial = orig_multinomial
        assert len(self.sample) == len(self.renoise) == len(self.accepted) == len(self.argmax)
        return out


def generate_case(model, prompt, seed, settings):
    """Run generate under a Recorder; the steps per block come from counting drafts around each init."""
    rec = Recorder()
    counts = []
    orig_put = rec.put

    def put(value):                          # a block is committed: the drafts since the last one are its steps
        before = sum(counts)
        if rec._prompt_seen:
            counts.append(len(rec.argmax) - before)
        orig_put(value)

    rec.put = put
    kwargs = dict(settings)
    if "entropy_bound" in kwargs:            # generate takes it inside its sampler's config
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig
        kwargs["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=float(kwargs.pop("entropy_bound")))
    out = rec.run(model, prompt, seed, **kwargs)
    seq = out.sequences[0].numpy().astype(np.int32)
    n_blocks = len(rec.init)
    assert len(counts) == n_blocks == len(rec.blocks)
    return {
        "prompt": np.asarray(prompt, np.int32), "settings": json.dumps(settings, sort_keys=True),
        "init": np.stack(rec.init).astype(np.int32), "steps": np.asarray(counts, np.int32),
        "sample": np.stack(rec.sample).astype(np.int32), "renoise": np.stack(rec.renoise).astype(np.int32),
        "accepted": np.stack(rec.accepted).astype(bool), "argmax": np.stack(rec.argmax).astype(np.int32),
        "sequences": seq, "tpf": np.float32(out.tokens_per_forward[0].item()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir", nargs="?", default=str(DEFAULT_HF))
    ap.add_argument("out", nargs="?", default=str(DEFAULT_OUT))
    args = ap.parse_args()
    import torch
    from transformers.models.diffusion_gemma import DiffusionGemmaForBlockDiffusion
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.hf_dir, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    tc = model.config.text_config
    V, C, W = tc.vocab_size, model.config.canvas_length, tc.sliding_window
    rng = np.random.default_rng(1)
    short = [2] + rng.integers(3, V, 5).tolist()
    long = [2] + rng.integers(3, V, 2 * W + 1).tolist()
    cases = [generate_case(model, short, 0, {})]
    sharp = {"t_min": 0.05, "t_max": 0.25, "entropy_bound": 2.0, "stability_threshold": 1,
             "confidence_threshold": 1.0}
    cases.append(generate_case(model, short, 1, sharp))
    # an eos that case 1 commits inside its first block, not at its start: same seed, same draws until then
    first = cases[1]["sequences"][len(short):len(short) + C].tolist()
    eos = next(t for t in first[3:] if t not in first[:3])
    cases.append(generate_case(model, short, 1, {**sharp, "eos_token_id": [eos]}))
    cases.append(generate_case(model, long, 3, {"max_new_tokens": 40, "stability_threshold": 0, "t_min": 0.1,
                                                "t_max": 0.5, "entropy_bound": 1.0, "confidence_threshold": 3.0}))
    cases.append(generate_case(model, long, 3, {"stability_threshold": 1, "t_min": 0.1, "t_max": 0.5,
                                                "entropy_bound": 1.0, "confidence_threshold": 3.0}))

    arrays = {f"{k}_{i}": v for i, c in enumerate(cases) for k, v in c.items()}
    np.savez_compressed(args.out, **arrays)
    for i, c in enumerate(cases):
        print(f"case {i}: {c['settings']}: steps {c['steps'].tolist()}, {len(c['sequences'])} tokens, "
              f"accepted per step {c['accepted'].sum(-1).tolist()}", file=sys.stderr)
    print(f"wrote {args.out}: {len(cases)} cases, {Path(args.out).stat().st_size / 1024:.0f} KiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
