"""The 12B's audio goldens: what transformers makes of two clips through the tiny Gemma4Unified checkpoint's
audio embedder, for each of llama.cpp's projector files of it (tests/fixtures/forms/mmproj-12b*.audio.npz).

    python tools/make_unified_audio_golden.py [--out tests/fixtures/forms] [--seed 0]

The projector files (mmproj-12b.gguf F16, mmproj-12b-bf16.gguf) are tools/make_unified_vision_fixtures.py's:
llama.cpp's converter writes the 12B's image patch projection (gemma4uv) and its audio frames projection
(gemma4ua: `mm.a.input_projection.weight`, [frame, text hidden]) into one file. The checkpoint is
make_ollama_fixtures' `unified()` (same seed), whose audio config is `audio_embed_dim=32`: a frame of 32
samples a soft token (the real 12B's 640, 40 ms), projected by Gemma4UnifiedMultimodalEmbedder: an RMSNorm
without a scale, then a linear into the text width (randomize's N(0, 1 / 32) values, nothing damped:
there is no gain or bias to damp). Before anything is recorded, the checkpoint's image embedder is
checked against the file (set_from_projector: the same checkpoint, so the text model is gemma4-12b.gguf's,
which make_unified_vision_fixtures checks tensor for tensor), and its audio projection is set to the file's
values (F16 or BF16 rounding only), so the goldens test the forward, not the rounding.

Per clip i (0: 1001 samples, 1: 1500; neither a whole number of frames, so the last frame is zero-padded):
`clip_i` the 16 kHz samples (multiples of 1/32768: a 16-bit WAV holds them exactly), `frames_i` the
processor's input_features (Gemma4UnifiedAudioFeatureExtractor with audio_samples_per_token=32),
`tokens_i` Gemma4UnifiedProcessor's placeholder count (_compute_audio_num_tokens), `features_i`
get_audio_features' soft tokens [tokens, text hidden]. `audio_tokens` / `audio_logits`: a prompt with clip 0;
`two_audio_tokens` / `two_audio_logits`: with both clips; the masks are generate()'s
(create_masks_for_generate with the processor's mm_token_type_ids: 3 for audio, which stays causal; only
images and video see each other both ways).
"""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import make_ollama_fixtures as mof  # noqa: E402
from make_unified_vision_fixtures import FORMS, set_from_projector  # noqa: E402

LENGTHS = (1001, 1500)
AUDIO_TYPE = 3                  # the processor's mm_token_type_ids of an audio soft token


def clip(i: int, n: int) -> np.ndarray:
    """Synthetic speech-band audio: two tones and noise, quantized to 16 bits."""
    rng = np.random.default_rng(300 + i)
    t = np.arange(n) / 16000
    x = 0.4 * np.sin(2 * np.pi * (180 + 90 * i) * t) + 0.2 * np.sin(2 * np.pi * 1250 * t) + 0.1 * rng.standard_normal(n)
    return (np.round(np.clip(x, -1, 1) * 32767) / 32768).astype(np.float32)


def set_audio_from_projector(model, path: Path) -> None:
    """The model's audio projection set to the file's (rounding only: F16 or BF16)."""
    import torch
    from pyapp.gguf import read_gguf
    from pyapp.reference.quants import load_tensor
    g = read_gguf(path)
    audio = {n for n in g.tensors if n.startswith(("a.", "mm.a."))}
    if audio != {"mm.a.input_projection.weight"} or g.metadata.get("clip.audio.projector_type") != "gemma4ua":
        raise SystemExit(f"{path.name}: not the 12B's audio projection: {sorted(audio)}")
    param = model.model.embed_audio.embedding_projection.weight
    value = torch.from_numpy(load_tensor(g, "mm.a.input_projection.weight").copy()).reshape(param.shape)
    if (value - param).abs().max() > 1e-2 * param.abs().max():
        raise SystemExit(f"{path.name}: mm.a.input_projection.weight is not the checkpoint's")
    with torch.no_grad():
        param.copy_(value)


def goldens(model, fe) -> dict:
    import torch
    from transformers.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedProcessor
    counter = types.SimpleNamespace(feature_extractor=fe)
    out, clips = {}, []
    for i, n in enumerate(LENGTHS):
        samples = clip(i, n)
        batch = fe(samples, return_tensors="pt")
        frames, mask = batch["input_features"][0], batch["input_features_mask"][0]
        tokens = Gemma4UnifiedProcessor._compute_audio_num_tokens(counter, samples, 16000)
        assert tokens == int(mask.sum()) == len(frames) == math.ceil(n / fe.audio_samples_per_token)
        with torch.no_grad():
            features = model.model.get_audio_features(frames[None], mask[None]).pooler_output[0]
        out[f"clip_{i}"], out[f"frames_{i}"] = samples, frames.numpy()
        out[f"tokens_{i}"] = np.array(tokens, np.int32)
        out[f"features_{i}"] = features.float().numpy()
        clips.append((frames, mask, tokens))
    begin, soft, end = mof.AUDIO_MARKERS.values()
    prompts = {
        "audio": ([2, 300, 301, begin] + [soft] * clips[0][2] + [end, 302, 303, 304], clips[:1]),
        "two_audio": ([2, 300, begin] + [soft] * clips[0][2] + [end, 301, begin] + [soft] * clips[1][2]
                      + [end, 302, 303], clips),
    }
    for name, (ids, used) in prompts.items():
        out[f"{name}_tokens"] = np.array(ids, np.int32)
        out[f"{name}_logits"] = audio_logits(model, ids, used, soft)
    return out


def audio_logits(model, ids: list[int], clips: list, soft: int) -> np.ndarray:
    """transformers' logits of a prompt whose placeholder runs hold these clips (frames, mask, tokens), with
    generate()'s masks and the processor's token types."""
    import torch
    ids_t = torch.tensor([ids])
    mm_token_type_ids = torch.where(ids_t == soft, AUDIO_TYPE, 0)
    frames = torch.nn.utils.rnn.pad_sequence([f for f, _, _ in clips], batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([m for _, m, _ in clips], batch_first=True)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(torch.where(ids_t == soft, 0, ids_t))
        masks = model.create_masks_for_generate(model.config, embeds, None, None,
                                                torch.arange(len(ids))[None], mm_token_type_ids=mm_token_type_ids)
        outputs = model(input_ids=ids_t, attention_mask=masks, mm_token_type_ids=mm_token_type_ids,
                        input_features=frames, input_features_mask=mask)
    return outputs.logits[0].float().numpy()


def main() -> int:
    from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import Gemma4UnifiedAudioFeatureExtractor
    args = mof.forms_parser(__doc__).parse_args()
    model = mof.unified(args.seed)
    model.config.boa_token_id, model.config.audio_token_id, model.config.eoa_token_index = mof.AUDIO_MARKERS.values()
    size = model.config.audio_config.audio_samples_per_token
    fe = Gemma4UnifiedAudioFeatureExtractor(feature_size=size, audio_samples_per_token=size)
    for stem in FORMS:
        path = args.out / f"{stem}.gguf"
        set_from_projector(model, path)
        set_audio_from_projector(model, path)
        dest = path.with_suffix(".audio.npz")
        np.savez_compressed(dest, **goldens(model, fe))
        print(f"{dest.name}: {dest.stat().st_size / 2**10:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
