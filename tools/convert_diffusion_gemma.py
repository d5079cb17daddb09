#!/usr/bin/env python3
"""Convert a Hugging Face DiffusionGemma checkpoint (`DiffusionGemmaForBlockDiffusion`) to GGUF.

    python tools/convert_diffusion_gemma.py HF_DIR OUT.gguf [--outtype f32|f16|q8_0|q4_k] [--vocab VOCAB.gguf]

HF_DIR holds config.json, *.safetensors and (optionally) generation_config.json, as transformers
(>= 5.23, models/diffusion_gemma) saves them. The layout is the one in shared/notes/diffusion_gemma.md (b):

* The text stack is a Gemma 4 26B-A4B stack, so every tensor shared with Gemma 4 takes the name our
  reader binds for it (pyapp/model/weights.py, the names llama.cpp's Gemma 4 converter writes), taken
  from weights.py itself rather than spelled here. The checkpoint stores the decoder's copy of each
  shared text weight; the encoder's are tied to it, as are the LM head and the encoder's embedding
  and norm, so they are written once. Norm gains are written as they are (no +1, as for Gemma 4);
  nothing is permuted (Gemma's RoPE is NeoX-style, on the HF layout).
* The extras: the self-conditioning MLP (`self_cond_pre_norm`, `self_cond_gate`, `self_cond_up`,
  `self_cond_down`) and the encoder's layer scalars (`blk.N.enc_layer_output_scale.weight`; the
  decoder's are Gemma 4's `blk.N.layer_output_scale.weight`). The encoder's scalars are the only
  weights that differ between the two passes.
* The vision tower and its embedder are skipped (text only).
* `rope_freqs.weight` as llama.cpp writes it for Gemma 4: the full layers' "proportional" RoPE as a
  full-width NeoX rope whose unrotated pairs get frequency factor 1e30.
* Metadata: the hyperparameters under the architecture's keys, as llama.cpp writes them for gemma4, plus
  `diffusion-gemma.diffusion.*`: canvas_length, shift_logits (false: logit j scores canvas position j)
  and the generation defaults of generation_config.json (HF's built-in defaults where it has none);
  the eos ids as `tokenizer.ggml.eos_token_ids`, the list our tokenizer reads.

The architecture is `diffusion-gemma`, not `gemma4`: the tensors are a superset of a Gemma 4 26B-A4B's,
so a Gemma 4 loader (llama.cpp, Ollama, this app's engine) would otherwise load the file and run it as
an autoregressive model, without the self-conditioning, with the decoder's layer scales and causal
attention: fluent-looking garbage instead of a clear refusal. A distinct name makes every loader say
what the file is; the keys under it are gemma4's, so a DiffusionGemma forward reads them with the same
code. (`diffusion-gemma` follows llama.cpp's spelling of architecture names, e.g. `llada-moe`.)

Types, as llama.cpp's convert_hf_to_gguf.py chooses them: 1-D tensors, norms, the router and the
`.scale` tensors stay F32; the rest take --outtype. q4_k is like llama.cpp's Q4_K_M where it matters
here: the tied embedding (the LM head) and attn_v go to Q6_K. Rows whose length the type's block does
not divide fall back as llama.cpp's quantizer does (tools/make_bench_model.storage_type: Q4_K -> Q5_0,
Q6_K -> Q8_0, then F16). Quantization is pyapp.reference.quants' (round to nearest).

Tokenizer: DiffusionGemma uses Gemma 4's vocabulary. --vocab GGUF copies the `tokenizer.*` keys of a
Gemma 4 GGUF (default: llama.cpp's ggml-vocab-gemma-4.gguf in .cache/llama.cpp/models, if present);
a smaller model vocabulary gets the first N ids (tools/hf_tokenizer.reduce_vocab, as the test
fixtures do). --no-vocab writes none.

Needs numpy and gguf only (plus pyapp.ggml and pyapp.reference.quants from this checkout): safetensors
files are read here directly (numpy has no bfloat16, so the safetensors package's numpy loader cannot
read a bf16 checkpoint), tensor by tensor, memory-mapped, and written to the GGUF as they are
converted, so memory stays at about one tensor.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType, GGUFWriter, LlamaFileType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                  # this checkout's pyapp
sys.path.insert(0, str(ROOT / "tools"))        # make_bench_model, hf_tokenizer
from make_bench_model import FILE_TYPES, read_kv, storage_type  # noqa: E402

from pyapp import ggml  # noqa: E402
from pyapp.model import weights as W  # noqa: E402
from pyapp.families.diffusion_gemma import weights as DW  # noqa: E402

ARCH = "diffusion-gemma"
HF_ARCHITECTURE = "DiffusionGemmaForBlockDiffusion"
DEFAULT_VOCAB = ROOT / ".cache" / "llama.cpp" / "models" / "ggml-vocab-gemma-4.gguf"
OUTTYPES = {"f32": T.F32, "f16": T.F16, "q8_0": T.Q8_0, "q4_k": T.Q4_K}

# DiffusionGemmaTextConfig's defaults (transformers 5.23), for keys a config.json leaves out
TEXT_DEFAULTS = dict(vocab_size=262_144, hidden_size=2304, intermediate_size=9216, num_hidden_layers=30,
                     num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                     hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131_072, rms_norm_eps=1e-6,
                     pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True,
                     sliding_window=512, final_logit_softcapping=30.0, use_bidirectional_attention=None,
                     attention_bias=False, global_head_dim=512)
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                   "rope_theta": 1_000_000.0}}
# DiffusionGemmaGenerationConfig._get_default_generation_params (transformers 5.23)
GENERATION_DEFAULTS = dict(max_new_tokens=256, max_denoising_steps=48, entropy_bound=0.1, t_min=0.4, t_max=0.8,
                           stability_threshold=1, confidence_threshold=0.005)

# Per-layer checkpoint names (after `model.decoder.layers.N.`) -> the pyapp.model.weights.LayerWeights field
LAYER_FIELDS = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v",            # sliding layers only: V is the raw K on full layers
    "self_attn.o_proj.weight": "attn_output",
    "self_attn.q_norm.weight": "attn_q_norm",
    "self_attn.k_norm.weight": "attn_k_norm",
    "post_attention_layernorm.weight": "post_attention_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1",
    "router.proj.weight": "router",
    "router.scale": "router_scale",
    "router.per_expert_scale": "experts_down_scale",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2",
    "experts.gate_up_proj": "experts_gate_up",      # [E, 2F, H]: gate rows then up rows, as llama.cpp's
    "experts.down_proj": "experts_down",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2",
    "post_feedforward_layernorm.weight": "post_ffw_norm",
    "layer_scalar": "output_scale",                 # the decoder's scale
}
GLOBAL_FIELDS = {"model.decoder.embed_tokens.weight": "token_embd", "model.decoder.norm.weight": "output_norm"}
# DiffusionGemma's own tensors (not in Gemma 4), declared in pyapp/families/diffusion_gemma/weights.py
EXTRA_NAMES = {hf: W.gguf_name(DW.DiffusionWeights, fld) for hf, fld in {
    "model.decoder.self_conditioning.pre_norm.weight": "self_cond_pre_norm",
    "model.decoder.self_conditioning.gate_proj.weight": "self_cond_gate",
    "model.decoder.self_conditioning.up_proj.weight": "self_cond_up",
    "model.decoder.self_conditioning.down_proj.weight": "self_cond_down",
}.items()}
ENC_LAYER_SCALE = W.gguf_name(DW.DiffusionLayerWeights, "enc_output_scale")    # blk.N. + this: the encoder's layer scalar
DECODER_LAYER = "model.decoder.layers."
ENCODER_LAYER = "model.encoder.language_model.layers."
SKIPPED = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")    # vision only
# tied copies of decoder weights, if a checkpoint stores them anyway (transformers does not)
TIED = ("lm_head.weight", "model.encoder.language_model.")


class ConvertError(ValueError):
    """The directory is not a DiffusionGemma checkpoint this converter understands."""


# ---------------------------------------------------------------- safetensors

_ST_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "F64": np.float64}


class Checkpoint:
    """The tensors of every *.safetensors file of a directory, memory-mapped, read on demand."""

    def __init__(self, directory: Path):
        self.entries: dict[str, tuple[Path, str, tuple[int, ...], int]] = {}
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise ConvertError(f"{directory} has no *.safetensors files")
        for path in files:
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                if not 2 <= n <= 1 << 30:
                    raise ConvertError(f"{path}: not a safetensors file (header length {n})")
                header = json.loads(f.read(n))
            base = 8 + n
            for name, e in header.items():
                if name == "__metadata__":
                    continue
                if name in self.entries:
                    raise ConvertError(f"{name} is in two files ({self.entries[name][0].name}, {path.name})")
                begin, end = e["data_offsets"]
                shape = tuple(int(d) for d in e["shape"])
                if e["dtype"] not in _ST_DTYPES:
                    raise ConvertError(f"{path.name}: {name} is {e['dtype']}; expected one of {sorted(_ST_DTYPES)}")
                if end - begin != math.prod(shape) * np.dtype(_ST_DTYPES[e["dtype"]]).itemsize:
                    raise ConvertError(f"{path.name}: {name}: {end - begin} bytes for shape {list(shape)}")
                self.entries[name] = (path, e["dtype"], shape, base + begin)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][2]

    def raw(self, name: str) -> np.ndarray:
        """The tensor as stored (bf16 as uint16), memory-mapped."""
        path, dtype, shape, offset = self.entries[name]
        return np.memmap(path, dtype=_ST_DTYPES[dtype], mode="r", offset=offset, shape=shape)

    def f32(self, name: str, rows: slice | None = None) -> np.ndarray:
        """float32 copy of the tensor (of its leading-axis slice `rows`)."""
        a = self.raw(name)
        if rows is not None:
            a = a[rows]
        if self.entries[name][1] == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        return np.asarray(a, dtype=np.float32)


# ---------------------------------------------------------------- config

def _layer_override(tc: dict, i: int) -> dict:
    plc = tc.get("per_layer_config") or {}
    return plc.get(str(i)) or plc.get(i) or {}


def read_config(hf_dir: Path) -> dict:
    """The hyperparameters the GGUF needs, from config.json (and generation_config.json), checked."""
    try:
        cfg = json.loads((hf_dir / "config.json").read_text())
    except FileNotFoundError:
        raise ConvertError(f"{hf_dir} has no config.json") from None
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") != "diffusion_gemma" and HF_ARCHITECTURE not in archs:
        raise ConvertError(f"{hf_dir}/config.json describes {archs or cfg.get('model_type')!r}, "
                           f"not a DiffusionGemma checkpoint ({HF_ARCHITECTURE})")
    tc = TEXT_DEFAULTS | (cfg.get("text_config") or {})
    for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        if not tc.get(key):
            raise ConvertError(f"text_config.{key} is {tc.get(key)!r}: DiffusionGemma has experts in every layer")
    if tc["use_bidirectional_attention"] == "all":
        raise ConvertError("text_config.use_bidirectional_attention is 'all' (a bidirectional encoder): the "
                           "GGUF layout assumes the causal encoder of the released model")
    if tc["hidden_activation"] != "gelu_pytorch_tanh" or tc["attention_bias"]:
        raise ConvertError(f"hidden_activation {tc['hidden_activation']!r}, attention_bias {tc['attention_bias']}: "
                           "expected gelu_pytorch_tanh without biases")
    if not cfg.get("tie_word_embeddings", True) or not tc["tie_word_embeddings"]:
        raise ConvertError("tie_word_embeddings is false: DiffusionGemma ties the LM head to the embedding")
    n = int(tc["num_hidden_layers"])
    types = list(tc.get("layer_types") or
                 ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)])
    if len(types) != n or any(t not in ("sliding_attention", "full_attention") for t in types):
        raise ConvertError(f"text_config.layer_types {types!r} for {n} layers")
    types[-1] = "full_attention"                     # as transformers forces it
    sliding = [t == "sliding_attention" for t in types]
    hd, kv = [], []
    for i, s in enumerate(sliding):
        o = _layer_override(tc, i)
        if "per_layer_config" in tc or s:
            hd.append(int(o.get("head_dim", tc["head_dim"])))
            kv.append(int(o.get("num_key_value_heads", tc["num_key_value_heads"])))
        else:
            hd.append(int(tc["global_head_dim"]))
            kv.append(int(tc.get("num_global_key_value_heads") or tc["num_key_value_heads"]))
    for kind in (True, False):
        dims = {d for d, s in zip(hd, sliding) if s == kind}
        if len(dims) > 1:
            raise ConvertError(f"{'sliding' if kind else 'full'} layers have head dims {sorted(dims)}; "
                               "GGUF stores one per layer kind")
    hd_swa = next((d for d, s in zip(hd, sliding) if s), tc["head_dim"])
    hd_full = next(d for d, s in zip(hd, sliding) if not s)
    rope = tc.get("rope_parameters") or DEFAULT_ROPE
    r_full, r_swa = rope.get("full_attention", {}), rope.get("sliding_attention", {})
    if r_full.get("rope_type", "proportional") != "proportional" or r_swa.get("rope_type", "default") != "default":
        raise ConvertError(f"rope_parameters {rope!r}: expected default RoPE on sliding layers and proportional "
                           "on full layers")
    factor_swa = float(r_swa.get("partial_rotary_factor", 1.0))
    factor_full = float(r_full.get("partial_rotary_factor", 1.0))

    gen = dict(GENERATION_DEFAULTS)
    gen_eos = None
    gpath = hf_dir / "generation_config.json"
    if gpath.exists():
        g = json.loads(gpath.read_text())
        for key in GENERATION_DEFAULTS:
            if key == "entropy_bound":
                value = (g.get("sampler_config") or {}).get("entropy_bound")
            else:
                value = g.get(key)
            if value is not None:
                gen[key] = value
        gen_eos = g.get("eos_token_id")
    eos = gen_eos if gen_eos is not None else tc["eos_token_id"]
    eos = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    return dict(
        n_layers=n, hidden=int(tc["hidden_size"]), vocab=int(tc["vocab_size"]), ffn=int(tc["intermediate_size"]),
        heads=int(tc["num_attention_heads"]), sliding=sliding, head_dims=hd, kv_heads=kv,
        head_dim_swa=int(hd_swa), head_dim_full=int(hd_full),
        experts=int(tc["num_experts"]), experts_used=int(tc["top_k_experts"]),
        expert_ffn=int(tc["moe_intermediate_size"]), window=int(tc["sliding_window"]),
        context=int(tc["max_position_embeddings"]), eps=float(tc["rms_norm_eps"]),
        softcap=float(tc["final_logit_softcapping"] or 0.0),
        rope_base=float(r_full.get("rope_theta", 1_000_000.0)), rope_base_swa=float(r_swa.get("rope_theta", 10_000.0)),
        rope_dims_swa=int(hd_swa * factor_swa), rope_rotated_full=int(hd_full * factor_full / 2),
        canvas=int(cfg.get("canvas_length") or 256), generation=gen, eos=eos,
        bos=int(tc["bos_token_id"]), pad=int(tc["pad_token_id"]),
        name=cfg.get("_name_or_path") or hf_dir.resolve().name,
    )


# ---------------------------------------------------------------- tensor plan

def plan_tensors(ck: Checkpoint, hp: dict) -> list[tuple[str, str | None]]:
    """(GGUF name, checkpoint name) in writing order; checkpoint name None: generated (rope_freqs)."""
    plan: list[tuple[str, str | None]] = [(W.gguf_name(W.ModelWeights, "rope_freqs"), None)]
    unknown = []
    for hf in sorted(ck.entries, key=_natural):
        if hf.startswith(SKIPPED) or (hf.startswith(TIED) and not hf.endswith(".layer_scalar")):
            continue
        if hf in GLOBAL_FIELDS:
            plan.append((W.gguf_name(W.ModelWeights, GLOBAL_FIELDS[hf]), hf))
        elif hf in EXTRA_NAMES:
            plan.append((EXTRA_NAMES[hf], hf))
        elif hf.startswith(DECODER_LAYER) and (i := _layer_index(hf, DECODER_LAYER, hp)) is not None \
                and (rest := hf.split(".", 4)[4]) in LAYER_FIELDS:
            plan.append((W.gguf_name(W.LayerWeights, LAYER_FIELDS[rest], i), hf))
        elif hf.startswith(ENCODER_LAYER) and hf.endswith(".layer_scalar") \
                and (i := _layer_index(hf, ENCODER_LAYER, hp)) is not None:
            plan.append((W.layer_prefix(i) + ENC_LAYER_SCALE, hf))
        else:
            unknown.append(hf)
    if unknown:
        raise ConvertError(f"{len(unknown)} checkpoint tensors this converter does not know: "
                           f"{', '.join(unknown[:6])}{' ...' if len(unknown) > 6 else ''}")
    have = {g for g, _ in plan}
    for name in ("token_embd", "output_norm"):
        if W.gguf_name(W.ModelWeights, name) not in have:
            raise ConvertError(f"the checkpoint lacks {next(k for k, v in GLOBAL_FIELDS.items() if v == name)}")
    missing = [hf for hf in EXTRA_NAMES if EXTRA_NAMES[hf] not in have]
    for i in range(hp["n_layers"]):
        for rest, fld in LAYER_FIELDS.items():
            if fld == "attn_v" and not hp["sliding"][i]:
                continue
            if W.gguf_name(W.LayerWeights, fld, i) not in have:
                missing.append(f"{DECODER_LAYER}{i}.{rest}")
        if W.layer_prefix(i) + ENC_LAYER_SCALE not in have:
            missing.append(f"{ENCODER_LAYER}{i}.layer_scalar")
    if missing:
        raise ConvertError(f"the checkpoint lacks {len(missing)} tensors: {', '.join(missing[:6])}"
                           f"{' ...' if len(missing) > 6 else ''}")
    return plan


def _natural(name: str):
    return [int(p) if p.isdigit() else p for p in name.split(".")]


def _layer_index(hf: str, prefix: str, hp: dict) -> int | None:
    part = hf[len(prefix):].split(".", 1)[0]
    if not part.isdigit() or int(part) >= hp["n_layers"]:
        raise ConvertError(f"{hf}: layer index out of range for {hp['n_layers']} layers")
    return int(part)


def expected_shape(gguf_name: str, hp: dict) -> tuple[int, ...]:
    """The numpy (torch-order) shape a tensor must have."""
    H, V, I, F, E = hp["hidden"], hp["vocab"], hp["ffn"], hp["expert_ffn"], hp["experts"]
    if gguf_name.startswith("blk."):
        i = int(gguf_name.split(".")[1])
        hd, kv, nh = hp["head_dims"][i], hp["kv_heads"][i], hp["heads"]
        suffix = gguf_name.split(".", 2)[2]
        return {"attn_q.weight": (nh * hd, H), "attn_k.weight": (kv * hd, H), "attn_v.weight": (kv * hd, H),
                "attn_output.weight": (H, nh * hd), "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,),
                "ffn_gate.weight": (I, H), "ffn_up.weight": (I, H), "ffn_down.weight": (H, I),
                "ffn_gate_inp.weight": (E, H), "ffn_gate_inp.scale": (H,), "ffn_down_exps.scale": (E,),
                "ffn_gate_up_exps.weight": (E, 2 * F, H), "ffn_down_exps.weight": (E, H, F),
                "layer_output_scale.weight": (1,), ENC_LAYER_SCALE: (1,)}.get(suffix, (H,))
    return {"token_embd.weight": (V, H), "rope_freqs.weight": (hp["head_dim_full"] // 2,),
            "self_cond_gate.weight": (I, H), "self_cond_up.weight": (I, H), "self_cond_down.weight": (H, I)
            }.get(gguf_name, (H,))


def tensor_type(gguf_name: str, shape: tuple[int, ...], outtype) -> T:
    """The stored type, as llama.cpp's converter (and, for q4_k, its Q4_K_M) picks it."""
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or not gguf_name.endswith(".weight") \
            or gguf_name.endswith(W.gguf_name(W.LayerWeights, "router")):
        return T.F32
    qtype = outtype
    if outtype == T.Q4_K and (gguf_name == W.gguf_name(W.ModelWeights, "token_embd")
                              or gguf_name.endswith(W.gguf_name(W.LayerWeights, "attn_v"))):
        qtype = T.Q6_K
    return storage_type(qtype, shape[-1])


