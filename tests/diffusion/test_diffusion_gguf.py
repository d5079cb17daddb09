"""DiffusionGemma to GGUF (issue 12, item 1): tools/convert_diffusion_gemma.py on the committed tiny
checkpoint (tests/fixtures/diffusion-tiny-hf, made by tools/make_diffusion_fixture.py with transformers),
read back with pyapp.gguf; the config and `info` recognising the architecture.

The expected names, shapes and metadata are spelled here from shared/notes/diffusion_gemma.md (b) and
the checkpoint's own config.json, and the checkpoint is read by a reader of its own below, so the
converter is not checked against itself."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.paths import ROOT, load_tool
from pyapp.gguf import read_gguf
from pyapp.reference.quants import load_tensor

HF = ROOT / "tests" / "fixtures" / "diffusion-tiny-hf"
CONFIG = json.loads((HF / "config.json").read_text())
GENERATION = json.loads((HF / "generation_config.json").read_text())
N_LAYERS = 4
SLIDING = [True, False, True, False]

# checkpoint suffix (after model.decoder.layers.N.) -> GGUF suffix (after blk.N.)
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "layer_scalar": "layer_output_scale.weight",
}
GLOBAL_NAMES = {
    "model.decoder.embed_tokens.weight": "token_embd.weight",
    "model.decoder.norm.weight": "output_norm.weight",
    "model.decoder.self_conditioning.pre_norm.weight": "self_cond_pre_norm.weight",
    "model.decoder.self_conditioning.gate_proj.weight": "self_cond_gate.weight",
    "model.decoder.self_conditioning.up_proj.weight": "self_cond_up.weight",
    "model.decoder.self_conditioning.down_proj.weight": "self_cond_down.weight",
}
EXTRAS = {"self_cond_pre_norm.weight", "self_cond_gate.weight", "self_cond_up.weight", "self_cond_down.weight",
          *(f"blk.{i}.enc_layer_output_scale.weight" for i in range(N_LAYERS))}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float32 (bf16 widened exactly)."""
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[8 + n + b:8 + n + end]
        assert e["dtype"] == "BF16", (name, e["dtype"])
        out[name] = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(e["shape"])
    return out


CKPT = read_safetensors(HF / "model.safetensors")


def expected_map() -> dict[str, str]:
    """GGUF name -> checkpoint name for every converted tensor."""
    out = {gguf: hf for hf, gguf in GLOBAL_NAMES.items()}
    for i in range(N_LAYERS):
        for suffix, gsuffix in LAYER_NAMES.items():
            if suffix == "self_attn.v_proj.weight" and not SLIDING[i]:
                continue
            out[f"blk.{i}.{gsuffix}"] = f"model.decoder.layers.{i}.{suffix}"
        out[f"blk.{i}.enc_layer_output_scale.weight"] = f"model.encoder.language_model.layers.{i}.layer_scalar"
    return out


@pytest.fixture(scope="module")
def converter():
    return load_tool("convert_diffusion_gemma")


@pytest.fixture(scope="module")
def converted(tmp_path_factory, converter):
    """outtype -> the GGUF file converted from the fixture (no tokenizer); q8_0 through the command line."""
    d = tmp_path_factory.mktemp("diffusion")
    out = {}
    for outtype in ("f32", "f16", "q4_k"):
        out[outtype] = d / f"tiny-{outtype}.gguf"
        converter.convert(HF, out[outtype], outtype, vocab=None, log=lambda _msg: None)
    out["q8_0"] = d / "tiny-q8_0.gguf"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_diffusion_gemma.py"), str(HF),
                        str(out["q8_0"]), "--outtype", "q8_0", "--no-vocab"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "97 tensors" in r.stderr and "canvas 16" in r.stderr
    return out


