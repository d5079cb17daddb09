"""Write a Gemma 4 Hugging Face checkpoint as a GGUF the way Ollama's converter does.

    python tools/ollama_convert.py HF_DIR OUT.gguf [--published]

Our own code, written from reading Ollama's Go source (github.com/ollama/ollama):
`convert/convert_gemma4.go` (CG, commit 96b202d34, PR #15214: the only commit of that
file), `convert/convert.go` (CV), `convert/tokenizer.go` (TK), `convert/reader.go` (RD)
and `llama/compat/llama-ollama-compat.cpp` (CMP: `handle_gemma4`, what llama.cpp must
change in the published blobs). The test fixtures of this form are made with it
(tools/make_ollama_fixtures.py), so the app is tested on the files Ollama users have.

What it writes (each rule and where it comes from):
- one GGUF holding the text model and, inline, the vision (`v.*`), audio (`a.*`) and
  projector (`mm.*`, `mm.a.*`) tensors: Gemma 4 has no separate projector layer in
  Ollama (CG does not implement MultimodalConverter; CV L431-448).
- keys: `general.architecture = gemma4` (CG L71), `general.file_type = 1` whatever the
  tensors are (CV L132), the text keys read from `text_config` only (CG L75-162), the
  vision keys `gemma4.vision.*` (CG L164-187) and audio keys `gemma4.audio.*` (CG
  L189-204); `feed_forward_length` an INT32 array only with a double-wide MLP and shared
  KV layers (CG L80-94), `head_count_kv` an array only when the global KV head count
  differs (CG L97-110), `embedding_length_per_layer_input` always (CG L157-162); no
  `general.name`; keys in sorted order (fs/ggml/gguf.go L620-751).
- tokenizer (TK L247-289, CG L72-73): `tokenizer.ggml.model = "llama"`,
  `tokenizer.ggml.pre = "gemma4"`, tokens from tokenizer.json sorted by id, scores = the
  token id, types: an added token flagged `special` CONTROL, another added token
  USER_DEFINED, everything else NORMAL (the `<0xXX>` byte tokens too); merges; special
  ids from tokenizer_config.json looked up among the added tokens (TK L115-205);
  `add_*_token` flags always written, false when unset (CV at 96b202d34 ~L150); list-valued
  ids of generation_config.json as `*_token_ids` (CV L149-157); the chat template only
  from tokenizer_config.json (CV L145-147).
- tensor names: Go's strings.NewReplacer over the safetensors key with the pairs of CG
  L442-573, in their order (first listed wins at a position; no rescan), then CG
  `Tensors()` fixups: `embedding_post_projection_norm` dropped (L233-236); vision block
  leaf renames (L239-246); audio `per_dim_scale` softplus'd with `.weight` added
  (L249-252, L428-434); the depthwise conv squeezed to 2-D (L255-257); `v.patch_embd`
  permuted (h, w, c) -> (c, h, w) and stored 4-D F16 (L283-299, L396-424);
  `v.position_embd` kept 3-D F32 (L301-302); experts as stored, `[E, out, in]`
  (L274-276); `rope_freqs.weight` synthesized: global_head_dim/2 factors, 1.0 for the
  rotated pairs and 1e30 for the rest, partial rotary factor 0.25 unless given (L316-345);
  0-dim clamp scalars as 1-element tensors (L262-264).
- types (RD L40-70, reader_safetensors.go L137-152): F32 for the router projection
  (`.ffn_gate_inp.weight`), biases, `a.conv1d.*`, `.conv_dw.`, `v.position_embd` and every
  1-D tensor; other tensors F16, or BF16 when the source is BF16 and the name does not
  start with `v.` or `mm.`.

`--published` writes what the original library tags (`gemma4:e2b`, `e4b`, `26b`, `31b`)
hold, as CMP's `handle_gemma4` shows by what it must undo: the experts split into
`ffn_gate_exps` + `ffn_up_exps` (CMP L1095-1110; halves of the fused tensor, gate
first), the per-expert scale as `ffn_gate_inp.per_expert_scale` (CMP L1111), and the
vision clamp bounds packed into one `v.clamp_data` tensor (CG L210-227, L347-391: per
vision layer, for q, k, v, out, gate, up, down, the four bounds in_min, in_max, out_min,
out_max; then the projector's four) instead of the per-linear scalars.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4

# CG L442-573, in order: at each position of a name the first pair that matches is applied.
REPLACEMENTS = [
    # clippable linears wrap a Linear
    (".linear.weight", ".weight"), (".linear.bias", ".bias"),
    # audio subsampling front end
    ("model.audio_tower.subsample_conv_projection.conv_0.conv", "a.conv1d.0"),
    ("model.audio_tower.subsample_conv_projection.conv_0.norm", "a.conv1d.0.norm"),
    ("model.audio_tower.subsample_conv_projection.conv_1.conv", "a.conv1d.1"),
    ("model.audio_tower.subsample_conv_projection.conv_1.norm", "a.conv1d.1.norm"),
    ("model.audio_tower.subsample_conv_projection.layer0.conv", "a.conv1d.0"),
    ("model.audio_tower.subsample_conv_projection.layer0.norm", "a.conv1d.0.norm"),
    ("model.audio_tower.subsample_conv_projection.layer1.conv", "a.conv1d.1"),
    ("model.audio_tower.subsample_conv_projection.layer1.norm", "a.conv1d.1.norm"),
    ("model.audio_tower.subsample_conv_projection.input_proj_linear", "a.pre_encode.out"),
    ("model.audio_tower.conformer", "a.blk"), ("model.audio_tower.layers", "a.blk"),
    # conformer block leaves (old and new transformers names)
    ("attention.attn.relative_position_embedding.pos_proj", "linear_pos"),
    ("self_attn.relative_k_proj", "linear_pos"),
    ("attention.attn.per_dim_key_scale", "per_dim_k_scale"),
    ("attention.attn.per_dim_scale", "per_dim_scale"), ("self_attn.per_dim_scale", "per_dim_scale"),
    ("attention.attn.q_proj", "attn_q"), ("attention.attn.k_proj", "attn_k"), ("attention.attn.v_proj", "attn_v"),
    ("attention.pre_attn_norm", "ln1"), ("norm_pre_attn", "ln1"),
    ("attention.post_norm", "ln2"), ("norm_post_attn", "ln2"),
    ("attention.post", "attn_out"), ("self_attn.post", "attn_out"),
    ("ffw_layer_start.pre_layer_norm", "ffn_norm"), ("feed_forward1.pre_layer_norm", "ffn_norm"),
    ("ffw_layer_start.post_layer_norm", "ffn_post_norm"), ("feed_forward1.post_layer_norm", "ffn_post_norm"),
    ("ffw_layer_start.ffw_layer_1", "ffn_up"), ("feed_forward1.ffw_layer_1", "ffn_up"),
    ("ffw_layer_start.ffw_layer_2", "ffn_down"), ("feed_forward1.ffw_layer_2", "ffn_down"),
    ("ffw_layer_end.pre_layer_norm", "ffn_norm_1"), ("feed_forward2.pre_layer_norm", "ffn_norm_1"),
    ("ffw_layer_end.post_layer_norm", "ffn_post_norm_1"), ("feed_forward2.post_layer_norm", "ffn_post_norm_1"),
    ("ffw_layer_end.ffw_layer_1", "ffn_up_1"), ("feed_forward2.ffw_layer_1", "ffn_up_1"),
    ("ffw_layer_end.ffw_layer_2", "ffn_down_1"), ("feed_forward2.ffw_layer_2", "ffn_down_1"),
    ("lconv1d.depthwise_conv1d", "conv_dw"), ("lconv1d.pre_layer_norm", "conv_norm"),
    ("lconv1d.conv_norm", "norm_conv"), ("lconv1d.linear_start", "conv_pw1"), ("lconv1d.linear_end", "conv_pw2"),
    ("norm_out", "layer_pre_norm"),
    # audio projectors
    ("model.embed_audio.embedding_projection", "mm.a.input_projection"),
    ("model.audio_tower.output_proj", "mm.a.fc"),
    # vision
    ("model.vision_tower.encoder.layers", "v.blk"),
    ("model.vision_tower.patch_embedder.input_proj", "v.patch_embd"),
    ("model.vision_tower.patch_embedder.position_embedding_table", "v.position_embd.weight"),
    ("model.vision_tower.std_bias", "v.std_bias"), ("model.vision_tower.std_scale", "v.std_scale"),
    ("model.embed_vision.embedding_projection", "mm.input_projection"),
    # text
    ("model.language_model.embed_tokens_per_layer", "per_layer_token_embd"),
    ("model.language_model.embed_tokens", "token_embd"),
    ("model.language_model.per_layer_model_projection", "per_layer_model_proj"),
    ("model.language_model.per_layer_projection_norm", "per_layer_proj_norm"),
    ("model.language_model.norm", "output_norm"),
    ("model.language_model.layers", "blk"),
    # leaves shared by the text and vision blocks
    ("input_layernorm", "attn_norm"),
    ("self_attn.q_proj", "attn_q"), ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_proj", "attn_k"), ("self_attn.k_norm", "attn_k_norm"),
    ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"), ("mlp.down_proj", "ffn_down"), ("mlp.up_proj", "ffn_up"),
    # norms: the _2 / _1 forms before their prefix
    ("post_attention_layernorm", "post_attention_norm"),
    ("pre_feedforward_layernorm_2", "pre_ffw_norm_2"), ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm_1", "post_ffw_norm_1"), ("post_feedforward_layernorm_2", "post_ffw_norm_2"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
    # per-layer embeddings
    ("per_layer_input_gate", "inp_gate"), ("per_layer_projection", "proj"),
    ("post_per_layer_input_norm", "post_norm"),
    # mixture of experts
    ("router.proj", "ffn_gate_inp"), ("router.scale", "ffn_gate_inp.scale"),
    ("router.per_expert_scale.weight", "ffn_down_exps.scale"), ("router.per_expert_scale", "ffn_down_exps.scale"),
    ("experts.gate_up_proj.weight", "ffn_gate_up_exps.weight"), ("experts.gate_up_proj", "ffn_gate_up_exps.weight"),
    ("experts.down_proj.weight", "ffn_down_exps.weight"), ("experts.down_proj", "ffn_down_exps.weight"),
    ("layer_scalar", "layer_output_scale.weight"),
]
# CG L239-246: vision block leaves get llama.cpp's clip names
VISION_LEAVES = [(".attn_norm.", ".ln1."), (".ffn_norm.", ".ln2."), (".attn_output.", ".attn_out."),
                 (".post_attention_norm.", ".attn_post_norm."), (".post_ffw_norm.", ".ffn_post_norm."),
                 (".layer_output_scale.", ".out_scale.")]
CLAMP_BOUNDS = ("input_min", "input_max", "output_min", "output_max")
CLAMPED_LINEARS = ("attn_q", "attn_k", "attn_v", "attn_out", "ffn_gate", "ffn_up", "ffn_down")   # CG L347-391


def replace_all(name: str, pairs=REPLACEMENTS) -> str:
    """Go's strings.NewReplacer: one left-to-right pass, the first listed pair matching at a
    position wins, replaced text is not scanned again."""
    out, i = [], 0
    while i < len(name):
        for old, new in pairs:
            if name.startswith(old, i):
                out.append(new)
                i += len(old)
                break
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


def gguf_name(hf_name: str) -> str | None:
    """The tensor name Ollama's converter gives a safetensors key (None: dropped)."""
    if "embedding_post_projection_norm" in hf_name:          # CG L233-236
        return None
    name = replace_all(hf_name)
    if name.startswith("v.blk."):                              # CG L239-246
        for old, new in VISION_LEAVES:
            name = name.replace(old, new)
    if name.startswith("a.blk.") and name.endswith("per_dim_scale"):   # CG L249-252
        name += ".weight"
    return name


