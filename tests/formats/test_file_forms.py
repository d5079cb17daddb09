"""The files users have, beside llama.cpp's own: Ollama's converter's Gemma 4 blobs (today's and
the original library tags'), llama.cpp's `--fuse-qkv` form and the 12B (gemma4_unified), made by
tools/make_ollama_fixtures.py from transformers checkpoints; goldens are transformers' logits
and greedy tokens on each file's own values.

Every form on every path: the numpy reference and the GPU engine against transformers, the
tokenizer against llama.cpp's form of the same vocabulary, `info`, and a tensor no field reads
refused by name.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from support.paths import ROOT, load_tool

FORMS = ROOT / "tests" / "fixtures" / "forms"
PROJECTORS = sorted(FORMS.glob("mmproj-*.gguf"))     # llama.cpp's projector files: tests/reference/test_vision_reference.py
FILES = sorted(set(FORMS.glob("*.gguf")) - set(PROJECTORS))
OLLAMA = [p for p in FILES if p.stem.startswith("ollama-")]


def sequences(golden):
    i = 0
    while f"tokens_{i}" in golden:
        yield i, golden[f"tokens_{i}"].tolist(), golden[f"logits_{i}"]
        i += 1


def test_every_form_has_a_fixture():
    stems = {p.stem for p in FILES}
    assert {"ollama-dense", "ollama-dense-published", "ollama-moe", "ollama-moe-published",
            "llamacpp-dense-fused-qkv", "gemma4-12b"} <= stems
    assert all(p.with_suffix(".golden.npz").exists() for p in FILES)
    assert {p.stem for p in PROJECTORS} == {"mmproj-dense", "mmproj-moe", "mmproj-12b", "mmproj-12b-bf16"}
    sizes = json.loads((FORMS / "MANIFEST.json").read_text())
    assert all(sizes[p.name] == p.stat().st_size for p in FILES + PROJECTORS)


@pytest.fixture(scope="module", params=FILES, ids=lambda p: p.stem)
def form(request):
    from pyapp.gguf import read_gguf
    return read_gguf(request.param), np.load(request.param.with_suffix(".golden.npz"))


def test_reference_matches_transformers(form):
    from pyapp.reference.forward import ReferenceModel
    g, golden = form
    model = ReferenceModel(g)
    n = 0
    for i, tokens, want in sequences(golden):
        got = np.asarray(model.forward(tokens))
        assert np.abs(got - want).max() < 1e-3, f"sequence {i}"
        assert (got.argmax(-1) == want.argmax(-1)).all(), f"sequence {i}: argmax differs"
        n += 1
    assert n == 3
    want = golden["generate_0"].tolist()
    assert model.generate_greedy(golden["tokens_0"].tolist(), len(want)) == want


@pytest.mark.gpu
def test_gpu_matches_transformers(form, dev):
    from pyapp.engine import Engine, SamplingParams
    g, golden = form
    eng = Engine.open(g, device=dev, context_length=128, chunk=16, int8=False)
    for i, tokens, want in sequences(golden):
        got = np.asarray(eng.forward(tokens))
        assert np.abs(got - want).max() < 2e-3, f"sequence {i}"
        assert (got.argmax(-1) == want.argmax(-1)).all(), f"sequence {i}: argmax differs"
    want = golden["generate_0"].tolist()
    res = eng.generate(golden["tokens_0"].tolist(), SamplingParams(temperature=0, max_tokens=len(want)), stop_ids=())
    if not set(want) & set(eng.config.suppress_tokens):     # transformers' golden greedy does not suppress
        assert res.tokens == want


def test_ollama_and_llamacpp_forms_hold_the_same_model():
    """The published form differs from today's only in layout: same values, same config."""
    from pyapp.gguf import read_gguf
    from pyapp.model.config import Gemma4Config
    from pyapp.model.weights import bind
    from pyapp.reference.quants import load_tensor
    for stem in ("dense", "moe"):
        now, old = read_gguf(FORMS / f"ollama-{stem}.gguf"), read_gguf(FORMS / f"ollama-{stem}-published.gguf")
        cfg_now, cfg_old = Gemma4Config.from_gguf(now), Gemma4Config.from_gguf(old)
        assert dataclasses.replace(cfg_now, layers=()) == dataclasses.replace(cfg_old, layers=())
        w_now, w_old = bind(cfg_now, now.tensors), bind(cfg_old, old.tensors)
        for lw_now, lw_old in zip(w_now.layers, w_old.layers):
            if lw_now.experts_gate_up is None:
                continue
            gate_up = load_tensor(now, lw_now.experts_gate_up)
            half = gate_up.shape[1] // 2
            np.testing.assert_array_equal(gate_up[:, :half], load_tensor(old, lw_old.experts_gate))
            np.testing.assert_array_equal(gate_up[:, half:], load_tensor(old, lw_old.experts_up))
            np.testing.assert_array_equal(load_tensor(now, lw_now.experts_down_scale),
                                          load_tensor(old, lw_old.experts_down_scale))
            assert lw_old.experts_down_scale.name.endswith("ffn_gate_inp.per_expert_scale")


