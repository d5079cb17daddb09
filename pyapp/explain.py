"""Errors for people: what went wrong, with which file, and what to do about it.

The reader, the config and weight checks, the memory plan and the engine raise errors
that say precisely what they found ("tensor 'blk.3.<name>' ... extends past the
end of the file (at byte 1234)"). That is the right detail for a bug report and the
wrong first sentence for someone who downloaded a model. `explain` turns such an error
into {"error": plain words naming the file and the next step, "detail": the original
message, "file": the file's name}; the page shows the words and keeps the detail in a
disclosure. An error that says nothing about the file keeps its own message, with no detail.

What an error says about the file is read from its type and fields, never from its words:
the fault its raiser states (pyapp.errors.Fault, on it or on an error it wraps), else the
damaged-file types below.

Runs unchanged in Pyodide and CPython (no browser imports): tests/cli/test_explain.py.
"""

from __future__ import annotations

from .errors import Fault, fault_of
from .gguf import GGUFError
from .model.config import ConfigError, UnsupportedModelError
from .model.weights import WeightsError
from .tokenizer import TokenizerError

# what people are told of each fault; {file} is the quoted name, the rest the error's facts
_WORDS = {
    Fault.CHANGED: "{file} changed on disk or was removed since it was opened: open it again.",
    Fault.INCOMPLETE: "{file} is incomplete: it ends before the data its header describes. The download or copy "
                      "was probably cut short: {again}.",
    Fault.DENIED: "Permission to read {file} was denied or withdrawn: open it again and allow reading.",
    Fault.NOT_GGUF: "{file} is not a GGUF model file. Choose a .gguf file (a Gemma 4 model), or open your Ollama "
                    "models folder.",
    Fault.GGUF_KIND: "{file} is a kind of GGUF this app cannot read. Download the model again (current downloads "
                     "work), or convert it with a recent llama.cpp.",
    Fault.DIFFUSION: "{file} is a DiffusionGemma model (text diffusion): it writes by denoising, not token by token, "
                     "so it has no next-token logits. Chat with it, or use diffusion-logits for one denoising step.",
    Fault.OTHER_MODEL: "{file} is a {arch} model, not Gemma 4: this app runs Gemma 4 models only.",
    Fault.NO_KERNEL: "{file} uses a quantization this app cannot run yet. Choose another quantization of the model "
                     "(Q4_K_M, Q6_K, Q8_0, F16 and BF16 work).",
    Fault.TOO_SMALL: "{file} needs at least {need} of GPU memory with these settings: raise GPU memory (MiB) if "
                     "your GPU has that much, or lower the context length.",
    Fault.DOES_NOT_FIT: "{file} does not fit this GPU as set up: lower the context length, or lower GPU memory (MiB) "
                        "so more stays in the file; a smaller quantization helps too. Close other tabs that use the "
                        "GPU.",
}
# types that are one fault whatever raised them
_FAULT_OF_TYPE = {UnsupportedModelError: Fault.DIFFUSION}
# When no fault is stated: errors that can only mean the file's contents are not what they should be.
_DAMAGED = {
    TokenizerError: "{file} has no Gemma 4 tokenizer this app can read: it may be damaged or made by an old "
                    "converter. Download it again.",
    GGUFError: "{file} is damaged: its header does not make sense. Download it again.",
    ConfigError: "{file} is damaged or not a Gemma 4 model this app understands: its settings are not what Gemma 4 "
                 "has. Download it again, or use a GGUF made by a recent llama.cpp or Ollama.",
    WeightsError: "{file} is damaged or not a Gemma 4 model this app understands: its weights are not what Gemma 4 "
                  "has. Download it again, or use a GGUF made by a recent llama.cpp or Ollama.",
}


def _chain(exc: BaseException):
    """The error and the ones it was raised from (EngineError wraps the checks' errors)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _fault(chain: list) -> tuple[Fault, dict] | None:
    """The fault the errors state, with its facts: the outermost stated one, then one a type means."""
    for e in chain:
        if (fault := fault_of(e)) in _WORDS:       # a fault about a model file (an adapter's is not: explain_adapter)
            return fault, getattr(e, "facts", {})
    for e in chain:
        for kind, fault in _FAULT_OF_TYPE.items():
            if isinstance(e, kind):
                return fault, {}
    return None


def explain(exc: BaseException, file: str | None = None, ollama_name: str | None = None) -> dict:
    """{"error": words for people, "detail": the technical message, "file": file} for an error about
    a model file (ollama_name: the file is that Ollama model's); {"error": the message} when it is no
    file's fault or not one we recognise."""
    detail = str(exc) or type(exc).__name__
    own = f"{detail} {exc.hint}" if getattr(exc, "hint", "") else detail      # its words, and what to do if apart
    if not file:
        return {"error": own}
    quoted = f"\u201c{file}\u201d"
    again = f"download it again (ollama pull {ollama_name})" if ollama_name else "download it again"
    chain = list(_chain(exc))
    if (stated := _fault(chain)) is not None:
        fault, facts = stated
        return {"error": _WORDS[fault].format(file=quoted, again=again, **facts), "detail": detail, "file": file}
    damaged = next((words for e in chain for kind, words in _DAMAGED.items() if isinstance(e, kind)), None)
    if damaged:
        return {"error": damaged.format(file=quoted), "detail": detail, "file": file}
    return {"error": own}


def explain_adapter(exc: BaseException, name: str, model: str) -> str:
    """Why the adapter file `name` cannot be applied to `model`, in words (the LoraError's message kept)."""
    if fault_of(exc) is Fault.OTHER_BASE:
        return (f"\u201c{name}\u201d cannot be applied to {model}: it was made for a different base model. "
                "Choose the adapter trained on this model.")
    return f"\u201c{name}\u201d cannot be applied to {model}: {exc}"
