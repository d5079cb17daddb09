#!/usr/bin/env python3
"""Write a full-size random-weight Gemma 4 audio projector (llama.cpp's mmproj form) for speed measurements.

    python tools/make_audio_bench.py --shape e2b --out /tmp/mmproj-audio-bench-e2b.gguf
    python tools/make_audio_bench.py --shape e4b --out /tmp/mmproj-audio-bench-e4b.gguf
    python tools/make_audio_bench.py --shape tiny --out /tmp/mmproj-audio-tiny.gguf      # quick checks

The file is the audio half of what llama.cpp's converter (`convert_hf_to_gguf.py --mmproj --outtype f16`,
Gemma4VisionAudioModel in conversion/gemma.py; see tests/fixtures/forms/mmproj-dense.gguf) writes for
Gemma 4 E2B / E4B: `general.architecture` clip, `general.type` mmproj, `clip.has_audio_encoder` and the
`clip.audio.*` keys (projector type gemma4a, projection_dim = the text model's width, 128 mel bins,
epsilon 1e-6), tensors `a.*` and `mm.a.input_projection.weight`. As the converter stores them: the
matrices F16; the subsampling convs ([3, 3, in, out] in ggml order), their norms, the input projection
(its name holds "_conv": forced F32) and the depthwise conv squeezed to [kernel, hidden] F32; every 1-D
tensor (norms, per_dim_scale after softplus, the output projection's bias) F32; four F32 scalars per
clippable linear (`a.blk.N.attn_q.input_min` ...). No vision tensors (`clip.has_vision_encoder` false):
the audio encoder alone is timed. Our AudioEncoder and llama.cpp's `llama-mtmd-cli --mmproj` both load it;
pair it with the text model of the same width from tools/make_bench_model.py (e2b: 1536, e4b: 2560).

The weights are random (fan-in scaled normals, norms near 1, finite clamp bounds of +-50, positive
per-dim scales): numerics are meaningless, but finite, and the time to encode a clip depends only on
the shapes.

Shapes: transformers' Gemma4AudioConfig defaults (the E2B / E4B checkpoints' audio_config): hidden 1024,
12 Conformer layers, 8 heads of 128, feed-forward 4 x hidden (the converter's intermediate_size),
subsampling channels (128, 32), depthwise kernel 5, output_proj_dims 1536; E2B and E4B share the encoder
and differ in the embedder's output, the text width (1536 / 2560):
  e2b   ~300M-parameter encoder, text width 1536
  e4b   the same encoder, text width 2560
  tiny  the fixtures' audio config (tools/make_ollama_fixtures.py AUDIO: hidden 64, 2 layers, 2 heads,
        channels (128, 8), output 48, text 256): the same tensor names, types and shape pattern as
        tests/fixtures/forms/mmproj-dense.gguf's audio part (tests/audio/test_audio_bench.py checks it)

--layers N keeps N Conformer layers (quick checks), --text-hidden W another projection width.
Needs numpy and the `gguf` package only.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from gguf import GGUFValueType as V

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the image projector's helpers
from make_vision_bench import (CLAMP, arguments, finish, generate, matrix, norm,  # noqa: E402
                               projector_writer, scalar)

SHAPES = {
    "e2b": dict(hidden=1024, layers=12, heads=8, channels=(128, 32), kernel=5, out=1536, text_hidden=1536),
    "e4b": dict(hidden=1024, layers=12, heads=8, channels=(128, 32), kernel=5, out=1536, text_hidden=2560),
    "tiny": dict(hidden=64, layers=2, heads=2, channels=(128, 8), kernel=5, out=48, text_hidden=256),
}
N_MELS = 128
# the clippable linears (transformers' Gemma4ClippableLinear) and their (out, in) in units of hidden
LINEARS = {"ffn_up": (4, 1), "ffn_down": (1, 4), "ffn_up_1": (4, 1), "ffn_down_1": (1, 4),
           "attn_q": (1, 1), "attn_k": (1, 1), "attn_v": (1, 1), "attn_out": (1, 1),
           "conv_pw1": (2, 1), "conv_pw2": (1, 1)}
NORMS = ("ffn_norm", "ffn_post_norm", "ffn_norm_1", "ffn_post_norm_1", "attn_pre_norm", "attn_post_norm",
         "conv_norm", "norm_conv", "ln2")


def parameters(s: dict) -> int:
    """Parameters of the encoder and its embedder (the matrices and convs; norms and scalars left out)."""
    d, (c0, c1) = s["hidden"], s["channels"]
    per_layer = sum(o * i for o, i in LINEARS.values()) * d * d + d * d + s["kernel"] * d   # + attn_k_rel, conv_dw
    front = 9 * c0 + 9 * c0 * c1 + N_MELS // 4 * c1 * d
    return s["layers"] * per_layer + front + d * s["out"] + s["out"] * s["text_hidden"]


def f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def write(s: dict, out: str, seed: int = 0, name: str = "bench", log=None) -> dict:
    """Write the audio projector for shape dict `s` (SHAPES' keys); returns what was written."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    rng = np.random.default_rng(seed)
    d, heads, T, o = s["hidden"], s["heads"], s["text_hidden"], s["out"]
    c0, c1 = s["channels"]
    if d % heads or (d // heads) % 2:
        raise SystemExit(f"hidden {d} over {heads} heads is not an even head width")
    w = projector_writer(out, f"mmproj-audio-{name}")
    w.add_key_value("clip.has_vision_encoder", False, V.BOOL)
    w.add_key_value("clip.has_audio_encoder", True, V.BOOL)
    w.add_key_value("clip.audio.projection_dim", T, V.UINT32)
    w.add_key_value("clip.audio.embedding_length", d, V.UINT32)
    w.add_key_value("clip.audio.feed_forward_length", 4 * d, V.UINT32)
    w.add_key_value("clip.audio.block_count", s["layers"], V.UINT32)
    w.add_key_value("clip.audio.attention.head_count", heads, V.UINT32)
    w.add_key_value("clip.audio.projector_type", "gemma4a", V.STRING)
    w.add_key_value("clip.audio.num_mel_bins", N_MELS, V.UINT32)
    w.add_key_value("clip.audio.attention.layer_norm_epsilon", 1e-6, V.FLOAT32)
    w.add_key_value("general.quantization_version", 2, V.UINT32)

    for i in range(s["layers"]):
        p = f"a.blk.{i}."
        for lin, (n_out, n_in) in LINEARS.items():
            w.add_tensor(p + lin + ".weight", matrix(rng, n_out * d, n_in * d))
            for bound, v in (("input_min", -CLAMP), ("input_max", CLAMP), ("output_min", -CLAMP),
                             ("output_max", CLAMP)):
                w.add_tensor(f"{p}{lin}.{bound}", scalar(v))
        for n in NORMS:
            w.add_tensor(p + n + ".weight", norm(rng, d))
        w.add_tensor(p + "attn_k_rel.weight", matrix(rng, d, d))
        # softplus(per_dim_scale), as the converter stores it: positive, near softplus(0) = log 2
        w.add_tensor(p + "per_dim_scale.weight", f32(np.log1p(np.exp(0.1 * rng.standard_normal(d // heads)))))
        # the depthwise conv squeezed: ggml [kernel, hidden] = numpy [hidden, kernel]
        w.add_tensor(p + "conv_dw.weight", f32(rng.standard_normal((d, s["kernel"])) / np.sqrt(s["kernel"])))
    # after the layers: the output projection (and its bias), then the embedder into the text width
    w.add_tensor("a.pre_encode.out.weight", matrix(rng, o, d))
    w.add_tensor("a.pre_encode.out.bias", f32(0.02 * rng.standard_normal(o)))
    # the subsampling front end: ggml [3, 3, in, out] = numpy [out, in, 3, 3]; the input projection F32
    w.add_tensor("a.input_projection.weight", f32(matrix(rng, d, N_MELS // 4 * c1)))
    w.add_tensor("a.conv1d.0.weight", f32(rng.standard_normal((c0, 1, 3, 3)) / 3.0))
    w.add_tensor("a.conv1d.0.norm.weight", norm(rng, c0))
    w.add_tensor("a.conv1d.1.weight", f32(rng.standard_normal((c1, c0, 3, 3)) / np.sqrt(9 * c0)))
    w.add_tensor("a.conv1d.1.norm.weight", norm(rng, c1))
    w.add_tensor("mm.a.input_projection.weight", matrix(rng, T, o))
    return finish(w, out, s, parameters(s), say)


def main() -> int:
    args = arguments(__doc__, SHAPES).parse_args()
    return generate(write, args, dict(SHAPES[args.shape]))


if __name__ == "__main__":
    sys.exit(main())