def tensor_type(name: str, shape: tuple, source_bf16: bool) -> str:
    """RD L40-70: the ggml type Ollama writes a tensor as."""
    forced_f32 = (name.endswith(".ffn_gate_inp.weight") or name.endswith(".bias") or name.startswith("a.conv1d.")
                  or ".conv_dw." in name or name == "v.position_embd.weight")
    if forced_f32 or len(shape) <= 1:
        return "F32"
    if source_bf16 and not name.startswith(("v.", "s.", "mm.")):
        return "BF16"
    return "F16"


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


def _patch_embd(w: np.ndarray, patch: int, channels: int) -> np.ndarray:
    """CG L396-424: rows of (h, w, c) pixels, c fastest -> [n, c, h, w]."""
    n = w.shape[0]
    return w.reshape(n, patch, patch, channels).transpose(0, 3, 1, 2).copy()


def rope_freqs(text: dict) -> np.ndarray | None:
    """CG L316-345: the global layers' frequency factors (1e30 leaves a pair unrotated)."""
    head_dim = text.get("global_head_dim") or 0
    if head_dim <= 0:
        return None
    full = (text.get("rope_parameters") or {}).get("full_attention") or {}
    n_rot = int(head_dim * float(full.get("partial_rotary_factor", 0.25)) / 2)
    return np.array([1.0] * n_rot + [1e30] * (head_dim // 2 - n_rot), np.float32)


def read_safetensors(hf_dir: Path) -> dict[str, tuple[np.ndarray, bool]]:
    """name -> (float32 values, stored as BF16)."""
    from safetensors import safe_open
    out = {}
    for path in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():
                t = f.get_tensor(key)
                out[key] = (t.float().numpy(), str(t.dtype) == "torch.bfloat16")
    return out


def convert_tensors(hf_dir: Path, config: dict, published: bool) -> list[tuple[str, np.ndarray, str]]:
    """(GGUF name, values in torch order, ggml type) for every tensor the converter writes."""
    vision = config.get("vision_config") or {}
    text = config.get("text_config") or {}
    out, clamps = [], {}
    for hf_name, (data, bf16) in read_safetensors(hf_dir).items():
        name = gguf_name(hf_name)
        if name is None:
            continue
        if data.ndim == 0:                                     # CG L262-264
            data = data.reshape(1)
        if name.startswith("a.blk.") and name.endswith("per_dim_scale.weight"):
            data = _softplus(data)
        if ".conv_dw." in name and data.ndim == 3:            # [C, 1, K] -> [C, K]
            data = data.reshape(data.shape[0], data.shape[2])
        if name == "v.patch_embd.weight":
            data = _patch_embd(data, int(vision.get("patch_size", 16)), int(vision.get("num_channels", 3)))
            out.append((name, data, "F16"))
            continue
        leaf = name.rsplit(".", 1)[-1]
        if published and leaf in CLAMP_BOUNDS and name.startswith(("v.blk.", "mm.input_projection.")):
            clamps[name] = float(data.reshape(-1)[0])
            continue
        if published and name.endswith("ffn_gate_up_exps.weight"):    # CMP L1095-1110: stored split
            half = data.shape[1] // 2
            block = name[:-len("ffn_gate_up_exps.weight")]
            for part, rows in (("ffn_gate_exps.weight", data[:, :half]), ("ffn_up_exps.weight", data[:, half:])):
                out.append((block + part, np.ascontiguousarray(rows), tensor_type(block + part, rows.shape, bf16)))
            continue
        if published and name.endswith("ffn_down_exps.scale"):         # CMP L1111
            name = name[:-len("ffn_down_exps.scale")] + "ffn_gate_inp.per_expert_scale"
        out.append((name, data, tensor_type(name, data.shape, bf16)))
    if clamps:
        out.append(("v.clamp_data", _pack_clamps(clamps, int(vision.get("num_hidden_layers", 0))), "F32"))
    if (freqs := rope_freqs(text)) is not None:
        out.append(("rope_freqs.weight", freqs, "F32"))
    return out


def _pack_clamps(clamps: dict, n_layers: int) -> np.ndarray:
    """CG L347-391: per vision layer, per clamped linear, the four bounds; then the projector's."""
    values = []
    prefixes = [f"v.blk.{i}.{lin}." for i in range(n_layers) for lin in CLAMPED_LINEARS] + ["mm.input_projection."]
    for prefix in prefixes:
        for bound in CLAMP_BOUNDS:
            values.append(clamps.get(prefix + bound, float("-inf") if bound.endswith("min") else float("inf")))
    return np.array(values, np.float32)


def text_keys(config: dict) -> dict:
    """(value, gguf value type) per key: CG L75-162, from text_config only."""
    import gguf
    U32, F32, I32, BOOL = (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.INT32,
                           gguf.GGUFValueType.BOOL)
    t = config.get("text_config") or {}
    n = t["num_hidden_layers"]
    keys = {"block_count": (n, U32), "embedding_length": (t["hidden_size"], U32),
            "context_length": (t["max_position_embeddings"], U32),
            "attention.head_count": (t["num_attention_heads"], U32),
            "attention.key_length": (t.get("global_head_dim") or 0, U32),
            "attention.value_length": (t.get("global_head_dim") or 0, U32),
            "attention.key_length_swa": (t["head_dim"], U32), "attention.value_length_swa": (t["head_dim"], U32),
            "attention.layer_norm_rms_epsilon": (t["rms_norm_eps"], F32),
            "attention.sliding_window": (t["sliding_window"], U32),
            "attention.shared_kv_layers": (t.get("num_kv_shared_layers") or 0, U32),
            "embedding_length_per_layer_input": (t.get("hidden_size_per_layer_input") or 0, U32)}
    shared = t.get("num_kv_shared_layers") or 0
    if t.get("use_double_wide_mlp") and shared > 0:
        ff = t["intermediate_size"]
        keys["feed_forward_length"] = ([ff * 2 if i >= n - shared else ff for i in range(n)], I32)
    else:
        keys["feed_forward_length"] = (t["intermediate_size"], U32)
    kv, global_kv, types = t["num_key_value_heads"], t.get("num_global_key_value_heads"), t.get("layer_types") or []
    if global_kv is not None and global_kv != kv and types:
        keys["attention.head_count_kv"] = ([kv if lt == "sliding_attention" else global_kv for lt in types], I32)
    else:
        keys["attention.head_count_kv"] = (kv, U32)
    if types:
        keys["attention.sliding_window_pattern"] = ([lt == "sliding_attention" for lt in types], BOOL)
    rope = t.get("rope_parameters") or {}
    if "full_attention" in rope:
        keys["rope.freq_base"] = (rope["full_attention"]["rope_theta"], F32)
        keys["rope.dimension_count"] = (t.get("global_head_dim") or 0, U32)
    if "sliding_attention" in rope:
        keys["rope.freq_base_swa"] = (rope["sliding_attention"]["rope_theta"], F32)
        keys["rope.dimension_count_swa"] = (t["head_dim"], U32)
    if (t.get("final_logit_softcapping") or 0) > 0:
        keys["final_logit_softcapping"] = (t["final_logit_softcapping"], F32)
    if t.get("enable_moe_block") and t.get("num_experts"):
        keys["expert_count"] = (t["num_experts"], U32)
        keys["expert_used_count"] = (t["top_k_experts"], U32)
        keys["expert_feed_forward_length"] = (t["moe_intermediate_size"], U32)
    v = config.get("vision_config") or {}
    if (v.get("num_hidden_layers") or 0) > 0:                 # CG L164-187
        keys |= {"vision.block_count": (v["num_hidden_layers"], U32),
                 "vision.embedding_length": (v["hidden_size"], U32),
                 "vision.attention.head_count": (v["num_attention_heads"], U32),
                 "vision.feed_forward_length": (v["intermediate_size"], U32),
                 "vision.patch_size": (v.get("patch_size", 16), U32),
                 "vision.num_channels": (v.get("num_channels", 3), U32),
                 "vision.projector.scale_factor": (v.get("pooling_kernel_size", 3), U32),
                 "vision.attention.layer_norm_epsilon": (v.get("layer_norm_eps", 1e-6), F32)}
    a = config.get("audio_config") or {}
    if (a.get("num_hidden_layers") or 0) > 0:                 # CG L189-204
        keys |= {"audio.block_count": (a["num_hidden_layers"], U32),
                 "audio.embedding_length": (a["hidden_size"], U32),
                 "audio.feed_forward_length": (4 * a["hidden_size"], U32),
                 "audio.attention.head_count": (a["num_attention_heads"], U32),
                 "audio.attention.layer_norm_epsilon": (a.get("rms_norm_eps", 1e-6), F32)}
        if (a.get("conv_kernel_size") or 0) > 0:
            keys["audio.conv_kernel_size"] = (a["conv_kernel_size"], U32)
    return {f"gemma4.{k}": v for k, v in keys.items()}


def tokenizer_keys(hf_dir: Path) -> dict:
    """TK L247-289 and L115-205, CV L141-157: the tokenizer as Ollama writes it."""
    import gguf
    T = gguf.GGUFValueType
    tj = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
    tc_path = hf_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8")) if tc_path.exists() else {}
    by_id = {i: (t, NORMAL) for t, i in tj["model"]["vocab"].items()}
    added = {}
    for a in tj.get("added_tokens", []):
        by_id[a["id"]] = (a["content"], CONTROL if a.get("special") else USER_DEFINED)
        added[a["content"]] = a["id"]
    ids = sorted(by_id)
    tokens = [by_id[i][0] for i in ids]
    merges = tj["model"].get("merges") or []
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    keys = {"tokenizer.ggml.model": ("llama", T.STRING), "tokenizer.ggml.pre": ("gemma4", T.STRING),
            "tokenizer.ggml.tokens": (tokens, T.STRING),
            "tokenizer.ggml.scores": ([float(i) for i in ids], T.FLOAT32),
            "tokenizer.ggml.token_type": ([by_id[i][1] for i in ids], T.INT32)}
    if merges:
        keys["tokenizer.ggml.merges"] = (merges, T.STRING)
    if isinstance(tc.get("chat_template"), str):
        keys["tokenizer.chat_template"] = (tc["chat_template"], T.STRING)
    for kind, stem in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("sep", "seperator"),
                       ("pad", "padding"), ("cls", "cls"), ("mask", "mask")):
        content = tc.get(f"{kind}_token")
        content = content.get("content") if isinstance(content, dict) else content
        if content in added:
            keys[f"tokenizer.ggml.{stem}_token_id"] = (added[content], T.UINT32)
            keys[f"tokenizer.ggml.add_{kind}_token"] = (bool(tc.get(f"add_{kind}_token", False)), T.BOOL)
    gen_path = hf_dir / "generation_config.json"
    if gen_path.exists():
        gen = json.loads(gen_path.read_text(encoding="utf-8"))
        for kind, stem in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
            if isinstance(gen.get(f"{kind}_token_id"), list):
                keys[f"tokenizer.ggml.{stem}_token_ids"] = (list(gen[f"{kind}_token_id"]), T.INT32)
    return keys


def convert(hf_dir: Path, out: Path, published: bool = False) -> None:
    import gguf
    config = json.loads((hf_dir / "config.json").read_text())
    if "text_config" not in config:
        raise SystemExit(f"{hf_dir}: config.json has no text_config (Ollama reads Gemma 4 settings only from it)")
    writer = gguf.GGUFWriter(str(out), arch="gemma4")
    keys = {"general.file_type": (1, gguf.GGUFValueType.UINT32),
            "general.quantization_version": (2, gguf.GGUFValueType.UINT32)}
    keys |= text_keys(config) | tokenizer_keys(hf_dir)
    for key in sorted(keys):
        value, vtype = keys[key]
        if isinstance(value, list):
            writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=vtype)
        else:
            writer.add_key_value(key, value, vtype)

    def order(item):     # fs/ggml/gguf.go: by block number, then name; the rest last
        parts = item[0].split(".")
        block = int(parts[1]) if parts[0] == "blk" and parts[1].isdigit() else 1 << 30
        return block, item[0]

    for name, data, qtype in sorted(convert_tensors(hf_dir, config, published), key=order):
        if qtype == "F32":
            writer.add_tensor(name, data.astype(np.float32))
        elif qtype == "F16":
            writer.add_tensor(name, data.astype(np.float16))
        else:      # BF16: the top 16 bits, rounded to nearest even
            bits = data.astype(np.float32).view(np.uint32)
            bf = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            writer.add_tensor(name, bf.view(np.uint8).reshape(*data.shape[:-1], -1),
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("hf_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--published", action="store_true",
                   help="the original library tags' form: split experts, per_expert_scale, packed v.clamp_data")
    args = p.parse_args()
    convert(args.hf_dir, args.out, args.published)
    print(f"{args.out}: {args.out.stat().st_size / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