def rope_freqs(hp: dict) -> np.ndarray:
    """Frequency factors of the full layers' proportional RoPE (llama.cpp's Gemma 4 converter)."""
    n_pairs, n_rot = hp["head_dim_full"] // 2, hp["rope_rotated_full"]
    return np.array([1.0] * n_rot + [1e30] * (n_pairs - n_rot), np.float32)


# ---------------------------------------------------------------- writing

CHUNK_ELEMENTS = 1 << 24          # converted (and quantized) at most this many elements at a time


def _encode(ck: Checkpoint, hf: str, qtype) -> np.ndarray:
    """The tensor's bytes in qtype, converted chunk by chunk along its leading axis."""
    from pyapp.reference.quants import quantize
    shape = ck.shape(hf)
    per_row = math.prod(shape[1:]) if len(shape) > 1 else 1
    step = max(1, CHUNK_ELEMENTS // max(per_row, 1))
    parts = []
    for lo in range(0, shape[0], step):
        x = ck.f32(hf, slice(lo, lo + step))
        parts.append(np.frombuffer(quantize(x, qtype.name), np.uint8))
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _nbytes(qtype, shape: tuple[int, ...]) -> int:
    return ggml.row_bytes(int(qtype), shape[-1]) * math.prod(shape[:-1])


def tokenizer_keys(vocab_path: Path, n_vocab: int, say) -> dict:
    """`tokenizer.*` keys of a Gemma 4 GGUF -> (value, type, element type), cut to n_vocab ids."""
    kv = {k: v for k, v in read_kv(vocab_path).items() if k.startswith("tokenizer.")}
    tokens = kv.get("tokenizer.ggml.tokens", ([],))[0]
    if len(tokens) == n_vocab:
        return kv
    if len(tokens) < n_vocab:
        say(f"note: {vocab_path} has {len(tokens)} tokens, the model {n_vocab}: no tokenizer written")
        return {}
    from hf_tokenizer import reduce_vocab
    text = {k: ([x.decode() if isinstance(x, bytes) else x for x in v] if isinstance(v, list)
                else v.decode() if isinstance(v, bytes) else v) for k, (v, _vt, _et) in kv.items()}
    try:
        cut = reduce_vocab(text, n_vocab)
    except ValueError as e:
        say(f"note: {e}: no tokenizer written")
        return {}
    say(f"note: the model has {n_vocab} tokens: tokenizer cut to the first {n_vocab} of {vocab_path.name}")
    return {k: (cut[k], vt, et) for k, (_v, vt, et) in kv.items() if k in cut}


def convert(hf_dir, out, outtype: str = "f16", vocab=None, log=None) -> dict:
    """Write OUT.gguf from the checkpoint in hf_dir; returns {gguf name: ggml type} of what was written."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    hf_dir, qtype = Path(hf_dir), OUTTYPES[outtype]
    hp = read_config(hf_dir)
    ck = Checkpoint(hf_dir)
    plan = plan_tensors(ck, hp)
    bad = [f"{hf} {list(ck.shape(hf))} (expected {list(expected_shape(g, hp))})"
           for g, hf in plan if hf is not None and tuple(ck.shape(hf)) != expected_shape(g, hp)]
    if bad:
        raise ConvertError(f"tensors whose shapes do not fit config.json: {'; '.join(bad[:6])}")

    w = GGUFWriter(str(out), ARCH)
    w.add_type("model")
    w.add_name(str(hp["name"]))
    write_hparams(w, hp)
    w.add_file_type(int(FILE_TYPES.get(qtype, LlamaFileType.GUESSED)))
    write_tokenizer(w, tokenizer_keys(Path(vocab), hp["vocab"], say) if vocab else {}, hp)

    types = {}
    for g, hf in plan:
        shape = expected_shape(g, hp)
        types[g] = t = T.F32 if hf is None else tensor_type(g, shape, qtype)
        w.add_tensor_info(g, shape, np.dtype(np.float32), _nbytes(t, shape), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for g, hf in plan:
        data = rope_freqs(hp).view(np.uint8) if hf is None else _encode(ck, hf, types[g])
        w.write_tensor_data(data)
    w.close()
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t.name] = counts.get(t.name, 0) + 1
    say(f"wrote {out}: {len(plan)} tensors ({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}), "
        f"{hp['n_layers']} layers, canvas {hp['canvas']}")
    return types


SPECIAL_TOKEN_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eos_token_ids", "tokenizer.ggml.bos_token_id",
                      "tokenizer.ggml.padding_token_id")


def write_tokenizer(w: GGUFWriter, tok: dict, hp: dict) -> None:
    """The vocabulary's `tokenizer.*` keys (name -> (value, type, element type)), its special ids replaced
    by the model's: bos, pad, and the generation's eos list (hp: read_config's bos, pad, eos)."""
    for key, (val, vt, et) in tok.items():
        if key not in SPECIAL_TOKEN_KEYS:
            w.add_key_value(key, val, vt, sub_type=et)
    w.add_bos_token_id(hp["bos"])
    w.add_pad_token_id(hp["pad"])
    w.add_eos_token_id(hp["eos"][0])
    w.add_array("tokenizer.ggml.eos_token_ids", hp["eos"])


def write_hparams(w: GGUFWriter, hp: dict) -> None:
    """The hyperparameters under diffusion-gemma.*, with the keys llama.cpp writes for gemma4."""
    a = ARCH
    w.add_context_length(hp["context"])
    w.add_embedding_length(hp["hidden"])
    w.add_block_count(hp["n_layers"])
    w.add_feed_forward_length(hp["ffn"])
    w.add_head_count(hp["heads"])
    w.add_head_count_kv(hp["kv_heads"])
    w.add_rope_freq_base(hp["rope_base"])
    w.add_float32(f"{a}.rope.freq_base_swa", hp["rope_base_swa"])
    w.add_layer_norm_rms_eps(hp["eps"])
    w.add_key_length(hp["head_dim_full"])
    w.add_value_length(hp["head_dim_full"])
    w.add_uint32(f"{a}.attention.key_length_swa", hp["head_dim_swa"])
    w.add_uint32(f"{a}.attention.value_length_swa", hp["head_dim_swa"])
    w.add_final_logit_softcapping(hp["softcap"])
    w.add_sliding_window(hp["window"])
    w.add_array(f"{a}.attention.sliding_window_pattern", hp["sliding"])
    w.add_uint32(f"{a}.attention.shared_kv_layers", 0)
    w.add_uint32(f"{a}.embedding_length_per_layer_input", 0)
    w.add_expert_count(hp["experts"])
    w.add_expert_used_count(hp["experts_used"])
    w.add_uint32(f"{a}.expert_feed_forward_length", hp["expert_ffn"])
    w.add_rope_dimension_count(hp["head_dim_full"])       # full width; rope_freqs leaves pairs unrotated
    w.add_uint32(f"{a}.rope.dimension_count_swa", hp["rope_dims_swa"])
    # DiffusionGemma: the block length and the generation defaults
    d = f"{a}.diffusion."
    g = hp["generation"]
    w.add_uint32(d + "canvas_length", hp["canvas"])
    w.add_bool(d + "shift_logits", False)                 # llama.cpp's key: logit j scores canvas position j
    w.add_uint32(d + "max_new_tokens", int(g["max_new_tokens"]))
    w.add_uint32(d + "max_denoising_steps", int(g["max_denoising_steps"]))
    w.add_float32(d + "t_min", float(g["t_min"]))
    w.add_float32(d + "t_max", float(g["t_max"]))
    w.add_float32(d + "entropy_bound", float(g["entropy_bound"]))
    w.add_uint32(d + "stability_threshold", int(g["stability_threshold"]))
    w.add_float32(d + "confidence_threshold", float(g["confidence_threshold"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--outtype", choices=sorted(OUTTYPES), default="f16")
    ap.add_argument("--vocab", default=None,
                    help=f"a Gemma 4 GGUF whose tokenizer to copy (default: {DEFAULT_VOCAB.relative_to(ROOT)} "
                         "if present)")
    ap.add_argument("--no-vocab", action="store_true", help="write no tokenizer keys")
    args = ap.parse_args()
    vocab = None
    if not args.no_vocab:
        if args.vocab and not Path(args.vocab).exists():
            ap.error(f"--vocab {args.vocab}: no such file")
        vocab = args.vocab or (str(DEFAULT_VOCAB) if DEFAULT_VOCAB.exists() else None)
    try:
        convert(args.hf_dir, args.out, args.outtype, vocab=vocab)
    except ConvertError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
