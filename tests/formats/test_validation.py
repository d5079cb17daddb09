"""Bad hyperparameters and tensor shapes give a clear error, never a traceback, hang or runaway memory.

Gemma4Config.from_metadata checks every `gemma4.*` value (type, range, agreement with the
other keys and the tensor list) and raises ConfigError naming the key and the value;
weights.bind checks every bound tensor's shape (ggml order) and type against the config and
raises WeightsError naming the tensor, the shape found and the shape expected. One test per
case seen crashing (issue 11), then hypothesis fuzzing of both and of the CLI's `info` and
`logits --backend reference` on GGUF files written with fuzzed metadata.
"""

import contextlib
import copy
import dataclasses
import io
import math
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyapp import __main__ as cli
from pyapp import ggml
from pyapp.engine import EngineError
from pyapp.gguf import GGUFError, read_gguf
from pyapp.model.config import ConfigError, Gemma4Config
from pyapp.model.weights import WeightsError, bind

from support.paths import FIXTURES

DENSE = read_gguf(FIXTURES / "gemma4-dense-f32.gguf")     # E2B-like: PLE, KV sharing, per-layer FFN widths
MOE = read_gguf(FIXTURES / "gemma4-moe-f32.gguf")         # 26B-A4B-like: experts, K=V global layers
MODELS = {"dense": DENSE, "moe": MOE}
OURS = (ConfigError, WeightsError, GGUFError, EngineError)


def variant(g, meta: dict | None = None, drop=(), tensors: dict | None = None):
    """A copy of a parsed GGUF with metadata keys replaced or dropped and tensor infos replaced."""
    v = copy.copy(g)
    v.metadata = {k: val for k, val in g.metadata.items() if k not in drop} | (meta or {})
    v.tensors = g.tensors | (tensors or {})
    return v


def reshaped(g, name: str, shape=None, type=None):
    t = g.tensors[name]
    return variant(g, tensors={name: dataclasses.replace(t, shape=tuple(shape or t.shape),
                                                         type=t.type if type is None else type)})


def load(g):
    """What every loader does first: the config, then the bound weights."""
    cfg = Gemma4Config.from_gguf(g)
    return cfg, bind(cfg, g.tensors)


def result_or_our_error(fn, *args):
    """fn(*args), or the error it raised, which must be one of ours with a short message."""
    try:
        return fn(*args)
    except OURS as e:
        assert 0 < len(str(e)) < 2000, str(e)[:2000]    # huge values are shown abbreviated
        return e


# ---- one test per case seen crashing ---------------------------------------------------

@pytest.mark.parametrize("model,meta,message", [
    ("dense", {"gemma4.attention.head_count_kv": 0}, "gemma4.attention.head_count_kv = 0: must be between 1 and 2"),
    ("dense", {"gemma4.attention.head_count": "2"}, "gemma4.attention.head_count = '2': must be an integer"),
    ("dense", {"gemma4.context_length": [4096, 4096]}, "gemma4.context_length = [4096, 4096]: must be an integer"),
    ("dense", {"gemma4.context_length": math.inf}, "gemma4.context_length = inf: must be an integer"),
    ("dense", {"gemma4.attention.sliding_window": math.nan}, "gemma4.attention.sliding_window = nan"),
    ("dense", {"gemma4.rope.freq_base": math.nan}, "gemma4.rope.freq_base = nan: must be > 0"),
    ("dense", {"gemma4.attention.layer_norm_rms_epsilon": math.inf}, "layer_norm_rms_epsilon = inf"),
    ("dense", {"gemma4.embedding_length": 0}, "gemma4.embedding_length = 0: must be between 4 and"),
    ("moe", {"gemma4.expert_count": 0}, "gemma4.expert_count = 0: no experts, yet the GGUF has "
                                        "blk.0.ffn_gate_inp.weight"),
    ("moe", {"gemma4.expert_count": 2**20}, "gemma4.expert_count = 1048576: must be between 0 and 4096"),
    ("moe", {"gemma4.expert_used_count": 5}, "gemma4.expert_used_count = 5: must be between 1 and 4"),
    ("dense", {"gemma4.feed_forward_length": [128, 128, 256, -256]}, "gemma4.feed_forward_length[3] = -256"),
    ("dense", {"gemma4.attention.key_length": 66}, "gemma4.attention.key_length = 66: must be a multiple of 4"),
    ("dense", {"gemma4.rope.dimension_count": 33}, "gemma4.rope.dimension_count = 33: must be a multiple of 2"),
    ("dense", {"gemma4.attention.value_length": 32}, "gemma4.attention.value_length = 32: must equal the key"),
])
def test_bad_hyperparameter_is_named_with_its_value(model, meta, message):
    with pytest.raises(ConfigError) as e:
        load(variant(MODELS[model], meta))
    assert message in str(e.value)


