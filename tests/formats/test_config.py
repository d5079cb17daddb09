"""Gemma4Config from real and synthetic GGUF metadata."""

import pytest

from pyapp.model.config import ConfigError, Gemma4Config

from support.paths import VOCAB


def _base_meta(**over):
    n = 6
    meta = {
        "general.architecture": "gemma4",
        "gemma4.block_count": n,
        "gemma4.embedding_length": 256,
        "gemma4.feed_forward_length": 512,
        "gemma4.attention.head_count": 4,
        "gemma4.attention.head_count_kv": 2,
        "gemma4.attention.key_length": 128,
        "gemma4.attention.key_length_swa": 64,
        "gemma4.attention.sliding_window": 16,
        "gemma4.attention.sliding_window_pattern": [True, False, True, False, True, False],
        "gemma4.attention.shared_kv_layers": 2,
        "gemma4.rope.dimension_count": 128,
        "gemma4.rope.dimension_count_swa": 64,
        "gemma4.rope.freq_base": 1e6,
        "gemma4.rope.freq_base_swa": 1e4,
    }
    meta.update(over)
    return meta


def test_kv_sharing_donors_and_per_layer_dims():
    cfg = Gemma4Config.from_metadata(_base_meta(), vocab_size=512)
    assert [lc.kv_source for lc in cfg.layers] == [0, 1, 2, 3, 2, 3]
    assert [lc.head_dim for lc in cfg.layers] == [64, 128] * 3
    assert [lc.rope_base for lc in cfg.layers] == [1e4, 1e6] * 3
    assert cfg.layers[4].shares_kv and not cfg.layers[3].shares_kv
    assert cfg.first_shared_layer == 4


def test_rejects_other_architectures_and_bad_counts():
    with pytest.raises(ConfigError, match="llama"):
        Gemma4Config.from_metadata({"general.architecture": "llama"})
    with pytest.raises(ConfigError, match="sliding_window_pattern"):
        Gemma4Config.from_metadata(_base_meta(**{"gemma4.attention.sliding_window_pattern": [True]}))
    with pytest.raises(ConfigError, match="block_count"):
        meta = _base_meta()
        del meta["gemma4.block_count"]
        Gemma4Config.from_metadata(meta)


@pytest.mark.skipif(not VOCAB.exists(), reason=f"vendored Gemma 4 vocab missing ({VOCAB}); run `python3 build.py setup`")
def test_real_26b_a4b_hyperparameters():
    from pyapp.gguf import read_gguf
    cfg = Gemma4Config.from_gguf(read_gguf(VOCAB))
    assert cfg.n_layers == 30 and cfg.hidden == 2816 and cfg.n_heads == 16
    assert cfg.vocab_size == 262144
    assert cfg.is_moe and (cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_dim) == (128, 8, 704)
    globals_ = [lc.index for lc in cfg.layers if not lc.sliding]
    assert globals_ == [5, 11, 17, 23, 29]
    assert {lc.n_kv_heads for lc in cfg.layers if lc.sliding} == {8}
    assert {lc.n_kv_heads for lc in cfg.layers if not lc.sliding} == {2}
    assert {(lc.head_dim, lc.rope_dims, lc.rope_base) for lc in cfg.layers if not lc.sliding} == {(512, 512, 1e6)}
    assert {(lc.head_dim, lc.rope_dims, lc.rope_base) for lc in cfg.layers if lc.sliding} == {(256, 256, 1e4)}
    assert cfg.sliding_window == 1024 and cfg.final_softcap == 30.0 and cfg.ple_dim == 0
    assert all(not lc.shares_kv for lc in cfg.layers)