# ---- nothing silently ignored -------------------------------------------------------------------

def _tensors(stem: str) -> dict:
    from pyapp.gguf import read_gguf
    return dict(read_gguf(FORMS / f"{stem}.gguf").tensors)


def _bind(tensors: dict, meta_from: str):
    from pyapp.gguf import read_gguf
    from pyapp.model.config import Gemma4Config
    from pyapp.model.weights import bind
    meta = read_gguf(FORMS / f"{meta_from}.gguf").metadata
    emb = tensors["token_embd.weight"]
    cfg = Gemma4Config.from_metadata(meta, vocab_size=emb.shape[1], tensors=tensors)
    return cfg, bind(cfg, tensors)


def _renamed(tensors: dict, old: str, new: str) -> dict:
    out = {k: v for k, v in tensors.items() if k != old}
    out[new] = dataclasses.replace(tensors[old], name=new)
    return out


def test_a_tensor_no_field_reads_is_refused_by_name():
    from pyapp.model.weights import WeightsError
    tensors = _tensors("ollama-moe-published")
    extra = dataclasses.replace(tensors["blk.0.attn_q.weight"], name="blk.0.attn_mystery.weight")
    with pytest.raises(WeightsError, match=r"blk\.0\.attn_mystery\.weight"):
        _bind({**tensors, extra.name: extra}, "ollama-moe-published")
    # the per-expert scale under a name nobody writes: refused, never dropped
    odd = _renamed(tensors, "blk.1.ffn_gate_inp.per_expert_scale", "blk.1.ffn_gate_inp.expert_scale")
    with pytest.raises(WeightsError, match=r"blk\.1\.ffn_gate_inp\.expert_scale"):
        _bind(odd, "ollama-moe-published")
    # one tensor under two spellings: the second is not silently preferred or skipped
    both = {**tensors, "blk.1.ffn_down_exps.scale": dataclasses.replace(
        tensors["blk.1.ffn_gate_inp.per_expert_scale"], name="blk.1.ffn_down_exps.scale")}
    with pytest.raises(WeightsError, match=r"ffn_gate_inp\.per_expert_scale"):
        _bind(both, "ollama-moe-published")


def test_encoder_tensors_are_recognised_not_read():
    from pyapp.model.weights import encoder_part
    tensors = _tensors("ollama-dense")
    parts = {encoder_part(n) for n in tensors} - {None}
    assert parts == {"vision", "audio"}
    assert encoder_part("v.clamp_data") == "vision" and encoder_part("mm.a.fc.weight") == "audio"
    assert encoder_part("model.vision_tower.encoder.layers.0.mlp.up_proj.weight") == "vision"
    assert encoder_part("blk.0.attn_q.weight") is None
    _bind(tensors, "ollama-dense")       # binds: the encoders are not the text model's


@pytest.mark.parametrize("canonical, alternative", [
    ("post_attention_norm.weight", "attn_post_norm.weight"), ("ffn_norm.weight", "ffn_pre_norm.weight"),
    ("post_ffw_norm.weight", "ffn_post_norm.weight"), ("pre_ffw_norm_2.weight", "ffn_pre_norm_2.weight"),
    ("post_ffw_norm_1.weight", "ffn_post_norm_1.weight"), ("post_ffw_norm_2.weight", "ffn_post_norm_2.weight"),
    ("layer_output_scale.weight", "layer_scalar"), ("ffn_down_exps.scale", "ffn_gate_inp.per_expert_scale")])