def test_huge_block_count_is_refused_before_any_per_layer_table():
    g = variant(DENSE, {"gemma4.block_count": 200_000_000, "gemma4.feed_forward_length": 128},
                drop=["gemma4.attention.sliding_window_pattern"])      # every per-layer value a scalar
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="gemma4.block_count = 200000000: must be between 1 and 1024"):
            Gemma4Config.from_gguf(g)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated"


def test_one_dimensional_embedding_table():
    with pytest.raises(ConfigError, match=r"token_embd.weight has shape \[256\]; expected \[hidden, vocab\]"):
        load(reshaped(DENSE, "token_embd.weight", shape=[256]))


def test_expert_tensors_without_their_router():
    g = variant(MOE)
    del g.tensors["blk.2.ffn_gate_inp.weight"]
    with pytest.raises(ConfigError, match=r"the GGUF has blk\.2\.\S+ but lacks blk\.2\.ffn_gate_inp\.weight"):
        load(g)


@pytest.mark.parametrize("model,name,shape,message", [
    # ffn_down stored [hidden, ff] instead of [ff, hidden]
    ("dense", "blk.1.ffn_down.weight", [256, 128],
     "blk.1.ffn_down.weight has shape [256, 128], expected [ff=128, hidden=256]"),
    ("dense", "blk.1.attn_q.weight", [256, 64],
     "blk.1.attn_q.weight has shape [256, 64], expected [hidden=256, heads*hd=128]"),
    ("dense", "output_norm.weight", [128], "output_norm.weight has shape [128], expected [hidden=256]"),
    ("dense", "rope_freqs.weight", [64], "rope_freqs.weight has shape [64], expected [global_hd/2=32]"),
    ("dense", "per_layer_token_embd.weight", [32, 512],
     "per_layer_token_embd.weight has shape [32, 512], expected [layers*ple=128, vocab=512]"),
    # expert tensors are [k, n, experts] in ggml order: the experts count last
    ("moe", "blk.2.ffn_down_exps.weight", [64, 128, 8],
     "blk.2.ffn_down_exps.weight has shape [64, 128, 8], expected [expert_ff=64, hidden=128, experts=4]"),
    ("moe", "blk.0.ffn_gate_up_exps.weight", [4, 128, 128],
     "blk.0.ffn_gate_up_exps.weight has shape [4, 128, 128], expected [hidden=128, 2*expert_ff=128, experts=4]"),
    ("moe", "blk.0.ffn_gate_inp.weight", [128, 4, 1],
     "blk.0.ffn_gate_inp.weight has shape [128, 4, 1], expected [hidden=128, experts=4]"),
    ("moe", "blk.1.layer_output_scale.weight", [2], "blk.1.layer_output_scale.weight has shape [2], expected [1]"),
])
def test_wrong_tensor_shape_is_named_with_the_expected_shape(model, name, shape, message):
    with pytest.raises(WeightsError) as e:
        load(reshaped(MODELS[model], name, shape=shape))
    assert message in str(e.value)


@pytest.mark.parametrize("name,type,message", [
    ("blk.0.ffn_norm.weight", ggml.Q8_0, "blk.0.ffn_norm.weight is stored as Q8_0, expected F32, F16 or BF16"),
    ("blk.0.attn_q.weight", ggml.I32, "blk.0.attn_q.weight is stored as I32, expected a float or quantized type"),
])
def test_wrong_tensor_type_is_named(name, type, message):
    with pytest.raises(WeightsError) as e:
        load(reshaped(DENSE, name, type=type))
    assert message in str(e.value)


# ---- fuzzing ---------------------------------------------------------------------------

