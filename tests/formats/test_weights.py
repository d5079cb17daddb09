"""The model's structure declared once: GGUF names bound to fields, flags resolved once, one Logits type."""

import ast

import numpy as np
import pytest

from pyapp.gguf import read_gguf
from pyapp.model.config import Gemma4Config
from pyapp.model.logits import Logits
from pyapp.model.weights import LayerWeights, ModelWeights, WeightsError, bind, gguf_name, names

from support.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures"


def test_every_fixture_tensor_is_bound_to_exactly_one_field():
    for path in sorted(FIXTURES.glob("*.gguf")):
        g = read_gguf(path)
        cfg = Gemma4Config.from_gguf(g)
        w = bind(cfg, g.tensors)
        bound = [n for n, _, _ in names(cfg, w)]
        assert sorted(bound) == sorted(g.tensors), path.name
        assert w.layers[0].attn_q is g.tensors["blk.0.attn_q.weight"]


def test_layer_flags_from_the_tensor_list():
    dense = read_gguf(FIXTURES / "gemma4-dense-f32.gguf")
    moe = read_gguf(FIXTURES / "gemma4-moe-f32.gguf")
    d, m = Gemma4Config.from_gguf(dense), Gemma4Config.from_gguf(moe)
    assert all(lc.has_ple and not lc.has_moe for lc in d.layers)
    assert [lc.owns_kv for lc in d.layers] == [lc.kv_source == lc.index for lc in d.layers]
    assert any(lc.shares_kv for lc in d.layers)
    assert all(lc.has_moe and not lc.has_ple for lc in m.layers)
    # the 26B-A4B-like fixture has no attn_v on its global layers: V is the raw K there
    for lc in m.layers:
        has_v = f"blk.{lc.index}.attn_v.weight" in moe.tensors
        assert lc.has_v == has_v and lc.k_eq_v == (not has_v)
    assert any(lc.k_eq_v for lc in m.layers)


def test_missing_required_tensors_are_named():
    g = read_gguf(FIXTURES / "gemma4-moe-f32.gguf")
    cfg = Gemma4Config.from_gguf(g)
    tensors = {k: v for k, v in g.tensors.items()
               if k not in ("blk.1.ffn_down_exps.weight", "output_norm.weight")}
    with pytest.raises(WeightsError, match="output_norm.weight.*blk.1.ffn_down_exps.weight"):
        bind(cfg, tensors)
    # optional tensors may be absent
    tensors = {k: v for k, v in g.tensors.items() if not k.endswith("ffn_gate_inp.scale")}
    assert bind(cfg, tensors).layers[0].router_scale is None


def test_map_keeps_the_structure():
    g = read_gguf(FIXTURES / "gemma4-dense-q8_0.gguf")
    cfg = Gemma4Config.from_gguf(g)
    w = bind(cfg, g.tensors).map(lambda t: t.name)
    assert w.layers[2].ffn_down == "blk.2.ffn_down.weight" and w.output_norm == "output_norm.weight"
    assert w.head == w.token_embd == "token_embd.weight"          # tied head
    assert gguf_name(LayerWeights, "router", 4) == "blk.4.ffn_gate_inp.weight"
    assert gguf_name(ModelWeights, "ple_token_embd") == "per_layer_token_embd.weight"


def test_no_tensor_name_is_spelled_outside_the_declaration():
    """pyapp reads fields; GGUF tensor names appear only in model/weights.py."""
    declared = {f.metadata["gguf"] for cls in (LayerWeights, ModelWeights)
                for f in cls.__dataclass_fields__.values() if "gguf" in f.metadata}
    offenders = []
    for path in (ROOT / "pyapp").rglob("*.py"):
        if path.name == "weights.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if any(name in node.value for name in declared):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not offenders, offenders


def test_logits_type():
    rows = [np.arange(5, dtype=np.float32), np.array([3, 9, 9, 1, 0], np.float32)]
    lg = Logits.from_rows(rows)
    assert lg.shape == (2, 5) and len(lg) == 2
    assert lg.argmax_row(0) == 4 and lg.argmax_row(-1) == 1       # first of equal maxima, as numpy
    np.testing.assert_array_equal(np.asarray(lg), np.stack(rows))
    assert Logits.from_rows([r.tobytes() for r in rows]).tolist() == lg.tolist()
