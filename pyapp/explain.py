"""Errors for people: what went wrong, with which file, and what to do about it.

The reader, the config and weight checks, the memory plan and the engine raise errors
that say precisely what they found ("tensor 'blk.3.<name>' ... extends past the
end of the file (at byte 1234)"). That is the right detail for a bug report and the
wrong first sentence for someone who downloaded a model. `explain` turns such an error
into {"error": plain words naming the file and the next step, "detail": the original
message, "file": the file's name}; the page shows the words and keeps the detail in a
disclosure. An error it does not recognise keeps its own message, with no detail.

Runs unchanged in Pyodide and CPython (no browser imports): tests/test_explain.py.
"""

from __future__ import annotations

import re

# (what the technical message says, what people are told; {file} is the quoted name), first match wins
_RULES: list[tuple[str, str]] = [
    (r"NotReadableError|NotFoundError|changed? on disk",
     "{file} changed on disk or was removed since it was opened: open it again."),
    (r"truncated|past the end|runs past|outside .* bytes\)|incomplete download|short read|"
     r"cannot fit in a \d+-byte file",
     "{file} is incomplete: it ends before the data its header describes. The download or copy was "
     "probably cut short: {again}."),
    (r"NotAllowedError|SecurityError",
     "Permission to read {file} was denied or withdrawn: open it again and allow reading."),
    (r"not a GGUF file",
     "{file} is not a GGUF model file. Choose a .gguf file (a Gemma 4 model), or open your Ollama "
     "models folder."),
    (r"unsupported GGUF version|big-endian",
     "{file} is a kind of GGUF this app cannot read. Download the model again (current downloads work), "
     "or convert it with a recent llama.cpp."),
    (r"DiffusionGemma .*no next-token logits",
     "{file} is a DiffusionGemma model (text diffusion): it writes by denoising, not token by token, so it "
     "has no next-token logits. Chat with it, or use diffusion-logits for one denoising step."),
    (r"architecture is '(?P<arch>[^']*)', not 'gemma4'",
     "{file} is a {arch} model, not Gemma 4: this app runs Gemma 4 models only."),
    (r"has no GPU kernel",
     "{file} uses a quantization this app cannot run yet. Choose another quantization of the model "
     "(Q4_K_M, Q6_K, Q8_0, F16 and BF16 work)."),
    (r"needs at least (?P<need>[\d.,]+ \w+) of GPU memory",
     "{file} needs at least {need} of GPU memory with these settings: raise GPU memory (MiB) if your "
     "GPU has that much, or lower the context length."),
    (r"out of GPU memory|binding limit|this GPU binds at most",
     "{file} does not fit this GPU as set up: lower the context length, or lower GPU memory (MiB) so "
     "more stays in the file; a smaller quantization helps too. Close other tabs that use the GPU."),
]
# When no rule matched: errors that can only mean the file's contents are not what they should be.
_DAMAGED = {
    "TokenizerError": "{file} has no Gemma 4 tokenizer this app can read: it may be damaged or made by an "
                      "old converter. Download it again.",
    "GGUFError": "{file} is damaged: its header does not make sense. Download it again.",
    "ConfigError": "{file} is damaged or not a Gemma 4 model this app understands: its settings are not "
                   "what Gemma 4 has. Download it again, or use a GGUF made by a recent llama.cpp or Ollama.",
    "WeightsError": "{file} is damaged or not a Gemma 4 model this app understands: its weights are not "
                    "what Gemma 4 has. Download it again, or use a GGUF made by a recent llama.cpp or Ollama.",
}
# Errors that can come from a file; any other (a bad setting, a cancelled load) is no fault of it.
_FILE_ERRORS = {"GGUFError", "ConfigError", "WeightsError", "TokenizerError", "SourceError", "OllamaError",
                "ModelError", "PlanError", "EngineError", "GPUError", "OSError", "JsException"}


def _chain(exc: BaseException):
    """The error and the ones it was raised from (EngineError wraps the checks' errors)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def explain(exc: BaseException, file: str | None = None, ollama_name: str | None = None) -> dict:
    """{"error": words for people, "detail": the technical message, "file": file} for an error about
    a model file (ollama_name: the file is that Ollama model's); {"error": the message} when it is no
    file's fault or not one we recognise."""
    detail = str(exc) or type(exc).__name__
    kinds = [c.__name__ for e in _chain(exc) for c in type(e).__mro__]
    if not file or not _FILE_ERRORS.intersection(kinds):
        return {"error": detail}
    quoted = f"\u201c{file}\u201d"
    again = f"download it again (ollama pull {ollama_name})" if ollama_name else "download it again"
    for pattern, words in _RULES:
        found = re.search(pattern, detail, re.IGNORECASE)
        if found:
            return {"error": words.format(file=quoted, again=again, **found.groupdict()), "detail": detail,
                    "file": file}
    damaged = next((_DAMAGED[k] for k in kinds if k in _DAMAGED), None)
    if damaged:
        return {"error": damaged.format(file=quoted), "detail": detail, "file": file}
    return {"error": detail}