def test_fixture_is_a_tiny_diffusion_gemma():
    assert CONFIG["architectures"] == ["DiffusionGemmaForBlockDiffusion"]
    tc = CONFIG["text_config"]
    assert (tc["hidden_size"], tc["num_hidden_layers"], tc["num_experts"], tc["vocab_size"]) == (64, 4, 4, 512)
    assert any(k.startswith("model.encoder.vision_tower.") for k in CKPT)
    # the encoder's layer scalars are its own (the decoder's differ), everything else is the decoder's copy
    enc = [CKPT[f"model.encoder.language_model.layers.{i}.layer_scalar"][0] for i in range(N_LAYERS)]
    dec = [CKPT[f"model.decoder.layers.{i}.layer_scalar"][0] for i in range(N_LAYERS)]
    assert all(e != d for e, d in zip(enc, dec))
    assert (HF / "model.safetensors").stat().st_size < 1 << 20


def test_f32_names_shapes_and_values(converted):
    g = read_gguf(converted["f32"])
    assert g.architecture == "diffusion-gemma"
    want = expected_map()
    assert set(g.tensors) == set(want) | {"rope_freqs.weight"}
    assert not any("vision" in n or n == "output.weight" for n in g.tensors)
    for gname, hf in want.items():
        t = g.tensors[gname]
        ref = CKPT[hf]
        assert t.shape == tuple(reversed(ref.shape)), gname          # ggml order: row length first
        assert t.type_name == "F32", gname
        np.testing.assert_array_equal(load_tensor(g, gname), ref, err_msg=gname)
    # a few shapes spelled out (ggml order), from the note's table at this model's size
    assert g.tensors["token_embd.weight"].shape == (64, 512)
    assert g.tensors["blk.0.attn_q.weight"].shape == (64, 4 * 32)
    assert g.tensors["blk.1.attn_q.weight"].shape == (64, 4 * 64)
    assert g.tensors["blk.1.attn_k.weight"].shape == (64, 1 * 64)
    assert g.tensors["blk.0.attn_v.weight"].shape == (64, 2 * 32)
    assert "blk.1.attn_v.weight" not in g.tensors and "blk.3.attn_v.weight" not in g.tensors   # K = V
    assert g.tensors["blk.2.ffn_gate_up_exps.weight"].shape == (64, 2 * 32, 4)
    assert g.tensors["blk.2.ffn_down_exps.weight"].shape == (32, 64, 4)
    assert g.tensors["self_cond_down.weight"].shape == (96, 64)
    assert g.tensors["blk.3.enc_layer_output_scale.weight"].shape == (1,)
    # the gate rows of the fused expert tensor come first, as in llama.cpp's gemma4
    gu = load_tensor(g, "blk.2.ffn_gate_up_exps.weight")
    np.testing.assert_array_equal(gu[1, :32], CKPT["model.decoder.layers.2.experts.gate_up_proj"][1, :32])
    # full layers' proportional RoPE (factor 0.25 of head dim 64: 8 rotated pairs of 32)
    np.testing.assert_array_equal(load_tensor(g, "rope_freqs.weight"), np.array([1.0] * 8 + [1e30] * 24, np.float32))


def test_metadata(converted):
    m = read_gguf(converted["f32"]).metadata
    tc = CONFIG["text_config"]
    a = "diffusion-gemma."
    assert m["general.architecture"] == "diffusion-gemma"
    assert m["general.file_type"] == 0
    expect = {
        "block_count": 4, "embedding_length": tc["hidden_size"], "context_length": 4096,
        "feed_forward_length": 96, "expert_feed_forward_length": 32, "expert_count": 4, "expert_used_count": 2,
        "attention.head_count": 4, "attention.head_count_kv": [2, 1, 2, 1],
        "attention.key_length": 64, "attention.value_length": 64,
        "attention.key_length_swa": 32, "attention.value_length_swa": 32,
        "attention.sliding_window": 8, "attention.sliding_window_pattern": SLIDING,
        "attention.shared_kv_layers": 0, "embedding_length_per_layer_input": 0,
        "rope.dimension_count": 64, "rope.dimension_count_swa": 32,
        "diffusion.canvas_length": CONFIG["canvas_length"], "diffusion.shift_logits": False,
        "diffusion.max_new_tokens": GENERATION["max_new_tokens"],
        "diffusion.max_denoising_steps": GENERATION["max_denoising_steps"],
        "diffusion.stability_threshold": GENERATION["stability_threshold"],
    }
    for k, v in expect.items():
        assert m[a + k] == v, k
    floats = {"rope.freq_base": 1e6, "rope.freq_base_swa": 1e4, "attention.layer_norm_rms_epsilon": 1e-6,
              "final_logit_softcapping": 30.0, "diffusion.t_min": GENERATION["t_min"],
              "diffusion.t_max": GENERATION["t_max"], "diffusion.confidence_threshold": 0.01,
              "diffusion.entropy_bound": GENERATION["sampler_config"]["entropy_bound"]}
    for k, v in floats.items():
        assert m[a + k] == pytest.approx(v, rel=1e-6), k
    assert (m["diffusion-gemma.diffusion.t_max"], m["diffusion-gemma.diffusion.entropy_bound"]) != (0.8, 0.1)
    assert list(m["tokenizer.ggml.eos_token_ids"]) == [1, 106, 50]
    assert (m["tokenizer.ggml.eos_token_id"], m["tokenizer.ggml.bos_token_id"],
            m["tokenizer.ggml.padding_token_id"]) == (1, 2, 0)
    assert "tokenizer.ggml.tokens" not in m


