"""pyapp.explain: errors about a model file in plain words (file named, what to do), the technical
message kept as detail; errors that are no file's fault keep their own message."""

from pathlib import Path

import numpy as np
import pytest

from pyapp.engine import Engine, EngineError
from pyapp.explain import explain
from pyapp.gguf import read_gguf
from pyapp.model.config import Gemma4Config
from pyapp.sampling import ParamError, SamplingParams
from pyapp.source import BytesSource

from support.paths import FIXTURES

DEMO = FIXTURES / "demo.gguf"


def _error_of(f, *args):
    with pytest.raises(Exception) as info:
        f(*args)
    return info.value


def test_an_incomplete_file_says_download_it_again():
    e = _error_of(read_gguf, BytesSource(DEMO.read_bytes()[:5000]))
    got = explain(e, "broken.gguf")
    assert got["error"].startswith("\u201cbroken.gguf\u201d is incomplete") and "download it again" in got["error"]
    assert got["detail"] == str(e) and ("truncated" in got["detail"] or "past the end" in got["detail"])
    assert got["file"] == "broken.gguf"
    assert "ollama pull gemma4:e2b" in explain(e, "gemma4:e2b", ollama_name="gemma4:e2b")["error"]


def test_not_a_gguf_and_not_gemma4():
    got = explain(_error_of(read_gguf, BytesSource(b"hello " * 20)), "notes.gguf")
    assert got["error"].startswith("\u201cnotes.gguf\u201d is not a GGUF model file.") and "not a GGUF" in got["detail"]
    gguf = pytest.importorskip("gguf")
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "llama.gguf"
        w = gguf.GGUFWriter(str(path), arch="llama")
        w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
        w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
        e = _error_of(Gemma4Config.from_gguf, read_gguf(path))
    got = explain(e, "llama.gguf")
    assert got["error"] == "\u201cllama.gguf\u201d is a llama model, not Gemma 4: this app runs Gemma 4 models only."
    assert "architecture is 'llama'" in got["detail"]


def test_errors_wrapped_by_the_engine_are_explained_by_their_cause():
    g = read_gguf(DEMO)
    e = _error_of(Engine.plan, g, {}, 4096, 1)              # a GPU memory budget of 1 MiB: far too small
    assert isinstance(e, EngineError)
    got = explain(e, "demo.gguf")
    assert got["error"].startswith("\u201cdemo.gguf\u201d needs at least ") and "raise GPU memory" in got["error"]
    damaged = g.tensors.pop("output_norm.weight")
    try:
        got = explain(_error_of(Engine.plan, g, {}), "demo.gguf")
    finally:
        g.tensors["output_norm.weight"] = damaged
    assert got["error"].startswith("\u201cdemo.gguf\u201d is damaged") and "output_norm" in got["detail"]


@pytest.mark.parametrize("error", [EngineError("loading cancelled"), ValueError("x")])
def test_what_is_no_file_s_fault_keeps_its_message(error):
    assert explain(error, "demo.gguf") == {"error": str(error)}
    e = _error_of(SamplingParams, 5.0, 2.5)                 # top_k 2.5
    assert isinstance(e, ParamError) and explain(e, "demo.gguf") == {"error": str(e)}
    assert explain(EngineError("truncated"), None) == {"error": "truncated"}     # no file: nothing to name


def test_a_file_changed_on_disk_says_open_it_again(tmp_path):
    from pyapp.errors import Fault
    from pyapp.source import FileSource, SourceError
    e = SourceError("short read at byte 9 of demo.gguf: the file changed on disk?", fault=Fault.CHANGED)
    assert explain(e, "demo.gguf")["error"] == ("\u201cdemo.gguf\u201d changed on disk or was removed since it "
                                                "was opened: open it again.")
    path = tmp_path / "shrinks.gguf"                        # the reader's own error, not its words, says so
    path.write_bytes(b"GGUF" * 100)
    with FileSource(path) as src:
        path.write_bytes(b"GGUF")
        e = _error_of(src.read, 100, 10)
    assert explain(e, "shrinks.gguf")["error"].startswith("\u201cshrinks.gguf\u201d changed on disk")


def test_the_words_follow_the_type_not_the_message():
    """A message that happens to say "truncated" is no fault of the file; a fault stated by the raiser is one,
    whatever its words; a browser error is known by its name (Pyodide's JsException)."""
    from pyapp.errors import Fault, Gemma4Error
    from pyapp.gguf import GGUFError
    from pyapp.source import SourceError
    assert explain(SourceError("the file ends too soon", fault=Fault.INCOMPLETE), "a.gguf")["error"].startswith(
        "\u201ca.gguf\u201d is incomplete")
    assert explain(SourceError("truncated, past the end, not a GGUF file"), "a.gguf") == {
        "error": "truncated, past the end, not a GGUF file"}
    assert explain(GGUFError("odd header"), "a.gguf")["error"].startswith("\u201ca.gguf\u201d is damaged")
    assert isinstance(GGUFError("x"), Gemma4Error) and isinstance(GGUFError("x"), ValueError)

    class JsException(Exception):          # the name Pyodide gives a JavaScript error
        name = "NotAllowedError"
    try:
        try:
            raise JsException("read refused")
        except JsException as js:
            raise Gemma4Error("reading the model file failed at byte 0") from js
    except Gemma4Error as e:
        wrapped = e
    assert explain(wrapped, "a.gguf")["error"].startswith("Permission to read \u201ca.gguf\u201d was denied")


def test_the_engine_states_what_does_not_fit():
    """The engine's checks state their fault (pyapp.errors.Fault); explain reads it, not their words."""
    from pyapp.errors import Fault
    g = read_gguf(DEMO)
    e = _error_of(Engine.plan, g, {"max_storage_buffer_binding_size": 4096, "max_buffer_size": 1 << 30}, 4096)
    assert isinstance(e, EngineError) and e.fault is Fault.DOES_NOT_FIT
    assert explain(e, "demo.gguf")["error"].startswith("\u201cdemo.gguf\u201d does not fit this GPU as set up")
    e = _error_of(Engine.plan, g, {}, 4096, 1)
    assert e.__cause__.fault is Fault.TOO_SMALL and e.__cause__.facts["need"] in str(e)
