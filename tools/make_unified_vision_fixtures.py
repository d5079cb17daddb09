"""The 12B's image input fixtures: llama.cpp's projector files of the tiny Gemma4Unified checkpoint and
transformers' goldens for each (tests/fixtures/forms/mmproj-12b*.gguf, mmproj-12b*.vision.npz).

    python tools/make_unified_vision_fixtures.py [--out tests/fixtures/forms] [--seed 0]

Needs the `tools` extra and `python3 build.py setup` (the vendored converter), like
tools/make_ollama_fixtures.py, whose `unified()` checkpoint it rebuilds (same seed: the text model of
gemma4-12b.gguf, checked tensor for tensor, with its image embedder: 48 x 48 patches, LayerNorm, Dense,
LayerNorm, + the 2-D position table, LayerNorm, then the projector's RMSNorm and linear). Its tensors
are written under the names of Google's checkpoints (`model.vision_embedder.*`), which llama.cpp's
converter maps, with a processor_config.json of Gemma4UnifiedImageProcessor's defaults.

The storage forms people have (the 12B's Ollama tags ship this same file as their projector layer):

- `mmproj-12b.gguf`: `convert_hf_to_gguf.py --mmproj --outtype f16`: projector type gemma4uv (its audio
  gemma4ua beside it), F16 patch embedding and projection, F32 norms and position table;
- `mmproj-12b-bf16.gguf`: `--outtype bf16`: the patch embedding F32, the projection BF16.

The checkpoint's audio config (`audio_embed_dim=32`) makes the converter write the 12B's audio frames
projection into the same files (gemma4ua: `mm.a.input_projection.weight`); its goldens
(`mmproj-12b*.audio.npz`) are tools/make_unified_audio_golden.py's, from these files.

Each file's golden comes from transformers (float32) with the image embedder set to that file's values
(llama.cpp's column order of the patch values, CHW for its im2col, and its [2, positions, width] position
table turned back), so the goldens test the forward, not the rounding:

- per case i (two images, a wide and a tall one, each at budgets 70 and 140): `case_i` = (width, height,
  budget, soft tokens), the pixels `random.Random(100 + i).randbytes(width * height * 3)` at a size
  the processor keeps (so it does not resample: its torchvision resize is not reproduced here),
  `pixels_sha_i` the sha256 of the processor's pixel_values x 255 as uint8 (unpadded: [n, 48 * 48 * 3],
  pixel (y, x) then channel), `positions_i` its image_position_ids (unpadded), `encoded_i` the embedder's
  output before the projector ([n, 16]) and `features_i` the soft tokens ([n, text hidden]), from
  get_image_features on the processor's padded batch (positions -1 past the image);
- `image_tokens` / `image_logits`: a prompt with case 0's image; `two_image_tokens` / `two_image_logits`:
  two small images (`small_j`: across, down; pixels `random.Random(200 + j)`), each image's soft tokens
  seeing each other both ways on the sliding layers. The masks are those generate() uses
  (Gemma4UnifiedForConditionalGeneration.create_masks_for_generate: both ways on sliding layers only,
  as llama.cpp does); a plain forward of transformers 5.24 opens the full-attention layers too.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import random
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import make_ollama_fixtures as mof  # noqa: E402
from make_mmproj_fixtures import PROCESSOR_CONFIG  # noqa: E402

FORMS = {"mmproj-12b": "f16", "mmproj-12b-bf16": "bf16"}
SOURCES = ((800, 400), (300, 900))          # (width, height): a wide image and a tall one
BUDGETS = (70, 140)
SMALL = ((3, 2), (2, 4))                    # the two-image prompt's images, in 48-px patches
UNIFIED_PROCESSOR = {**PROCESSOR_CONFIG, "processor_class": "Gemma4UnifiedProcessor",
                     "image_processor": {**PROCESSOR_CONFIG["image_processor"],
                                         "image_processor_type": "Gemma4UnifiedImageProcessor"}}


@contextlib.contextmanager
def without_torchvision():
    """Import the 12B's image processor module where torchvision is not installed: its patchify and merge
    functions are plain torch; only its resize (never called here: the images are at their size) is
    torchvision's."""
    import transformers.image_processing_backends  # noqa: F401  (asks whether torchvision is there: before the stubs)
    names = ("torchvision", "torchvision.transforms", "torchvision.transforms.v2")
    stubs = {name: types.ModuleType(name) for name in names}
    functional = stubs["torchvision.transforms.v2"].functional = types.ModuleType("functional")
    functional.InterpolationMode = object           # named in an annotation
    added = [n for n in names if n not in sys.modules]
    sys.modules.update({n: stubs[n] for n in added})
    try:
        yield importlib.import_module("transformers.models.gemma4_unified.image_processing_gemma4_unified")
    finally:
        for n in added:
            sys.modules.pop(n, None)


