"""LoRA adapters in llama.cpp's format (pyapp.model.lora): applied on the GPU and by the reference,
against transformers + PEFT; every refusal path.

The adapters are tests/fixtures/lora/gemma4-{dense,moe}.gguf: a PEFT LoRA (rank 4, alpha 8, random
non-zero A and B) converted by llama.cpp's convert_lora_to_gguf.py (tools/make_lora_fixture.py).
Goldens: transformers + PEFT logits on each base file's dequantized weights, so the only differences
are float rounding and summation order. Tolerances: GPU <= 1e-3, reference <= 1e-4 (max abs logit,
logits of size ~6; seen: 7e-6 both), argmax equal at every position.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.adapters import write_adapter
from support.paths import ROOT

FIX = ROOT / "tests" / "fixtures"
CASES = [("gemma4-dense", "f32"), ("gemma4-dense", "q4_k"), ("gemma4-moe", "f32")]
GPU_ATOL, REF_ATOL = 1e-3, 1e-4


def base_path(model: str, qtype: str) -> Path:
    return FIX / f"{model}-{qtype}.gguf"


def adapter_path(model: str) -> Path:
    return FIX / "lora" / f"{model}.gguf"


def lora_golden(model: str, qtype: str):
    return np.load(FIX / "lora" / f"{model}-{qtype}.golden.npz")


def sequences(golden):
    i = 0
    while f"tokens_{i}" in golden:
        yield golden[f"tokens_{i}"].tolist(), golden[f"logits_{i}"]
        i += 1


def assert_matches(got, want, atol):
    diff = np.abs(got - want).max()
    assert diff < atol, f"max |ours - transformers+PEFT| = {diff:.2e}"
    assert (got.argmax(-1) == want.argmax(-1)).all()


# ---- the adapter format: reading, binding, refusals (no GPU) ---------------------------------------

@pytest.fixture(scope="module")
def dense():
    """(cfg, bound weights, architecture) of the dense fixture."""
    from pyapp.gguf import read_gguf
    from pyapp.model.config import Gemma4Config
    from pyapp.model.weights import bind
    g = read_gguf(base_path("gemma4-dense", "f32"))
    cfg = Gemma4Config.from_gguf(g)
    return cfg, bind(cfg, g.tensors), g.architecture


def adapter_tensors(model: str = "gemma4-dense") -> dict:
    """The fixture adapter's tensors as numpy arrays (numpy order: lora_a [r, n_in], lora_b [n_out, r])."""
    from pyapp.gguf import read_gguf
    g = read_gguf(adapter_path(model))
    return {n: np.frombuffer(g.read_tensor(n), np.float32).reshape(tuple(reversed(t.shape)))
            for n, t in g.tensors.items()}


def test_fixture_adapter_binds_to_the_weight_fields(dense):
    from pyapp.model.lora import load_lora
    cfg, bound, arch = dense
    a = load_lora(str(adapter_path("gemma4-dense")), cfg, bound, 1.0, arch)
    assert a.alpha == 8.0 and len(a.targets) == 32 and {t.rank for t in a.targets} == {4}
    fields = {(t.layer, t.field) for t in a.targets}
    assert (0, "attn_q") in fields and (3, "ple_proj") in fields and (1, "attn_v") in fields
    assert (2, "attn_k") not in fields                     # KV-shared layers have no k/v projection
    t = next(t for t in a.targets if t.name == "blk.0.ffn_down.weight")
    assert (t.n_in, t.n_out, t.field) == (128, 256, "ffn_down")
    assert a.scale(t) == 2.0 and a.scale(t, 0.5) == 1.0        # user_scale * alpha / r
    raw_a, raw_b = a.arrays(t)
    want = adapter_tensors()
    assert np.array_equal(np.frombuffer(raw_a, np.float32).reshape(4, 128), want["blk.0.ffn_down.weight.lora_a"])
    assert np.array_equal(np.frombuffer(raw_b, np.float32).reshape(256, 4), want["blk.0.ffn_down.weight.lora_b"])


def _without(name):
    def edit(t):
        del t[name]
    return edit


def _add(name, arr):
    def edit(t):
        t[name] = arr
    return edit


def _q8(name, n_in, rows):
    gguf = pytest.importorskip("gguf")
    raw = gguf.quants.quantize(np.ones((rows, n_in), np.float32), gguf.GGMLQuantizationType.Q8_0)
    return _add(name, (raw, gguf.GGMLQuantizationType.Q8_0))


