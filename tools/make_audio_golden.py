"""Golden audio features for the Ollama-form dense fixture (tests/fixtures/forms/ollama-dense.audio.npz).

    python tools/make_audio_golden.py [--out tests/fixtures/forms]

Rebuilds the tiny E2B-like checkpoint of tools/make_ollama_fixtures.py (same seed: the same weights,
checked against the committed ollama-dense.gguf and mmproj-dense.gguf, whose audio tensors hold the
same values under their two sets of names), rounds the text weights as the file stores them, and runs
transformers on two clips of synthetic speech (a voiced tone whose pitch and loudness move, breath
noise, a pause), of lengths that fill no chunk of 12 soft tokens exactly:

- clip_i: the samples (16 kHz, float32); mel_i: Gemma4AudioFeatureExtractor's rows of its frames that
  are the clip's (the processor's padding frames are masked and their soft tokens dropped);
- encoded_i: the audio tower's output (after its output projection) at the clip's soft tokens;
  features_i: get_audio_features' soft tokens in the text model's width (the embedder's output);
- audio_tokens / audio_logits: a prompt with clip 0 (`<|audio>` + N x `<|audio|>` + `<audio|>` amid
  text), two_audio_tokens / two_audio_logits: one with both clips, as the processor pads a batch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import make_ollama_fixtures as mof  # noqa: E402

RATE = 16_000
LENGTHS = (21_923, 9_771)          # 1.37 s and 0.61 s: 35 and 16 soft tokens


def speech_like(rng, n: int) -> np.ndarray:
    """A voiced sound (harmonics of a gliding pitch, a syllable-rate envelope), breath noise, and a pause."""
    t = np.arange(n) / RATE
    pitch = 120 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t + rng.uniform(0, 6))
    x = 0.25 * envelope * voiced + 0.02 * rng.standard_normal(n)
    x[int(0.6 * n):int(0.7 * n)] *= 0.01
    return x.astype(np.float32)


def check_values(model, out: Path) -> int:
    """Every audio tensor of both files equals the weight it came from (per_dim_scale: its softplus, in
    float32 by each converter); returns how many were compared."""
    import torch
    from pyapp.gguf import read_gguf
    from pyapp.reference.quants import load_tensor
    from pyapp.families.gemma4_audio.weights import file_names
    import ollama_convert
    state = model.state_dict()
    ollama = {ollama_convert.gguf_name(k): k for k in state if k.startswith(mof.AUDIO_PARTS)}
    inline = read_gguf(out / "ollama-dense.gguf")
    projector = read_gguf(out / "mmproj-dense.gguf")
    inline_names = file_names(inline.tensors, ollama=True)
    projector_names = file_names(projector.tensors, ollama=False)
    if set(inline_names) != set(projector_names):
        raise SystemExit(f"the two files' audio tensors differ: {sorted(set(inline_names) ^ set(projector_names))[:6]}")
    reverse = {file_names({o: o}, ollama=True).popitem()[0]: o for o in ollama if o}
    n = 0
    for name, t in inline_names.items():
        want = state[ollama[reverse[name]]].float()
        if name.endswith("per_dim_scale.weight"):
            want = torch.nn.functional.softplus(want)
        want = want.numpy().reshape(-1)
        for g, info in ((inline, t), (projector, projector_names[name])):
            got = load_tensor(g, info).reshape(-1)
            tol = 1e-6 if name.endswith("per_dim_scale.weight") else 0
            if got.shape != want.shape or np.abs(got - want).max() > tol:
                raise SystemExit(f"{name}: the file's values are not the checkpoint's")
        n += 1
    return n


def main() -> int:
    import torch
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    args = mof.forms_parser(__doc__).parse_args()
    model = mof.multimodal(mof.DENSE, mof.VISION, mof.AUDIO, args.seed)
    model.config.boa_token_id, model.config.audio_token_id, model.config.eoa_token_index = mof.AUDIO_MARKERS.values()
    mof.round_as_stored(model)           # the text weights as the file stores them: the logits are the file's
    n = check_values(model, args.out)
    extractor = Gemma4AudioFeatureExtractor()
    rng = np.random.default_rng(args.seed + 11)
    clips = [speech_like(rng, n_samples) for n_samples in LENGTHS]
    out = {}
    for i, clip in enumerate(clips):
        batch = extractor([clip], return_tensors="pt")
        frames = batch["input_features_mask"][0]
        with torch.no_grad():
            res = model.model.get_audio_features(batch["input_features"], batch["input_features_mask"])
        tokens = res.attention_mask[0]
        out[f"clip_{i}"] = clip
        out[f"mel_{i}"] = batch["input_features"][0][frames].numpy()
        out[f"encoded_{i}"] = res.last_hidden_state[0][tokens].float().numpy()
        out[f"features_{i}"] = res.pooler_output[0][tokens].float().numpy()
    begin, soft, end = mof.AUDIO_MARKERS.values()
    sizes = [len(out[f"features_{i}"]) for i in range(len(clips))]
    one = [2, 300, 301, begin] + [soft] * sizes[0] + [end, 302, 303, 304]
    two = [2, 300, begin] + [soft] * sizes[0] + [end, 301, begin] + [soft] * sizes[1] + [end, 302, 303]
    for name, ids, batch_clips in (("audio", one, clips[:1]), ("two_audio", two, clips)):
        batch = extractor(batch_clips, return_tensors="pt")
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), input_features=batch["input_features"],
                           input_features_mask=batch["input_features_mask"]).logits[0]
        out[f"{name}_tokens"] = np.array(ids, np.int32)
        out[f"{name}_logits"] = logits.float().numpy()
    dest = args.out / "ollama-dense.audio.npz"
    np.savez_compressed(dest, **out)
    print(f"{dest.name}: soft tokens {sizes}, {n} audio tensors of both files checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
