"""Golden image features for the Ollama-form fixtures (tests/fixtures/forms/ollama-*.vision.npz).

    python tools/make_vision_golden.py [--out tests/fixtures/forms]

Rebuilds the tiny multimodal checkpoints of tools/make_ollama_fixtures.py (same seed: the same
weights, checked against the committed files), rounds the vision weights as Ollama's converter
stores them (F16 matrices), and runs transformers' Gemma4Model.get_image_features on images of
random pixels of two shapes (a wide one and a tall one, every patch a multiple of the 3 x 3 pool):
the encoder's pooled output and the projected soft tokens, float32.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import make_ollama_fixtures as mof  # noqa: E402
import ollama_convert  # noqa: E402

SHAPES = ((6, 3), (3, 9))           # (patches across, patches down)


def round_vision(model) -> None:
    import torch
    with torch.no_grad():
        for hf_name, p in model.state_dict().items():
            name = ollama_convert.gguf_name(hf_name)
            if name and name.startswith(("v.", "mm.")) and ollama_convert.tensor_type(name, tuple(p.shape), False) == "F16":
                p.copy_(p.half().float())


def image(rng, across: int, down: int, patch: int) -> tuple[np.ndarray, np.ndarray]:
    """(patches [across * down, patch * patch * 3] in [0, 1], their (x, y) positions), row by row. The
    pixels are bytes / 255, as a decoded image's are: the GPU encoder takes RGBA8."""
    pixels = (rng.integers(0, 256, (3, down * patch, across * patch)) / np.float32(255)).astype(np.float32)
    patches = pixels.reshape(3, down, patch, across, patch).transpose(1, 3, 2, 4, 0).reshape(across * down, -1)
    ys, xs = np.meshgrid(np.arange(down), np.arange(across), indexing="ij")
    return patches, np.stack([xs.reshape(-1), ys.reshape(-1)], -1).astype(np.int64)


def main() -> int:
    import torch
    from pyapp.gguf import read_gguf
    from pyapp.reference.quants import load_tensor
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "forms")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    for stem, text, audio in (("dense", mof.DENSE, mof.AUDIO), ("moe", mof.MOE, None)):
        model = mof.multimodal(text, mof.VISION, audio, args.seed)
        if "moe" in stem:     # as 26B-A4B and 31B: an image's soft tokens see each other on sliding layers
            model.config.text_config.use_bidirectional_attention = "vision"
        model.config.boi_token_id, model.config.image_token_id, model.config.eoi_token_id = mof.IMAGE_MARKERS.values()
        round_vision(model)
        mof.round_as_stored(model)       # the text weights too: the logits are the file's
        g = read_gguf(args.out / f"ollama-{stem}.gguf")
        got = load_tensor(g, "v.blk.0.attn_q.weight")
        want = model.model.vision_tower.encoder.layers[0].self_attn.q_proj.linear.weight.detach().numpy()
        if not np.array_equal(got, want):
            raise SystemExit(f"ollama-{stem}.gguf: not this checkpoint (remake both with the same seed)")
        rng = np.random.default_rng(args.seed + 7)
        out = {}
        for i, (across, down) in enumerate(SHAPES):
            patches, positions = image(rng, across, down, mof.VISION.get("patch_size", 16))
            with torch.no_grad():
                res = model.model.get_image_features(torch.from_numpy(patches)[None],
                                                     torch.from_numpy(positions)[None])
            out[f"patches_{i}"] = patches
            out[f"positions_{i}"] = positions
            out[f"encoded_{i}"] = res.last_hidden_state.float().numpy()
            out[f"features_{i}"] = res.pooler_output[0].float().numpy()
        # a prompt with the second image: <|image>, a soft token per pooled square, <image|> amid text; and
        # one with it twice (two images: on the MoE model, whose images attend both ways on its sliding
        # layers, a block must see its own image and not the other)
        begin, soft, end = mof.IMAGE_MARKERS.values()
        n = len(out["features_1"])
        tokens = [2, 300, 301, begin] + [soft] * n + [end, 302, 303, 304]
        twice = [2, 300, begin] + [soft] * n + [end, 301, begin] + [soft] * n + [end, 302, 303]
        pixels = torch.from_numpy(out["patches_1"])[None]
        positions = torch.from_numpy(out["positions_1"])[None]
        for name, ids, count in (("image", tokens, 1), ("two_image", twice, 2)):
            ids_t = torch.tensor([ids])
            with torch.no_grad():
                logits = model(input_ids=ids_t, pixel_values=pixels.repeat(count, 1, 1),
                               image_position_ids=positions.repeat(count, 1, 1),
                               mm_token_type_ids=(ids_t == soft).long()).logits[0]
            out[f"{name}_tokens"] = np.array(ids, np.int32)
            out[f"{name}_logits"] = logits.float().numpy()
        np.savez_compressed(args.out / f"ollama-{stem}.vision.npz", **out)
        print(f"ollama-{stem}.vision.npz: {[out[f'features_{i}'].shape for i in range(len(SHAPES))]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
