"""DiffusionGemma generation (issue 12, item 3) against transformers' `generate` with its random draws injected
(tests/fixtures/diffusion-tiny.generate.npz, made by tools/make_diffusion_generate_golden.py): the numpy
reference (pyapp/reference/denoise.py) and the GPU engine make every decision the same way: each step's
acceptance mask and argmax draft, the stop step of each block, the committed blocks token for token (pad after
an eos), tokens per forward."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import ROOT, load_tool
from pyapp.gguf import read_gguf

HF = ROOT / "tests" / "fixtures" / "diffusion-tiny-hf"
TRACE = np.load(ROOT / "tests" / "fixtures" / "diffusion-tiny.generate.npz")
N_CASES = 5


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("diffusion-generate") / "tiny-f32.gguf"
    load_tool("convert_diffusion_gemma").convert(HF, path, "f32", vocab=None, log=lambda _msg: None)
    return path


def params_of(cfg, i):
    from pyapp.denoising import DenoiseParams
    s = json.loads(str(TRACE[f"settings_{i}"]))
    eos = tuple(s.pop("eos_token_id", (1, 106, 50)))
    s["steps"] = s.pop("max_denoising_steps", None)
    return DenoiseParams.from_config(cfg, eos_ids=eos, **s)


def draws_of(i):
    from pyapp.denoising import ReplayDraws
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
    from pyapp.reference.denoise import generate
    from pyapp.reference.diffusion import DiffusionReference
    model = DiffusionReference(read_gguf(gguf_path))
    res = generate(model, TRACE[f"prompt_{i}"].tolist(), params_of(model.cfg, i), draws_of(i))
    check_against_trace(res, i)
    assert res.stop_reason == ("stop" if i == 2 else "length")
