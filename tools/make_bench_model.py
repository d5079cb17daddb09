#!/usr/bin/env python3
"""Write a full-size random-weight Gemma 4 GGUF for speed measurements.

    python tools/make_bench_model.py --shape e2b --quant Q4_K --out /tmp/e2b.gguf
    python tools/make_bench_model.py --shape a26b --quant Q4_K --out /tmp/a26b.gguf --vocab VOCAB.gguf
    python tools/make_bench_model.py --shape diffusion --quant Q4_K --out /tmp/diffusion.gguf

The tensor names, shapes and metadata keys are those llama.cpp's converter
(convert_hf_to_gguf.py, vendored in .cache/llama.cpp by build.py) writes for
Gemma 4; the weights are random quantized blocks with small, sane scales
(numerics are meaningless, bytes per token are real). Rows whose length is not a
multiple of the type's block fall back as llama.cpp's quantizer does
(llama-quant.cpp, tensor_type_fallback: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0).
Q4_K files keep attn_v in Q6_K, as Q4_K_M does.

Shapes with a 262144-token vocabulary get the `tokenizer.*` keys of llama.cpp's
ggml-vocab-gemma-4.gguf (--vocab; found in .cache/llama.cpp/models by default)
so that llama.cpp loads the file; the `a26b` shape also takes every `gemma4.*`
hyperparameter key verbatim from that file's header (it describes 26B-A4B).

The `diffusion` shape is DiffusionGemma (26B-A4B dimensions, the a26b numbers): the `diffusion-gemma`
architecture with tools/convert_diffusion_gemma.py's keys, tensor names and generation defaults (that
module writes them; canvas 256). `tiny-diffusion` is its structure at toy size. --layers N keeps the
first N layers of any shape (the last one full on DiffusionGemma) and --vocab-size N another vocabulary
size, for quick checks of the big ones.

Needs numpy and the `gguf` package only (plus pyapp.ggml and, for toy sizes,
pyapp.reference.quants, both importable without the rest of pyapp, from this
checkout), so it also runs on a bare GPU machine. Not committed output: a Q4_K
E2B is about 2.5 GiB, a Q4_K 26B-A4B about 17 GiB.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType, GGUFWriter, LlamaFileType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # this checkout's pyapp, installed or not
from pyapp import ggml  # noqa: E402

DEFAULT_VOCAB = ROOT / ".cache" / "llama.cpp" / "models" / "ggml-vocab-gemma-4.gguf"

# Gemma 4 E2B text model as its HF config describes it.
SHAPES = {
    "e2b": dict(hidden=1536, layers=35, ffn=6144, heads=8, kv_heads=1, head_dim=256, global_head_dim=512,
                vocab=262144, window=512, pattern=5, shared=20, ple=256, double_wide=True, softcap=30.0),
    "e4b": dict(hidden=2560, layers=42, ffn=10240, heads=8, kv_heads=2, head_dim=256, global_head_dim=512,
                vocab=262144, window=512, pattern=6, shared=18, ple=256, double_wide=False, softcap=30.0),
    # E2B's structure at toy size (SSG SSG + 2 KV-shared), for engine-vs-reference tests
    "tiny": dict(hidden=256, layers=8, ffn=512, heads=4, kv_heads=1, head_dim=64, global_head_dim=128,
                 vocab=1000, window=8, pattern=3, shared=2, ple=64, double_wide=True, softcap=30.0),
    # Gemma 4 26B-A4B as llama.cpp's ggml-vocab-gemma-4.gguf header describes it (header=True: its
    # gemma4.* keys are copied from that header, checked against these numbers): 5 sliding layers then
    # 1 global, dense MLP next to 128 experts (8 used), no V on global layers (K is V)
    "a26b": dict(hidden=2816, layers=30, ffn=2112, heads=16, kv_heads=8, head_dim=256, global_head_dim=512,
                 vocab=262144, window=1024, pattern=6, shared=0, ple=0, double_wide=False, softcap=30.0,
                 experts=128, experts_used=8, expert_ffn=704, global_kv_heads=2, k_eq_v=True,
                 context=262144, header=True),
    # 26B-A4B's structure at toy size: dense MLP + 8 experts (2 used), no V on global layers
    "tiny-moe": dict(hidden=256, layers=6, ffn=256, heads=4, kv_heads=2, head_dim=64, global_head_dim=128,
                     vocab=1000, window=8, pattern=3, shared=0, ple=0, double_wide=False, softcap=30.0,
                     experts=8, experts_used=2, expert_ffn=256, global_kv_heads=1, k_eq_v=True),
}
# DiffusionGemma (google/diffusiongemma-26B-A4B-it): the 26B-A4B text stack (a26b's numbers) plus the
# self-conditioning MLP and the encoder's layer scales, under the `diffusion-gemma` architecture, written
# with tools/convert_diffusion_gemma.py's names, keys and generation defaults; canvas of 256 tokens
SHAPES["diffusion"] = dict(SHAPES["a26b"], header=False, diffusion=True, canvas=256)
# its structure at toy size (tiny-moe's numbers; SSG SSG, the last layer full as DiffusionGemma forces)
SHAPES["tiny-diffusion"] = dict(SHAPES["tiny-moe"], diffusion=True, canvas=16)

# Matrices up to this many elements get quantized real-valued weights; bigger ones
# random quant blocks (fast to make; speed does not depend on the values).
SMALL = 1 << 22

# Types written as random blocks, and where the f16 scale(s) sit inside a block (Q4_1/Q5_1: d and m).
SCALE_OFFSETS = {T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2),
                 T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}

# llama.cpp's llama-quant.cpp (tensor_type_fallback): a row length the type's block does not divide
# takes this type instead (a 32-block type that still does not fit, or has no entry: F16)
FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0}

# general.file_type (llama_ftype) of a file made with --quant; Q4_K files are Q4_K_M-like (attn_v Q6_K)
FILE_TYPES = {T.F32: LlamaFileType.ALL_F32, T.F16: LlamaFileType.MOSTLY_F16, T.Q4_0: LlamaFileType.MOSTLY_Q4_0,
              T.Q4_1: LlamaFileType.MOSTLY_Q4_1, T.Q5_0: LlamaFileType.MOSTLY_Q5_0,
              T.Q5_1: LlamaFileType.MOSTLY_Q5_1, T.Q8_0: LlamaFileType.MOSTLY_Q8_0,
              T.Q4_K: LlamaFileType.MOSTLY_Q4_K_M, T.Q5_K: LlamaFileType.MOSTLY_Q5_K_S,
              T.Q6_K: LlamaFileType.MOSTLY_Q6_K}


def storage_type(qtype, ne0: int):
    """The type a row of ne0 elements is stored in when qtype is asked for (llama.cpp's fallback)."""
    if ne0 % ggml.lookup(qtype).block == 0:
        return qtype
    t = FALLBACK.get(qtype, qtype)
    return t if ne0 % ggml.lookup(t).block == 0 else T.F16


# ---- metadata of llama.cpp's vocabulary GGUF ------------------------------------------------

_SCALAR_FMT = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
               GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
               GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
               GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}


