"""pyapp.train.adapter_out: the adapter GGUF a fine-tune writes, read back by our reader and LoRA checks
(pyapp.gguf, pyapp.model.lora), by gguf-py (keys, types, names, shapes, data; and byte for byte against
gguf-py's GGUFWriter given the same content), and checked against llama.cpp's load rules
(src/llama-adapter.cpp, mirrored below; the rules' source lines are checked in the vendored copy when
the llama-cpp-python sdist is there)."""

from __future__ import annotations

import tarfile
from array import array

import numpy as np
import pytest

from pyapp.train.adapter_out import (AdapterWriteError, adapter_gguf, lora_targets, parse_targets,
                                     write_adapter)

from support.adapters import llama_cpp_load_errors
from support.paths import ROOT

FIX = ROOT / "tests" / "fixtures"
SDIST = ROOT / ".cache" / "sdist" / "llama_cpp_python-0.3.36.tar.gz"
RANK, ALPHA = 3, 16.0


def model(name: str):
    from pyapp.gguf import read_gguf
    from pyapp.model.config import Gemma4Config
    from pyapp.model.weights import bind
    g = read_gguf(FIX / f"{name}.gguf")
    cfg = Gemma4Config.from_gguf(g)
    return g, cfg, bind(cfg, g.tensors)


@pytest.fixture(scope="module")
def dense():
    return model("gemma4-dense-f32")


def random_pairs(specs, rank=RANK, seed=0):
    """{base: (A [r, n_in], B [n_out, r])} as numpy, and the same as the writer's inputs (array('f'))."""
    rng = np.random.default_rng(seed)
    arrays = {s.name: (rng.standard_normal((rank, s.n_in)).astype(np.float32),
                       rng.standard_normal((s.n_out, rank)).astype(np.float32)) for s in specs}
    return arrays, {n: (array("f", a.ravel().tolist()), array("f", b.ravel().tolist())) for n, (a, b) in arrays.items()}


