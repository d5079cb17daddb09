"""llama.cpp's projector files (mmproj) of the Ollama-form fixtures' checkpoints
(tests/fixtures/forms/mmproj-{dense,moe}.gguf), made by llama.cpp's own converter.

    python tools/make_mmproj_fixtures.py [--out tests/fixtures/forms] [--seed 0]

Needs the `tools` extra and `python3 build.py setup` (the vendored converter), like
tools/make_ollama_fixtures.py, whose checkpoints it rebuilds (same seed: the same weights): the
E2B-like dense model (vision and audio encoders) and the 26B-A4B-like MoE (vision only). Each is
converted by `convert_hf_to_gguf.py --mmproj --outtype f16`, the form hf.co's mmproj-*.gguf and Ollama's
projector layers have: `clip.*` keys (projector type gemma4v), F16 matrices, F32 norms, position table
and per-linear clamp scalars.

The converter reads the image processor's mean and std from `processor_config.json` (Google's
checkpoints ship one; save_pretrained of a bare model writes none), so one is written beside the
checkpoint with Gemma4ImageProcessor's defaults: no mean/std normalization (mean 0, std 1), 16-pixel
patches, 3 x 3 pooling, 280 soft tokens, pixels / 255, bicubic.

The vision goldens (tests/fixtures/forms/ollama-*.vision.npz, tools/make_vision_golden.py) come from
the weights rounded as Ollama's converter stores them; every vision tensor of the projector file is
checked here to hold those same values, so the goldens are this file's goldens too.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import make_ollama_fixtures as mof  # noqa: E402

PROCESSOR_CONFIG = {
    "processor_class": "Gemma4Processor",
    "image_seq_length": 280,
    "image_processor": {
        "image_processor_type": "Gemma4ImageProcessor",
        "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
        "do_normalize": False, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_resize": True, "resample": 3, "do_convert_rgb": True,
        "patch_size": 16, "pooling_kernel_size": 3, "max_soft_tokens": 280,
    },
}


def check_vision_values(projector: Path, inline: Path) -> int:
    """Every vision tensor (v.*, mm.input_projection) of the projector equals the Ollama-form file's
    (same name; the patch embedding in either layout; a clamp scalar against v.clamp_data's value or
    the inline scalar); returns how many were compared."""
    from pyapp.gguf import read_gguf
    from pyapp.reference.quants import load_tensor
    p, o = read_gguf(projector), read_gguf(inline)
    n = 0
    for name in p.tensors:
        if not (name.startswith("v.") or name == "mm.input_projection.weight"):
            continue
        got = load_tensor(p, name)
        if name not in o.tensors:
            raise SystemExit(f"{projector.name}: {name} is not in {inline.name}")
        want = load_tensor(o, name)
        if name == "v.patch_embd.weight" and got.shape != want.shape:
            got = got.transpose(0, 2, 3, 1).reshape(want.shape) if got.ndim == 4 else got
            want = want.transpose(0, 2, 3, 1).reshape(got.shape) if want.ndim == 4 else want
        if not np.array_equal(got.reshape(-1), want.reshape(-1)):
            raise SystemExit(f"{projector.name}: {name} differs from {inline.name} "
                             f"(max {np.abs(got.reshape(-1) - want.reshape(-1)).max()})")
        n += 1
    return n


def main() -> int:
    from pyapp.gguf import read_gguf
    args = mof.forms_parser(__doc__).parse_args()
    manifest_path, manifest = mof.read_manifest(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        for stem, text, audio in (("dense", mof.DENSE, mof.AUDIO), ("moe", mof.MOE, None)):
            model = mof.multimodal(text, mof.VISION, audio, args.seed)
            ckpt = Path(tmp) / stem
            mof.write_checkpoint(model, ckpt, "Gemma4ForConditionalGeneration")
            (ckpt / "processor_config.json").write_text(json.dumps(PROCESSOR_CONFIG, indent=1))
            dest = args.out / f"mmproj-{stem}.gguf"
            mof.llama_convert(ckpt, dest, "f16", "--mmproj")
            n = check_vision_values(dest, args.out / f"ollama-{stem}.gguf")
            meta = read_gguf(dest).metadata
            manifest[dest.name] = dest.stat().st_size
            print(f"{dest.name}: {dest.stat().st_size / 2**20:.2f} MiB, {n} vision tensors equal to "
                  f"ollama-{stem}.gguf's; projector {meta.get('clip.vision.projector_type')}, "
                  f"audio {meta.get('clip.has_audio_encoder', False)}")
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