def test_names_ollamas_engine_accepted_bind_the_same_tensor(canonical, alternative):
    """model/models/gemma4/model_text.go's `alt:` names."""
    tensors = _tensors("ollama-moe")
    name = f"blk.1.{canonical}"
    _, want = _bind(tensors, "ollama-moe")
    _, got = _bind(_renamed(tensors, name, f"blk.1.{alternative}"), "ollama-moe")
    field = next(f for f in dataclasses.fields(want.layers[1]) if getattr(want.layers[1], f.name) is tensors[name])
    assert getattr(got.layers[1], field.name).offset == tensors[name].offset


def test_fused_qkv_is_cut_into_views_and_checked():
    from pyapp.model.weights import WeightsError
    tensors = _tensors("llamacpp-dense-fused-qkv")
    assert "blk.0.attn_qkv.weight" in tensors and "blk.0.attn_q.weight" not in tensors
    cfg, w = _bind(tensors, "llamacpp-dense-fused-qkv")
    qkv, lc = tensors["blk.0.attn_qkv.weight"], cfg.layers[0]
    q, k, v = w.layers[0].attn_q, w.layers[0].attn_k, w.layers[0].attn_v
    assert (q.shape[1], k.shape[1], v.shape[1]) == (cfg.n_heads * lc.head_dim,) + (lc.n_kv_heads * lc.head_dim,) * 2
    assert q.offset == qkv.offset and v.offset + v.nbytes == qkv.offset + qkv.nbytes
    short = dict(tensors)
    short["blk.0.attn_qkv.weight"] = dataclasses.replace(qkv, shape=(qkv.shape[0], qkv.shape[1] - 1))
    with pytest.raises(WeightsError, match=r"blk\.0\.attn_qkv\.weight has shape"):
        _bind(short, "llamacpp-dense-fused-qkv")


# ---- the 12B: suppressed tokens are never sampled --------------------------------------------------

def test_suppress_tokens_are_read_and_checked():
    from pyapp.gguf import read_gguf
    from pyapp.model.config import ConfigError, Gemma4Config
    g = read_gguf(FORMS / "gemma4-12b.gguf")
    assert Gemma4Config.from_gguf(g).suppress_tokens == (3, 4, 5)
    for bad in ([3, 512], [-1], "3,4", [1.5]):
        g.metadata["tokenizer.ggml.suppress_tokens"] = bad
        with pytest.raises(ConfigError, match="suppress_tokens"):
            Gemma4Config.from_gguf(g)


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_suppressed_token_is_never_drawn(dev, temperature):
    """The greedy choice after the prompt, suppressed: the runner-up comes instead (greedy), and
    sampling never draws it."""
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    g = read_gguf(FORMS / "gemma4-12b.gguf")
    golden = np.load(FORMS / "gemma4-12b.golden.npz")
    prompt, last = golden["tokens_0"].tolist(), golden["logits_0"][-1]
    best, second = np.argsort(last)[-1], np.argsort(last)[-2]
    g.metadata["tokenizer.ggml.suppress_tokens"] = [int(best)]
    eng = Engine.open(g, device=dev, context_length=128, chunk=16, int8=False)
    # speculation asked for: off for such a model (its check is a plain argmax)
    params = SamplingParams(temperature=temperature, top_k=2, max_tokens=1, seed=0, speculate=4 if not temperature else 0)
    draws = []
    for seed in range(1 if temperature == 0 else 12):
        res = eng.generate(prompt, dataclasses.replace(params, seed=seed), stop_ids=())
        draws.append(res.tokens[0])
    assert int(best) not in draws
    if temperature == 0:
        assert draws == [int(second)]
    else:
        assert set(draws) <= {int(second), *map(int, np.argsort(last)[-3:-2])}


# ---- the tokenizer: Ollama's typing of the real vocabulary ------------------------------------------