def read_kv(path) -> dict[str, tuple]:
    """Every metadata key of a GGUF file -> (value, GGUFValueType, array element type or None),
    in file order, so it can be written again unchanged with GGUFWriter.add_key_value.
    (gguf.GGUFReader takes ~20 s on a 262144-token vocabulary; this reads it in ~1 s.)"""
    data = Path(path).read_bytes()
    magic, version, _n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    if magic != b"GGUF" or version < 2:
        raise ValueError(f"{path}: not a GGUF v2/v3 file")
    pos = 24

    def string() -> bytes:             # kept as bytes: copied byte for byte
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        return data[pos - n:pos]

    def scalar(vt):
        nonlocal pos
        fmt = "<" + _SCALAR_FMT[vt]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    out = {}
    for _ in range(n_kv):
        key = string().decode("utf-8")
        (vt,) = struct.unpack_from("<I", data, pos)
        pos += 4
        vt = GGUFValueType(vt)
        if vt == GGUFValueType.ARRAY:
            et, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            et = GGUFValueType(et)
            if et == GGUFValueType.STRING:
                val = [string() for _ in range(count)]
            elif et in _SCALAR_FMT:
                fmt = f"<{count}{_SCALAR_FMT[et]}"
                val = list(struct.unpack_from(fmt, data, pos))
                pos += struct.calcsize(fmt)
            else:
                raise ValueError(f"{path}: {key}: nested arrays are not supported here")
            out[key] = (val, vt, et)
        else:
            out[key] = (string() if vt == GGUFValueType.STRING else scalar(vt), vt, None)
    return out


