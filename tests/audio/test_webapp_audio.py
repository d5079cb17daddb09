"""The worker's audio commands (pyapp.webapp: add_audio, clip_tokens, and whether a model hears audio), run natively:
pyapp.webapp imports Pyodide's `js` and `pyodide.ffi`, stood in for here by empty modules (these commands use
neither), and its async bridge runs the same steps synchronously on the native GPU.

On the E2B-like fixture (its audio encoder inline in Ollama's blob): a clip given as float32 bytes, as the page
hands a Float32Array, gets the key and soft tokens the app layer gives the same samples, and a message naming it
by that key is answered as the app layer answers it; a clip given twice is encoded once; a clip too short, bytes
that are no float32 samples, NaN and a clip before a model is loaded are refused in words; llama.cpp's text GGUF
(no audio encoder) says it takes none, and its mmproj gives it one."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import types
from array import array

import pytest

from pyapp.gguf import read_gguf
from support.paths import FIXTURES

FORMS = FIXTURES / "forms"
DENSE = FORMS / "ollama-dense.gguf"
TEXT_ONLY = FORMS / "llamacpp-dense-fused-qkv.gguf"
MMPROJ = FORMS / "mmproj-dense.gguf"


@pytest.fixture(scope="module")
def webapp():
    """pyapp.webapp with stand-ins for Pyodide's modules, its session fresh; the real modules come back after."""
    saved = {name: sys.modules.get(name) for name in ("js", "pyodide", "pyodide.ffi", "pyapp.webapp")}
    sys.modules["js"] = types.ModuleType("js")
    ffi = types.ModuleType("pyodide.ffi")
    ffi.to_js = lambda value, **_: value
    sys.modules["pyodide"] = types.ModuleType("pyodide")
    sys.modules["pyodide.ffi"] = ffi
    sys.modules.pop("pyapp.webapp", None)
    import pyapp.webapp as w
    from pyapp.steps import run

    async def run_async(steps):            # the page's bridge awaits the browser's twins; natively: the same steps
        return run(steps)
    w.run_async = run_async
    yield w
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


def choose(w, path, load: bool = True) -> None:
    from pyapp.app import model
    from pyapp.steps import run
    w.SESSION.unload()
    w.SESSION.projector = w.SESSION.projector_name = None
    w.SESSION.forget_encoders()
    g = read_gguf(path)
    model.choose(w.SESSION, g, model.describe(g, path.name))
    if load:
        run(model.load(w.SESSION, context_length=1024))


def tone(seconds: float, hz: float = 440.0) -> array:
    return array("f", [0.3 * math.sin(2 * math.pi * hz * i / 16_000) for i in range(int(16_000 * seconds))])


def test_a_model_with_an_encoder_hears_audio_and_one_without_says_so(webapp):
    choose(webapp, DENSE, load=False)
    info = webapp._audio()
    assert info == {"takes": True, "why": "", "max_seconds": 30, "sample_rate": 16_000}
    choose(webapp, TEXT_ONLY, load=False)
    info = webapp._audio()
    assert not info["takes"] and info["why"] == "this model has no audio encoder"
    webapp.SESSION.projector, webapp.SESSION.projector_name = read_gguf(MMPROJ), MMPROJ.name
    assert webapp._audio()["takes"]


def test_clip_tokens(webapp):
    assert webapp.clip_tokens(16_000) == {"tokens": 25}                  # one soft token per 40 ms
    assert webapp.clip_tokens(10 * 16_000 * 30) == {"tokens": 750}       # heard up to 30 s
    short = webapp.clip_tokens(40)
    assert short["audio_error"] and "is too short to hear" in short["error"]


