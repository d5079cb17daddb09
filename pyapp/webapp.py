"""The app's Python side, running in Pyodide inside web/worker.js (a dedicated Web Worker).

worker.js calls these coroutines with plain values or JS handles and posts their
results to the page; streaming events (load progress, tokens) go out through
`emit`. Every command returns a dict; expected failures come back as
{"error": message} so the page can show them and carry on.

Model bytes never pass through here wholesale: the GGUF header and per-token
PLE rows are read from the File with FileReaderSync (`BlobSource`), and weights
go File -> GPU inside JS (pyapp.gpu.browser).
"""

from __future__ import annotations

import dataclasses
import json
import time
from array import array

import js  # type: ignore[import-not-found]
from pyodide.ffi import to_js  # type: ignore[import-not-found]

from . import ollama
from .chat import render_ids, reply_ids, split_thinking, style_for
from .engine import DEFAULT_CONTEXT, Engine, EngineError, SamplingParams
from .explain import explain
from .families import model_config
from .families.diffusion_gemma import DenoiseParams, DiffusionEngine, ReplayDraws
from .gguf import GGUFError, read_gguf, summarize
from .gpu import GPUError, get_device_async
from .model.config import DIFFUSION_ARCH, DIFFUSION_NOT_AUTOREGRESSIVE, ConfigError, Gemma4Config
from .model.forms import file_form
from .model.lora import LoraError, bind_lora
from .model.weights import bind
from .sampling import DENOISE_SETTINGS, check_temperature_range, denoise_settings, page_rules
from .source import SourceError
from .tokenizer import TokenizerError

EXPECTED = (GGUFError, ConfigError, EngineError, GPUError, SourceError, TokenizerError, ollama.OllamaError,
            OSError, ValueError)


def emit(event: str, **data) -> None:
    """Post an event to the page (progress, tokens, status)."""
    js.postMessage(to_js({"event": event, **data}, dict_converter=js.Object.fromEntries))


