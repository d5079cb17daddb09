"""Make the fixtures of the file forms users have beside llama.cpp's (tests/fixtures/forms/).

    python tools/make_ollama_fixtures.py [--out tests/fixtures/forms] [--seed 0]

Needs the `tools` extra and `python3 build.py setup`, like tools/make_fixtures.py.

Tiny random multimodal Gemma 4 checkpoints made with transformers
(Gemma4ForConditionalGeneration: the text model of make_fixtures' DENSE (E2B-like: PLE,
KV sharing, double-wide MLP) with a tiny vision and audio encoder; MOE (26B-A4B-like) with a
tiny vision encoder; Gemma4UnifiedForConditionalGeneration for the 12B), written as:

- `ollama-dense.gguf`, `ollama-moe.gguf`: by tools/ollama_convert.py, as Ollama's converter
  writes them today (F16 matrices, inline v./a./mm. tensors, tokenizer model "llama");
- `ollama-dense-published.gguf`, `ollama-moe-published.gguf`: with `--published`, what the
  original library tags hold (split experts, ffn_gate_inp.per_expert_scale, v.clamp_data);
- `llamacpp-dense-fused-qkv.gguf`: the text model by llama.cpp's convert_hf_to_gguf.py
  `--fuse-qkv --outtype q8_0` (attn_qkv tensors);
- `gemma4-12b.gguf`: the 12B's text model by llama.cpp's converter (F32), with the
  `tokenizer.ggml.suppress_tokens` its generation_config.json lists (`--only-12b` makes it alone);
  its image embedder's projector files are tools/make_unified_vision_fixtures.py's.

Golden logits and greedy tokens come from transformers (float32, eager) run on each
file's own values (the same weights rounded as the file stores them); before that, every
text tensor of each file is checked equal to the weight it was made from.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from make_fixtures import DENSE, MOE, VENDORED, VOCAB, golden  # noqa: E402
import ollama_convert  # noqa: E402

S, G = "sliding_attention", "full_attention"
VOCAB_SIZE = 512
# tiny encoders: enough layers and widths to exercise every tensor kind Ollama writes
VISION = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=2, head_dim=32, position_embedding_size=64, use_clipped_linears=True)
# The audio tower: E2B's layout in miniature. Its first conv has 128 channels, as every Gemma 4's (the
# input projection reads (channels[0] / 4) x channels[1] values: the 32 mel bands left after two
# stride-2 convs times channels[1]); chunking, context and logit cap are the defaults, which the files
# cannot state (llama.cpp and this app assume them).
AUDIO = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, subsampling_conv_channels=[128, 8],
             output_proj_dims=48)
# The 12B's text model in miniature: no PLE, no experts, sliding + global layers.
UNIFIED_TEXT = dict(hidden_size=128, intermediate_size=192, num_hidden_layers=4, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=32, global_head_dim=64, sliding_window=4,
                    layer_types=[S, G, S, G], final_logit_softcapping=30.0)
# Its image embedder (no encoder: 48 x 48 patches, LayerNorm, Dense, LayerNorm, + 2-D positions, LayerNorm,
# then RMSNorm and the projection): the real processor's 16-px patches merged 3 x 3, a narrow embedding and
# a position table of 64 per axis (images up to 64 patches a side: 3072 px).
UNIFIED_VISION = dict(patch_size=16, pooling_kernel_size=3, mm_embed_dim=16, mm_posemb_size=64, output_proj_dims=16)
IMAGE_MARKERS = {"<|image>": 6, "<|image|>": 7, "<image|>": 8}     # begin, soft token, end
AUDIO_MARKERS = {"<|audio>": 9, "<|audio|>": 10, "<audio|>": 11}    # begin, soft token, end
SUPPRESS = [3, 4, 5]     # <unk>, <mask>, [multimodal]: ids the tiny vocabulary has
# Tokens Google's tokenizer.json flags special though llama.cpp types them USER_DEFINED.
VISIBLE = ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>')


AUDIO_PARTS = ("model.audio_tower.", "model.embed_audio.")


def randomize(model, seed: int, audio_stream: bool = False) -> None:
    """make_fixtures' initialization (fan-in scaled matrices, norms near 1), and clamp bounds
    that bite: |bound| in [1, 2] (the bounds and the text layers' scalars are buffers). audio_stream:
    the audio tower draws from a stream of its own, so that its shape changes nothing else."""
    import torch
    main = torch.Generator().manual_seed(seed)
    audio = torch.Generator().manual_seed(seed + 1) if audio_stream else main
    with torch.no_grad():
        for name, p in model.named_parameters():
            gen = audio if name.startswith(AUDIO_PARTS) else main
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            elif "q_norm" in name or "k_norm" in name:
                p.copy_(0.35 + 0.05 * torch.randn(p.shape, generator=gen))
            elif "layer_scalar" in name:
                p.copy_(0.8 + 0.1 * torch.rand(p.shape, generator=gen))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():       # the text layers' layer_scalar is a buffer, so are the bounds
            gen = audio if name.startswith(AUDIO_PARTS) else main
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("layer_scalar"):
                b.copy_(0.8 + 0.1 * torch.rand(b.shape, generator=gen))
            elif leaf in ("input_min", "output_min", "input_max", "output_max"):
                sign = -1.0 if leaf.endswith("min") else 1.0     # inside the activations' range: they bite
                b.copy_(sign * (1.0 + 1.0 * torch.rand(b.shape, generator=gen)))


def multimodal(text: dict, vision: dict | None, audio: dict | None, seed: int):
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration
    cfg = Gemma4Config(text_config=dict(vocab_size=VOCAB_SIZE, vocab_size_per_layer_input=VOCAB_SIZE,
                                        max_position_embeddings=4096, **text),
                       vision_config=vision, audio_config=audio)
    model = randomized(Gemma4ForConditionalGeneration, cfg, seed, audio_stream=True)
    if audio is not None:
        half_precise_audio(model)
    return model


def half_precise_audio(model) -> None:
    """The audio weights Ollama's converter stores as F16 made F16 values: llama.cpp's --mmproj f16 keeps
    some of them F32 (the input projection), so both files then hold the same values."""
    import torch
    with torch.no_grad():
        for hf_name, p in model.state_dict().items():
            name = ollama_convert.gguf_name(hf_name)
            if name and name.startswith(("a.", "mm.a.")) and ollama_convert.tensor_type(name, tuple(p.shape), False) == "F16":
                p.copy_(p.half().float())


def unified(seed: int):
    from transformers import Gemma4UnifiedConfig, Gemma4UnifiedForConditionalGeneration
    cfg = Gemma4UnifiedConfig(text_config=dict(vocab_size=VOCAB_SIZE, max_position_embeddings=4096, **UNIFIED_TEXT),
                              vision_config=UNIFIED_VISION, audio_config=dict(audio_embed_dim=32))
    model = randomized(Gemma4UnifiedForConditionalGeneration, cfg, seed)
    undamp_patch_projection(model, seed)
    return model


def undamp_patch_projection(model, seed: int) -> None:
    """The 12B's image embedder with values that show every mistake (after randomize, whose stream the
    text weights were drawn from first, so they stay as they were): LayerNorm biases N(0, 0.5), not
    randomize's 1 + noise (a bias left in another order than its weight must show), LayerNorm gains
    1 + 0.3 N(0, 1), the position table N(0, 1): as large as the normed patch it is added to."""
    import torch
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in model.model.embed_vision.named_parameters():
            if name == "pos_embedding":
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif p.ndim == 1:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))


def randomized(model_class, cfg, seed: int, audio_stream: bool = False):
    """model_class(cfg) in float32 with eager attention, its weights set by randomize."""
    import torch
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_class(cfg).float().eval()
    randomize(model, seed, audio_stream)
    return model


def write_checkpoint(model, out: Path, architecture: str, suppress=None) -> None:
    from hf_tokenizer import reduce_vocab, write_tokenizer
    from pyapp.gguf import read_gguf
    model.config.architectures = [architecture]
    model.config.boi_token_id, model.config.image_token_id, model.config.eoi_token_id = IMAGE_MARKERS.values()
    model.config.boa_token_id, model.config.audio_token_id, model.config.eoa_token_index = AUDIO_MARKERS.values()
    model.save_pretrained(out, safe_serialization=True)
    if architecture.startswith("Gemma4Unified"):
        google_vision_names(out)
    write_tokenizer(reduce_vocab(read_gguf(VOCAB).metadata, VOCAB_SIZE), out)
    tj = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    for a in tj["added_tokens"]:        # as Google's tokenizer.json flags them
        if a["content"] in VISIBLE:
            a["special"] = True
    # the image and audio markers (ids 255999, 258880, 258882 and 256000, 258881, 258883 in the real
    # vocabulary) in place of six <unusedN> of the cut vocabulary, special like the real ones: prompts
    # with an image or a clip can be written
    vocab = tj["model"]["vocab"]
    markers = IMAGE_MARKERS | AUDIO_MARKERS
    for old, (new, tid) in zip([f"<unused{i}>" for i in range(len(markers))], markers.items()):
        assert vocab.pop(old) == tid
        vocab[new] = tid
        tj["added_tokens"].append({"id": tid, "content": new, "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": True})
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    # Google ships the chat template as chat_template.jinja, which Ollama's converter does not read
    # (CV L145-147): its files carry no tokenizer.chat_template
    tc = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    tc["extra_special_tokens"] = tc.get("extra_special_tokens", []) + list(markers)
    if "chat_template" in tc:
        (out / "chat_template.jinja").write_text(tc.pop("chat_template"), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(tc, ensure_ascii=False, indent=1), encoding="utf-8")
    # config.json as Google's checkpoints spell it: transformers 5.23 folds the global layers'
    # head size and KV heads into per_layer_config, the released files (and Ollama's converter,
    # which reads only these keys) have global_head_dim / num_global_key_value_heads
    cfg = json.loads((out / "config.json").read_text())
    text = cfg["text_config"]
    for layer in (text.get("per_layer_config") or {}).values():
        text.setdefault("global_head_dim", layer.get("head_dim"))
        if "num_key_value_heads" in layer:
            text.setdefault("num_global_key_value_heads", layer["num_key_value_heads"])
    if architecture.startswith("Gemma4Unified"):      # llama.cpp's Gemma4Model asks for it (None: no experts)
        text.setdefault("moe_intermediate_size", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    gen = {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0}
    if suppress is not None:
        gen["suppress_tokens"] = suppress
    (out / "generation_config.json").write_text(json.dumps(gen))


# The 12B's image embedder under the names of Google's checkpoints (transformers renames them on load,
# conversion_mapping.py "gemma4_unified"; llama.cpp's converter maps these): ours -> theirs.
GOOGLE_VISION_NAMES = {
    "model.embed_vision.patch_ln1.": "model.vision_embedder.patch_ln1.",
    "model.embed_vision.patch_dense.": "model.vision_embedder.patch_dense.",
    "model.embed_vision.patch_ln2.": "model.vision_embedder.patch_ln2.",
    "model.embed_vision.pos_embedding": "model.vision_embedder.pos_embedding",
    "model.embed_vision.pos_norm.": "model.vision_embedder.pos_norm.",
    "model.embed_vision.multimodal_embedder.embedding_projection.": "model.embed_vision.embedding_projection.",
}


def google_vision_names(ckpt: Path) -> None:
    """Rename the saved image embedder's tensors as GOOGLE_VISION_NAMES says (save_pretrained of a model
    made in memory writes transformers' own names)."""
    from safetensors.torch import load_file, save_file
    path = ckpt / "model.safetensors"
    renamed = {}
    for name, value in load_file(path).items():
        for ours, theirs in GOOGLE_VISION_NAMES.items():
            if name.startswith(ours):
                name = theirs + name[len(ours):]
                break
        renamed[name] = value
    save_file(renamed, path, metadata={"format": "pt"})


