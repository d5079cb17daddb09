"""The command line: python -m pyapp info / tokenize / logits / generate / bench on the fixtures."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from support.paths import ROOT

FIX = ROOT / "tests" / "fixtures"


def pyapp(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyapp", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, check=check, timeout=300)


def test_info():
    out = pyapp("info", FIX / "gemma4-moe-q8_0.gguf").stdout
    assert "architecture:  gemma4" in out and "MoE 2/4 experts" in out and "Q8_0" in out


def test_tokenize_matches_the_tokenizer():
    from pyapp.gguf import read_gguf
    from pyapp.tokenizer import Tokenizer
    tok = Tokenizer.from_metadata(read_gguf(FIX / "demo.gguf").metadata)
    out = pyapp("tokenize", FIX / "demo.gguf", "--text", "Hello world, hello!").stdout.split()
    assert [int(x) for x in out] == tok.encode("Hello world, hello!")
    assert pyapp("tokenize", FIX / "demo.gguf", "--text", "hi", "--bos").stdout.split()[0] == "2"


@pytest.mark.parametrize("backend", ["reference", pytest.param("native", marks=pytest.mark.gpu)])
def test_logits_match_golden(tmp_path, backend):
    if backend == "native":
        pytest.importorskip("wgpu")
    path = FIX / "gemma4-dense-q6_k.gguf"
    golden = np.load(path.with_suffix(".golden.npz"))
    tokens = golden["tokens_1"].tolist()
    out = tmp_path / "l.npy"
    r = pyapp("logits", path, "--tokens", ",".join(map(str, tokens)), "--out", out, "--backend", backend, check=False)
    if r.returncode and "no WebGPU adapter" in r.stderr:
        pytest.skip("no WebGPU adapter")
    assert r.returncode == 0, r.stderr
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == golden["logits_1"].shape
    assert np.abs(got - golden["logits_1"]).max() < 2e-3


@pytest.mark.gpu
def test_logits_no_int8(tmp_path):
    """A 90-token prompt's logits: by default within int8's rounding of the f32 reference, with --no-int8
    within float rounding (the flag reaches the engine)."""
    pytest.importorskip("wgpu")
    path = FIX / "gemma4-dense-q4_k.gguf"
    tokens = ",".join(map(str, [2] + np.random.default_rng(3).integers(3, 250, 89).tolist()))
    got = {}
    for flag in ("--no-int8", None, "reference"):
        out = tmp_path / f"{flag}.npy"
        extra = ["--backend", "reference"] if flag == "reference" else [flag] if flag else []
        r = pyapp("logits", path, "--tokens", tokens, "--out", out, *extra, check=False)
        if r.returncode and "no WebGPU adapter" in r.stderr:
            pytest.skip("no WebGPU adapter")
        assert r.returncode == 0, r.stderr
        got[flag] = np.load(out)
    assert np.abs(got["--no-int8"] - got["reference"]).max() < 1e-4
    assert 1e-3 < np.abs(got[None] - got["reference"]).mean() < 0.06


@pytest.mark.gpu
def test_logits_f16(tmp_path):
    """--f16 reaches the engine: on a device with shader-f16 a 30-token prompt's logits move off the
    f32 ones by f16's rounding (the f16 tiles ran), and no further."""
    pytest.importorskip("wgpu")
    from pyapp.gpu import get_device
    if not get_device("native").has_f16:
        pytest.skip("device has no shader-f16")
    path = FIX / "gemma4-dense-q6_k.gguf"
    tokens = ",".join(map(str, [2] + np.random.default_rng(6).integers(3, 250, 29).tolist()))
    got = {}
    for flag in ("--f16", None):
        out = tmp_path / f"{flag}.npy"
        r = pyapp("logits", path, "--tokens", tokens, "--out", out, *([flag] if flag else []), check=False)
        assert r.returncode == 0, r.stderr
        got[flag] = np.load(out)
    assert 1e-5 < np.abs(got["--f16"] - got[None]).mean() < 0.02