def header_hparams(kv: dict, arch: str, n_layers: int, expect: dict) -> dict:
    """The vocabulary header's `arch.*` keys for a model of n_layers (per-layer arrays cut to it),
    after checking them against the numbers the shape declares (expect: key suffix -> value)."""
    n_header = kv[f"{arch}.block_count"][0]
    out = {}
    for key, (val, vt, et) in kv.items():
        if not key.startswith(arch + "."):
            continue
        if key == f"{arch}.block_count":
            val = n_layers
        elif vt == GGUFValueType.ARRAY and len(val) == n_header:
            val = val[:n_layers]
        out[key] = (val, vt, et)
    for suffix, want in expect.items():
        got = out.get(f"{arch}.{suffix}", (None,))[0]
        if isinstance(want, list) and not isinstance(got, list) and got is not None:
            got = [got] * len(want)            # a scalar stands for every layer
        ok = got == want or (isinstance(want, float) and got is not None and abs(got - want) <= 1e-6 * abs(want))
        if not ok:
            raise ValueError(f"vocabulary header: {arch}.{suffix} = {got!r}, the shape says {want!r}")
    return out


def random_blocks(rng, n_elements: int, qtype) -> np.ndarray:
    t = ggml.lookup(qtype)
    elems, size = t.block, t.block_bytes
    assert n_elements % elems == 0, (n_elements, qtype)
    nb = n_elements // elems
    raw = np.frombuffer(rng.bytes(nb * size), dtype=np.uint8).reshape(nb, size).copy()
    scales = (rng.random(nb, dtype=np.float32) * 0.002 + 0.001).astype(np.float16).view(np.uint8).reshape(nb, 2)
    for off in SCALE_OFFSETS[qtype]:
        raw[:, off:off + 2] = scales
    return raw.reshape(-1)


def add_matrix(w: GGUFWriter, rng, name: str, ne0: int, ne1: int, qtype, n3: int = 1):
    qtype = storage_type(qtype, ne0)
    shape = (n3, ne1, ne0) if n3 > 1 else (ne1, ne0)   # numpy order (reversed GGUF ne)
    n = ne0 * ne1 * n3
    if n <= SMALL:
        # toy sizes: real-valued weights (fan-in scaled, so activations stay O(1)), quantized
        from pyapp.reference.quants import quantize
        data = (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(ne0)).astype(np.float32)
        if qtype == T.F16:
            w.add_tensor(name, data.astype(np.float16))
            return
        raw = np.frombuffer(quantize(data, qtype.name), np.uint8)
        w.add_tensor(name, raw.reshape(*shape[:-1], -1), raw_dtype=qtype)
        return
    if qtype == T.F16:
        data = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(np.float16).reshape(shape)
        w.add_tensor(name, data)
        return
    raw = random_blocks(rng, n, qtype).reshape(*shape[:-1], ggml.row_bytes(qtype, ne0))
    w.add_tensor(name, raw, raw_dtype=qtype)   # gguf-py takes the byte shape of quantized rows


