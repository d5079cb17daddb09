"""Sampling parameters and the context length: one set of rules (pyapp.sampling) for the CLI, the
engine and the page, Ollama's meaning of each value, and a ParamError naming the parameter, its
value and the allowed range for anything else."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import numpy as np
import pytest

from pyapp.sampling import ParamError, SamplingParams, check_context_length, page_rules

from support.paths import ROOT

DEMO = ROOT / "tests" / "fixtures" / "demo.gguf"

BAD = [  # (field, value, what the message must say)
    ("temperature", 1e40, "temperature must be a number from 0 to 100 (0 = greedy), got 1e+40"),
    ("temperature", float("nan"), "temperature must be a number from 0 to 100 (0 = greedy), got nan"),
    ("temperature", -0.5, "temperature must be a number from 0 to 100 (0 = greedy), got -0.5"),
    ("top_k", 2**40, "top_k must be an integer from 0 to 256 (0 = no limit; the GPU sampler keeps at most "
                     "256 candidates), got 1099511627776"),
    ("top_k", -1, "top_k must be an integer from 0 to 256"),
    ("top_k", 2.5, "top_k must be an integer from 0 to 256"),
    ("top_k", True, "got True"),
    ("top_p", 1.5, "top_p must be a number from 0 to 1 (1 = off, 0 = only the most likely token), got 1.5"),
    ("top_p", -1, "top_p must be a number from 0 to 1 (1 = off, 0 = only the most likely token), got -1"),
    ("top_p", float("nan"), "top_p must be a number from 0 to 1"),
    ("min_p", float("inf"), "min_p must be a number from 0 to 1 (0 = off), got inf"),
    ("repeat_penalty", 0, "repeat_penalty must be a number above 0 and at most 100 (1 = off), got 0"),
    ("repeat_last_n", 65, "repeat_last_n must be an integer from -1 to 64"),
    ("max_tokens", 0, "max_tokens must be an integer of at least 1 (or -1: until a stop token or the end of "
                      "the context), got 0"),
    ("max_tokens", -5, "max_tokens must be an integer of at least 1"),
    ("seed", "7", "seed must be an integer"),
    ("temperature", "0.7", "temperature must be a number from 0 to 100 (0 = greedy), got '0.7'"),
]


@pytest.mark.parametrize("field,value,message", BAD, ids=lambda v: repr(v)[:20])
def test_bad_values_name_the_parameter_its_value_and_the_range(field, value, message):
    with pytest.raises(ParamError) as e:
        SamplingParams(**{field: value})
    assert message in str(e.value)
    assert isinstance(e.value, ValueError)


def test_a_field_changed_after_creation_is_checked_again():
    p = SamplingParams()
    p.top_k = 2**40
    with pytest.raises(ParamError, match="top_k must be"):
        p.validate()


def test_ollamas_special_values():
    p = SamplingParams(top_k=0, top_p=0, repeat_last_n=-1, seed=-1, max_tokens=-1, temperature=0)
    assert (p.top_k, p.top_p, p.repeat_last_n, p.seed, p.max_tokens) == (0, 0.0, 64, None, -1)
    assert p.token_limit == math.inf
    assert SamplingParams(max_tokens=7).token_limit == 7
    # whole floats (JSON from the page) become ints
    q = SamplingParams(top_k=40.0, seed=3.0, max_tokens=12.0)
    assert (q.top_k, q.seed, q.max_tokens) == (40, 3, 12) and type(q.top_k) is int


def test_top_p_zero_keeps_only_the_most_likely_token():
    """Ollama's top_p 0: the smallest prefix of mass >= 0 is the top token (was: top-p off)."""
    from pyapp.reference.sampling import sample
    logits = np.array([0.0, 2.0, 1.9, 1.8], np.float32)
    picks = {sample(logits, temperature=1.0, top_k=0, top_p=0.0, min_p=0.0, u=u) for u in (0.0, 0.5, 0.99)}
    assert picks == {1}
    assert sample(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, u=0.99) == 0   # off: all four


def test_from_ollama_reads_a_params_layer_as_ollama_does():
    p = SamplingParams.from_ollama({"temperature": -1, "top_k": 1000, "top_p": 2, "min_p": -0.1,
                                    "num_predict": -2, "repeat_last_n": -1, "seed": 5, "stop": ["<eos>"]})
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.max_tokens, p.repeat_last_n, p.seed) == \
        (0.0, 256, 1.0, 0.0, -1, 64, 5)
    assert SamplingParams.from_ollama({"num_predict": 0}).max_tokens == 512      # 0: our default
    assert SamplingParams.from_ollama(None) == SamplingParams()
    with pytest.raises(ParamError, match="top_k must be an integer"):
        SamplingParams.from_ollama({"top_k": "lots"})


def test_engine_re_exports_the_one_definition():
    import pyapp.engine
    import pyapp.sampling
    assert pyapp.engine.SamplingParams is pyapp.sampling.SamplingParams
    assert pyapp.engine.DEFAULT_CONTEXT == pyapp.sampling.DEFAULT_CONTEXT == 4096


def test_context_length():
    assert check_context_length(None, 131072) == 4096
    assert check_context_length(None, 1024) == 1024
    assert check_context_length(8192, 131072) == 8192
    assert check_context_length(10**9, 131072) == 131072       # Ollama: cut to the trained context
    for bad in (0, -1, 1, 2.5, float("nan"), "4096", True):
        with pytest.raises(ParamError, match=rf"context length must be an integer of at least 2, got {bad!r}"):
            check_context_length(bad, 131072)