def processor_pixels(ip, rgb: bytes, width: int, height: int, budget: int):
    """What Gemma4UnifiedImageProcessor makes of an image already at its size: (pixel_values padded to the
    budget [budget, 6912], image_position_ids [budget, 2], soft tokens), as its _preprocess does."""
    import torch
    image = torch.frombuffer(bytearray(rgb), dtype=torch.uint8).reshape(height, width, 3).permute(2, 0, 1)
    image = image * (1 / 255)                                   # rescale: uint8 * float -> float32
    patch, k = 16, 3
    across, down = width // patch, height // patch
    patches = ip.convert_image_to_patches(image, patch)
    grid = torch.meshgrid(torch.arange(across), torch.arange(down), indexing="xy")
    positions = torch.stack(grid, dim=-1).reshape(patches.shape[0], 2)
    n = patches.shape[0] // (k * k)
    merged, merged_positions = ip.patches_merge(patches[None], positions[None], n)
    padded, padded_positions = ip.pad_along_first_dim(merged[0], merged_positions[0], budget)
    return padded, padded_positions, n


def sized(width: int, height: int, budget: int) -> tuple[int, int]:
    """A size near width x height that the processor keeps (its get_aspect_ratio_preserving_size gives it
    back: resized again until it does, so that it is not resampled)."""
    from transformers.models.gemma4_unified.processing_gemma4_unified import get_aspect_ratio_preserving_size
    while True:
        h, w = get_aspect_ratio_preserving_size(height=height, width=width, patch_size=16,
                                                max_patches=budget * 9, pooling_kernel_size=3)
        if (w, h) == (width, height):
            return w, h
        width, height = w, h


def set_from_projector(model, path: Path) -> None:
    """The model's image embedder set to the projector file's values, llama.cpp's layouts turned back:
    the patch values' CHW order (patch_ln1 and patch_dense's columns) and the [2, positions, width]
    position table; every embedder tensor of the file used once."""
    import torch
    from pyapp.gguf import read_gguf
    from pyapp.reference.quants import load_tensor
    g = read_gguf(path)
    emb = model.model.embed_vision
    p = model.config.vision_config.patch_size * model.config.vision_config.pooling_kernel_size
    i = torch.arange(p * p * 3)
    hwc_of_chw = (i % (p * p)) // p * p * 3 + i % p * 3 + i // (p * p)     # the converter's permutation
    chw_of_hwc = torch.argsort(hwc_of_chw)
    targets = {
        "v.patch_norm.1.weight": (emb.patch_ln1.weight, lambda t: t[chw_of_hwc]),
        "v.patch_norm.1.bias": (emb.patch_ln1.bias, lambda t: t[chw_of_hwc]),
        "v.patch_embd.weight": (emb.patch_dense.weight, lambda t: t[:, chw_of_hwc]),
        "v.patch_embd.bias": (emb.patch_dense.bias, None),
        "v.patch_norm.2.weight": (emb.patch_ln2.weight, None),
        "v.patch_norm.2.bias": (emb.patch_ln2.bias, None),
        "v.position_embd.weight": (emb.pos_embedding, lambda t: t.permute(1, 0, 2)),
        "v.patch_norm.3.weight": (emb.pos_norm.weight, None),
        "v.patch_norm.3.bias": (emb.pos_norm.bias, None),
        "mm.input_projection.weight": (emb.multimodal_embedder.embedding_projection.weight, None),
    }
    vision = {n for n in g.tensors if n.startswith("v.") or n == "mm.input_projection.weight"}
    if vision != set(targets):
        raise SystemExit(f"{path.name}: unexpected image tensors {sorted(vision ^ set(targets))}")
    with torch.no_grad():
        for name, (param, unpermute) in targets.items():
            value = torch.from_numpy(load_tensor(g, name).copy())
            value = unpermute(value) if unpermute else value
            value = value.reshape(param.shape)
            if (value - param).abs().max() > 1e-2 * param.abs().max():      # rounding only (F16, BF16)
                raise SystemExit(f"{path.name}: {name} is not the checkpoint's (layout?)")
            param.copy_(value)


def check_text(model_path: Path, reference: Path) -> None:
    """The checkpoint's text model is gemma4-12b.gguf's, tensor for tensor."""
    from pyapp.gguf import read_gguf
    from pyapp.reference.quants import load_tensor
    a, b = read_gguf(model_path), read_gguf(reference)
    for name in b.tensors:
        if not np.array_equal(load_tensor(a, name), load_tensor(b, name)):
            raise SystemExit(f"{reference.name}: {name} is not this checkpoint's (remake it: "
                             "tools/make_ollama_fixtures.py --only-12b)")


