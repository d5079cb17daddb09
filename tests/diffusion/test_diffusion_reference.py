"""DiffusionGemma's numpy reference (issue 12, item 2, CPU side): one decoder step of
pyapp.families.diffusion_gemma.reference on the GGUF converted from the committed tiny checkpoint against transformers'
logits (tests/fixtures/diffusion-tiny.golden.npz, made by tools/make_diffusion_golden.py): step 0, self-
conditioned on given previous logits, a prompt longer than the sliding window, and after a committed block.
The config reads the file for the reference while the engine's config still refuses it."""

import dataclasses

import numpy as np
import pytest

from support.paths import ROOT
from pyapp.gguf import read_gguf
from pyapp.model import weights
from pyapp.families.diffusion_gemma import DiffusionGemmaConfig
from pyapp.model.config import ConfigError, Gemma4Config, UnsupportedModelError

GOLDEN = np.load(ROOT / "tests" / "fixtures" / "diffusion-tiny.golden.npz")
N_CASES = 4


@pytest.fixture(scope="module")
def gguf_files(diffusion_gguf):
    """outtype -> the converted fixture (f32; f16 holds bf16 exactly)."""
    return {outtype: diffusion_gguf(outtype) for outtype in ("f32", "f16")}


@pytest.fixture(scope="module")
def model(gguf_files):
    from pyapp.families.diffusion_gemma.reference import DiffusionReference
    return DiffusionReference(read_gguf(gguf_files["f32"]))


def case(i):
    prev, block = GOLDEN[f"prev_{i}"], GOLDEN[f"block_{i}"]
    return (GOLDEN[f"prompt_{i}"], GOLDEN[f"canvas_{i}"], prev if len(prev) else None,
            [block] if len(block) else [], GOLDEN[f"logits_{i}"])


def test_golden_cases_cover_the_brief():
    cfg_window, canvas = 8, 16
    kinds = [(len(case(i)[0]) > cfg_window, case(i)[2] is not None, bool(case(i)[3])) for i in range(N_CASES)]
    assert kinds == [(False, False, False), (False, True, False), (True, False, False), (True, True, True)]
    assert all(GOLDEN[f"logits_{i}"].shape == (canvas, 512) for i in range(N_CASES))


def test_config_reads_the_diffusion_gguf(gguf_files):
    g = read_gguf(gguf_files["f32"])
    cfg = DiffusionGemmaConfig.from_gguf(g)
    assert cfg.is_diffusion and not Gemma4Config.is_diffusion
    assert (cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.vocab_size, cfg.sliding_window) == (4, 64, 4, 512, 8)
    assert [lc.sliding for lc in cfg.layers] == [True, False, True, False]
    assert [lc.k_eq_v for lc in cfg.layers] == [False, True, False, True]
    assert all(lc.has_moe and lc.experts_fused for lc in cfg.layers)
    assert [c.__name__ for c in cfg.weights_classes()] == ["DiffusionWeights", "DiffusionLayerWeights"]
    assert (cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_dim, cfg.self_cond_ffn_dim) == (4, 2, 32, 96)
    # generation defaults: tools/make_diffusion_fixture.py's generation_config.json
    assert (cfg.canvas_length, cfg.max_new_tokens, cfg.max_denoising_steps, cfg.stability_threshold) == (16, 32, 12, 2)
    assert (np.float32(cfg.t_min), np.float32(cfg.t_max)) == (np.float32(0.3), np.float32(0.9))
    assert (np.float32(cfg.entropy_bound), np.float32(cfg.confidence_threshold)) == (np.float32(0.25),
                                                                                      np.float32(0.01))
    # every tensor bound to a field: the Gemma 4 ones, the self-conditioning MLP and the encoder's scales
    w = weights.bind(cfg, g.tensors)
    assert sorted(n for n, _, _ in weights.names(cfg, w)) == sorted(g.tensors)
    assert w.self_cond_down is not None and all(lw.enc_output_scale is not None for lw in w.layers)
    # the next-token config refuses it (model_config gives the diffusion one), and the diffusion config refuses a
    # Gemma 4 file
    with pytest.raises(UnsupportedModelError, match="^DiffusionGemma .* has no next-token logits: "):
        Gemma4Config.from_gguf(g)
    with pytest.raises(ConfigError, match="not 'diffusion-gemma'"):
        DiffusionGemmaConfig.from_gguf(read_gguf(ROOT / "tests" / "fixtures" / "gemma4-moe-f32.gguf"))
    # a Gemma 4 file does not need the DiffusionGemma tensors: its weights are Gemma 4's classes, which have none
    moe = read_gguf(ROOT / "tests" / "fixtures" / "gemma4-moe-f32.gguf")
    bound = weights.bind(Gemma4Config.from_gguf(moe), moe.tensors)
    assert type(bound) is weights.ModelWeights and not hasattr(bound, "self_cond_gate")
    assert type(w).__name__ == "DiffusionWeights" and type(w.layers[0]).__name__ == "DiffusionLayerWeights"