def test_page_rules_match_the_checks():
    rules = page_rules()
    assert rules["top_k"] == {"min": 0, "max": 256, "rule": "an integer from 0 to 256 (0 = no limit; "
                              "the GPU sampler keeps at most 256 candidates)",
                              "lo": 0, "above_lo": False, "integer": True, "special": None}
    assert rules["repeat_penalty"]["above_lo"] and rules["max_tokens"]["special"] == -1
    assert rules["max_tokens"]["min"] == -1 and rules["max_tokens"]["max"] is None
    assert rules["context_length"]["min"] == 2
    assert set(rules) == set(SamplingParams.__dataclass_fields__) | {"context_length"} | {
        "denoise_steps", "denoise_t_min", "denoise_t_max", "denoise_entropy_bound"}
    assert rules["denoise_steps"]["rule"] == ("an integer from 1 to 65536 (per block of text; a block stops "
                                              "sooner once it settles)")
    assert rules["denoise_t_max"]["above_lo"] and rules["denoise_entropy_bound"]["max"] is None


def test_denoise_settings_are_checked_in_the_pages_words():
    """A DiffusionGemma model's settings from the page: DenoiseParams fields, each checked; absent ones are left
    to the model's defaults; the temperature range the right way round."""
    from pyapp.sampling import check_temperature_range, denoise_settings
    assert denoise_settings({"denoise_steps": 12.0, "denoise_t_min": 0.3, "denoise_t_max": 1,
                             "denoise_entropy_bound": 0, "temperature": 5}) == {
        "steps": 12, "t_min": 0.3, "t_max": 1.0, "entropy_bound": 0.0}
    assert denoise_settings({"denoise_steps": None}) == {}
    for name, value, message in [
            ("denoise_steps", 0, "max steps must be an integer from 1 to 65536"),
            ("denoise_steps", 2.5, "max steps must be an integer"),
            ("denoise_t_max", 0, "highest temperature must be a number above 0 and at most 100"),
            ("denoise_t_min", -0.1, "lowest temperature must be a number from 0 to 100"),
            ("denoise_entropy_bound", float("nan"), "entropy bound must be a number of at least 0")]:
        with pytest.raises(ParamError, match="^" + re.escape(message)):
            denoise_settings({name: value})
    check_temperature_range(0.4, 0.4)
    with pytest.raises(ParamError, match=r"^The lowest temperature \(0.9\) must not be above the highest \(0.3\)$"):
        check_temperature_range(0.9, 0.3)


# -- the CLI checks before loading anything; the engine before any GPU work ------------------

def pyapp(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyapp", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("flag,value,message", [
    ("--top-p", "1.5", "error: top_p must be a number from 0 to 1"),
    ("--temperature", "1e40", "error: temperature must be a number from 0 to 100"),
    ("--top-k", str(2**40), "error: top_k must be an integer from 0 to 256"),
    ("--max-tokens", "0", "error: max_tokens must be an integer of at least 1"),
    ("--temperature", "nan", "error: temperature must be a number from 0 to 100 (0 = greedy), got nan"),
])
def test_cli_refuses_bad_sampling_options(flag, value, message):
    r = pyapp("generate", DEMO, "--prompt", "Hi", flag, value)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("context", ["0", "-1"])
def test_cli_refuses_a_bad_context(dev, context):
    r = pyapp("generate", DEMO, "--prompt", "Hi", "--context", context)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"error: context length must be an integer of at least 2, got {context}" in r.stderr


@pytest.mark.gpu
def test_engine_context_and_token_limits(dev):
    from pyapp.engine import Engine, EngineError
    from pyapp.gguf import read_gguf
    g = read_gguf(DEMO)
    with pytest.raises(ParamError, match="context length must be an integer of at least 2, got 0"):
        Engine.open(g, device=dev, context_length=0)
    assert Engine.open(g, device=dev, context_length=10**6).context_length == 4096     # the model's own
    # a context whose KV cache exceeds one GPU binding: refused before any upload, with the largest that fits
    from pyapp.model.config import Gemma4Config
    g.metadata["gemma4.context_length"] = 1 << 24
    per_token = max(4 * lc.n_kv_heads * lc.head_dim for lc in Gemma4Config.from_gguf(g).layers if not lc.sliding)
    fits = min(dev.limits["max_storage_buffer_binding_size"], dev.limits["max_buffer_size"]) // per_token
    with pytest.raises(EngineError, match=rf"choose a context of at most {fits} tokens"):
        Engine.open(g, device=dev, context_length=fits + 1)

    eng = Engine.open(read_gguf(DEMO), device=dev, context_length=16)
    res = eng.generate([2, 10, 11, 12], SamplingParams(temperature=0, max_tokens=-1), stop_ids=())
    assert res.stop_reason == "context" and len(res.tokens) == 12
    p = SamplingParams(temperature=0)
    p.temperature = 1e40
    with pytest.raises(ParamError, match="temperature must be a number from 0 to 100"):
        eng.generate([2, 10], p, stop_ids=())
    assert eng.generate([2, 10, 11], SamplingParams(temperature=0, max_tokens=3), stop_ids=()).stop_reason == "length"