@pytest.mark.gpu
def test_generate_and_bench():
    pytest.importorskip("wgpu")
    r = pyapp("generate", FIX / "demo.gguf", "--prompt", "Hi", "--max-tokens", "5", "--temperature", "0", check=False)
    if r.returncode and "no WebGPU adapter" in r.stderr:
        pytest.skip("no WebGPU adapter")
    assert r.returncode == 0, r.stderr
    assert "generated" in r.stderr and "tok/s" in r.stderr
    b = json.loads(pyapp("bench", FIX / "gemma4-dense-q8_0.gguf", "--json", "--prompt-tokens", "16",
                         "--decode-tokens", "8").stdout.strip().splitlines()[-1])
    assert b["generated_tokens"] == 8 and b["decode_tok_s"] > 0 and b["adapter"].startswith("native")
    assert len(b["runs"]["decode_tok_s"]) == 3 and sorted(b["runs"]["decode_tok_s"])[1] == round(b["decode_tok_s"], 1)


def test_logits_refuses_ids_outside_the_vocabulary(tmp_path):
    for ids in ("2,99999", "2,-1"):
        r = pyapp("logits", FIX / "demo.gguf", "--tokens", ids, "--out", tmp_path / "x.npy", "--backend", "reference",
                  check=False)
        assert r.returncode == 2 and "outside the vocabulary (0..4095)" in r.stderr and "Traceback" not in r.stderr


def test_bad_file_is_a_clean_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    r = pyapp("info", bad, check=False)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr


@pytest.mark.gpu
def test_generate_and_bench_speculate():
    """--speculate N: generate says what it drafted and accepted; off (and says so) when sampling;
    bench reports drafted, accepted and tokens per step for a repeating prompt; a bad N is refused."""
    pytest.importorskip("wgpu")
    model = FIX / "gemma4-dense-q8_0.gguf"
    r = pyapp("generate", model, "--prompt", "one two one two one two", "--raw", "--max-tokens", "12",
              "--speculate", "4", check=False)
    if r.returncode and "no WebGPU adapter" in r.stderr:
        pytest.skip("no WebGPU adapter")
    assert r.returncode == 0, r.stderr
    assert re.search(r"speculative: \d+ of \d+ drafted tokens accepted, [\d.]+ tokens per step", r.stderr), r.stderr
    r = pyapp("generate", model, "--prompt", "Hi", "--max-tokens", "3", "--speculate", "4", "--temperature", "0.5")
    assert "speculative decoding is off: greedy only" in r.stderr
    b = json.loads(pyapp("bench", model, "--json", "--prompt-tokens", "32", "--decode-tokens", "12", "--repeat", "1",
                         "--speculate", "4", "--prompt-kind", "repeat").stdout.strip().splitlines()[-1])
    assert b["speculate"] == 4 and b["prompt"] == "repeat" and b["generated_tokens"] == 12
    assert b["accepted"] > 0 and b["tokens_per_step"] > 1
    r = pyapp("generate", model, "--prompt", "Hi", "--speculate", "17", check=False)
    assert r.returncode == 2 and "speculate must be an integer from 0 to 16" in r.stderr