def test_shared_tensors_bind_as_gemma4(converted):
    """The Gemma 4 part of the file is exactly what pyapp.model.weights binds for a Gemma 4 26B-A4B:
    read as gemma4, every declared tensor fits, and what is left over are the DiffusionGemma extras."""
    from pyapp.model import weights
    from pyapp.model.config import Gemma4Config
    g = read_gguf(converted["q8_0"])
    meta = {("gemma4." + k[len("diffusion-gemma."):] if k.startswith("diffusion-gemma.") else k): v
            for k, v in g.metadata.items()}
    meta["general.architecture"] = "gemma4"
    cfg = Gemma4Config.from_metadata(meta, vocab_size=512, tensors=g.tensors)
    assert [lc.sliding for lc in cfg.layers] == SLIDING
    assert all(lc.has_moe and lc.experts_fused for lc in cfg.layers)
    assert [lc.k_eq_v for lc in cfg.layers] == [False, True, False, True]
    # the extras are the family's own declarations (pyapp.families.diffusion_gemma.weights): a Gemma 4 config
    # binds everything else, and refuses the file with them (a tensor the math needs is never skipped)
    from pyapp.families.diffusion_gemma.weights import DiffusionLayerWeights, DiffusionWeights
    own = {f.metadata["gguf"] for cls, base in ((DiffusionWeights, weights.ModelWeights),
                                                 (DiffusionLayerWeights, weights.LayerWeights))
           for f in cls.__dataclass_fields__.values() if f.name not in base.__dataclass_fields__}
    extras = {n for n in g.tensors if n in own or n.split(".", 2)[-1] in own}
    assert extras == EXTRAS
    w = weights.bind(cfg, {n: t for n, t in g.tensors.items() if n not in extras})
    assert {name for name, _owner, _field in weights.names(cfg, w)} == set(g.tensors) - EXTRAS
    with pytest.raises(weights.WeightsError, match="does not know how to use"):
        weights.bind(cfg, g.tensors)


def _blockwise_max(x: np.ndarray, block: int) -> np.ndarray:
    """max |x| over each block of `block` along the rows, repeated over the block."""
    b = np.abs(x).reshape(*x.shape[:-1], -1, block).max(axis=-1, keepdims=True)
    return np.broadcast_to(b, (*b.shape[:-1], block)).reshape(x.shape)


