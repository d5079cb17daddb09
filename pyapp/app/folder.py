"""An Ollama models folder opened in the page: its models listed (the Gemma 4 and DiffusionGemma ones usable,
the others with why not, in words), and one of them chosen.

The folder is any pyapp.ollama.AsyncDirectory (the page's: a picked folder or OPFS, pyapp.webapp.JsDirectory).
"""

from __future__ import annotations

from .. import ollama
from ..errors import Fault
from ..gguf import read_gguf
from ..model.config import DIFFUSION_ARCH
from ..ollama import Problem
from .model import choose, describe
from .session import Refused, Session
from .settings import sampling_defaults

# a model the folder lists but the app cannot open: what people are told ({pull}: how to get it again)
_WORDS = {
    Problem.MANIFEST: "Its manifest (Ollama's list of the model's files) is damaged or unreadable: {pull}.",
    Problem.MISSING: "Its model file is missing from the folder: {pull}.",
    Problem.INCOMPLETE: "Its model file is incomplete (an interrupted download?): {pull}.",
    Problem.SAFETENSORS: "It is stored as safetensors layers, not one GGUF file: this app reads GGUF models.",
    Problem.NO_MODEL: "Its manifest lists no model file: it may be an embedding or adapter-only entry.",
    Problem.UNREADABLE: "Its model file cannot be read as a GGUF model: {pull}.",
}


def usable(m) -> bool:
    return m.usable and (ollama.is_gemma4(m) or m.architecture == DIFFUSION_ARCH)


def why_not(m) -> tuple[str, str]:
    """Why a model of the folder cannot be chosen, in words, and the reader's exact message (the detail)."""
    if not m.error:
        arch = m.architecture or "unknown"
        return (f"It is not a Gemma 4 model (its architecture is {arch}): this app runs Gemma 4 and "
                "DiffusionGemma.", "")
    pull = f"re-pull it with \u201collama pull {m.name}\u201d"
    return _WORDS.get(m.problem, "It cannot be opened: {pull}.").format(pull=pull), m.error


async def open_folder(session: Session, folder) -> list[dict]:
    """List the folder's models (their GGUF headers read), remembered for choose_model."""
    session.folder = folder
    models = await ollama.list_models_async(folder, header=True)
    session.folder_models = {m.name: m for m in models}
    rows = []
    for m in models:
        ok = usable(m)
        words, detail = why_not(m) if not ok else ("", "")
        rows.append({"name": m.name, "size": m.size, "quantization": m.file_type, "parameters": m.parameter_size,
                     "architecture": m.architecture, "usable": ok, "why": words, "detail": detail,
                     "parts": list(m.parts), "digest": m.model.digest if m.model else ""})
    return rows


async def choose_model(session: Session, name: str, blob_source) -> dict:
    """Choose a model of the opened folder: its blob checked against the manifest and its header read.
    blob_source(path, name): awaitable, the front door's byte source for a blob of the folder. Returns
    {"model": what the page shows, "params": its Ollama defaults as settings, "system": its system prompt}."""
    m = session.folder_models.get(name)
    if m is None or session.folder is None:
        raise Refused(f"{name} is not in the opened folder")
    src = await blob_source(m.model.path, name)
    if src.size != m.model.size:
        raise ollama.OllamaError(f"{name}: the model blob is {src.size} bytes, the manifest says "
                                 f"{m.model.size}: incomplete download?", fault=Fault.INCOMPLETE)
    g = read_gguf(src)
    info = describe(g, name)
    # the model's Ollama defaults, checked like the page's own settings
    params = {**sampling_defaults(m.params), "num_ctx": int(m.params.get("num_ctx") or 0) if m.params else 0,
              **(info["denoise"] or {})}
    info["digest"] = m.model.digest     # the model blob's: names the base model an adapter belongs to
    info["name"] = m.name               # as Ollama names it (name:tag), not the file's internal name
    info["parts"] = list(m.parts or info["parts"])      # with a projector layer's encoders
    projector = None
    if m.projector is not None:         # the image encoder the tag ships apart (a newer tag's projector layer)
        psrc = await blob_source(m.projector.path, f"{name} (projector)")
        if psrc.size != m.projector.size:
            raise ollama.OllamaError(f"{name}: the projector blob is {psrc.size} bytes, the manifest says "
                                     f"{m.projector.size}: incomplete download?", fault=Fault.INCOMPLETE)
        projector = read_gguf(psrc)
    choose(session, g, info)
    session.ollama_projector = projector
    # the manifest's system prompt: the page applies it to a conversation that has none (as Ollama does)
    return {"model": info, "params": params, "system": m.system or ""}
