"""The DiffusionGemma bench model and benchmark (issue 12, the H100 item): tools/make_bench_model.py's
`tiny-diffusion` shape (the `diffusion` one at toy size) has the layout tools/convert_diffusion_gemma.py
writes, the engine loads and denoises it, bench/engine_bench.py reports the numbers bench/bench.py and
bench/node_bench.mjs print (sync and async drivers, resident and with streamed experts), and
bench/side_by_side.py tables them."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import pytest

from support.paths import ROOT, load_tool
from pyapp.gguf import read_gguf

HF = ROOT / "tests" / "fixtures" / "diffusion-tiny-hf"


@pytest.fixture(scope="module")
def bench_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("diffusion-bench") / "bench-tiny-diffusion-Q4_K.gguf"
    tool = load_tool("make_bench_model")
    tool.write("tiny-diffusion", tool.T.Q4_K, str(path), log=lambda _msg: None)
    return path


def _layout(path):
    """(metadata keys, global tensor names, per-layer tensor suffixes of sliding / full layers)."""
    g = read_gguf(path)
    names = set(g.tensors)
    per_layer = {}
    for n in names:
        if m := re.match(r"blk\.(\d+)\.(.+)", n):
            per_layer.setdefault(int(m[1]), set()).add(m[2])
    pattern = g.metadata["diffusion-gemma.attention.sliding_window_pattern"]
    kinds = {s: set.union(*(per_layer[i] for i, x in enumerate(pattern) if x == s)) for s in (True, False)}
    return set(g.metadata), {n for n in names if not n.startswith("blk.")}, kinds


def test_the_bench_model_has_the_converters_layout(bench_file, tmp_path):
    conv = load_tool("convert_diffusion_gemma")
    converted = tmp_path / "converted.gguf"
    conv.convert(HF, converted, "q8_0", vocab=None, log=lambda _msg: None)
    keys, globals_, layers = _layout(bench_file)
    want_keys, want_globals, want_layers = _layout(converted)
    assert read_gguf(bench_file).architecture == conv.ARCH == "diffusion-gemma"
    assert keys == want_keys
    assert globals_ == want_globals and {"self_cond_gate.weight", "self_cond_down.weight"} <= globals_
    assert layers == want_layers and "enc_layer_output_scale.weight" in layers[False]
    meta = read_gguf(bench_file).metadata
    assert meta["diffusion-gemma.diffusion.canvas_length"] == 16
    assert meta["diffusion-gemma.diffusion.max_denoising_steps"] == 48
    assert list(meta["tokenizer.ggml.eos_token_ids"]) == [1, 106, 50]
    assert meta["diffusion-gemma.attention.sliding_window_pattern"][-1] is False   # the last layer full


def test_the_full_size_shape_is_26b_a4b():
    tool = load_tool("make_bench_model")
    s, a = tool.SHAPES["diffusion"], tool.SHAPES["a26b"]
    assert s["diffusion"] and s["canvas"] == 256 and not s["header"]
    assert {k: v for k, v in s.items() if k not in ("diffusion", "canvas", "header")} == \
        {k: v for k, v in a.items() if k != "header"}


def test_layers_override_keeps_the_last_layer_full(tmp_path):
    tool = load_tool("make_bench_model")
    path = tmp_path / "l4.gguf"
    tool.write("tiny-diffusion", tool.T.Q8_0, str(path), layers=4, vocab_size=512, log=lambda _msg: None)
    meta = read_gguf(path).metadata
    assert list(meta["diffusion-gemma.attention.sliding_window_pattern"]) == [True, True, False, False]
    assert meta["diffusion-gemma.block_count"] == 4
    assert read_gguf(path).tensors["token_embd.weight"].shape[-1] == 512


def check_record(r, steps, gen, canvas=16):
    assert r["mode"] == "diffusion" and r["canvas_length"] == canvas and r["max_steps"] == steps
    assert r["max_new_tokens"] == gen and r["prompt_tokens"] == 20
    blocks = -(-gen // canvas)
    assert len(r["steps_taken"]) <= blocks and all(1 <= s <= steps for s in r["steps_taken"])
    # random weights: eos (1, 106, 50) may end it early; otherwise every block is committed in full
    if r["stop_reason"] == "length":
        assert len(r["steps_taken"]) == blocks and r["committed_tokens"] == blocks * canvas
    assert r["tokens_per_forward"] == pytest.approx(r["committed_tokens"] / sum(r["steps_taken"]), abs=1e-3)
    assert r["step_ms"] > 0 and r["prompt_encode_s"] > 0 and r["committed_tok_s"] > 0
    assert r["sampler"] == {"t_min": 0.4, "t_max": 0.8, "entropy_bound": 0.1, "stability_threshold": 1,
                            "confidence_threshold": 0.005, "seed": 0}


@pytest.mark.gpu
def test_bench_script_on_a_diffusion_file(bench_file):
    """bench/bench.py as h100.sh runs it: resident, then with 3 of 8 experts per layer cached (5 MiB)."""
    base = [sys.executable, str(ROOT / "bench" / "bench.py"), "--models", str(bench_file), "--prompt-tokens", "20",
            "--gen-tokens", "32", "--steps", "2", "--repeat", "1", "--context", "256", "--chunk", "16"]
    r = json.loads(subprocess.run(base, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    check_record(r, 2, 32)
    assert r["file"] == bench_file.name and r["budget_mib"] is None and "expert_hit_rate" not in r
    r = json.loads(subprocess.run(base + ["--gpu-memory", "5"], capture_output=True, text=True, check=True,
                                  cwd=ROOT).stdout)
    check_record(r, 2, 32)
    assert r["budget_mib"] == 5 and r["expert_slots"] < 8
    assert 0 < r["expert_hit_rate"] < 1 and r["read_mib_per_step"] > 0


@pytest.mark.gpu
def test_bench_async_as_node_bench_drives_it(bench_file, dev):
    """The browser path's driver (drive_async: awaited readbacks and file reads) on the native device."""
    from pyapp.families.diffusion_gemma import DiffusionEngine
    from pyapp.engine import Engine

    async def run():
        eng = await Engine.open_async(read_gguf(bench_file), dev, context_length=256, chunk=16, gpu_memory_mib=5)
        assert isinstance(eng, DiffusionEngine)
        return await load_tool_from(ROOT / "bench" / "engine_bench.py").bench_async(
            eng, prompt_tokens=20, gen_tokens=16, repeat=1, steps=3)

    r = asyncio.run(run())
    check_record(r, 3, 16)
    assert r["expert_slots"] < 8