def round_as_stored(model) -> dict[str, str]:
    """Round each text weight as ollama_convert stores it (F16 or F32); HF name -> GGUF name."""
    import torch
    names = {}
    with torch.no_grad():
        for hf_name, p in model.state_dict().items():
            name = ollama_convert.gguf_name(hf_name)
            if name is None or name.startswith(("v.", "a.", "mm.")) or hf_name == "lm_head.weight":
                continue
            names[hf_name] = name
            if ollama_convert.tensor_type(name, tuple(p.shape), False) == "F16":
                p.copy_(p.half().float())
    return names


def check_values(model, names: dict[str, str], path: Path, published: bool) -> None:
    """Every text tensor of the file equals the (rounded) weight it came from."""
    from pyapp.gguf import read_gguf
    from pyapp.reference.quants import load_tensor
    g = read_gguf(path)
    state = model.state_dict()
    seen = set()
    for hf_name, name in names.items():
        want = state[hf_name].numpy()
        if published and name.endswith("ffn_gate_up_exps.weight"):
            half = want.shape[1] // 2
            base = name[:-len("ffn_gate_up_exps.weight")]
            parts = [(base + "ffn_gate_exps.weight", want[:, :half]), (base + "ffn_up_exps.weight", want[:, half:])]
        elif published and name.endswith("ffn_down_exps.scale"):
            parts = [(name[:-len("ffn_down_exps.scale")] + "ffn_gate_inp.per_expert_scale", want)]
        else:
            parts = [(name, want)]
        for gname, w in parts:
            got = load_tensor(g, gname)
            if not np.array_equal(got.reshape(-1), w.reshape(-1).astype(np.float32)):
                raise SystemExit(f"{path.name}: {gname} differs from {hf_name}")
            seen.add(gname)
    text = {n for n in g.tensors if not n.startswith(("v.", "a.", "mm.")) and n != "rope_freqs.weight"}
    if text - seen:
        raise SystemExit(f"{path.name}: tensors not checked: {sorted(text - seen)[:5]}")