GGUF_INTS = st.integers(-2**63, 2**64 - 1)              # what a GGUF integer can hold
INTS = st.one_of(st.sampled_from([0, -1, 1, 2, 3, 4, 6, 33, 64, 127, 128, 512, 513, 1024, 1025, 4096, 2**20,
                                  200_000_000, 2**31, 2**32, 2**63 - 1, 2**64 - 1]), GGUF_INTS)
TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=8)
SCALARS = st.one_of(INTS, st.floats(), st.booleans(), TEXT)
ARRAYS = st.one_of(st.lists(st.integers(-2**63, 2**63 - 1), max_size=6),
                   st.lists(st.sampled_from([0, 1, 2, 4, 32, 64, 128, 256, -1]), min_size=4, max_size=4),  # per layer
                   st.lists(st.floats(), max_size=4), st.lists(st.booleans(), min_size=1, max_size=6),
                   st.lists(TEXT, max_size=3))
VALUES = st.one_of(SCALARS, ARRAYS)
# every gemma4.* key the fixtures have, and the optional ones the config reads
KEYS = sorted({k for g in MODELS.values() for k in g.metadata if k.startswith("gemma4.")}
              | {f"gemma4.{k}" for k in ("attention.global_head_count_kv", "rope.partial_rotary_factor",
                                         "rope.local.freq_base", "expert_count", "expert_used_count",
                                         "expert_feed_forward_length")})


def near(value):
    """Values next to a real one: scaled, shifted, negated, as a float."""
    if isinstance(value, int) and not isinstance(value, bool):
        return st.sampled_from([value * 2, value // 2, value + 1, value - 1, -value, float(value)])
    if isinstance(value, float):
        return st.sampled_from([value * 2, -value, 0.0, math.nan, math.inf])
    return VALUES


@st.composite
def fuzzed_metadata(draw, g):
    meta = dict(g.metadata)
    for key in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True)):
        if draw(st.integers(0, 5)) == 0:
            meta.pop(key, None)
        else:
            meta[key] = draw(st.one_of(VALUES, near(meta.get(key))))
    return meta


@settings(max_examples=600, deadline=None, derandomize=True)
@given(data=st.data())
def test_fuzz_hyperparameters_raise_only_our_errors(data):
    g = data.draw(st.sampled_from(list(MODELS.values())))
    result_or_our_error(load, variant(g, data.draw(fuzzed_metadata(g))))