class BlobSource:
    """A File/Blob as a synchronous ByteSource (FileReaderSync: workers only).

    `.blob` lets BrowserDevice.upload_async copy ranges File -> GPU inside JS."""

    def __init__(self, blob, name: str = ""):
        self.blob = blob
        self.size = int(blob.size)
        self.name = name or getattr(blob, "name", "") or "model.gguf"
        self._reader = js.FileReaderSync.new()

    def read(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise SourceError(f"read of {n} bytes at {offset} is outside {self.name} ({self.size} bytes)")
        try:
            buf = self._reader.readAsArrayBuffer(self.blob.slice(offset, offset + n))
        except Exception as e:   # NotReadableError: the file changed or was removed on disk
            raise SourceError(f"cannot read {self.name} any more ({e}); did the file change on disk? "
                              "Open it again.") from e
        data = buf.to_bytes()
        if len(data) != n:
            raise SourceError(f"short read at byte {offset} of {self.name}: the file changed on disk?")
        return data


class AsyncBlobSource:
    """A File as pyapp.ollama's AsyncSource (small reads: manifests, params, headers)."""

    def __init__(self, blob):
        self.blob, self.size = blob, int(blob.size)

    async def read(self, offset: int, n: int) -> bytes:
        buf = await self.blob.slice(offset, offset + n).arrayBuffer()
        return buf.to_bytes()


class JsDirectory:
    """A FileSystemDirectoryHandle (picked folder or OPFS) as pyapp.ollama's AsyncDirectory."""

    def __init__(self, handle):
        self.handle = handle

    async def list(self, path: str) -> list[tuple[str, bool]]:
        try:
            entries = await js.fsList(self.handle, path)
        except Exception as e:
            raise FileNotFoundError(f"{path}: {e}") from e
        return sorted((str(e[0]), bool(e[1])) for e in entries.to_py())

    async def open(self, path: str):
        try:
            return AsyncBlobSource(await js.fsFile(self.handle, path))
        except Exception as e:
            raise FileNotFoundError(f"{path}: {e}") from e

    async def file(self, path: str):
        """The JS File itself (model blobs: read by range, uploaded from JS)."""
        try:
            return await js.fsFile(self.handle, path)
        except Exception as e:
            raise FileNotFoundError(f"{path}: {e}") from e

    async def exists(self, path: str) -> bool:
        return bool(await js.fsExists(self.handle, path))


class State:
    device = None
    gguf = None
    model_info: dict = {}
    params: dict = {}           # Ollama params layer of the chosen model
    engine: Engine | None = None
    folder: JsDirectory | None = None
    models: dict = {}
    stop = False
    cancelled_load = 0          # id of the load the user cancelled (ids: the page numbers its loads)
    adapter = None              # the chosen LoRA adapter's parsed GGUF (applied from the next load on)
    adapter_on = True
    adapter_scale = 1.0
    training = None             # the Fine-tune panel's pyapp.train.session.TrainingSession, once used
    prefill_rate: dict = {}     # id(engine) -> prompt tokens/s of its last reply (the next reply's estimate)


S = State()


def _device_lost() -> str | None:
    """Why the GPU device was lost, or None."""
    return S.device.lost_reason if S.device is not None else None


def _failed_reply(e: Exception) -> dict:
    """A reply that raised: a lost device unloads the model; expected errors become the page's message;
    anything else is a bug and propagates."""
    if _device_lost():
        _unload()
        return _fail(e)
    if isinstance(e, EXPECTED):
        return _fail(e)
    raise e


def _gpu_rejected(what: str) -> GPUError | None:
    """The error to report if the GPU rejected a command since the last clear_error(), else None: a
    rejected buffer or dispatch leaves its output unwritten, so what was computed (the weights, a
    reply's tokens) would be wrong without a word."""
    err = S.device.last_error
    return GPUError(f"the GPU rejected {what}: {err}") if err else None


def _fail(e: BaseException, file: str | None = None, ollama_name: str | None = None) -> dict:
    """A user-facing error: about `file` (the model's, by default), in plain words with what to do
    next and the technical message as detail (pyapp.explain)."""
    lost = _device_lost()
    if lost:
        return {"error": f"The GPU device was lost ({lost}). Reload the model to go on; your conversation is kept.",
                "device_lost": True}
    return explain(e, file or S.model_info.get("file"), ollama_name)


# -- commands -----------------------------------------------------------------

def _sampling_settings(ollama_params: dict | None = None) -> dict:
    """The page's sampling settings from SamplingParams, the one definition (the page has none):
    its defaults, or those of a model's Ollama params layer."""
    return dataclasses.asdict(SamplingParams.from_ollama(ollama_params))


def _sampling_params(p: dict) -> SamplingParams:
    """The page's settings as SamplingParams: checked there (ParamError names the bad one)."""
    return SamplingParams(**{k: v for k, v in p.items() if k in SamplingParams.__dataclass_fields__})


# WebGPU does not tell a page how much memory the GPU has: the budget is a setting. Its default
# suits an 8 GB GPU (a CPU adapter such as SwiftShader borrows system memory: less).
DEFAULT_GPU_MEMORY_MIB = 6144
CPU_ADAPTER_GPU_MEMORY_MIB = 2048


SOFTWARE_ADAPTERS = {"swiftshader": "SwiftShader", "llvmpipe": "llvmpipe", "lavapipe": "lavapipe",
                     "warp": "Microsoft WARP", "basic render": "Microsoft Basic Render Driver"}


def software_adapter(info: dict) -> str | None:
    """The name of a software (CPU) adapter, or None for a GPU: the browser's fallback adapter, or one whose
    name says it renders on the CPU (SwiftShader, llvmpipe, ...)."""
    described = " ".join(str(info.get(k, "")) for k in ("vendor", "architecture", "description", "device")).lower()
    for key, name in SOFTWARE_ADAPTERS.items():
        if key in described:
            return name
    return "the browser's fallback adapter" if info.get("fallback") else None


def default_gpu_memory(info: dict) -> int:
    return CPU_ADAPTER_GPU_MEMORY_MIB if software_adapter(info) else DEFAULT_GPU_MEMORY_MIB


async def boot() -> dict:
    """Request the WebGPU device; describe it. Also hands the page the sampling defaults and the
    rules each setting follows (pyapp.sampling.RULES: its inputs' bounds)."""
    defaults = {**_sampling_settings(), "context_length": DEFAULT_CONTEXT, **_denoise_defaults(DenoiseParams())}
    try:
        S.device = await get_device_async("browser")
    except GPUError as e:
        return {"error": str(e).removeprefix("Error: "), "webgpu": False, "defaults": defaults,
                "rules": page_rules()}
    d = S.device
    return {"adapter": d.describe(), "info": d.info, "f16": d.has_f16, "subgroups": d.has_subgroups,
            "limits": d.limits, "webgpu": True, "defaults": defaults, "rules": page_rules(),
            "gpu_memory": default_gpu_memory(d.info), "software": software_adapter(d.info)}


def _budget(gpu_memory) -> float | None:
    """The page's GPU memory setting in MiB; 0 or empty: no budget (everything on the GPU)."""
    return float(gpu_memory) if gpu_memory not in (None, "") and float(gpu_memory) > 0 else None


def memory_plan(context_length: int = DEFAULT_CONTEXT, gpu_memory=None) -> dict:
    """What loading the chosen model with these settings would put on the GPU and leave in the file."""
    if S.gguf is None:
        return {"error": "choose a model first"}
    try:
        plan = Engine.plan(S.gguf, S.device.limits if S.device else {}, int(context_length), _budget(gpu_memory))
    except EXPECTED as e:
        return {"error": str(e)}
    return {"lines": plan.describe(), **_plan_figures(plan)}


def _plan_figures(plan) -> dict:
    """A plan's figures for the page's bar: the parts on the GPU (weights, experts or their cache, activations
    and KV cache) and what stays in the file (experts that stream, the per-layer embeddings when they stay there).
    Experts all resident are on the GPU, never in the file."""
    ple_resident = 0 if plan.ple_in_file else plan.ple_table
    return {"total": plan.total, "budget": plan.budget, "streams": plan.streams, "minimum": plan.minimum,
            "expert_each": plan.expert_each, "n_experts": plan.n_experts, "slots": plan.slots,
            "weights": plan.weights + ple_resident, "experts": 0 if plan.streams else plan.experts,
            "expert_cache": plan.expert_cache, "state": plan.state,
            "resident": plan.total - plan.expert_cache,
            "in_file": (plan.experts - plan.expert_cache if plan.streams else 0)
                       + (plan.ple_table if plan.ple_in_file else 0)}


TEST_MODEL_MAX_TOKENS = 64      # the default max tokens of a test model (random weights)


def _describe(g, source_name: str) -> dict:
    cfg = model_config(g)
    s = summarize(g)
    main_type = max(s["by_type"].items(), key=lambda kv: kv[1]["bytes"])[0] if s["by_type"] else "?"
    ft = g.metadata.get("general.file_type")
    form = file_form(g.metadata, g.tensors)
    return {"name": g.metadata.get("general.name") or source_name, "file": source_name,
            "parts": list(form.parts), "converter": form.converter,
            "architecture": g.architecture, "quantization": ollama.file_type_name(ft) or main_type,
            "parameters": s["n_elements"], "parameter_size": ollama.human_number(s["n_elements"]),
            "bytes": s["total_bytes"], "context_length": cfg.context_length, "config": _config_line(cfg),
            "test_model": "test model" in str(g.metadata.get("general.name", "")) or "demo" in source_name.lower(),
            "moe": cfg.is_moe, "ple": cfg.has_ple,       # which fine-tuning targets it has (router, ple_*)
            # a DiffusionGemma model: its sampler settings' defaults (the page shows its own panel); else None
            "denoise": _denoise_defaults(DenoiseParams.from_config(cfg)) if cfg.is_diffusion else None}


def open_file(blob, name: str = "") -> dict:
    """Parse a GGUF's header from a File; check it is a Gemma 4 model we can run."""
    if int(getattr(blob, "size", 1)) == 0:
        shown = name or getattr(blob, "name", "") or "the file"
        return {"error": f"\u201c{shown}\u201d is empty (0 bytes): it holds no model. Download or copy it again."}
    try:
        src = BlobSource(blob, name)
        g = read_gguf(src)
        if g.metadata.get("general.type") == "adapter":     # a dropped LoRA adapter, not a model
            return _open_adapter(g, src.name)
        info = _describe(g, src.name)
    except EXPECTED as e:
        return _fail(e, name or getattr(blob, "name", "") or "the file")
    _unload()
    S.gguf, S.model_info, S.params, S.adapter = g, info, {}, None
    if info["denoise"]:       # the model's own generation settings (its GGUF) are the page's defaults
        return {"model": info, "params": info["denoise"]}
    if info["test_model"]:    # it talks nonsense (slowly on a CPU adapter): a short reply shows it working
        return {"model": info, "suggested": {"max_tokens": TEST_MODEL_MAX_TOKENS}}
    return {"model": info}


async def open_folder(handle) -> dict:
    """List the models of an Ollama models folder (Gemma 4 ones usable, others explained)."""
    S.folder = JsDirectory(handle)
    try:
        models = await ollama.list_models_async(S.folder, header=True)
    except EXPECTED as e:
        return _fail(e, str(getattr(handle, "name", "")) or "the folder")
    S.models = {m.name: m for m in models}
    rows = []
    for m in models:
        usable = m.usable and (ollama.is_gemma4(m) or m.architecture == DIFFUSION_ARCH)
        why = m.error or ("" if usable else f"architecture {m.architecture or '?'}: not a Gemma 4 model "
                                            "or DiffusionGemma")
        words, detail = _folder_reason(m, why) if why else ("", "")
        rows.append({"name": m.name, "size": m.size, "quantization": m.file_type, "parameters": m.parameter_size,
                     "architecture": m.architecture, "usable": usable, "why": words, "detail": detail,
                     "parts": list(m.parts), "digest": m.model.digest if m.model else ""})
    return {"models": rows, "folder": str(getattr(handle, "name", ""))}


def _folder_reason(m, why: str) -> tuple[str, str]:
    """Why a model of the folder cannot be chosen, in words (and the reader's exact message, folded as detail)."""
    pull = f"re-pull it with \u201collama pull {m.name}\u201d"
    if not m.error:
        arch = m.architecture or "unknown"
        return (f"It is not a Gemma 4 model (its architecture is {arch}): this app runs Gemma 4 and "
                "DiffusionGemma.", "")
    e = m.error
    if m.manifest_path and e.startswith(f"{m.manifest_path}:"):    # the manifest itself (ollama._load)
        words = f"Its manifest (Ollama's list of the model's files) is damaged or unreadable: {pull}."
    elif "is missing" in e:
        words = f"Its model file is missing from the folder: {pull}."
    elif "bytes, the manifest says" in e:
        words = f"Its model file is incomplete (an interrupted download?): {pull}."
    elif "safetensors" in e:
        words = "It is stored as safetensors layers, not one GGUF file: this app reads GGUF models."
    elif "no model layer" in e:
        words = "Its manifest lists no model file: it may be an embedding or adapter-only entry."
    elif "not a readable GGUF" in e or "unreadable" in e:
        words = f"Its model file cannot be read as a GGUF model: {pull}."
    else:
        words = f"It cannot be opened: {pull}."
    return words, e


async def open_folder_model(name: str) -> dict:
    m = S.models.get(name)
    if m is None or S.folder is None:
        return {"error": f"{name} is not in the opened folder"}
    try:
        blob = await S.folder.file(m.model.path)
        src = BlobSource(blob, name)
        if src.size != m.model.size:
            raise ollama.OllamaError(f"{name}: the model blob is {src.size} bytes, the manifest says "
                                     f"{m.model.size}: incomplete download?")
        g = read_gguf(src)
        info = _describe(g, name)
        # the model's Ollama defaults, checked like the page's own settings
        params = {**_sampling_settings(m.params), "num_ctx": int(m.params.get("num_ctx") or 0) if m.params else 0,
                  **(info["denoise"] or {})}
    except EXPECTED as e:
        return _fail(e, name, ollama_name=name)
    _unload()
    info["digest"] = m.model.digest     # the model blob's: names the base model an adapter belongs to
    info["name"] = m.name               # as Ollama names it (name:tag), not the file's internal name
    info["parts"] = list(m.parts or info["parts"])      # with a projector layer's encoders
    S.gguf, S.model_info, S.params, S.adapter = g, info, dict(m.params or {}), None
    # the manifest's system prompt: the page applies it to a conversation that has none (as Ollama does)
    return {"model": info, "params": params, "system": m.system or ""}


def _unload() -> None:
    if S.training is not None:   # a run trains the engine being unloaded: its buffers go with it
        S.training.close()
    if S.engine is not None:
        try:
            S.engine.close()
        except Exception:   # a lost device: its buffers are gone anyway
            pass
    S.engine = None
    S.prefill_rate = {}


async def load(context_length: int = DEFAULT_CONTEXT, load_id: int = 0, gpu_memory=None, f16: bool = False) -> dict:
    """Upload the chosen model's weights to the GPU (progress events; cancel_load(load_id) stops it);
    f16: the prompt matmuls int8 does not take in f16 tiles where the device has shader-f16."""
    if S.gguf is None:
        return {"error": "choose a model first"}
    _unload()
    if S.device is None or _device_lost():
        try:   # after a device loss (driver reset, GPU process crash) a fresh device usually works
            S.device = await get_device_async("browser")
        except GPUError as e:
            return {"error": "This browser gives the page no WebGPU device, so the model cannot run here: use a "
                             "recent Chrome or Edge with WebGPU on (see the message at the top of the page).",
                    "detail": str(e), "no_webgpu": True}
    S.device.clear_error()
    last = [0.0]

    def progress(done, total, elapsed):
        now = time.perf_counter()
        if now - last[0] > 0.1 or done == total:
            last[0] = now
            rate = done / elapsed if elapsed > 0 else 0
            emit("progress", done=done, total=total, eta=(total - done) / rate if rate else -1)

    try:
        t = time.perf_counter()
        S.engine = await Engine.open_async(S.gguf, S.device, context_length=context_length, progress=progress,
                                           cancelled=lambda: S.cancelled_load == load_id,
                                           gpu_memory_mib=_budget(gpu_memory), lora=_lora(), f16=bool(f16))
        if (rejected := _gpu_rejected("the model")):
            _unload()
            return _fail(rejected)
        return {"ready": True, "seconds": time.perf_counter() - t, "context_length": S.engine.context_length,
                "model": S.model_info, "plan": S.engine.memory_plan.describe(S.engine.load_bytes_per_s),
                "plan_figures": _plan_figures(S.engine.memory_plan), "adapter": _adapter_info()}
    except Exception as e:
        S.engine = None
        if isinstance(e, EXPECTED) or _device_lost():
            return _fail(e)
        raise


# -- LoRA adapter ---------------------------------------------------------------

def _lora() -> list:
    """The engine's lora option: the chosen adapter at its scale (off: scale 0, so the switch needs no reload)."""
    return [(S.adapter, S.adapter_scale if S.adapter_on else 0.0)] if S.adapter is not None else []


def _adapter_info() -> dict | None:
    eng = S.engine
    if eng is None or eng.adapters is None:
        return None
    a = eng.adapters.adapters[0]
    return {"name": a.label, "lines": a.describe(), "on": S.adapter_on, "scale": S.adapter_scale}


def _open_adapter(g, name: str) -> dict:
    """Check an adapter GGUF against the chosen model; it applies from the next load (the page reloads)."""
    if S.gguf is None:
        return {"error": f"Choose the model first: \u201c{name}\u201d is a LoRA adapter, made for one base model.",
                "adapter_error": True}
    model = S.model_info.get("name", "this model")
    try:
        cfg = Gemma4Config.from_gguf(S.gguf)
        adapter = bind_lora(g, cfg, bind(cfg, S.gguf.tensors), S.adapter_scale, S.gguf.architecture, name)
    except LoraError as e:
        return {"error": _adapter_words(str(e), name, model), "detail": str(e), "adapter_error": True}
    except EXPECTED as e:
        return _fail(e, name)
    S.adapter = g
    return {"adapter": {"name": name, "lines": adapter.describe(), "on": S.adapter_on, "scale": S.adapter_scale}}


# what the checks say when an adapter was trained on another base model
_OTHER_MODEL = ("incorrect shape", "does not exist in the base model", "is for architecture")


def _adapter_words(message: str, name: str, model: str) -> str:
    if any(m in message for m in _OTHER_MODEL):
        return (f"\u201c{name}\u201d cannot be applied to {model}: it was made for a different base model. "
                "Choose the adapter trained on this model.")
    return f"\u201c{name}\u201d cannot be applied to {model}: {message}"


def open_adapter(blob, name: str = "") -> dict:
    """Choose a LoRA adapter (llama.cpp's GGUF format) for the chosen model."""
    try:
        src = BlobSource(blob, name)
        g = read_gguf(src)
    except EXPECTED as e:
        return _fail(e, name or "the adapter")
    if g.metadata.get("general.type") != "adapter":
        return {"error": f"\u201c{src.name}\u201d is not a LoRA adapter (its general.type is "
                         f"{g.metadata.get('general.type')!r}): open models with Open a GGUF file.",
                "adapter_error": True}
    return _open_adapter(g, src.name)


def set_adapter(on: bool = True, scale=1.0) -> dict:
    """Switch the adapter on or off and set its scale: applied from the next reply, no reload."""
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        scale = float("nan")
    if not -100 <= scale <= 100:
        return {"error": "The adapter scale must be a number from -100 to 100 (1 applies it as trained, 0 turns "
                         "it off)."}
    S.adapter_on, S.adapter_scale = bool(on), scale
    if S.engine is not None and S.engine.adapters is not None:
        S.engine.set_lora_scale(0, scale if on else 0.0)
    return {"adapter": _adapter_info()}


def remove_adapter() -> dict:
    """Forget the adapter; the page reloads the model without it."""
    S.adapter = None
    return {}


# -- fine-tuning: the Fine-tune panel (pyapp.train.session) -----------------------------------------
# The page drives a run one update per command (train_step), so Stop is taken between updates and the
# page stays free; the trainer works on the loaded engine's weights. Plain-language failures come back
# as {"error", "field"} (the panel's field at fault, if any).

def _training():
    """The panel's session; the training modules are imported when the panel is first used."""
    if S.training is None:
        from .train.session import TrainingSession
        S.training = TrainingSession()
    return S.training


def _not_trainable() -> dict | None:
    if S.engine is None:
        return {"error": "Load a Gemma 4 model first: fine-tuning trains an adapter for the loaded model."}
    if isinstance(S.engine, DiffusionEngine):
        return {"error": "DiffusionGemma models cannot be fine-tuned here: load a Gemma 4 model."}
    return None


def _train_failed(e: Exception) -> dict:
    """A training command that raised: a field or data problem names its field; a lost device unloads."""
    from .train.data import DataError
    from .train.session import FieldError
    from .train.trainer import TrainError
    if _device_lost():
        return _failed_reply(e)
    if isinstance(e, FieldError):
        return {"error": str(e), "field": e.field}
    if isinstance(e, DataError):
        return {"error": str(e), "field": "data"}
    if isinstance(e, TrainError):
        return {"error": str(e)}
    return _failed_reply(e)


def train_options() -> dict:
    """The panel's presets, targets and field rules (pyapp.train.session.options)."""
    from .train.session import options
    return options()


def train_data(blob, name: str = "", fields_json: str = "{}") -> dict:
    """Read a training file (blob None: the one read before, with changed settings): its statistics and
    warnings, for the panel to show before Start."""
    if (why := _not_trainable()):
        return why
    run = _training()
    if run.running:
        return {"error": "A run is in progress: stop it first."}
    try:
        data = BlobSource(blob, name).read(0, int(blob.size)) if hasattr(blob, "size") else None   # JS null: None
        return run.load_data(S.engine, data, name or run.name, json.loads(fields_json), _style())
    except Exception as e:
        return _train_failed(e)


def train_start(fields_json: str = "{}") -> dict:
    """Make the run's Trainer: the updates it plans and the data it trains on."""
    if (why := _not_trainable()):
        return why
    if S.engine.adapters is not None:
        return {"error": "Remove the LoRA adapter first: training starts from the base model."}
    if S.engine.config.is_moe and S.engine.runner.experts is not None:   # the trainer refuses it in CLI words
        return {"error": "Fine-tuning a mixture-of-experts model needs all its experts in GPU memory, but with this "
                         "GPU memory setting they are read from the file as needed. Raise GPU memory (MiB) in the "
                         "settings (0 puts the whole model on the GPU) and reload the model.", "field": "gpu_memory"}
    try:
        S.device.clear_error()
        return _training().start(S.engine, json.loads(fields_json), _style())
    except Exception as e:
        return _train_failed(e)


async def train_step() -> dict:
    """One update of the run (the page calls again for the next, or train_finish)."""
    run = S.training
    if run is None or not run.running:
        return {"error": "No training run is in progress."}
    try:
        report = await run.step()
        if (rejected := _gpu_rejected("a training step")):
            raise rejected
        return report
    except Exception as e:
        return _train_failed(e)


async def train_finish() -> dict:
    """End the run: the adapter GGUF of its best parameters (bytes: the page keeps and offers it) and the
    log; the trainer's GPU memory is freed, the model stays loaded."""
    run = S.training
    if run is None or not run.running:
        return {"error": "No training run is in progress."}
    try:
        out = await run.finish()
    except Exception as e:
        return _train_failed(e)
    return {**out, "model": {k: S.model_info.get(k) for k in ("name", "file", "digest", "bytes", "architecture")}}


def cancel_load(load_id: int = 0) -> None:
    S.cancelled_load = load_id


def stop() -> None:
    S.stop = True


def _style():
    """The prompt format the loaded model's GGUF asks for (its own template, else its size)."""
    return style_for(S.gguf.metadata, S.model_info.get("parameters")) if S.gguf is not None else style_for({})


def _prefill_event(eng, ids: list) -> None:
    """Before a reply: the prompt tokens the model must read first (those the KV cache does not hold) and the
    time that should take at the rate measured on this model's earlier replies (eta -1: none yet; the first
    reply also prepares the GPU's programs). The page shows it until the first token."""
    new = len(ids) - eng.reusable(ids)
    rate = S.prefill_rate.get(id(eng))
    emit("prefill", tokens=new, prompt_tokens=len(ids), eta=new / rate if rate else -1, measured=bool(rate),
         context_used=len(ids), context_length=eng.context_length)


def _token_events(prompt_tokens: int, context_length: int):
    """on_token for a reply: each piece of text goes to the page with the figures so far (tokens,
    decode tokens/s, context used), so the page shows them moving while the reply streams."""
    count, first = 0, 0.0

    def on_token(tok, text: str) -> None:
        nonlocal count, first
        now = time.perf_counter()
        if tok is not None:              # None: the decoder's last bytes, no new token
            count += 1
            first = first or now
        tps = (count - 1) / (now - first) if count > 1 and now > first else 0.0   # the first waited on the prompt
        emit("token", text=text, tokens=count, tps=tps, context_used=prompt_tokens + count,
             context_length=context_length)
    return on_token


async def chat(messages_json: str, params_json: str) -> dict:
    """Generate the next assistant reply for a conversation; tokens stream as events."""
    if S.engine is None:
        return {"error": "no model loaded"}
    messages = json.loads(messages_json)
    p = json.loads(params_json)
    thinking = bool(p.pop("thinking", False))
    eng = S.engine
    if isinstance(eng, DiffusionEngine):
        return await _chat_diffusion(eng, messages, p, thinking)
    try:
        params = _sampling_params(p)
        ids = render_ids(eng.tokenizer, messages, add_generation_prompt=True, thinking=thinking, style=_style())
        if len(ids) + 1 >= eng.context_length:
            return {"error": f"the conversation ({len(ids)} tokens) fills the context of {eng.context_length}; "
                             "start a new chat or shorten it"}
        S.stop = False
        S.device.clear_error()
        _prefill_event(eng, ids)
        res = await eng.generate_async(ids, params, on_token=_token_events(len(ids), eng.context_length),
                                       should_stop=lambda: S.stop,
                                       on_prefill=lambda done, total: emit("prefill_done", done=done, total=total))
        if (rejected := _gpu_rejected("a command during the reply")):
            raise rejected
    except Exception as e:
        return _failed_reply(e)
    if res.prompt_tokens and res.prefill_s > 0 and res.tokens:
        S.prefill_rate[id(eng)] = res.prompt_tokens / res.prefill_s
    thought, answer = split_thinking(res.text)
    # the page keeps ids + vocab with the reply and sends them back: the next prompt then extends the cache
    return {"text": res.text, "answer": answer, "thought": thought, "stop_reason": res.stop_reason,
            **reply_ids(eng.tokenizer, ids, res.tokens), "cached": res.cached_tokens,
            "tokens": len(res.tokens), "prompt_tokens": len(ids), "evaluated": res.prompt_tokens,
            "prefill_s": res.prefill_s, "decode_tps": res.decode_tps, "context_used": eng.n_past + 1,
            "context_length": eng.context_length, "drafted": res.drafted, "accepted": res.accepted,
            "adapter": _reply_adapter(eng)}


def _reply_adapter(eng) -> dict | None:
    """The adapter a reply was generated with (kept with the reply: a conversation can outlive a switch)."""
    if eng.adapters is None or not S.adapter_on or S.adapter_scale == 0:
        return None
    return {"name": eng.adapters.adapters[0].label, "scale": S.adapter_scale}


def count_tokens(messages_json: str) -> dict:
    messages = json.loads(messages_json)
    if S.engine is None or not messages:
        return {"tokens": 0}
    ids = render_ids(S.engine.tokenizer, messages, add_generation_prompt=False, style=_style())
    return {"tokens": len(ids), "context_length": S.engine.context_length}


async def logits(tokens_json: str) -> dict:
    """Logits for a token sequence (tests compare them with golden files)."""
    if S.engine is None:
        return {"error": "no model loaded"}
    if isinstance(S.engine, DiffusionEngine):       # it scores a canvas (diffusion_logits), not a next token
        return _fail(EngineError(DIFFUSION_NOT_AUTOREGRESSIVE))
    try:
        rows = await S.engine.forward_async(json.loads(tokens_json))   # Logits
    except EXPECTED as e:
        return _fail(e)
    return {"rows": rows.tolist()}


async def generate_tokens(tokens_json: str, params_json: str = "{}") -> dict:
    """Token ids generated after a raw token sequence, from an empty cache (tests: golden outputs)."""
    if S.engine is None:
        return {"error": "no model loaded"}
    p = json.loads(params_json)
    S.engine.reset()
    try:
        params = _sampling_params(p)
        S.device.clear_error()
        res = await S.engine.generate_async(json.loads(tokens_json), params, stop_ids=())
        if (rejected := _gpu_rejected("a command during generation")):
            raise rejected
    except EXPECTED as e:
        return _fail(e)
    return {"tokens": list(res.tokens), "stop_reason": res.stop_reason}


def simulate_device_loss() -> dict:
    """For tests: destroy the GPU device, as a driver reset would (device.lost fires)."""
    if S.device is not None:
        S.device.device.destroy()
    return {}


# -- DiffusionGemma: replies by denoising (pyapp.families.diffusion_gemma) -----------------------

def _config_line(cfg) -> str:
    line = cfg.describe()
    return f"DiffusionGemma (text diffusion): {line}, canvas {cfg.canvas_length}" if cfg.is_diffusion else line


def _denoise_defaults(d: DenoiseParams) -> dict:
    """DenoiseParams' page settings (pyapp.sampling.DENOISE_SETTINGS' names) and its max new tokens as max_tokens;
    the GGUF keeps float32s: shown rounded (0.3, not 0.30000001192092896)."""
    out = {name: getattr(d, field) for name, (field, _, _) in DENOISE_SETTINGS.items()}
    return {**{k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in out.items()},
            "max_tokens": d.max_new_tokens}


def _denoise_params(cfg, p: dict, room: int) -> DenoiseParams:
    """The page's settings for a DiffusionGemma reply: the model's defaults, overridden by the panel's fields,
    max_tokens and seed as for Gemma 4 (room: the most tokens the context has left). ParamError names a bad one."""
    s = _sampling_params(p)
    d = DenoiseParams.from_config(cfg, **denoise_settings(p))
    check_temperature_range(d.t_min, d.t_max)
    d.max_new_tokens, d.seed = max(1, int(min(s.token_limit, room))), s.seed
    d.validate()
    return d


class _DenoiseEvents:
    """A DiffusionGemma reply's events for the page. Per step ("denoise"): the block's argmax draft as one text
    piece per canvas position and the acceptance mask, with the figures so far (steps taken, committed tokens per
    second and per forward pass); per committed block ("token"): its text, which the page appends to the reply.
    A few KiB per step: no logits leave the GPU."""

    def __init__(self, tok, params: DenoiseParams, prompt_tokens: int, context_length: int):
        self.tok, self.decoder = tok, tok.stream()
        self.eos, self.pad = set(params.eos_ids), params.pad_id
        self.prompt_tokens, self.context_length = prompt_tokens, context_length
        self.pieces: dict[int, str] = {}       # id -> its text (a draft repeats ids step after step)
        self.tokens: list[int] = []             # the reply: committed ids up to the first eos
        self.text, self.passes, self.committed, self.canvas_tokens, self.ended = "", 0, 0, 0, False
        self.t0 = time.perf_counter()

    def _piece(self, t: int) -> str:
        if t not in self.pieces:
            self.pieces[t] = "" if t in self.eos else self.tok.decode([t])
        return self.pieces[t]

    def figures(self) -> dict:
        seconds = time.perf_counter() - self.t0
        return {"steps": self.passes, "tps": self.committed / seconds if seconds > 0 else 0.0,
                "tpf": self.committed / self.passes if self.passes else 0.0}

    def on_step(self, block: int, step: int, argmax, accepted) -> None:
        self.passes += 1
        emit("denoise", block=block, step=step, pieces=[self._piece(t) for t in argmax],
             accepted=[1 if a else 0 for a in accepted], **self.figures())

    def on_block(self, block: int, ids) -> None:
        self.committed += sum(t != self.pad for t in ids)       # transformers' tokens_per_forward counts these
        self.canvas_tokens += len(ids)
        piece = ""
        for t in ids:
            if self.ended or t in self.eos:
                self.ended = True
                break
            self.tokens.append(t)
            piece += self.decoder.push(t)
        self.text += piece
        emit("token", text=piece, tokens=len(self.tokens), context_used=self.prompt_tokens + self.canvas_tokens,
             context_length=self.context_length, block=block, **self.figures())

    def finish(self) -> str:
        self.text += self.decoder.flush()
        return self.text


async def _chat_diffusion(eng: DiffusionEngine, messages: list, p: dict, thinking: bool) -> dict:
    """chat() on a DiffusionGemma model: the reply denoised block by block, each step shown (_DenoiseEvents);
    Stop takes effect between steps."""
    try:
        ids = render_ids(eng.tokenizer, messages, add_generation_prompt=True, thinking=thinking, style=_style())
        room = eng.context_length - len(ids)
        if room < eng.canvas_length:
            return {"error": f"the conversation ({len(ids)} tokens) leaves no room in the context of "
                             f"{eng.context_length} for a block of {eng.canvas_length}; start a new chat or shorten it"}
        params = _denoise_params(eng.config, p, room)
        reused = eng.reusable(ids)            # what the denoiser keeps of the cache (a chat's earlier turns)
        live = _DenoiseEvents(eng.tokenizer, params, len(ids), eng.context_length)
        emit("prefill", tokens=len(ids) - reused, prompt_tokens=len(ids), eta=-1, measured=False, denoise=True,
             context_used=len(ids), context_length=eng.context_length)
        S.stop = False
        res = await eng.denoise_async(ids, params, on_step=live.on_step, on_block=live.on_block,
                                      should_stop=lambda: S.stop)
    except Exception as e:
        return _failed_reply(e)
    text = live.finish()
    thought, answer = split_thinking(text)
    fig = live.figures()
    return {"text": text, "answer": answer, "thought": thought, "stop_reason": res.stop_reason,
            **reply_ids(eng.tokenizer, ids, live.tokens), "cached": reused, "tokens": len(live.tokens),
            "prompt_tokens": len(ids), "evaluated": len(ids) - reused, "prefill_s": 0.0,
            "decode_tps": live.committed / res.seconds if res.seconds > 0 else 0.0,
            "context_used": len(ids) + live.canvas_tokens, "context_length": eng.context_length,
            "denoise": {"steps": fig["steps"], "blocks": len(res.blocks), "block_steps": list(res.steps),
                        "tokens_per_forward": res.tokens_per_forward(params.pad_id)}}


def _diffusion_engine():
    return S.engine if isinstance(S.engine, DiffusionEngine) else None


async def diffusion_logits(prompt_json: str, canvas_json: str, prev_json: str = "null", blocks_json: str = "[]"
                           ) -> dict:
    """One denoising step's logits [canvas, vocab] after encoding the prompt (and committed blocks) from an empty
    cache; prev: the previous step's processed logits, rows of floats (tests compare them with golden files)."""
    eng = _diffusion_engine()
    if eng is None:
        return {"error": "no DiffusionGemma model loaded"}
    prev = json.loads(prev_json)
    prev_bytes = None if prev is None else array("f", [x for row in prev for x in row]).tobytes()
    try:
        rows = await eng.decoder_logits_async(json.loads(prompt_json), json.loads(canvas_json), prev_bytes,
                                              json.loads(blocks_json))
    except EXPECTED as e:
        return _fail(e)
    return {"rows": rows.tolist()}


async def denoise_tokens(prompt_json: str, params_json: str = "{}", draws_json: str = "null") -> dict:
    """One generation from an empty cache with DenoiseParams' fields (the model's defaults for the rest) and, when
    given, recorded random draws {init, sample, renoise} (ReplayDraws): every step's decisions (tests replay
    transformers' generate)."""
    eng = _diffusion_engine()
    if eng is None:
        return {"error": "no DiffusionGemma model loaded"}
    p, d = json.loads(params_json), json.loads(draws_json)
    if "eos_ids" in p:
        p["eos_ids"] = tuple(p["eos_ids"])
    eng.reset()
    try:
        res = await eng.denoise_async(json.loads(prompt_json), DenoiseParams.from_config(eng.config, **p),
                                      ReplayDraws(d["init"], d["sample"], d["renoise"]) if d else None)
    except EXPECTED as e:
        return _fail(e)
    return {"tokens": res.tokens, "steps": res.steps, "argmax": res.argmax,
            "accepted": [[1 if a else 0 for a in row] for row in res.accepted], "stop_reason": res.stop_reason,
            "tokens_per_forward": res.tokens_per_forward()}
