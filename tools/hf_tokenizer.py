"""Build a Hugging Face tokenizer (tokenizer.json) from a Gemma 4 GGUF's vocabulary.

Two uses: the independent implementation our tokenizer is tested against
(HF `tokenizers` runs its own BPE), and the tokenizer files llama.cpp's converter
needs beside a tiny fixture model. `reduce_vocab` cuts the vocabulary to its first
N ids with the merges that stay valid, so the committed fixtures stay small. Ids are
not renumbered: the text specials (<pad> .. <turn|>, ids < 256) and the byte tokens
(<0x00>..<0xFF>, ids 238..493) lead Gemma 4's vocabulary, so any N past the last byte
token keeps them all; the image/audio/video markers near the end are dropped.

    python tools/hf_tokenizer.py VOCAB.gguf OUT_DIR [--keep N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CONTROL, USER_DEFINED, BYTE = 3, 4, 6


def reduce_vocab(meta: dict, keep: int) -> dict:
    """tokenizer.ggml.* metadata for the first `keep` ids and the merges among them."""
    types = meta.get("tokenizer.ggml.token_type") or []
    last_byte = max((i for i, t in enumerate(types) if t == BYTE), default=-1)
    if keep <= last_byte:
        raise ValueError(f"keep={keep} would drop byte tokens (the last is id {last_byte}); "
                         f"byte fallback needs all 256")
    tokens = meta["tokenizer.ggml.tokens"][:keep]
    kept = set(tokens)
    merges = []
    for m in meta["tokenizer.ggml.merges"]:
        cut = m.find(" ", 1)
        left, right = m[:cut], m[cut + 1:]
        if left in kept and right in kept and left + right in kept:
            merges.append(m)
    out = {k: v for k, v in meta.items() if k.startswith("tokenizer.")}   # ids, flags, chat template
    out["tokenizer.ggml.tokens"] = tokens
    out["tokenizer.ggml.merges"] = merges
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in meta:
            out[key] = meta[key][:keep]
    return out


def build_tokenizer_json(meta: dict, keep: int | None = None) -> dict:
    """tokenizer.json (HF `tokenizers` format) equivalent to llama.cpp's gemma4 tokenizer.

    With `keep`, for the vocabulary cut to its first `keep` ids (see reduce_vocab)."""
    if keep is not None:
        meta = reduce_vocab(meta, keep)
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    merges = []
    for m in meta["tokenizer.ggml.merges"]:
        cut = m.find(" ", 1)
        merges.append([m[:cut], m[cut + 1:]])
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == CONTROL}
             for i, t in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        # llama.cpp splits runs of newlines from the rest and runs BPE on each piece
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\n+"}, "behavior": "Isolated", "invert": False},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }


def tokenizer_config(meta: dict) -> dict:
    """tokenizer_config.json: every control token is named special, so that llama.cpp's
    converter (which asks transformers for the special ids) types them CONTROL again."""
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]

    def tok(key, default):
        i = meta.get(key)
        return tokens[i] if i is not None and i < len(tokens) else default
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": True, "add_eos_token": False,
           "bos_token": tok("tokenizer.ggml.bos_token_id", "<bos>"),
           "eos_token": tok("tokenizer.ggml.eos_token_id", "<eos>"),
           "pad_token": tok("tokenizer.ggml.padding_token_id", "<pad>"),
           "unk_token": tok("tokenizer.ggml.unknown_token_id", "<unk>"),
           "mask_token": tok("tokenizer.ggml.mask_token_id", "<mask>"),
           "model_max_length": 1 << 20}
    named = {cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")}
    cfg["extra_special_tokens"] = [t for t, ty in zip(tokens, types) if ty == CONTROL and t not in named]
    if "tokenizer.chat_template" in meta:
        cfg["chat_template"] = meta["tokenizer.chat_template"]
    return cfg


def write_tokenizer(meta: dict, out_dir: str | Path) -> None:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(build_tokenizer_json(meta), ensure_ascii=False), encoding="utf-8")
    cfg = tokenizer_config(meta)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=1), encoding="utf-8")
    specials = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")}
    (out / "special_tokens_map.json").write_text(json.dumps(specials), encoding="utf-8")


def hf_tokenizer(meta: dict, keep: int | None = None):
    """A `tokenizers.Tokenizer` built from the metadata (tests)."""
    from tokenizers import Tokenizer
    return Tokenizer.from_str(json.dumps(build_tokenizer_json(meta, keep)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("vocab_gguf")
    ap.add_argument("out_dir")
    ap.add_argument("--keep", type=int, default=0, help="cut the vocabulary to its first N ids")
    args = ap.parse_args()
    from pyapp.gguf import read_gguf
    meta = read_gguf(args.vocab_gguf).metadata
    if args.keep:
        meta = reduce_vocab(meta, args.keep)
    write_tokenizer(meta, args.out_dir)
    print(f"wrote {args.out_dir}: {len(meta['tokenizer.ggml.tokens'])} tokens, "
          f"{len(meta['tokenizer.ggml.merges'])} merges")
    return 0


if __name__ == "__main__":
    sys.exit(main())
