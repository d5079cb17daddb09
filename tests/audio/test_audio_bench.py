"""The audio benchmark's projector files (tools/make_audio_bench.py) and its reading of llama.cpp's logs
(bench/audio_bench.py): at tiny size the generator writes the tensors and keys llama.cpp's converter wrote
for the fixtures' audio encoder (tests/fixtures/forms/mmproj-dense.gguf), and the app, given the file as a
projector, loads it and turns a clip into the soft tokens Gemma 4's processor counts."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from pyapp.gguf import read_gguf
from support.paths import FIXTURES, ROOT

# bench/ and tools/ on the path only while the scripts import (they import their neighbours): left there,
# bench/profile.py would shadow the standard library's `profile` for every later test (torch imports cProfile)
_saved_path = list(sys.path)
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "bench")]
try:
    import audio_bench  # noqa: E402
    import make_audio_bench  # noqa: E402
finally:
    sys.path[:] = _saved_path

FORMS = FIXTURES / "forms"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("audio-bench") / "mmproj-audio-tiny.gguf"
    make_audio_bench.write(make_audio_bench.SHAPES["tiny"], str(path), log=lambda msg: None)
    return path


def audio_part(path):
    """The audio encoder's keys and (name, type, ggml shape) of its tensors."""
    g = read_gguf(path)
    keys = {k: v for k, v in g.metadata.items() if k.startswith("clip.audio.") or k == "clip.has_audio_encoder"}
    tensors = {n: (t.type, tuple(t.shape)) for n, t in g.tensors.items() if n.startswith(("a.", "mm.a."))}
    return keys, tensors


def test_tiny_is_what_the_converter_writes(tiny):
    assert audio_part(tiny) == audio_part(FORMS / "mmproj-dense.gguf")


def test_full_shapes_differ_only_in_the_text_width():
    e2b, e4b = make_audio_bench.SHAPES["e2b"], make_audio_bench.SHAPES["e4b"]
    assert (e2b["text_hidden"], e4b["text_hidden"]) == (1536, 2560)
    assert {k: v for k, v in e2b.items() if k != "text_hidden"} == {k: v for k, v in e4b.items() if k != "text_hidden"}


def test_the_bench_clips_soft_tokens():
    from pyapp.families.gemma4_audio import features
    assert [features.soft_tokens(s * 16_000) for s in (10, 30)] == [250, 750]     # 999 and 2999 frames


@pytest.mark.gpu
def test_the_app_encodes_a_clip_with_it(dev, tiny):
    from pyapp.app.audio import encode_clip
    from pyapp.app.session import ChosenModel, Session
    from pyapp.families.gemma4_audio import features
    from pyapp.steps import run
    model = read_gguf(FORMS / "llamacpp-dense-fused-qkv.gguf")           # a text model 256 wide, no audio
    session = Session(device=dev, model=ChosenModel(model, {}, None), engine=object(),
                      projector=read_gguf(tiny), projector_name=tiny.name)
    samples = audio_bench.synthetic_clip(1.5)
    clip = run(encode_clip(session, samples.tolist()))
    assert session.audio_encoder.cfg.text_hidden == 256
    assert clip.n == features.soft_tokens(len(samples)) == 38          # 149 frames, halved twice rounding up
    rows = np.frombuffer(dev.read(clip.rows, 0, 4 * clip.n * 256), np.float32)
    assert np.isfinite(rows).all() and np.abs(rows).max() > 0


def test_llama_logs_are_read(tmp_path):
    def log(name, encodes, decodes, prompt_eval):
        lines = []
        for e, d in zip(encodes, decodes):
            lines += ["encoding mtmd batch, n_chunks = 1 (done = 1, total = 3)", f"mtmd batch encoding done in {e} ms",
                      "decoding audio batch 1/1, n_tokens_batch = 250", f"audio decoded (batch 1/1) in {d} ms"]
        lines.append(f"llama_perf_context_print: prompt eval time =   {prompt_eval} ms /   262 tokens")
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        return tmp_path / name
    ones = [log(f"one-{i}.log", [e], [5], 100 + e) for i, e in enumerate((40, 30, 50))]
    many = log("many.log", [40, 10, 12, 14], [5, 4, 4, 4], 500)
    rec = audio_bench.llama_record(ones, many, 4, {"shape": "e2b"})
    assert rec["kind"] == "audio_llama" and rec["shape"] == "e2b" and rec["soft_tokens"] == 250
    assert (rec["first_encode_ms"], rec["ttft_first_ms"], rec["encode_ms"], rec["audio_decode_ms"]) == (40, 140, 12, 4)
    assert rec["ttft_ms"] == 140 - 40 - 5 + 12 + 4
    bad = audio_bench.llama_record(ones, many, 3, {})
    assert "many_error" in bad and "ttft_ms" not in bad