def shapes_near(shape):
    """Permutations of a shape, and shapes of 1 to 4 dims from sizes near its own."""
    sizes = sorted({1, 2, 4, 32, *shape, *(d * 2 for d in shape), *(d // 2 for d in shape if d > 1)})
    return st.one_of(st.permutations(shape).map(tuple), st.lists(st.sampled_from(sizes), min_size=1, max_size=4)
                     .map(tuple))


@settings(max_examples=600, deadline=None, derandomize=True)
@given(data=st.data())
def test_fuzz_tensor_shapes_are_checked(data):
    """A tensor of another shape is refused, by name; only the embedding table may change the
    vocabulary size (then a tensor sized by the vocabulary disagrees, or none does)."""
    g = data.draw(st.sampled_from(list(MODELS.values())))
    name = data.draw(st.sampled_from(sorted(g.tensors)))
    t = g.tensors[name]
    shape = data.draw(shapes_near(t.shape))
    type_ = data.draw(st.one_of(st.just(t.type), st.sampled_from(sorted(ggml.TYPES))))
    got = result_or_our_error(load, reshaped(g, name, shape=shape, type=type_))
    vocab_only = name == "token_embd.weight" and len(shape) == 2 and shape[0] == t.shape[0]
    if isinstance(got, Exception):
        assert name in str(got) or vocab_only, str(got)
    else:
        assert shape == t.shape or vocab_only


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.data())
def test_fuzz_missing_tensors_are_named(data):
    """Dropping tensors: a clear error about the layer they belong to, or a model that needs none of them."""
    g = data.draw(st.sampled_from(list(MODELS.values())))
    dropped = data.draw(st.lists(st.sampled_from(sorted(g.tensors)), min_size=1, max_size=3, unique=True))
    v = variant(g)
    for name in dropped:
        del v.tensors[name]
    got = result_or_our_error(load, v)
    if isinstance(got, Exception):
        # a layer's tensor: the error is about that layer (blk.N.)
        assert any((name[:name.index(".", 4) + 1] if name.startswith("blk.") else name) in str(got)
                   for name in dropped), str(got)


# ---- the CLI on GGUF files with fuzzed metadata ----------------------------------------

_TYPE_IDS = {bool: 7, str: 8, float: 12}      # GGUF value types; ints are u64 or i64, arrays 9


def _gguf_value(v) -> tuple[int, bytes]:
    if isinstance(v, int) and not isinstance(v, bool):
        return (11, struct.pack("<q", v)) if v < 0 else (10, struct.pack("<Q", v))
    if isinstance(v, list):
        items = [_gguf_value(x) for x in v]
        types = {t for t, _ in items}
        etype = 11 if types == {10, 11} else (types.pop() if len(types) == 1 else 0)
        body = b"".join(struct.pack("<q", x) if etype == 11 and t == 10 else b for (t, b), x in zip(items, v))
        return 9, struct.pack("<IQ", etype, len(v)) + body
    if isinstance(v, str):
        b = v.encode()
        return 8, struct.pack("<Q", len(b)) + b
    return _TYPE_IDS[type(v)], struct.pack("<?" if isinstance(v, bool) else "<d", v)


def write_gguf(path: Path, g, metadata: dict) -> None:
    """A GGUF v3 with this metadata and g's tensors (infos and data block copied from g's file)."""
    out = [b"GGUF", struct.pack("<IQQ", 3, len(g.tensors), len(metadata))]
    for key, value in metadata.items():
        k = key.encode()
        vtype, body = _gguf_value(value)
        out += [struct.pack("<Q", len(k)), k, struct.pack("<I", vtype), body]
    for t in g.tensors.values():
        n = t.name.encode()
        out += [struct.pack("<Q", len(n)), n, struct.pack(f"<I{len(t.shape)}Q", len(t.shape), *t.shape),
                struct.pack("<IQ", t.type, t.offset - g.data_offset)]
    header = b"".join(out)
    header += b"\0" * (-len(header) % g.alignment)
    path.write_bytes(header + g.source.read(g.data_offset, g.source.size - g.data_offset))


def run_cli(*args) -> tuple[int, str]:
    """main(args) in this process: (exit status, stderr), or one of our errors if it escapes main."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = result_or_our_error(cli.main, [str(a) for a in args])
    return rc, err.getvalue()


def test_gguf_writer_round_trips(tmp_path):
    meta = dict(DENSE.metadata) | {"t.neg": [-1, 2**62], "t.nested": [[1], [2, 3]], "t.empty": []}
    write_gguf(tmp_path / "m.gguf", DENSE, meta)
    g = read_gguf(tmp_path / "m.gguf")
    assert g.metadata["t.neg"] == [-1, 2**62] and g.metadata["t.nested"] == [[1], [2, 3]]
    assert {k: v for k, v in g.metadata.items() if not k.startswith("t.")} == DENSE.metadata   # f32 -> f64: exact
    assert g.read_tensor("blk.3.ffn_down.weight") == DENSE.read_tensor("blk.3.ffn_down.weight")


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data())
def test_fuzz_cli_info_and_reference_logits(tmp_path_factory, data):
    """`info` prints what it can; `logits --backend reference` either writes [3, vocab] logits or
    fails with one of our errors (printed as `error: ...` with exit status 2, or raised by main)."""
    name = data.draw(st.sampled_from(["gemma4-dense-q8_0.gguf", "gemma4-moe-q8_0.gguf"]))
    g = read_gguf(FIXTURES / name)
    path = tmp_path_factory.mktemp("fuzz") / name
    write_gguf(path, g, data.draw(fuzzed_metadata(g)))
    rc, err = run_cli("info", path)
    assert rc == 0 or isinstance(rc, OURS) or (rc == 2 and err.startswith("error:")), err
    out = path.with_suffix(".npy")
    rc, err = run_cli("logits", path, "--tokens", "2,5,7", "--out", out, "--backend", "reference")
    if rc == 0:
        logits = np.load(out)
        assert logits.shape[0] == 3 and logits.dtype == np.float32
    else:
        assert isinstance(rc, OURS) or (rc == 2 and err.startswith("error:")), err