def test_q8_0_types_and_values(converted):
    g = read_gguf(converted["q8_0"])
    assert g.metadata["general.file_type"] == 7
    want = expected_map()
    assert set(g.tensors) == set(want) | {"rope_freqs.weight"}
    n_q8 = 0
    for gname, hf in want.items():
        t, ref = g.tensors[gname], CKPT[hf]
        assert t.shape == tuple(reversed(ref.shape)), gname
        got = load_tensor(g, gname)
        # as llama.cpp's converter: 1-D tensors, norms, the router and .scale tensors stay F32
        if ref.ndim == 1 or gname.endswith(("_norm.weight", ".scale")) or gname.endswith("ffn_gate_inp.weight"):
            assert t.type_name == "F32", gname
            np.testing.assert_array_equal(got, ref, err_msg=gname)
            continue
        assert t.type_name == "Q8_0", gname
        n_q8 += 1
        # round to nearest with d = amax/127 per 32 weights, as ggml does: error <= d/2, plus |q| <= 127
        # times the f16 rounding of d (relative 2^-11; absolute 2^-25 where d is subnormal in f16, as in
        # the self-conditioning down projection, scaled by 0.1)
        bound = _blockwise_max(ref, 32) / 127 * (0.5 + 127 / 2048) * 1.01 + 127 * 2.0 ** -25
        assert np.all(np.abs(got - ref) <= bound), gname
        assert not np.array_equal(got, ref)       # it was quantized
    assert n_q8 == 38
    np.testing.assert_array_equal(load_tensor(g, "rope_freqs.weight")[:8], np.ones(8, np.float32))


def test_q4_k_and_f16_types(converted):
    g = read_gguf(converted["q4_k"])
    assert g.metadata["general.file_type"] == 15          # Q4_K_M
    types = {n: t.type_name for n, t in g.tensors.items()}
    # rows of 256 (the full layers' attn_output: 4 heads x 64) take Q4_K; other rows are not a multiple of
    # 256 and fall back as llama.cpp does: Q4_K -> Q5_0; the LM head and attn_v want Q6_K -> Q8_0
    assert {n for n, t in types.items() if t == "Q4_K"} == {"blk.1.attn_output.weight", "blk.3.attn_output.weight"}
    assert {n for n, t in types.items() if t == "Q8_0"} == {"token_embd.weight", "blk.0.attn_v.weight",
                                                           "blk.2.attn_v.weight"}
    assert types["blk.0.ffn_gate_up_exps.weight"] == types["self_cond_gate.weight"] == "Q5_0"
    assert types["blk.0.ffn_gate_inp.weight"] == types["blk.0.attn_norm.weight"] == "F32"
    for gname, hf in expected_map().items():
        ref, got = CKPT[hf], load_tensor(g, gname)
        err = np.abs(got - ref).max()
        assert err <= 0.1 * np.abs(ref).max() + 1e-8, (gname, types[gname], err)
    g16 = read_gguf(converted["f16"])
    assert g16.tensors["blk.1.attn_q.weight"].type_name == "F16"
    assert g16.tensors["blk.1.attn_q_norm.weight"].type_name == "F32"
    ref = CKPT["model.decoder.self_conditioning.up_proj.weight"]
    np.testing.assert_array_equal(load_tensor(g16, "self_cond_up.weight"), ref.astype(np.float16).astype(np.float32))


