#!/usr/bin/env python3
"""Write a full-size random-weight Gemma 4 image projector (llama.cpp's mmproj form) for speed measurements.

    python tools/make_vision_bench.py --shape e2b --out /tmp/mmproj-bench-e2b.gguf
    python tools/make_vision_bench.py --shape a26b --out /tmp/mmproj-bench-a26b.gguf
    python tools/make_vision_bench.py --shape tiny --out /tmp/mmproj-tiny.gguf        # quick checks

The file is what llama.cpp's converter (`convert_hf_to_gguf.py --mmproj --outtype f16`, see
tools/make_mmproj_fixtures.py and tests/fixtures/forms/mmproj-*.gguf) writes for Gemma 4's image
encoder: `general.architecture` clip, `general.type` mmproj, the `clip.vision.*` keys (projector type
gemma4v, projection_dim = the text model's width), tensors `v.*` and `mm.input_projection.weight`,
F16 matrices (the patch embedding as a conv weight [16, 16, 3, hidden]), F32 norms, F32 position
table [hidden, positions, 2] and, on encoders with clippable linears, four F32 scalars per linear
(`v.blk.N.attn_q.input_min` ...). Our ImageEncoder and llama.cpp's `llama-mtmd-cli --mmproj` both load
it; pair it with the text model of the same shape from tools/make_bench_model.py (its width).

The weights are random (fan-in scaled normals, norms near 1, finite clamp bounds of +-50, position
table and std_bias small): numerics are meaningless, but finite (no NaN or inf anywhere), and the time
to encode an image depends only on the shapes.

Shapes (transformers' Gemma4VisionConfig; the widths not in its defaults are assumed, see SHAPES):
  e2b   the ~150M-parameter encoder of E2B / E4B: Gemma4VisionConfig's defaults (hidden 768, 16
        layers, 12 heads of 64, MLP 3072, position table 10240) with use_clipped_linears (clamp
        scalars), no standardization; text width 1536 (E2B)
  a26b  the ~550M-parameter encoder of 26B-A4B / 31B: hidden 1152, 16 heads of 72, standardize
        (v.std_bias / v.std_scale), no clippable linears, as public configs state; 27 layers and MLP
        4304 assumed (SigLIP so400m's, which gives the ~550M of Google's model card); text width 2816
  tiny  the e2b structure at toy size (with std too), for tests on lavapipe

--layers N keeps N encoder layers (quick checks), --text-hidden W another projection width (pair a
shape with another text model), --clamp / --no-clamp override the shape's clippable linears.
Needs numpy and the `gguf` package only.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from gguf import GGUFValueType as V
from gguf import GGUFWriter

SHAPES = {
    "e2b": dict(hidden=768, ffn=3072, layers=16, heads=12, head_dim=64, positions=10240, text_hidden=1536,
                clamp=True, std=False),
    "a26b": dict(hidden=1152, ffn=4304, layers=27, heads=16, head_dim=72, positions=10240, text_hidden=2816,
                 clamp=False, std=True),
    "tiny": dict(hidden=64, ffn=96, layers=2, heads=2, head_dim=32, positions=64, text_hidden=256,
                 clamp=True, std=True),
}
PATCH = 16
POOL = 3
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_out", "ffn_gate", "ffn_up", "ffn_down")
CLAMP = 50.0              # every clippable linear's bounds: [-CLAMP, CLAMP] on its input and its output


def parameters(s: dict) -> int:
    """Parameters of the encoder and projector (what the model cards count, roughly)."""
    d, f, hd = s["hidden"], s["ffn"], s["heads"] * s["head_dim"]
    per_layer = 3 * d * hd + hd * d + 3 * d * f
    return s["layers"] * per_layer + 3 * PATCH * PATCH * d + 2 * s["positions"] * d + d * s["text_hidden"]


def matrix(rng, n_out: int, n_in: int) -> np.ndarray:
    """A linear's weight in numpy order [out, in] (ggml's [in, out]), fan-in scaled, F16."""
    return (rng.standard_normal((n_out, n_in), dtype=np.float32) / np.sqrt(n_in)).astype(np.float16)


def norm(rng, n: int) -> np.ndarray:
    return (1.0 + 0.05 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)


def scalar(v: float) -> np.ndarray:
    return np.array([v], dtype=np.float32)


def write(s: dict, out: str, seed: int = 0, name: str = "bench", log=None) -> dict:
    """Write the projector for shape dict `s` (SHAPES' keys); returns what was written."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    rng = np.random.default_rng(seed)
    d, f, heads, hd, T = s["hidden"], s["ffn"], s["heads"], s["head_dim"], s["text_hidden"]
    if heads * hd != d:
        raise SystemExit(f"heads x head_dim = {heads} x {hd} is not the hidden size {d}")
    w = projector_writer(out, f"mmproj-{name}")
    w.add_key_value("clip.has_vision_encoder", True, V.BOOL)
    w.add_key_value("clip.vision.projection_dim", T, V.UINT32)
    w.add_key_value("clip.vision.image_size", 224, V.UINT32)        # the converter's value for Gemma 4
    w.add_key_value("clip.vision.patch_size", PATCH, V.UINT32)
    w.add_key_value("clip.vision.embedding_length", d, V.UINT32)
    w.add_key_value("clip.vision.feed_forward_length", f, V.UINT32)
    w.add_key_value("clip.vision.block_count", s["layers"], V.UINT32)
    w.add_key_value("clip.vision.attention.head_count", heads, V.UINT32)
    w.add_key_value("clip.vision.image_mean", [0.0, 0.0, 0.0], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("clip.vision.image_std", [1.0, 1.0, 1.0], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("clip.vision.projector_type", "gemma4v", V.STRING)
    w.add_key_value("clip.vision.attention.layer_norm_epsilon", 1e-6, V.FLOAT32)
    w.add_key_value("general.quantization_version", 2, V.UINT32)

    w.add_tensor("mm.input_projection.weight", matrix(rng, T, d))
    shapes = {"attn_q": (d, d), "attn_k": (d, d), "attn_v": (d, d), "attn_out": (d, d),
              "ffn_gate": (f, d), "ffn_up": (f, d), "ffn_down": (d, f)}          # (out, in)
    for i in range(s["layers"]):
        p = f"v.blk.{i}."
        for t in ("ln1", "ln2", "attn_post_norm", "ffn_post_norm"):
            w.add_tensor(p + t + ".weight", norm(rng, d))
        w.add_tensor(p + "attn_q_norm.weight", norm(rng, hd))
        w.add_tensor(p + "attn_k_norm.weight", norm(rng, hd))
        for lin in LINEARS:
            w.add_tensor(p + lin + ".weight", matrix(rng, *shapes[lin]))
            if s["clamp"]:
                for bound, v in (("input_min", -CLAMP), ("input_max", CLAMP), ("output_min", -CLAMP),
                                 ("output_max", CLAMP)):
                    w.add_tensor(f"{p}{lin}.{bound}", scalar(v))
    # the conv weight: ggml [16, 16, 3, hidden] = numpy [hidden, 3, 16, 16]
    embd = rng.standard_normal((d, 3, PATCH, PATCH), dtype=np.float32) / np.sqrt(3 * PATCH * PATCH)
    w.add_tensor("v.patch_embd.weight", embd.astype(np.float16))
    # ggml [hidden, positions, 2]: one table per axis
    w.add_tensor("v.position_embd.weight", (0.02 * rng.standard_normal((2, s["positions"], d), dtype=np.float32)))
    if s["std"]:
        w.add_tensor("v.std_bias", (0.01 * rng.standard_normal(d, dtype=np.float32)))
        w.add_tensor("v.std_scale", norm(rng, d))
    return finish(w, out, s, parameters(s), say)


def projector_writer(out: str, title: str) -> GGUFWriter:
    """A GGUFWriter of a llama.cpp projector file (general.architecture clip, type mmproj), F16 as --outtype f16."""
    w = GGUFWriter(out, "clip")
    w.add_type("mmproj")
    w.add_name(f"{title} (random weights, speed measurements)")
    w.add_key_value("general.file_type", 1, V.UINT32)               # MOSTLY_F16, as --outtype f16
    return w


def finish(w: GGUFWriter, out: str, s: dict, n_parameters: int, say) -> dict:
    """Write the file's header, metadata and tensors; returns (and says) what was written."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = {"file": out, "parameters": n_parameters, **s}
    say(f"wrote {out}: {n_parameters / 1e6:.1f}M parameters, {s}")
    return info


def arguments(doc: str, shapes: dict) -> argparse.ArgumentParser:
    """The projector generators' common options: --shape (of `shapes`), --out, --seed, --layers, --text-hidden."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(shapes), default="e2b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None, help="keep only N encoder layers (quick checks)")
    ap.add_argument("--text-hidden", type=int, default=None, help="another projection width (the text model's)")
    return ap


def generate(write_shape, args, s: dict) -> int:
    """Apply --layers / --text-hidden to shape `s`, write it (write_shape(s, out, seed, name=...)), timed."""
    if args.layers:
        s["layers"] = args.layers
    if args.text_hidden:
        s["text_hidden"] = args.text_hidden
    t0 = time.time()
    write_shape(s, args.out, args.seed, name=args.shape)
    print(f"wrote {args.out} in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


def main() -> int:
    ap = arguments(__doc__, SHAPES)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--clamp", dest="clamp", action="store_true", default=None, help="clamp scalars on every linear")
    g.add_argument("--no-clamp", dest="clamp", action="store_false", help="no clamp scalars")
    args = ap.parse_args()
    s = dict(SHAPES[args.shape])
    if args.clamp is not None:
        s["clamp"] = args.clamp
    return generate(write, args, s)


if __name__ == "__main__":
    sys.exit(main())
