"""DiffusionGemma generation (issue 12, item 3) against transformers' `generate` with its random draws injected
(tests/fixtures/diffusion-tiny.generate.npz, made by tools/make_diffusion_generate_golden.py): the numpy
reference (pyapp/families/diffusion_gemma/reference.py) and the GPU engine make every decision the same way: each step's
acceptance mask and argmax draft, the stop step of each block, the committed blocks token for token (pad after
an eos), tokens per forward."""

from __future__ import annotations

import json

import numpy as np
import pytest

from support.paths import ROOT, load_tool
from pyapp.gguf import read_gguf

HF = ROOT / "tests" / "fixtures" / "diffusion-tiny-hf"
TRACE = np.load(ROOT / "tests" / "fixtures" / "diffusion-tiny.generate.npz")
N_CASES = 5


@pytest.fixture(scope="module")
def gguf_path(diffusion_gguf):
    return diffusion_gguf("f32")


def params_of(cfg, i):
    from pyapp.families.diffusion_gemma import DenoiseParams
    s = json.loads(str(TRACE[f"settings_{i}"]))
    eos = tuple(s.pop("eos_token_id", (1, 106, 50)))
    s["steps"] = s.pop("max_denoising_steps", None)
    return DenoiseParams.from_config(cfg, eos_ids=eos, **s)


def draws_of(i):
    from pyapp.families.diffusion_gemma import ReplayDraws
    return ReplayDraws(TRACE[f"init_{i}"].tolist(), TRACE[f"sample_{i}"].tolist(), TRACE[f"renoise_{i}"].tolist())


def check_against_trace(res, i):
    prompt = TRACE[f"prompt_{i}"].tolist()
    assert res.steps == TRACE[f"steps_{i}"].tolist()
    np.testing.assert_array_equal(np.asarray(res.accepted), TRACE[f"accepted_{i}"])
    np.testing.assert_array_equal(np.asarray(res.argmax), TRACE[f"argmax_{i}"])
    assert prompt + res.tokens == TRACE[f"sequences_{i}"].tolist()
    assert res.tokens_per_forward() == pytest.approx(float(TRACE[f"tpf_{i}"]), rel=1e-6)


def test_the_trace_covers_the_sampler():
    """Early stops (confident; and held back by stability), many acceptances a step, an eos, whole canvases
    past max_new_tokens."""
    steps = [TRACE[f"steps_{i}"].tolist() for i in range(N_CASES)]
    assert steps == [[12, 12], [12, 12], [12], [10, 10, 10], [12, 12]]
    assert TRACE["accepted_1"].sum(-1).max() >= 10 and TRACE["accepted_0"].sum(-1).max() == 1
    assert len(TRACE["sequences_3"]) == len(TRACE["prompt_3"]) + 48          # 40 new tokens asked
    assert (TRACE["sequences_2"][-5:] == 0).all()                             # pad after the eos


@pytest.mark.parametrize("i", range(N_CASES))
def test_reference_replays_transformers(gguf_path, i):
    from pyapp.families.diffusion_gemma.reference import generate
    from pyapp.families.diffusion_gemma.reference import DiffusionReference
    model = DiffusionReference(read_gguf(gguf_path))
    res = generate(model, TRACE[f"prompt_{i}"].tolist(), params_of(model.cfg, i), draws_of(i))
    check_against_trace(res, i)
    assert res.stop_reason == ("stop" if i == 2 else "length")


@pytest.fixture(scope="module")
def engine(gguf_path, dev):
    from pyapp.engine import Engine
    return Engine.open(read_gguf(gguf_path), device=dev, context_length=96, chunk=16)


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(N_CASES))
def test_gpu_replays_transformers(engine, i):
    """The GPU engine (canvas programs + shaders/denoise.wgsl) with the trace's draws injected."""
    engine.reset()
    res = engine.denoise(TRACE[f"prompt_{i}"].tolist(), params_of(engine.config, i), draws_of(i))
    check_against_trace(res, i)
    assert res.stop_reason == ("stop" if i == 2 else "length")


@pytest.mark.gpu
def test_seeded_generation_matches_the_reference(engine, gguf_path):
    """Our own draws (SeededDraws: Python's generator, inverse-CDF sampling on the GPU): the GPU and the numpy
    reference given the same seed commit the same blocks after the same steps; the seed is reproducible."""
    from pyapp.families.diffusion_gemma import DenoiseParams, SeededDraws
    from pyapp.families.diffusion_gemma.reference import generate
    from pyapp.families.diffusion_gemma.reference import DiffusionReference
    model = DiffusionReference(read_gguf(gguf_path))
    prompt = TRACE["prompt_1"].tolist()
    params = params_of(model.cfg, 1)
    C, V = model.cfg.canvas_length, model.cfg.vocab_size
    want = generate(model, prompt, params, SeededDraws(7, V, C))
    engine.reset()
    got = engine.denoise(prompt, DenoiseParams(**{**params.__dict__, "seed": 7}))
    assert got.steps == want.steps and got.tokens == want.tokens
    np.testing.assert_array_equal(np.asarray(got.accepted), np.asarray(want.accepted))
    engine.reset()
    again = engine.denoise(prompt, DenoiseParams(**{**params.__dict__, "seed": 7}))
    assert again.tokens == got.tokens
    engine.reset()
    other = engine.denoise(prompt, DenoiseParams(**{**params.__dict__, "seed": 8}))
    assert other.tokens != got.tokens


@pytest.mark.gpu
def test_generate_takes_sampling_params(engine):
    """Engine.generate's contract (the CLI's and the app's): SamplingParams' max_tokens and seed, tokens up to
    the eos, streamed block by block."""
    from pyapp.engine import SamplingParams
    engine.reset()
    seen = []
    res = engine.generate(TRACE["prompt_1"].tolist(), SamplingParams(max_tokens=20, seed=3),
                          on_token=lambda t, piece: seen.append(t))
    assert res.stop_reason in ("length", "stop") and res.tokens == [t for t in seen if t is not None]
    assert len(res.denoise.tokens) == 32 or res.stop_reason == "stop"      # whole canvases: 20 -> 2 blocks
    assert all(t not in (1, 106, 50) for t in res.tokens)


@pytest.mark.gpu
def test_cli_generate_prints_blocks(tmp_path, vocab_gguf_path):
    """`python -m pyapp generate` on a DiffusionGemma GGUF (with the Gemma 4 tokenizer cut to its 512 ids):
    the committed text block by block, the same on the GPU and the reference for a seed; bad settings refused."""
    import subprocess
    import sys
    path = tmp_path / "tiny-vocab.gguf"
    load_tool("convert_diffusion_gemma").convert(HF, path, "f32", vocab=vocab_gguf_path, log=lambda _msg: None)
    base = [sys.executable, "-m", "pyapp", "generate", str(path), "--prompt", "Hello", "--max-tokens", "20",
            "--seed", "3", "--steps", "6", "--t-max", "0.3", "--t-min", "0.05", "--context", "128"]
    out = {}
    for backend in ("native", "reference"):
        r = subprocess.run(base + ["--backend", backend], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "[block 1: 6 denoising steps]" in r.stderr and "[block 2: 6 denoising steps]" in r.stderr
        assert "2 blocks, 12 denoising steps" in r.stderr
        out[backend] = r.stdout
    assert out["native"] == out["reference"] and out["native"].strip()
    r = subprocess.run(base + ["--t-min", "0.9"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "temperatures must satisfy 0 <= t_min <= t_max" in r.stderr