def test_config_and_info_say_what_it_is(converted):
    from pyapp.explain import explain
    from pyapp.families.diffusion_gemma import diffusion_summary
    from pyapp.model.config import ConfigError, Gemma4Config, UnsupportedModelError
    g = read_gguf(converted["q8_0"])
    with pytest.raises(UnsupportedModelError) as e:
        Gemma4Config.from_gguf(g)
    assert isinstance(e.value, ConfigError)
    assert str(e.value) == ("DiffusionGemma (text diffusion on the Gemma 4 26B-A4B) has no next-token logits: it "
                            "writes by denoising a canvas (diffusion-logits, generate, chat, the app)")
    assert explain(e.value, "tiny.gguf")["error"] == (
        "\u201ctiny.gguf\u201d is a DiffusionGemma model (text diffusion): it writes by denoising, not token by "
        "token, so it has no next-token logits. Chat with it, or use diffusion-logits for one denoising step.")
    assert diffusion_summary({"general.architecture": "gemma4"}) is None
    r = subprocess.run([sys.executable, "-m", "pyapp", "info", str(converted["q8_0"])], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "architecture:  diffusion-gemma" in out
    assert ("model:         DiffusionGemma, text diffusion on the Gemma 4 26B-A4B: 4 layers (SGSG), hidden 64, "
            "4 heads, MoE 2/4 experts x 32, window 8; canvas of 16 tokens, up to 12 denoising steps, "
            "temperature 0.9 -> 0.3, entropy bound 0.25") in out
    assert ("config:        4 layers (SGSG), hidden 64, 4 heads, vocab 512, window 8, MoE 2/4 experts x 32"
            in out) and "GPU memory:" in out         # the engine runs it (the app does not yet)
    assert "Q8_0        38 tensors" in out
    assert "Traceback" not in out + r.stderr
    # next-token logits do not apply: the command says what does
    r = subprocess.run([sys.executable, "-m", "pyapp", "logits", str(converted["q8_0"]), "--tokens", "2,5",
                        "--out", str(converted["q8_0"].with_suffix(".npy")), "--backend", "reference"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: DiffusionGemma scores its canvas, not a next token: use diffusion-logits "
                                "(one denoising step's logits), generate or chat")


def test_tokenizer_from_gemma4_vocab(tmp_path, converter, vocab_gguf_path):
    from pyapp.tokenizer import Tokenizer
    out = tmp_path / "tok.gguf"
    converter.convert(HF, out, "f32", vocab=vocab_gguf_path, log=lambda _msg: None)
    m = read_gguf(out).metadata
    assert len(m["tokenizer.ggml.tokens"]) == 512 and m["tokenizer.ggml.model"] == "gemma4"
    tok = Tokenizer.from_metadata(m)
    assert {1, 106, 50} <= set(tok.stop_ids)
    assert tok.decode(tok.encode("hello")) == "hello"


def _copy_fixture(tmp_path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    for f in HF.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    return d


def test_converter_refuses_what_it_does_not_know(tmp_path, converter):
    d = _copy_fixture(tmp_path)
    cfg = dict(CONFIG, architectures=["Gemma4ForConditionalGeneration"], model_type="gemma4")
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(converter.ConvertError, match="not a DiffusionGemma checkpoint"):
        converter.convert(d, tmp_path / "x.gguf", "f32")
    # a config that disagrees with the tensors
    tc = dict(CONFIG["text_config"], intermediate_size=128)
    (d / "config.json").write_text(json.dumps(dict(CONFIG, text_config=tc)))
    with pytest.raises(converter.ConvertError, match=r"mlp.down_proj.weight \[64, 96\] \(expected \[64, 128\]\)"):
        converter.convert(d, tmp_path / "x.gguf", "f32")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_diffusion_gemma.py"), str(tmp_path / "none"),
                        str(tmp_path / "x.gguf"), "--no-vocab"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "config.json" in r.stderr


def test_chunked_conversion_writes_the_same_file(tmp_path, converter, converted, monkeypatch):
    """Big tensors are converted a slice of rows at a time (memory stays at about one chunk): the bytes
    do not depend on the chunk size."""
    monkeypatch.setattr(converter, "CHUNK_ELEMENTS", 1000)
    out = tmp_path / "chunked.gguf"
    converter.convert(HF, out, "q8_0", vocab=None, log=lambda _msg: None)
    assert out.read_bytes() == converted["q8_0"].read_bytes()


def test_config_with_global_head_dim_instead_of_per_layer_config(tmp_path, converter, converted):
    """transformers turns global_head_dim / num_global_key_value_heads into per_layer_config when it
    saves; a config.json written with the former must convert the same."""
    d = _copy_fixture(tmp_path)
    tc = {k: v for k, v in CONFIG["text_config"].items() if k != "per_layer_config"}
    tc.update(global_head_dim=64, num_global_key_value_heads=1)
    (d / "config.json").write_text(json.dumps(dict(CONFIG, text_config=tc)))
    out = tmp_path / "x.gguf"
    converter.convert(d, out, "f32", vocab=None, log=lambda _msg: None)
    got, ref = read_gguf(out), read_gguf(converted["f32"])
    assert {k: v for k, v in got.metadata.items() if k != "general.name"} == \
        {k: v for k, v in ref.metadata.items() if k != "general.name"}
    assert {n: t.shape for n, t in got.tensors.items()} == {n: t.shape for n, t in ref.tensors.items()}