def test_targets_skip_kv_shared_layers(dense):
    _, cfg, bound = dense
    specs = lora_targets(cfg, bound, "q,k,v,o,gate,up,down")
    by_layer = {}
    for s in specs:
        by_layer.setdefault(s.layer, []).append(s.field)
    own = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    shared = ["attn_q", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    assert [lc.owns_kv for lc in cfg.layers] == [True, True, False, False]
    assert by_layer == {0: own, 1: own, 2: shared, 3: shared}
    down = next(s for s in specs if s.layer == 2 and s.field == "ffn_down")
    assert (down.name, down.n_in, down.n_out) == ("blk.2.ffn_down.weight", 256, 256)   # double-wide MLP
    q1 = next(s for s in specs if s.layer == 1 and s.field == "attn_q")
    assert (q1.n_in, q1.n_out) == (256, 128)                                        # 2 heads of 64 (global)
    assert [s.field for s in lora_targets(cfg, bound, ["ple_proj", "q"]) if s.layer == 0] == ["attn_q", "ple_proj"]


def test_targets_on_k_eq_v_layers_and_router():
    _, cfg, bound = model("gemma4-moe-f32")
    specs = lora_targets(cfg, bound, "v,router")
    assert {(s.layer, s.field) for s in specs} == ({(i, "router") for i in range(4)}
                                                  | {(i, "attn_v") for i, lc in enumerate(cfg.layers) if lc.has_v})
    assert not all(lc.has_v for lc in cfg.layers)           # global layers: K = V, no V projection


@pytest.mark.parametrize("bad", ["q,embed", "lm_head", "", "q,,x"])
def test_unknown_targets_are_refused(bad):
    with pytest.raises(ValueError, match="LoRA target"):
        parse_targets(bad)


def test_reads_back_through_our_reader_and_lora_checks(tmp_path, dense):
    from pyapp.gguf import read_gguf
    from pyapp.model.lora import load_lora
    g, cfg, bound = dense
    specs = lora_targets(cfg, bound)
    arrays, pairs = random_pairs(specs)
    path = tmp_path / "tuned.gguf"
    size = write_adapter(path, pairs, RANK, ALPHA, name="tuned")
    assert size == path.stat().st_size and not (tmp_path / "tuned.gguf.tmp").exists()
    a = load_lora(str(path), cfg, bound, 1.0, g.architecture)          # every llama.cpp check passes
    assert a.alpha == ALPHA and [t.name for t in a.targets] == [s.name for s in specs]
    assert {t.rank for t in a.targets} == {RANK} and a.scale(a.targets[0]) == pytest.approx(ALPHA / RANK)
    assert a.gguf.metadata_types["adapter.lora.alpha"] == 6 and a.gguf.version == 3
    assert a.gguf.metadata["general.name"] == "tuned"
    for t in a.targets:
        raw_a, raw_b = a.arrays(t)
        want_a, want_b = arrays[t.name]
        assert np.array_equal(np.frombuffer(raw_a, np.float32).reshape(RANK, t.n_in), want_a)
        assert np.array_equal(np.frombuffer(raw_b, np.float32).reshape(t.n_out, RANK), want_b)
    assert read_gguf(path).tensors[specs[0].name + ".lora_a"].offset % 32 == 0
    assert adapter_gguf(pairs, RANK, ALPHA, name="tuned") == path.read_bytes()


def test_gguf_py_reads_it_and_writes_the_same_bytes(tmp_path, dense):
    gguf = pytest.importorskip("gguf")
    _, cfg, bound = dense
    specs = lora_targets(cfg, bound, "q,k,v,o,gate,up,down,ple_gate,ple_proj")
    arrays, pairs = random_pairs(specs, seed=1)
    ours = tmp_path / "ours.gguf"
    write_adapter(ours, pairs, RANK, ALPHA)
    r = gguf.GGUFReader(str(ours))
    kinds = {k: f.types[0] for k, f in r.fields.items() if not k.startswith("GGUF.")}
    V = gguf.GGUFValueType
    assert kinds == {"general.architecture": V.STRING, "general.type": V.STRING, "adapter.type": V.STRING,
                     "adapter.lora.alpha": V.FLOAT32}
    assert [r.fields[k].contents() for k in ("general.architecture", "general.type", "adapter.type")] == \
        ["gemma4", "adapter", "lora"]
    assert r.fields["adapter.lora.alpha"].contents() == ALPHA
    assert [t.name for t in r.tensors] == [s.name + suffix for s in specs for suffix in (".lora_a", ".lora_b")]
    for t in r.tensors:
        a, b = arrays[t.name[:-7]]
        want = a if t.name.endswith(".lora_a") else b
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(t.shape) == list(reversed(want.shape))               # ggml ne: numpy shape reversed
        assert np.array_equal(np.asarray(t.data).reshape(want.shape), want)
    # gguf-py writing the same keys and tensors, as llama.cpp's notes say a loadable adapter is made
    theirs = tmp_path / "theirs.gguf"
    w = gguf.GGUFWriter(str(theirs), arch="gemma4")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", ALPHA)
    for s in specs:
        a, b = arrays[s.name]
        w.add_tensor(s.name + ".lora_a", a)
        w.add_tensor(s.name + ".lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert ours.read_bytes() == theirs.read_bytes()


# ---- llama.cpp's load rules (src/llama-adapter.cpp, llama_adapter_lora_init_impl) --------------------

# the source lines each rule below mirrors, as they stand in the vendored llama.cpp
RULE_SOURCE = [
    'if (general_type != "adapter")',
    "if (general_arch != model.arch)",
    'if (adapter_type != "lora")',
    "adapter.alpha = get_kv_f32(llm_kv(LLM_KV_ADAPTER_LORA_ALPHA));",
    'if (str_endswith(name, ".lora_a"))',
    'str_endswith(name, ".lora_b")',
    'str_endswith(name, "_norm.weight")',
    'throw std::runtime_error("LoRA tensor \'" + name + "\' has unexpected suffix");',
    "if (!w.a || !w.b)",
    "if (!model_tensor)",
    "if (model_tensor->ne[0] != w.a->ne[0] || model_tensor->ne[1] != w.b->ne[1])",
    "if (w.a->ne[1] != w.b->ne[0])",
]


def test_the_mirrored_rules_are_llama_cpps():
    if not SDIST.exists():
        pytest.skip(f"{SDIST} missing: run `python3 build.py setup`")
    with tarfile.open(SDIST) as tar:
        src = tar.extractfile("llama_cpp_python-0.3.36/vendor/llama.cpp/src/llama-adapter.cpp").read().decode()
    missing = [line for line in RULE_SOURCE if line not in src]
    assert not missing, missing


@pytest.mark.parametrize("fixture,targets", [("gemma4-dense-f32", "q,k,v,o,gate,up,down,ple_gate,ple_proj"),
                                             ("gemma4-moe-f32", "q,k,v,o,gate,up,down,router")])
def test_llama_cpp_rules_accept_what_we_write(tmp_path, fixture, targets):
    """The dense fixture's layers 2 and 3 share layer 0's and 1's K/V: a pair for their k is rejected."""
    gguf = pytest.importorskip("gguf")
    _, cfg, bound = model(fixture)
    _, pairs = random_pairs(lora_targets(cfg, bound, targets), rank=5)
    path = tmp_path / "a.gguf"
    write_adapter(path, pairs, 5, 10.0)
    base = gguf.GGUFReader(str(FIX / f"{fixture}.gguf"))
    assert llama_cpp_load_errors(gguf.GGUFReader(str(path)), base) == []
    # and the mirror does reject what llama.cpp rejects: a KV-shared layer's k, a pair of the wrong size
    bad = dict(pairs)
    if fixture == "gemma4-dense-f32":
        bad["blk.3.attn_k.weight"] = (array("f", [0.5] * 5 * 256), array("f", [0.5] * 5 * 64))
    bad["blk.0.attn_q.weight"] = (array("f", [0.5] * 5 * 7), pairs["blk.0.attn_q.weight"][1])
    write_adapter(path, bad, 5, 10.0)
    want = ["blk.0.attn_q.weight: incorrect shape"]
    if fixture == "gemma4-dense-f32":
        want.append("blk.3.attn_k.weight: not in base model")
    assert llama_cpp_load_errors(gguf.GGUFReader(str(path)), base) == want


def test_writer_refusals(tmp_path):
    ok = (array("f", [0.0] * 6), array("f", [0.0] * 4))
    with pytest.raises(AdapterWriteError, match="whole number of rank-2 rows"):
        adapter_gguf({"blk.0.attn_q.weight": (array("f", [0.0] * 5), ok[1])}, 2, 4.0)
    with pytest.raises(AdapterWriteError, match="NaN or infinite"):
        adapter_gguf({"blk.0.attn_q.weight": (ok[0], array("f", [0.0, float("nan"), 0.0, 0.0]))}, 2, 4.0)
    with pytest.raises(AdapterWriteError, match="give the base tensor's name"):
        adapter_gguf({"blk.0.attn_q.weight.lora_a": ok}, 2, 4.0)
    with pytest.raises(AdapterWriteError, match="at least one"):
        adapter_gguf({}, 2, 4.0)
    # nested lists work as flat ones; a failed write leaves the old file and no temporary behind
    nested = adapter_gguf({"blk.0.attn_q.weight": ([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[1.0, 2.0], [3.0, 4.0]])},
                          2, 4.0)
    flat = adapter_gguf({"blk.0.attn_q.weight": ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1.0, 2.0, 3.0, 4.0])}, 2, 4.0)
    assert nested == flat
    path = tmp_path / "a.gguf"
    path.write_bytes(b"old")
    with pytest.raises(AdapterWriteError):
        write_adapter(path, {"x": (array("f", [float("inf")] * 2), array("f", [0.0] * 2))}, 2, 4.0)
    assert path.read_bytes() == b"old" and not (tmp_path / "a.gguf.tmp").exists()