def test_side_by_side_tables_diffusion_records(tmp_path):
    sbs = load_tool_from(ROOT / "bench" / "side_by_side.py")
    rec = {"mode": "diffusion", "file": "bench-diffusion-Q4_K.gguf", "backend": "native", "prompt_tokens": 128,
           "max_new_tokens": 256, "canvas_length": 256, "max_steps": 48, "sampler": {"seed": 0}, "step_ms": 250.0,
           "steps_taken": [48], "committed_tok_s": 21.3, "tokens_per_forward": 5.333, "prompt_encode_s": 0.2,
           "budget_mib": None}
    browser = dict(rec, runtime="pyodide+dawn (node)", step_ms=200.0, committed_tok_s=26.6)
    streamed = dict(rec, budget_mib=8192, max_steps=3, steps_taken=[3], expert_hit_rate=0.41, read_mib_per_step=7000.0)
    a26b = {"file": "bench-a26b-Q4_K.gguf", "backend": "native", "decode_tok_s": 80.0, "prompt_tokens": 512}
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(x) for x in (rec, browser, streamed, a26b)) + "\n")
    table = sbs.diffusion_table(sbs.load_records([str(tmp_path)]), {"native": 69.7, "browser": 90.4})
    rows = [line for line in table.splitlines() if line.startswith("| bench-diffusion")]
    assert rows == [
        "| bench-diffusion-Q4_K.gguf | browser | none | 200.0 | 48 of 48 | 26.60 | 5.33 | 0.20 | 90.4 (given) "
        "| 0.29 | - | - |",
        "| bench-diffusion-Q4_K.gguf | native | none | 250.0 | 48 of 48 | 21.30 | 5.33 | 0.20 | 80.0 | 0.27 | - | - |",
        "| bench-diffusion-Q4_K.gguf | native | 8192 MiB | 250.0 | 3 of 3 | 21.30 | 5.33 | 0.20 | - | - | 0.410 "
        "| 7,000 |"]
    assert sbs.kind(rec) == "diffusion"     # not taken for an autoregressive record by the main table


def load_tool_from(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