def add_vector(w: GGUFWriter, rng, name: str, n: int, value: float | None = None):
    data = np.full(n, value, np.float32) if value is not None else (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    w.add_tensor(name, data)


def write(shape: str, qtype, out: str, seed: int = 0, vocab: str | Path | None = None,
          layers: int | None = None, vocab_size: int | None = None, log=None) -> None:
    """Write the model. vocab: llama.cpp's ggml-vocab-gemma-4.gguf, whose tokenizer.* keys are
    copied when its vocabulary has the shape's size (and, for header shapes, its gemma4.* keys).
    layers: fewer layers than the shape has; vocab_size: another vocabulary size (quick checks of the big
    shapes: a 256-token canvas's logits over 262144 ids need a 256 MiB binding, which lavapipe lacks)."""
    s = dict(SHAPES[shape])
    if vocab_size:
        s["vocab"] = vocab_size
    if layers:
        s["layers"] = layers
        s["shared"] = min(s["shared"], max(0, layers - s["pattern"]))
    rng = np.random.default_rng(seed)
    n = s["layers"]
    pattern = [(i + 1) % s["pattern"] != 0 for i in range(n)]          # True = sliding
    if s.get("diffusion"):
        pattern[-1] = False          # as transformers forces DiffusionGemma's last layer (--layers too)
    first_shared = n - s["shared"]
    ffn = [s["ffn"] * (2 if s["double_wide"] and i >= first_shared else 1) for i in range(n)]
    kv_heads = [s["kv_heads"] if sl else s.get("global_kv_heads", s["kv_heads"]) for sl in pattern]
    diffusion = _diffusion_writer() if s.get("diffusion") else None
    arch = diffusion.ARCH if diffusion else "gemma4"
    say = log or (lambda msg: print(msg, file=sys.stderr))

    kv = read_kv(vocab) if vocab else {}
    tokenizer = {k: v for k, v in kv.items() if k.startswith("tokenizer.")}
    n_vocab = len(tokenizer.get("tokenizer.ggml.tokens", ([],))[0])
    if tokenizer and n_vocab != s["vocab"]:
        say(f"note: {shape} has a {s['vocab']}-token vocabulary, {vocab} {n_vocab}: no tokenizer keys written")
        tokenizer = {}
    header = None
    if s.get("header"):
        if kv:
            expect = {"block_count": n, "embedding_length": s["hidden"], "feed_forward_length": ffn,
                      "attention.head_count": s["heads"], "attention.head_count_kv": kv_heads,
                      "attention.key_length": s["global_head_dim"], "attention.value_length": s["global_head_dim"],
                      "attention.key_length_swa": s["head_dim"], "attention.value_length_swa": s["head_dim"],
                      "attention.sliding_window": s["window"], "attention.sliding_window_pattern": pattern,
                      "attention.shared_kv_layers": s["shared"], "embedding_length_per_layer_input": s["ple"],
                      "final_logit_softcapping": s["softcap"], "expert_count": s.get("experts", 0),
                      "expert_used_count": s.get("experts_used", 0),
                      "expert_feed_forward_length": s.get("expert_ffn", 0)}
            header = header_hparams(kv, arch, n, expect)
        else:
            say(f"note: no vocabulary file: {shape}'s hyperparameters from SHAPES (taken from that header), "
                "no tokenizer keys (llama.cpp will not load the file)")

    w = GGUFWriter(out, arch)
    w.add_name(f"bench-{shape}-{qtype.name}")
    if diffusion:
        w.add_type("model")              # as the converter writes it
    if diffusion:
        hp = diffusion_hparams(diffusion, s, n, pattern, kv_heads)
        diffusion.write_hparams(w, hp)
    elif header:
        for key, (val, vt, et) in header.items():
            w.add_key_value(key, val, vt, sub_type=et)
    else:
        write_hparams(w, s, arch, n, pattern, ffn, kv_heads)
    w.add_file_type(int(FILE_TYPES.get(qtype, LlamaFileType.GUESSED)))
    if diffusion:
        diffusion.write_tokenizer(w, tokenizer, hp)      # the model's bos/pad/eos list, as the converter writes
    else:
        for key, (val, vt, et) in tokenizer.items():
            w.add_key_value(key, val, vt, sub_type=et)
    write_tensors(w, rng, s, qtype, n, pattern, ffn, kv_heads)
    if diffusion:
        write_diffusion_tensors(w, rng, diffusion, s, qtype, n)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_attention_keys(w: GGUFWriter, s: dict, arch: str) -> None:
    """The attention keys Gemma 4's converter writes alike for a model and its assistant drafter, from a shape's
    head widths (full and sliding): RoPE bases and rotated dims, the norm's epsilon, key and value lengths."""
    w.add_rope_freq_base(1_000_000.0)
    w.add_float32(f"{arch}.rope.freq_base_swa", 10_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(s["global_head_dim"])
    w.add_value_length(s["global_head_dim"])
    w.add_uint32(f"{arch}.attention.key_length_swa", s["head_dim"])
    w.add_uint32(f"{arch}.attention.value_length_swa", s["head_dim"])
    w.add_rope_dimension_count(s["global_head_dim"])
    w.add_uint32(f"{arch}.rope.dimension_count_swa", s["head_dim"])


def add_rope_freqs(w: GGUFWriter, global_head_dim: int) -> None:
    """rope_freqs: the full layers' frequency factors for partial_rotary_factor 0.25 (1 for the rotated pairs,
    1e30 for the rest), as the converter writes them."""
    n_rot = global_head_dim // 8
    w.add_tensor("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (global_head_dim // 2 - n_rot), np.float32))


def write_hparams(w: GGUFWriter, s: dict, arch: str, n: int, pattern: list, ffn: list, kv_heads: list) -> None:
    """The gemma4.* keys from the shape's numbers, as llama.cpp's converter writes them."""
    w.add_block_count(n)
    w.add_context_length(s.get("context", 131072))
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(ffn)
    w.add_head_count(s["heads"])
    w.add_head_count_kv(kv_heads)
    write_attention_keys(w, s, arch)
    w.add_final_logit_softcapping(s["softcap"])
    w.add_sliding_window(s["window"])
    w.add_uint32(f"{arch}.attention.shared_kv_layers", s["shared"])
    w.add_uint32(f"{arch}.embedding_length_per_layer_input", s["ple"])
    experts = s.get("experts", 0)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(s["experts_used"])
        w.add_uint32(f"{arch}.expert_feed_forward_length", s["expert_ffn"])
    w.add_array(f"{arch}.attention.sliding_window_pattern", pattern)


def write_tensors(w: GGUFWriter, rng, s: dict, qtype, n: int, pattern: list, ffn: list, kv_heads: list) -> None:
    h, V, ple = s["hidden"], s["vocab"], s["ple"]
    experts = s.get("experts", 0)
    add_matrix(w, rng, "token_embd.weight", h, V, qtype)
    if ple:
        add_matrix(w, rng, "per_layer_token_embd.weight", ple * n, V, qtype)
        add_matrix(w, rng, "per_layer_model_proj.weight", h, ple * n, T.F16)
        add_vector(w, rng, "per_layer_proj_norm.weight", ple)
    add_rope_freqs(w, s["global_head_dim"])
    add_vector(w, rng, "output_norm.weight", h)
    for i in range(n):
        p = f"blk.{i}."
        hd = s["head_dim"] if pattern[i] else s["global_head_dim"]
        add_vector(w, rng, p + "attn_norm.weight", h)
        add_matrix(w, rng, p + "attn_q.weight", h, s["heads"] * hd, qtype)
        add_vector(w, rng, p + "attn_q_norm.weight", hd)
        add_matrix(w, rng, p + "attn_k.weight", h, kv_heads[i] * hd, qtype)
        add_vector(w, rng, p + "attn_k_norm.weight", hd)
        if pattern[i] or not s.get("k_eq_v"):
            # like llama.cpp's Q4_K_M: V projections one step up, in Q6_K
            add_matrix(w, rng, p + "attn_v.weight", h, kv_heads[i] * hd, T.Q6_K if qtype == T.Q4_K else qtype)
        add_matrix(w, rng, p + "attn_output.weight", s["heads"] * hd, h, qtype)
        add_vector(w, rng, p + "post_attention_norm.weight", h)
        add_vector(w, rng, p + "ffn_norm.weight", h)
        add_matrix(w, rng, p + "ffn_gate.weight", h, ffn[i], qtype)
        add_matrix(w, rng, p + "ffn_up.weight", h, ffn[i], qtype)
        add_matrix(w, rng, p + "ffn_down.weight", ffn[i], h, qtype)
        add_vector(w, rng, p + "post_ffw_norm.weight", h)
        if experts:
            eff = s["expert_ffn"]
            add_matrix(w, rng, p + "ffn_gate_inp.weight", h, experts, T.F16)
            add_vector(w, rng, p + "ffn_gate_inp.scale", h)
            add_matrix(w, rng, p + "ffn_gate_up_exps.weight", h, 2 * eff, qtype, n3=experts)
            add_matrix(w, rng, p + "ffn_down_exps.weight", eff, h, qtype, n3=experts)
            add_vector(w, rng, p + "ffn_down_exps.scale", experts)
            for norm in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                add_vector(w, rng, p + norm + ".weight", h)
        if ple:
            add_matrix(w, rng, p + "inp_gate.weight", h, ple, T.F16)
            add_matrix(w, rng, p + "proj.weight", ple, h, T.F16)
            add_vector(w, rng, p + "post_norm.weight", h)
        add_vector(w, rng, p + "layer_output_scale.weight", 1, value=0.5)


def _diffusion_writer():
    """tools/convert_diffusion_gemma.py as a module: the DiffusionGemma layout is declared there once."""
    tools = str(Path(__file__).resolve().parent)
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import convert_diffusion_gemma
    return convert_diffusion_gemma


def diffusion_hparams(conv, s: dict, n: int, pattern: list, kv_heads: list) -> dict:
    """The shape as convert_diffusion_gemma.read_config describes a checkpoint (what its writers take)."""
    hd_full = s["global_head_dim"]
    return dict(n_layers=n, hidden=s["hidden"], vocab=s["vocab"], ffn=s["ffn"], heads=s["heads"], sliding=pattern,
                kv_heads=kv_heads, head_dim_swa=s["head_dim"], head_dim_full=hd_full, experts=s["experts"],
                experts_used=s["experts_used"], expert_ffn=s["expert_ffn"], window=s["window"],
                context=s.get("context", 131072), eps=1e-6, softcap=s["softcap"], rope_base=1_000_000.0,
                rope_base_swa=10_000.0, rope_dims_swa=s["head_dim"], rope_rotated_full=hd_full // 8,
                canvas=s["canvas"], generation=dict(conv.GENERATION_DEFAULTS), eos=[1, 106, 50], bos=2, pad=0)


def write_diffusion_tensors(w: GGUFWriter, rng, conv, s: dict, qtype, n: int) -> None:
    """DiffusionGemma's extras: the self-conditioning MLP (the dense MLP's width) and the encoder's layer
    scales (the decoder's are Gemma 4's layer_output_scale), named as the converter names them."""
    h, ffn = s["hidden"], s["ffn"]
    names = {fld: conv.W.gguf_name(conv.DW.DiffusionWeights, fld)
             for fld in ("self_cond_pre_norm", "self_cond_gate", "self_cond_up", "self_cond_down")}
    assert set(names.values()) == set(conv.EXTRA_NAMES.values()), "the converter's extras changed"
    add_vector(w, rng, names["self_cond_pre_norm"], h)
    add_matrix(w, rng, names["self_cond_gate"], h, ffn, qtype)
    add_matrix(w, rng, names["self_cond_up"], h, ffn, qtype)
    add_matrix(w, rng, names["self_cond_down"], ffn, h, qtype)
    for i in range(n):
        add_vector(w, rng, conv.W.layer_prefix(i) + conv.ENC_LAYER_SCALE, 1, value=0.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="e2b")
    ap.add_argument("--quant", choices=[t.name for t in SCALE_OFFSETS], default="Q4_K")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", default=None,
                    help=f"llama.cpp's ggml-vocab-gemma-4.gguf (default: {DEFAULT_VOCAB.relative_to(ROOT)} if present)")
    ap.add_argument("--no-vocab", action="store_true", help="write no tokenizer keys (llama.cpp will not load the file)")
    ap.add_argument("--layers", type=int, default=None, help="keep only the first N layers (quick checks)")
    ap.add_argument("--vocab-size", type=int, default=None, help="another vocabulary size (quick checks)")
    args = ap.parse_args()
    vocab = None
    if not args.no_vocab:
        vocab = args.vocab or (str(DEFAULT_VOCAB) if DEFAULT_VOCAB.exists() else None)
        if args.vocab and not Path(args.vocab).exists():
            ap.error(f"--vocab {args.vocab}: no such file")
    t0 = time.time()
    write(args.shape, T[args.quant], args.out, args.seed, vocab=vocab, layers=args.layers, vocab_size=args.vocab_size)
    print(f"wrote {args.out} in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