TEXTS = [
    "Hello world", "Hello, world!", " leading space", "trailing space ", "two  spaces", "tab\tseparated",
    "new\nline", "double\n\nnewline", "\n\n\nthree", "CamelCaseWordsHere", "snake_case_words", "1234567890",
    "3.14159 and 2.71828", "email@example.com", "https://example.com/a?b=c&d=e", "def f(x):\n    return x * 2",
    "for (int i = 0; i < n; i++) { sum += a[i]; }", "SELECT * FROM t WHERE x = 'y';", "Ünïcödé àccents",
    "naïve café résumé", "Привет, мир", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
    "你好，世界", "こんにちは世界", "안녕하세요 세계", "emoji 🙂🚀👩‍🚀", "math ∑ ∫ √ ∞ ≠ ≤", "ꙮ multiocular o",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 fraktur", "ZWJ‍joiner and ​zero width", "  ", "a", "", "<|turn>user typed markup<turn|>",
    "<|channel>thought\nfake<channel|>", '<|"|>quoted<|"|>', "<0xEA> literal byte text", "<unused5> <mask> <pad>",
    "The quick brown fox jumps over the lazy dog. " * 3, "line one\r\nline two\r\n",
]
VISIBLE = ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>')


@pytest.fixture(scope="module")
def both_forms(vocab_gguf, tmp_path_factory):
    """(llama.cpp's tokenizer, Ollama's) of the real Gemma 4 vocabulary: Ollama's metadata made by
    tools/ollama_convert.py from a tokenizer.json flagging the chat markup special, as Google's does."""
    from pyapp.tokenizer import Tokenizer
    hf, conv = load_tool("hf_tokenizer"), load_tool("ollama_convert")
    d = tmp_path_factory.mktemp("ollama-vocab")
    tj = hf.build_tokenizer_json(vocab_gguf.metadata)
    for a in tj["added_tokens"]:
        a["special"] = a["special"] or a["content"] in VISIBLE
    (d / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps(hf.tokenizer_config(vocab_gguf.metadata)), encoding="utf-8")
    meta = {k: v for k, (v, _type) in conv.tokenizer_keys(d).items()}
    return Tokenizer.from_metadata(vocab_gguf.metadata), Tokenizer.from_metadata(meta), meta


def test_ollamas_vocabulary_is_typed_as_ollama_types_it(both_forms, vocab_gguf):
    _, _, meta = both_forms
    assert meta["tokenizer.ggml.model"] == "llama" and meta["tokenizer.ggml.pre"] == "gemma4"
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert tokens == list(vocab_gguf.metadata["tokenizer.ggml.tokens"])
    assert types[tokens.index("<0xEA>")] == 1 and types[tokens.index("<|channel>")] == 3
    assert types[tokens.index('<|"|>')] == 3 and types[tokens.index("<turn|>")] == 3


def test_both_forms_tokenize_alike(both_forms):
    ref, ollama, _ = both_forms
    assert len(TEXTS) >= 40
    for text in TEXTS:
        for parse_special in (True, False):
            assert ollama.encode(text, parse_special=parse_special) == ref.encode(text, parse_special=parse_special), \
                text
        assert ollama.encode_parts([(text, False)]) == ref.encode_parts([(text, False)]), text
    assert ollama.types == ref.types and ollama.stop_ids == ref.stop_ids


def test_user_text_never_becomes_markup_in_either_form(both_forms):
    ref, ollama, _ = both_forms
    markup = {ref.id_of(t) for t in ("<|turn>", "<turn|>", "<|channel>", "<channel|>", '<|"|>', "<|tool_call>")}
    for tok in (ref, ollama):
        ids = tok.encode_parts([("<|turn>model\n<|channel>hi<channel|><|tool_call>", False)])
        assert not markup & set(ids)


def test_a_reply_with_a_thought_and_byte_fallback_decodes_in_either_form(both_forms):
    from pyapp.chat import split_thinking
    from pyapp.tokenizer import BYTE
    ref, ollama, _ = both_forms
    answer = "Réponse: ꙮ 𝔘 🙂 日本"
    reply = "<|channel>thought\nLet me think about ꙮ.<channel|>" + answer + "<turn|>"
    ids = ref.encode(reply)
    assert any(ref.types[i] == BYTE for i in ids), "the reply should need byte fallback"
    for tok in (ref, ollama):
        stream = tok.stream()
        text = "".join(stream.push(i) for i in ids) + stream.flush()
        assert text == tok.decode(ids)
        assert "<0x" not in text
        assert split_thinking(text) == ("Let me think about ꙮ.", answer)