def goldens(model, ip) -> dict:
    import torch
    out = {}
    i = 0
    for width, height in SOURCES:
        for budget in BUDGETS:
            w, h = sized(width, height, budget)
            rgb = random.Random(100 + i).randbytes(w * h * 3)
            pixels, positions, n = processor_pixels(ip, rgb, w, h, budget)
            with torch.no_grad():
                res = model.model.get_image_features(pixels[None], positions[None])
            out[f"case_{i}"] = np.array([w, h, budget, n], np.int32)
            as_bytes = np.round(pixels[:n].numpy() * 255).astype(np.uint8)
            out[f"pixels_sha_{i}"] = np.array(hashlib.sha256(as_bytes.tobytes()).hexdigest())
            out[f"positions_{i}"] = positions[:n].numpy().astype(np.int32)
            out[f"encoded_{i}"] = res.last_hidden_state[0, :n].float().numpy()
            out[f"features_{i}"] = res.pooler_output[0].float().numpy()
            assert out[f"features_{i}"].shape[0] == n and (positions[n:] == -1).all()
            i += 1
    begin, soft, end = mof.IMAGE_MARKERS.values()
    n0 = int(out["case_0"][3])
    w0, h0 = (int(v) for v in out["case_0"][:2])
    image = processor_pixels(ip, random.Random(100).randbytes(w0 * h0 * 3), w0, h0, n0)
    small = []
    for j, (across, down) in enumerate(SMALL):
        rgb = random.Random(200 + j).randbytes(across * 48 * down * 48 * 3)
        small.append(processor_pixels(ip, rgb, across * 48, down * 48, across * down))
        out[f"small_{j}"] = np.array([across, down], np.int32)
    prompts = {
        "image": ([2, 300, 301, begin] + [soft] * n0 + [end, 302, 303, 304], [image]),
        "two_image": ([2, 300, begin] + [soft] * small[0][2] + [end, 301, begin] + [soft] * small[1][2]
                      + [end, 302, 303], small),
    }
    for name, (ids, images) in prompts.items():
        logits = image_logits(model, ids, images, soft)
        out[f"{name}_tokens"] = np.array(ids, np.int32)
        out[f"{name}_logits"] = logits
    return out


def image_logits(model, ids: list[int], images: list, soft: int) -> np.ndarray:
    """transformers' logits of a prompt whose placeholder runs hold these images (processor_pixels each),
    with generate()'s masks."""
    import torch
    ids_t = torch.tensor([ids])
    mm_token_type_ids = (ids_t == soft).long()
    with torch.no_grad():
        features = torch.cat([model.model.get_image_features(p[None], q[None]).pooler_output[0]
                              for p, q, _ in images])
        embeds = model.get_input_embeddings()(torch.where(ids_t == soft, 0, ids_t))
        masks = model.create_masks_for_generate(model.config, embeds, None, None,
                                                torch.arange(len(ids))[None], mm_token_type_ids=mm_token_type_ids)
        outputs = model(input_ids=ids_t, attention_mask=masks, mm_token_type_ids=mm_token_type_ids,
                        mm_encoder_outputs={"image": types.SimpleNamespace(pooler_output=(features,))})
    return outputs.logits[0].float().numpy()


def main() -> int:
    args = mof.forms_parser(__doc__).parse_args()
    manifest_path, manifest = mof.read_manifest(args.out)
    with tempfile.TemporaryDirectory() as tmp, without_torchvision() as ip:
        model = mof.unified(args.seed)
        ckpt = Path(tmp) / "unified"
        mof.write_checkpoint(model, ckpt, "Gemma4UnifiedForConditionalGeneration", suppress=mof.SUPPRESS)
        (ckpt / "processor_config.json").write_text(json.dumps(UNIFIED_PROCESSOR, indent=1))
        text = Path(tmp) / "text.gguf"
        mof.llama_convert(ckpt, text, "f32")
        check_text(text, args.out / "gemma4-12b.gguf")
        for stem, outtype in FORMS.items():
            dest = args.out / f"{stem}.gguf"
            mof.llama_convert(ckpt, dest, outtype, "--mmproj")
            set_from_projector(model, dest)
            np.savez_compressed(dest.with_suffix(".vision.npz"), **goldens(model, ip))
            manifest[dest.name] = dest.stat().st_size
            print(f"{dest.name}: {dest.stat().st_size / 2**10:.0f} KiB, golden "
                  f"{dest.with_suffix('.vision.npz').stat().st_size / 2**10:.0f} KiB")
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
