"""The one base of every error pyapp raises on purpose, and what an error can say about a model file.

Every module keeps its own error class (GGUFError, EngineError, LoraError, ...: `except XError` names
what failed) and each derives from `Gemma4Error`, so a front door catches "an error we expect" as one
type: the CLI prints `error: <message>` (and the hint), the page shows the words of pyapp.explain.

An error carries
- message: what went wrong, as the raiser says it (`str(e)`, what the CLI prints after "error: ");
- hint: what to do next, when the message does not say it already ("" if none);
- detail: the technical text kept for a bug report (the message, unless a raise gives plain words as
  the message and keeps the technical text here);
- fault: what the error says about the model file it came from (a `Fault`), or None when it is no
  file's fault, with the facts its sentence names (facts: {"arch": ...}). The page turns a fault into
  a sentence naming the file (pyapp.explain).

Standard library only (runs in Pyodide).
"""

from __future__ import annotations

from enum import Enum


class Fault(Enum):
    """What is wrong with a model file, as the code that found it knows it (not as its message words it)."""
    CHANGED = "changed"          # it changed on disk or went away after it was opened
    INCOMPLETE = "incomplete"    # it ends before the data its header describes (a download cut short)
    DENIED = "denied"            # the browser withdrew or refused permission to read it
    NOT_GGUF = "not_gguf"        # it is not a GGUF file at all
    GGUF_KIND = "gguf_kind"      # a GGUF version or byte order this reader does not read
    DIFFUSION = "diffusion"      # a DiffusionGemma model asked for next-token logits
    OTHER_MODEL = "other_model"  # another architecture than Gemma 4 (facts: arch)
    NO_KERNEL = "no_kernel"      # a tensor type (quantization) no GPU kernel reads
    TOO_SMALL = "too_small"      # the GPU memory budget is below what the model needs (facts: need)
    DOES_NOT_FIT = "does_not_fit"   # the GPU cannot hold or bind it as set up
    OTHER_BASE = "other_base"    # a LoRA adapter made for another base model than the one it is applied to


class Gemma4Error(Exception):
    """Base of pyapp's errors: message (str(e)), hint, detail, fault (see the module's docstring)."""
    hint: str = ""
    fault: Fault | None = None

    def __init__(self, message: str = "", *, hint: str | None = None, detail: str | None = None,
                 fault: Fault | None = None, **facts):
        super().__init__(message)
        if hint is not None:
            self.hint = hint
        if fault is not None:
            self.fault = fault
        self._detail = detail
        self.facts = facts

    @property
    def message(self) -> str:
        return str(self)

    @property
    def detail(self) -> str:
        return self._detail if self._detail is not None else str(self)


# A browser error (Pyodide's JsException) is known by its DOMException name: the File API's and the
# File System Access API's. A file read that fails with one of these is that fault, whatever its message.
JS_FAULTS = {"NotReadableError": Fault.CHANGED, "NotFoundError": Fault.CHANGED,
             "NotAllowedError": Fault.DENIED, "SecurityError": Fault.DENIED}


def fault_of(exc: BaseException) -> Fault | None:
    """The fault an error states: its own `fault`, or a browser error's by its name; None if it states none."""
    fault = getattr(exc, "fault", None)
    if isinstance(fault, Fault):
        return fault
    if type(exc).__name__ == "JsException":       # pyodide.ffi's; not importable outside the browser
        return JS_FAULTS.get(str(getattr(exc, "name", "")))
    return None