@pytest.mark.gpu
def test_generate_with_an_assistant_drafter():
    """--draft-model: the drafter (the tiny random one of tests/fixtures/assistant/) drafts 4 tokens a step by
    default and the reply is the greedy one without it; a file that is no drafter, and a drafter made for
    another model, are refused in a sentence (exit 2)."""
    model, drafter = FIX / "gemma4-dense-f32.gguf", FIX / "assistant" / "gemma4-assistant-f32.gguf"
    args = ("generate", model, "--prompt", "one two", "--raw", "--max-tokens", "10")
    plain = pyapp(*args)
    r = pyapp(*args, "--draft-model", drafter)
    assert r.stdout == plain.stdout and r.stdout.strip()
    drafted = re.search(r"speculative: \d+ of (\d+) drafted tokens accepted", r.stderr)
    assert drafted and int(drafted[1]) >= 4, r.stderr
    b = json.loads(pyapp("bench", model, "--json", "--prompt-tokens", "16", "--decode-tokens", "8", "--repeat", "1",
                         "--draft-model", drafter).stdout.strip().splitlines()[-1])
    assert b["speculate"] == 4 and b["drafter_rounds"] > 0 and b["drafter_round_ms"] > 0
    assert 0 < b["break_even_acceptance"] <= 1 and b["break_even_tokens_per_step"] > 1
    r = pyapp("generate", model, "--prompt", "x", "--draft-model", model, check=False)
    assert r.returncode == 2 and "is not an assistant drafter" in r.stderr, r.stderr
    r = pyapp("generate", FIX / "gemma4-moe-q8_0.gguf", "--prompt", "x", "--draft-model", drafter, check=False)
    assert r.returncode == 2 and "the drafter does not fit this target" in r.stderr, r.stderr
    # --gpu-memory counts the drafter: a budget the model alone fits is refused naming the drafter's share
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    alone = Engine.plan(read_gguf(model), {}, 256).total
    tight = f"{(alone + (1 << 18)) / 2**20:.3f}"
    r = pyapp(*args, "--context", "256", "--gpu-memory", tight, "--draft-model", drafter, check=False)
    assert r.returncode != 0 and "the assistant drafter 1." in r.stderr, r.stderr
    assert pyapp(*args, "--context", "256", "--gpu-memory", tight).stdout == plain.stdout


@pytest.mark.gpu
def test_prompt_step_reaches_the_engine():
    """The app layer's load (the CLI's --prompt-step) sizes the engine's prompt steps: a 40-token prompt read
    in steps of 24 gives the logits of the default step (one step of 40), within float rounding."""
    from pyapp.app import model
    from pyapp.app.session import Session
    from pyapp.gguf import read_gguf
    from pyapp.steps import run
    prompt = [2] + np.random.default_rng(5).integers(3, 250, 39).tolist()
    logits = {}
    for step in (None, 24):
        s = Session()
        g = read_gguf(FIX / "gemma4-dense-f32.gguf")
        model.choose(s, g)
        run(model.load(s, context_length=256, prompt_step=step))
        assert s.engine.runner.chunk == (step or 512)
        logits[step] = np.asarray(s.engine.forward(prompt))
        s.unload()
    np.testing.assert_allclose(logits[24], logits[None], atol=1e-4)


def test_a_conversation_longer_than_the_loaded_context_is_refused_in_words():
    """A chat turn that the context loaded cannot hold is refused with what to do: a new chat, a shorter one, or
    (the model taking more than it was loaded with) a larger Context and a reload; at the model's own most, only
    the first two."""
    from pyapp.app import model
    from pyapp.app.reply import reply
    from pyapp.app.session import Refused, Session
    from pyapp.gguf import read_gguf
    from pyapp.steps import run
    s = Session()
    g = read_gguf(FIX / "gemma4-dense-f32.gguf")
    model.choose(s, g)
    run(model.load(s, context_length=32))
    most = s.engine.config.context_length
    long_chat = [{"role": "user", "content": "one two three four five six seven eight nine ten " * 4}]
    with pytest.raises(Refused, match=rf"The conversation \(\d+ tokens\) fills the context of 32; start a new chat or "
                                      rf"shorten it, or raise Context \(this model takes up to {most:,} tokens\) and "
                                      r"reload the model"):
        run(reply(s, long_chat, {"temperature": 0, "max_tokens": 4}))
    s.unload()
    run(model.load(s, context_length=most))
    longest = [{"role": "user", "content": "one two three " * most}]
    with pytest.raises(Refused, match=r"fills the context of [\d,]+; start a new chat or shorten it$"):
        run(reply(s, longest, {"temperature": 0, "max_tokens": 4}))
    s.unload()