def _rand(*shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def _pair(base, r, n_in, n_out):
    return lambda t: t.update({base + ".lora_a": _rand(r, n_in), base + ".lora_b": _rand(n_out, r)})


# case -> (metadata change (dict) or tensor edit (function), what the error must say)
REFUSALS = {
    "model file": (dict(general_type="model"), "general.type is 'model', expected 'adapter'"),
    "no general.type": (dict(general_type=None), "general.type is missing"),
    "other architecture": (dict(arch="llama"), "architecture 'llama', the model is 'gemma4'"),
    "not lora": (dict(adapter_type="ia3"), "adapter.type is 'ia3', expected 'lora'"),
    "float64 alpha": (dict(alpha_f64=True), "adapter.lora.alpha is stored as f64; llama.cpp requires FLOAT32"),
    "activated lora": (dict(extra=[lambda w, g: w.add_array("adapter.alora.invocation_tokens", [5, 6])]),
                       "activated LoRA"),
    "half pair": (_without("blk.1.attn_q.weight.lora_b"), "pair for 'blk.1.attn_q.weight' lacks its lora_b"),
    "unknown suffix": (_add("blk.0.attn_q.weight.lora_c", _rand(4, 256)),
                       "'blk.0.attn_q.weight.lora_c' has an unexpected name"),
    "missing base": (_pair("blk.7.attn_q.weight", 4, 256, 64),
                     "'blk.7.attn_q.weight' does not exist in the base model"),
    "wrong shape": (_add("blk.0.attn_q.weight.lora_b", _rand(128, 4)), "'blk.0.attn_q.weight' has incorrect shape"),
    "ranks differ": (_add("blk.0.attn_q.weight.lora_b", _rand(64, 3)), "their ranks differ"),
    "kv-shared k": (_pair("blk.2.attn_k.weight", 4, 256, 32),
                    "layer 2 reuses layer 0's keys and values: it has no attn_k"),
    "token_embd": (_pair("token_embd.weight", 4, 256, 512), "ties the LM head to token_embd"),
    "per-layer model projection": (_pair("per_layer_model_proj.weight", 4, 256, 128),
                                   "loads but never applies a LoRA to per_layer_model_proj"),
    "quantized pair": (_q8("blk.0.attn_q.weight.lora_a", 256, 4), "stored as Q8_0; adapters must be F32, F16 or BF16"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_name_the_problem(tmp_path, dense, case):
    from pyapp.model.lora import LoraError, load_lora
    cfg, bound, arch = dense
    change, message = REFUSALS[case]
    tensors, meta = adapter_tensors(), {}
    if isinstance(change, dict):
        meta = change
    else:
        change(tensors)
    path = write_adapter(tmp_path / "bad.gguf", tensors, **meta)
    with pytest.raises(LoraError) as e:
        load_lora(str(path), cfg, bound, 1.0, arch)
    assert message in str(e.value), str(e.value)


def test_expert_pairs_are_refused_for_now(tmp_path):
    """llama.cpp applies LoRA to the 3-D expert tensors (build_lora_mm_id); this runner refuses them."""
    from pyapp.gguf import read_gguf
    from pyapp.model.config import Gemma4Config
    from pyapp.model.lora import LoraError, load_lora
    from pyapp.model.weights import bind
    g = read_gguf(base_path("gemma4-moe", "f32"))
    cfg = Gemma4Config.from_gguf(g)
    tensors = adapter_tensors("gemma4-moe")
    tensors["blk.0.ffn_down_exps.weight.lora_a"] = _rand(4, 4, 64)
    tensors["blk.0.ffn_down_exps.weight.lora_b"] = _rand(4, 128, 4)
    path = write_adapter(tmp_path / "experts.gguf", tensors)
    with pytest.raises(LoraError, match="'blk.0.ffn_down_exps.weight' refused: the MoE expert tensors"):
        load_lora(str(path), cfg, bind(cfg, g.tensors), 1.0, g.architecture)


def test_norm_tensors_are_skipped_and_absent_alpha_means_user_scale(tmp_path, dense):
    """A `*_norm.weight` tensor is skipped (llama.cpp does too); without alpha the scale is the user
    scale: the same adapter without alpha at user scale 2 gives the logits of alpha 8 / rank 4 at 1."""
    from pyapp.gguf import read_gguf
    from pyapp.model.lora import load_lora
    from pyapp.reference.forward import ReferenceModel
    cfg, bound, arch = dense
    tensors = adapter_tensors()
    tensors["blk.0.attn_norm.weight"] = np.ones(256, np.float32)
    path = write_adapter(tmp_path / "noalpha.gguf", tensors, alpha=None)
    a = load_lora(str(path), cfg, bound, 2.0, arch)
    assert a.alpha == 0 and a.skipped == ["blk.0.attn_norm.weight"] and len(a.targets) == 32
    assert {a.scale(t) for t in a.targets} == {2.0}
    g = read_gguf(base_path("gemma4-dense", "f32"))
    tokens = [2, 40, 41, 300, 7]
    mine = np.asarray(ReferenceModel(g, lora=[(str(path), 2.0)]).forward(tokens))
    fixture = np.asarray(ReferenceModel(g, lora=[(str(adapter_path("gemma4-dense")), 1.0)]).forward(tokens))
    np.testing.assert_allclose(mine, fixture, atol=1e-5)


# ---- the reference backend -------------------------------------------------------------------------

@pytest.mark.parametrize("model, qtype", CASES)
def test_reference_matches_transformers_peft(model, qtype):
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    ref = ReferenceModel(read_gguf(base_path(model, qtype)), lora=[(str(adapter_path(model)), 1.0)])
    for tokens, want in sequences(lora_golden(model, qtype)):
        assert_matches(np.asarray(ref.forward(tokens)), want, REF_ATOL)


def test_reference_adapters_add_up():
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    g, a = read_gguf(base_path("gemma4-dense", "f32")), str(adapter_path("gemma4-dense"))
    tokens = [2, 9, 99, 199]
    halves = np.asarray(ReferenceModel(g, lora=[(a, 0.5), (a, 0.5)]).forward(tokens))
    np.testing.assert_allclose(halves, np.asarray(ReferenceModel(g, lora=[(a, 1.0)]).forward(tokens)), atol=1e-5)


# ---- the GPU engine ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engines(dev):
    """engine(model, qtype, chunk) with the fixture adapter at scale 1 (cached per module)."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    made = {}

    def make(model, qtype, chunk):
        key = (model, qtype, chunk)
        if key not in made:
            made[key] = Engine.open(read_gguf(base_path(model, qtype)), device=dev, context_length=64, chunk=chunk,
                                    lora=[(str(adapter_path(model)), 1.0)], int8=False)    # f32: float rounding
        return made[key]
    return make


@pytest.mark.gpu
@pytest.mark.parametrize("model, qtype", CASES)
def test_gpu_prefill_matches_transformers_peft(engines, model, qtype):
    """Chunks of 16 tokens: the tiled matmuls, then each projection's delta."""
    from pyapp.engine import SamplingParams
    eng, golden = engines(model, qtype, 16), lora_golden(model, qtype)
    for tokens, want in sequences(golden):
        assert_matches(np.asarray(eng.forward(tokens)), want, GPU_ATOL)
    want = golden["generate_0"].tolist()
    res = eng.generate(golden["tokens_0"].tolist(), SamplingParams(temperature=0, max_tokens=len(want)), stop_ids=())
    assert res.tokens == want


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["gemma4-dense", "gemma4-moe"])
def test_gpu_decode_matches_transformers_peft(engines, model):
    """One token per step: the decode matvecs, with the deltas in the fused q|k|v and gate|up outputs
    (one grouped dispatch each: gate|up's second delta starts at ff, q|k|v's at k_row and v_row) and
    the PLE gate unfused."""
    eng, golden = engines(model, "f32", 1), lora_golden(model, "f32")
    layers = eng.runner.layout.layers
    assert all(lw.qkv is None or lw.qkv.loras for lw in layers) and any(lw.qkv is not None for lw in layers)
    for lw in layers:
        (group, col0), = lw.ffn_gate_up.loras
        assert col0 == 0 and group.bounds == (lw.ffn_gate_up.shape[1] // 2,)
    own_kv = [lw.qkv for lw in layers if lw.qkv is not None]
    assert own_kv and all(len(g.loras) == 1 and len(g.loras[0][0].bounds) in (1, 2) for g in own_kv)   # K = V: q, k
    tokens, want = next(sequences(golden))
    assert_matches(np.asarray(eng.forward(tokens)), want, GPU_ATOL)


@pytest.mark.gpu
def test_gpu_scale_zero_is_the_base_model_and_two_differs(engines):
    """set_lora_scale rewrites the scale slots: 0 gives the base model's logits (bit for bit the
    engine without adapter's), 2 doubles the delta (as the reference at 2 says), 1 is back to PEFT's."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    model, qtype = "gemma4-dense", "f32"
    eng = engines(model, qtype, 16)
    tokens, want_lora = next(sequences(lora_golden(model, qtype)))
    base_golden = np.load(base_path(model, qtype).with_suffix(".golden.npz"))["logits_0"]
    try:
        eng.set_lora_scale(0, 0.0)
        zero = np.asarray(eng.forward(tokens))
        assert_matches(zero, base_golden, GPU_ATOL)
        plain = Engine.open(read_gguf(base_path(model, qtype)), device=eng.dev, context_length=64, chunk=16,
                            int8=False)
        assert np.array_equal(zero, np.asarray(plain.forward(tokens)))
        eng.set_lora_scale(0, 2.0)
        two = np.asarray(eng.forward(tokens))
        assert np.abs(two - want_lora).max() > 0.5
        ref = ReferenceModel(read_gguf(base_path(model, qtype)), lora=[(str(adapter_path(model)), 2.0)])
        assert_matches(two, np.asarray(ref.forward(tokens)), GPU_ATOL)
    finally:
        eng.set_lora_scale(0, 1.0)
    assert_matches(np.asarray(eng.forward(tokens)), want_lora, GPU_ATOL)


@pytest.mark.gpu
def test_engine_refuses_a_bad_adapter_before_uploading(tmp_path, dev):
    from pyapp.engine import Engine, EngineError
    from pyapp.gguf import read_gguf
    path = write_adapter(tmp_path / "bad.gguf", adapter_tensors(), alpha_f64=True)
    with pytest.raises(EngineError, match="LoRA adapter: adapter.lora.alpha is stored as f64"):
        Engine.open(read_gguf(base_path("gemma4-dense", "f32")), device=dev, context_length=64, lora=[(str(path), 1)])


# ---- the command line ----------------------------------------------------------------------------------

def pyapp(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyapp", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("backend", ["reference", pytest.param("native", marks=pytest.mark.gpu)])
def test_cli_logits_with_lora(tmp_path, backend):
    golden = lora_golden("gemma4-dense", "q4_k")
    tokens, want = list(sequences(golden))[1]
    out = tmp_path / "l.npy"
    r = pyapp("logits", base_path("gemma4-dense", "q4_k"), "--tokens", ",".join(map(str, tokens)), "--out", out,
              "--backend", backend, "--lora", adapter_path("gemma4-dense"), "--no-int8")
    if r.returncode and "no WebGPU adapter" in r.stderr:
        pytest.skip("no WebGPU adapter")
    assert r.returncode == 0, r.stderr
    assert_matches(np.load(out), want, GPU_ATOL)


def test_cli_info_lists_targets_and_refusals():
    r = pyapp("info", base_path("gemma4-dense", "f32"), "--lora", adapter_path("gemma4-dense"), "--lora-scale", "0.5")
    assert r.returncode == 0, r.stderr
    assert "32 adapted tensors, rank 4, scale = 0.5 * alpha 8 / rank 4 = 1" in r.stdout
    assert "attn_k       layers 0, 1\n" in r.stdout
    r = pyapp("info", base_path("gemma4-moe", "f32"), "--lora", adapter_path("gemma4-dense"))
    assert "refused: LoRA pair for 'blk.0.ffn_down.weight' has incorrect shape" in r.stdout


def test_cli_bad_adapter_is_a_clean_error(tmp_path):
    path = write_adapter(tmp_path / "bad.gguf", adapter_tensors(), general_type="model")
    r = pyapp("logits", base_path("gemma4-dense", "f32"), "--tokens", "2,3", "--out", tmp_path / "x.npy",
              "--backend", "reference", "--lora", path)
    assert r.returncode == 2 and "error: not a LoRA adapter: general.type is 'model'" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.gpu
def test_gpu_int8_prefill_with_an_adapter(dev):
    """A 90-token prompt in the 128-token plan: its matmuls take int8 activations that the residual adds and
    the GeGLU round (add_normed_q8, quantize_q8's geglu), while the adapter's deltas on q, k, v, gate, up and
    down read the f32 rows those kernels keep writing for them. Logits within int8's rounding of the f32 engine with
    the adapter (mean 0.03 seen; with the f32 rows left unwritten, 0.27), the adapter's own effect 0.46."""
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.gpu import Plan
    g = read_gguf(base_path("gemma4-dense", "q4_k"))
    tokens = [2] + np.random.default_rng(3).integers(3, 250, 89).tolist()

    def engine(**kw):
        return Engine.open(g, device=dev, context_length=128, chunk=128, **kw)
    int8 = engine(lora=[(str(adapter_path("gemma4-dense")), 1.0)])
    kernels = [op[1].label for plan in int8.runner._plans[("layers", 128, False, False)] if isinstance(plan, Plan)
               for op in plan.ops if op[0] == "d"]
    assert kernels.count("norm:add_normed_q8") == 2 * int8.config.n_layers - 1 and "lora:main" in kernels
    got = np.asarray(int8.forward(tokens))
    want = np.asarray(engine(lora=[(str(adapter_path("gemma4-dense")), 1.0)], int8=False).forward(tokens))
    plain = np.asarray(engine(int8=False).forward(tokens))
    diff = np.abs(got - want)
    assert np.abs(want - plain).mean() > 0.3                  # the adapter moves the logits well past the bounds
    assert 0 < diff.mean() < 0.06 and np.median(diff.max(-1)) < 0.3, (diff.mean(), np.median(diff.max(-1)))
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.5
    assert clear.sum() >= 10 and (got.argmax(-1) == want.argmax(-1))[clear].all()