@pytest.mark.gpu
def test_add_audio_encodes_a_clip_as_the_app_layer_does_and_a_reply_hears_it(webapp):
    pytest.importorskip("wgpu")
    from pyapp.app import audio
    from pyapp.app.reply import reply
    from pyapp.steps import run
    choose(webapp, DENSE)
    samples = tone(1.3)
    got = asyncio.run(webapp.add_audio(samples.tobytes()))
    assert set(got) == {"key", "tokens"} and got["tokens"] == 33
    assert asyncio.run(webapp.add_audio(samples.tobytes())) == got         # the same samples: encoded once
    assert len(webapp.SESSION.encoded_clips) == 1
    message = [{"role": "user", "content": [{"type": "audio", "key": got["key"]}, {"type": "text", "text": "Hi"}]}]
    settings = {"temperature": 0, "max_tokens": 6}
    page = run(reply(webapp.SESSION, message, settings))
    # the app layer on its own session: the same key and soft tokens, the same greedy reply
    from pyapp.app import model
    from pyapp.app.session import Session
    s = Session()
    g = read_gguf(DENSE)
    model.choose(s, g, model.describe(g, DENSE.name))
    run(model.load(s, context_length=1024))
    clip = run(audio.encode_clip(s, samples))
    assert (clip.key, clip.n) == (got["key"], got["tokens"])
    native = run(reply(s, message, settings))
    assert page["ids"] == native["ids"] and page["prompt_tokens"] == native["prompt_tokens"] > 33
    # a key the worker no longer holds (after a reload): the reply names it
    webapp.SESSION.forget_encoders()
    chat = asyncio.run(webapp.chat(json.dumps(message), '{"temperature": 0, "max_tokens": 6}'))
    assert chat["missing_clips"] == [got["key"]] and "must be added again" in chat["error"]


@pytest.mark.gpu
def test_bad_clips_are_refused_in_words(webapp):
    pytest.importorskip("wgpu")
    choose(webapp, DENSE, load=False)
    assert "Load the model first" in asyncio.run(webapp.add_audio(tone(1).tobytes()))["error"]
    choose(webapp, DENSE)
    for data, words in ((tone(0.005).tobytes(), "is too short to hear"),
                        (b"\0" * 4001, "are not a whole number of them"),
                        (array("f", [0.0, float("nan")] * 800).tobytes(), "not numbers (NaN or infinite)")):
        r = asyncio.run(webapp.add_audio(data))
        assert r["audio_error"] and words in r["error"] and r["error"][0].isupper(), r
    choose(webapp, TEXT_ONLY)
    r = asyncio.run(webapp.add_audio(tone(1).tobytes()))
    assert r["audio_error"] and r["error"] == "This model has no audio encoder."


@pytest.fixture(scope="module")
def audio_only_projectors(tmp_path_factory):
    """Projectors of the audio encoder alone (tools/make_audio_bench.py tiny: the tensors and keys llama.cpp's
    converter writes for the fixtures' audio encoder): for the text-only fixture's width (256), and for 320."""
    from support.paths import load_tool
    saved = list(sys.path)
    try:
        make_audio_bench = load_tool("make_audio_bench")
    finally:
        sys.path[:] = saved                 # the script puts tools/ on the path for its neighbour
    folder = tmp_path_factory.mktemp("projector")
    paths = {}
    for width in (256, 320):
        paths[width] = folder / f"mmproj-audio-{width}.gguf"
        make_audio_bench.write(dict(make_audio_bench.SHAPES["tiny"], text_hidden=width), str(paths[width]),
                               log=lambda msg: None)
    return paths


def test_a_projector_of_the_audio_encoder_alone_gives_the_model_its_ears(webapp, monkeypatch, audio_only_projectors):
    """add_projector (the page's projector box) takes a projector that holds only an audio encoder: the model then
    hears audio and says in words why it still takes no images; one made for another width is refused in words."""
    pytest.importorskip("gguf")
    monkeypatch.setattr(webapp, "BlobSource", lambda blob, name: blob)      # natively: the path, not a JS Blob
    choose(webapp, TEXT_ONLY, load=False)
    assert not webapp._audio()["takes"]
    refused = webapp.add_projector(audio_only_projectors[320], "mmproj-audio-320.gguf")
    assert refused.get("projector_error") and "another model" in refused["error"], refused
    assert webapp.SESSION.projector is None and not webapp._audio()["takes"]
    out = webapp.add_projector(audio_only_projectors[256], "mmproj-audio-256.gguf")
    assert "error" not in out, out
    assert out["audio"]["takes"] and not out["images"]["takes"]
    assert "no image encoder" in out["images"]["why"], out["images"]