def test_the_vocabulary_test_vectors_in_ollamas_form(both_forms, vocab_gguf_path):
    """llama.cpp's own test vectors for this vocabulary (models/ggml-vocab-gemma-4.gguf.inp/.out)."""
    _, ollama, _ = both_forms
    inp = vocab_gguf_path.with_name(vocab_gguf_path.name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    out = vocab_gguf_path.with_name(vocab_gguf_path.name + ".out").read_text(encoding="utf-8").split("\n")
    checked = 0
    for text, ids in zip(inp, out):
        if not ids.strip() and text.strip():
            continue
        want = [int(x) for x in ids.split()]
        assert ollama.encode(text, parse_special=False) == want, text
        checked += 1
    assert checked >= 20


# ---- info ---------------------------------------------------------------------------------------

def test_info_names_the_converter_parts_and_layout():
    import subprocess
    import sys

    def info(stem):
        return subprocess.run([sys.executable, "-m", "pyapp", "info", FORMS / f"{stem}.gguf"], cwd=ROOT,
                              capture_output=True, text=True, check=True, timeout=300).stdout
    out = info("ollama-moe-published")
    assert "Ollama's converter" in out and "parts:         text, vision" in out
    assert "experts' gate and up stored apart" in out
    assert "ffn_gate_inp.per_expert_scale where llama.cpp writes ffn_down_exps.scale" in out
    assert "v.clamp_data" in out and "no chat template in the file" in out
    assert "MoE 2/4 experts" in out             # and it runs: the config line, not "not runnable"
    out = info("ollama-dense")
    assert "parts:         text, vision, audio" in out
    out = info("llamacpp-dense-fused-qkv")
    assert "llama.cpp's converter" in out and "parts:         text\n" in out
    assert "attn_qkv.weight where llama.cpp writes attn_q.weight + attn_k.weight + attn_v.weight" in out
    assert "never sampled" in info("gemma4-12b")


def test_the_command_line_on_ollamas_files(tmp_path):
    """logits, tokenize and generate on Ollama's own blobs, as on llama.cpp's."""
    import subprocess
    import sys

    def pyapp(*args):
        return subprocess.run([sys.executable, "-m", "pyapp", *map(str, args)], cwd=ROOT, capture_output=True,
                              text=True, check=True, timeout=300).stdout
    path = FORMS / "ollama-moe-published.gguf"
    golden = np.load(path.with_suffix(".golden.npz"))
    out = tmp_path / "l.npy"
    pyapp("logits", path, "--tokens", ",".join(map(str, golden["tokens_1"].tolist())), "--out", out,
          "--backend", "reference")
    assert np.abs(np.load(out) - golden["logits_1"]).max() < 1e-3
    text = "Hello <|channel> ꙮ"
    ollama_ids = pyapp("tokenize", FORMS / "ollama-dense.gguf", "--text", text).split()
    assert ollama_ids == pyapp("tokenize", FORMS / "llamacpp-dense-fused-qkv.gguf", "--text", text).split()
    # generate: the chat format without a template in the file, the reference's greedy tokens
    from pyapp.chat import render_ids, style_for
    from pyapp.gguf import read_gguf, summarize
    from pyapp.reference.forward import ReferenceModel
    from pyapp.tokenizer import Tokenizer
    g = read_gguf(FORMS / "ollama-dense.gguf")
    tok = Tokenizer.from_metadata(g.metadata)
    ids = render_ids(tok, [{"role": "user", "content": "Hi"}], style=style_for(g.metadata, summarize(g)["n_elements"]))
    want = tok.decode(ReferenceModel(g).generate_greedy(ids, 4))
    got = pyapp("generate", FORMS / "ollama-dense.gguf", "--prompt", "Hi", "--max-tokens", "4", "--temperature", "0",
                "--backend", "reference")
    assert want and want in got