def test_diffusion_config_checks_its_keys(gguf_files):
    meta = dict(read_gguf(gguf_files["f32"]).metadata)
    bad = dict(meta, **{"diffusion-gemma.diffusion.t_min": 2.0})
    with pytest.raises(ConfigError, match=r"diffusion-gemma\.diffusion\.t_min = 2\.0: must be at most"):
        DiffusionGemmaConfig.from_metadata(bad, vocab_size=512)
    bad = dict(meta, **{"diffusion-gemma.diffusion.canvas_length": 0})
    with pytest.raises(ConfigError, match=r"canvas_length = 0: must be between 1 and"):
        DiffusionGemmaConfig.from_metadata(bad, vocab_size=512)
    missing = {k: v for k, v in meta.items() if not k.endswith("diffusion.canvas_length")}
    with pytest.raises(ConfigError, match="lacks diffusion-gemma.diffusion.canvas_length"):
        DiffusionGemmaConfig.from_metadata(missing, vocab_size=512)


@pytest.mark.parametrize("i", range(N_CASES))
def test_decoder_step_matches_transformers(model, i):
    prompt, canvas, prev, blocks, want = case(i)
    got = model.decoder_step(prompt, canvas, prev, blocks)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-3
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_f16_file_matches_too(gguf_files):
    """The checkpoint's bf16 weights fit f16 exactly: the same tolerance."""
    from pyapp.families.diffusion_gemma.reference import DiffusionReference
    m = DiffusionReference(read_gguf(gguf_files["f16"]))
    prompt, canvas, prev, blocks, want = case(3)
    got = m.decoder_step(prompt, canvas, prev, blocks)
    assert np.abs(got - want).max() <= 1e-3
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_the_pieces_that_differ_from_gemma4_matter(model):
    """Each DiffusionGemma detail changes the logits by far more than the tolerance: the sliding layers'
    prefix of window - 1 positions, the encoder's own layer scales, the self-conditioning input."""
    prompt, canvas, prev, blocks, want = case(3)
    cache = model.encode(prompt)
    for block in blocks:
        model.encode(block, cache)
    length = cache.length
    np.testing.assert_allclose(model.decode(canvas, cache, prev), want, atol=1e-3, rtol=0)
    assert cache.length == length                         # the decoder reads the cache, never writes it
    cfg = model.cfg
    try:
        model.cfg = dataclasses.replace(cfg, sliding_window=0)        # sliding layers see the whole prefix
        assert np.abs(model.decode(canvas, cache, prev) - want).max() > 0.1
    finally:
        model.cfg = cfg
    assert np.abs(model.decode(canvas, cache, None) - want).max() > 0.1
    # the decoder's scales in the encoder
    saved = [lw.enc_output_scale for lw in model.w.layers]
    try:
        for lw in model.w.layers:
            lw.enc_output_scale = lw.output_scale
        assert np.abs(model.decoder_step(prompt, canvas, prev, blocks) - want).max() > 0.1
    finally:
        for lw, s in zip(model.w.layers, saved):
            lw.enc_output_scale = s


def test_previous_logits_of_the_wrong_shape_are_refused(model):
    prompt, canvas, _, _, _ = case(0)
    with pytest.raises(ValueError, match=r"previous logits of shape \(16, 511\), expected \[16, 512\]"):
        model.decoder_step(prompt, canvas, np.zeros((16, 511), np.float32))


@pytest.mark.parametrize("backend", ["reference", pytest.param("native", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("i", [0, 1, 2])
def test_cli_diffusion_logits_writes_the_golden_step(gguf_files, tmp_path, i, backend, capsys):
    """`python -m pyapp diffusion-logits` (DESIGN.md's interface) on both backends."""
    from pyapp.__main__ import main
    prompt, canvas, prev, blocks, want = case(i)
    assert not blocks
    args = ["diffusion-logits", str(gguf_files["f32"]), "--prompt-tokens", ",".join(map(str, prompt)),
            "--canvas-tokens", ",".join(map(str, canvas)), "--out", str(tmp_path / "out.npy"), "--backend", backend,
            "--context", "64"]
    if prev is not None:
        np.save(tmp_path / "prev.npy", prev)
        args += ["--prev-logits", str(tmp_path / "prev.npy")]
    assert main(args) == 0
    got = np.load(tmp_path / "out.npy")
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-3 and (got.argmax(-1) == want.argmax(-1)).all()


def test_cli_diffusion_logits_refuses_bad_input(gguf_files, tmp_path, capsys):
    from pyapp.__main__ import main
    base = ["diffusion-logits", str(gguf_files["f32"]), "--out", str(tmp_path / "out.npy")]
    assert main(base + ["--prompt-tokens", "2,3", "--canvas-tokens", "4,99999"]) == 2
    assert "canvas token id 99999 is outside the vocabulary (0..511)" in capsys.readouterr().err
    np.save(tmp_path / "prev.npy", np.zeros((3, 512), np.float32))
    assert main(base + ["--prompt-tokens", "2", "--canvas-tokens", "4,5", "--prev-logits", str(tmp_path / "prev.npy")]) == 2
    assert "needs (2, 512)" in capsys.readouterr().err
    assert not (tmp_path / "out.npy").exists()