def llama_convert(ckpt: Path, dest: Path, outtype: str, *extra: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(VENDORED / "gguf-py"))
    subprocess.run([sys.executable, str(VENDORED / "convert_hf_to_gguf.py"), str(ckpt), "--outtype", outtype,
                    "--outfile", str(dest), "--model-name", dest.stem + " (random weights, test model)", *extra],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def llama_golden(model, dest: Path, seed: int) -> dict:
    """Golden outputs of a llama.cpp-converted file: the HF weights set to the file's values,
    matched by exact equality of the F32 conversion's values (make_fixtures.name_map)."""
    import torch
    from pyapp.gguf import read_gguf
    from pyapp.reference.quants import load_tensor
    g = read_gguf(dest)
    state = model.state_dict()
    with torch.no_grad():
        for name, t in g.tensors.items():
            if name == "rope_freqs.weight":
                continue
            got = torch.from_numpy(load_tensor(g, t))
            if name.endswith("attn_qkv.weight"):
                prefix = "model.language_model.layers." + name.split(".")[1] + ".self_attn."
                rows = [state[prefix + p + "_proj.weight"].shape[0] for p in "qkv"]
                for p, part in zip("qkv", got.split(rows)):
                    state[prefix + p + "_proj.weight"].copy_(part)
                continue
            hf = _hf_of(model, name, got)
            state[hf].copy_(got.reshape(state[hf].shape))
    return golden(model, VOCAB_SIZE, seed)


def _hf_of(model, gguf_name: str, values) -> str:
    """The HF parameter a llama.cpp tensor came from: by name shape and nearest values."""
    state = model.state_dict()
    best, err = None, float("inf")
    for hf, p in state.items():
        if p.numel() != values.numel() or hf.startswith(("model.vision", "model.audio", "model.embed_")):
            continue
        e = float((p.reshape(-1) - values.reshape(-1)).abs().max())
        if e < err:
            best, err = hf, e
    if best is None or err > 0.05:
        raise SystemExit(f"no HF weight matches {gguf_name} (closest differs by {err})")
    return best


def forms_parser(doc: str) -> argparse.ArgumentParser:
    """The options of the tools that make tests/fixtures/forms/: --out and --seed."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "forms")
    p.add_argument("--seed", type=int, default=0)
    return p


def read_manifest(out: Path) -> tuple[Path, dict]:
    """The forms' MANIFEST.json (file -> size) and its entries so far: each tool keeps the others'."""
    path = out / "MANIFEST.json"
    return path, json.loads(path.read_text()) if path.exists() else {}


def main() -> int:
    p = forms_parser(__doc__)
    p.add_argument("--only-12b", action="store_true", help="make gemma4-12b.gguf and its golden only")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path, manifest = read_manifest(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        for stem, text, vision, audio in () if args.only_12b else (("dense", DENSE, VISION, AUDIO),
                                                                   ("moe", MOE, VISION, None)):
            model = multimodal(text, vision, audio, args.seed)
            ckpt = Path(tmp) / stem
            write_checkpoint(model, ckpt, "Gemma4ForConditionalGeneration")
            names = round_as_stored(model)
            gold = golden(model, VOCAB_SIZE, args.seed + 1)
            for published in (False, True):
                dest = args.out / f"ollama-{stem}{'-published' if published else ''}.gguf"
                ollama_convert.convert(ckpt, dest, published)
                check_values(model, names, dest, published)
                np.savez_compressed(dest.with_suffix(".golden.npz"), **gold)
                manifest[dest.name] = dest.stat().st_size
            if stem == "dense":        # llama.cpp's --fuse-qkv, from the same checkpoint
                fresh = multimodal(text, vision, audio, args.seed)
                dest = args.out / "llamacpp-dense-fused-qkv.gguf"
                llama_convert(ckpt, dest, "q8_0", "--fuse-qkv")
                np.savez_compressed(dest.with_suffix(".golden.npz"), **llama_golden(fresh, dest, args.seed + 1))
                manifest[dest.name] = dest.stat().st_size
        model = unified(args.seed)
        ckpt = Path(tmp) / "unified"
        write_checkpoint(model, ckpt, "Gemma4UnifiedForConditionalGeneration", suppress=SUPPRESS)
        dest = args.out / "gemma4-12b.gguf"
        llama_convert(ckpt, dest, "f32")
        np.savez_compressed(dest.with_suffix(".golden.npz"), **llama_golden(model, dest, args.seed + 1))
        manifest[dest.name] = dest.stat().st_size
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    for name, size in manifest.items():
        print(f"{name}: {size / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
