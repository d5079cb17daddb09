"""The app's Python side, running in Pyodide inside web/worker.js (a dedicated Web Worker): the worker's
commands (@command), thin adapters over the use cases of pyapp.app.

worker.js calls these functions by name with plain values (JSON strings) or JS handles (Files, folder
handles) and posts their results to the page; what a use case reports while it runs goes out as events
(`emit`: load progress, the prompt to read, tokens, denoising steps). Every command returns a dict; an
error comes back as {"error": words, ...} chosen by its type (`_error`), so the page can show it and
carry on.

Model bytes never pass through here wholesale: the GGUF header and per-token PLE rows are read from the
File with FileReaderSync (`BlobSource`), and weights go File -> GPU inside JS (pyapp.gpu.browser).
"""

from __future__ import annotations

import json
import math
import sys
import time
from array import array

import js  # type: ignore[import-not-found]
from pyodide.ffi import to_js  # type: ignore[import-not-found]

from .app import adapters, audio, finetune, folder, images, model, settings
from .app.denoise import diffusion_engine, replay
from .app.events import Events
from .app.generate import generate
from .app.logits import diffusion_logits as _diffusion_logits
from .app.logits import logits as _logits
from .app.reply import count_tokens as _count_tokens
from .app.reply import reply
from .app.session import Refused, Session
from .families.diffusion_gemma import DenoiseParams
from .families.gemma4_assistant.config import ARCH as DRAFTER_ARCH
from .families.gemma4_audio import features
from .families.gemma4_audio.config import AudioError
from .families.gemma4_audio.source import holds_audio, serves_audio
from .engine import DEFAULT_CONTEXT, Engine
from .errors import Fault, Gemma4Error
from .explain import explain, explain_adapter
from .families import model_config
from .families.gemma4_vision.config import BUDGETS, DEFAULT_BUDGET, VisionError, encoder_config
from .families.gemma4_vision.source import check_projector
from .gguf import read_gguf
from .gpu import GPUError, get_device_async
from .model.config import ConfigError
from .model.lora import LoraError
from .sampling import DRAFTER_DRAFTS, page_rules
from .source import SourceError
from .steps import run_async
from .train.data import DataError
from .train.session import FieldError
from .train.trainer import TrainError

# What a command reports as a message instead of failing: pyapp's errors, a folder's files (OSError), and the
# ValueErrors that checks below pyapp's own errors raise (ggml types, kernel shapes).
EXPECTED = (Gemma4Error, OSError, ValueError)

SESSION = Session()     # the worker's one session: the model chosen and loaded, the adapter, the training run

# The worker's commands, declared here and nowhere else: web/worker.js asks for their names at boot and runs
# these, and only these; any other name (a helper of this module, toString, __proto__) is an unknown command.
COMMANDS: dict = {}


def command(fn):
    """Declare a worker command: the page calls it by name, with JSON strings, Files and handles."""
    COMMANDS[fn.__name__] = fn
    return fn


def command_names() -> list[str]:
    return sorted(COMMANDS)


def emit(event: str, **data) -> None:
    """Post an event to the page (progress, tokens, status)."""
    js.postMessage(to_js({"event": event, **data}, dict_converter=js.Object.fromEntries))


class PageEvents(Events):
    """The use cases' events, posted to the page under their own names (web/app.js's listeners)."""

    def progress(self, **figures):
        emit("progress", **figures)

    def compiling(self, done, made):
        emit("compiling", done=done, made=made)

    def prefill(self, denoise: bool = False, **figures):
        emit("prefill", **figures, **({"denoise": True} if denoise else {}))

    def prefill_done(self, done, total):
        emit("prefill_done", done=done, total=total)

    def token(self, **figures):
        emit("token", **figures)

    def denoise(self, **figures):
        emit("denoise", **figures)


EVENTS = PageEvents()


# -- the browser's files ----------------------------------------------------------------------------

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
            raise SourceError(f"read of {n} bytes at {offset} is outside {self.name} ({self.size} bytes)",
                              fault=Fault.INCOMPLETE)
        try:
            buf = self._reader.readAsArrayBuffer(self.blob.slice(offset, offset + n))
        except Exception as e:   # NotReadableError: the file changed or was removed on disk
            raise SourceError(f"cannot read {self.name} any more ({e}); did the file change on disk? "
                              "Open it again.", fault=Fault.CHANGED) from e
        data = buf.to_bytes()
        if len(data) != n:
            raise SourceError(f"short read at byte {offset} of {self.name}: the file changed on disk?",
                              fault=Fault.CHANGED)
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


# -- errors, by type --------------------------------------------------------------------------------

def _model_file() -> str | None:
    return SESSION.model.info.get("file") if SESSION.model is not None else None


def _error(e: BaseException, file: str | None = None, ollama_name: str | None = None) -> dict:
    """A command's error as the page shows it, chosen by its type: a use case's refusal in its own words
    (with its facts: field, adapter_error); a lost GPU device (the model unloaded: reload it); a Fine-tune
    field or the training data at fault; any other expected error in plain words about `file` (the model's,
    by default; pyapp.explain). Anything else is a bug and propagates (worker.js reports it)."""
    if isinstance(e, Refused):
        return {"error": str(e), **e.facts}
    lost = SESSION.device_lost
    if lost:
        SESSION.unload()
        return {"error": f"The GPU device was lost ({lost}). Reload the model to go on; your conversation is kept.",
                "device_lost": True}
    if isinstance(e, FieldError):
        return {"error": str(e), "field": e.field}
    if isinstance(e, DataError):
        return {"error": str(e), "field": "data"}
    if isinstance(e, TrainError):
        return {"error": str(e)}
    if isinstance(e, EXPECTED):
        return explain(e, file or _model_file(), ollama_name)
    raise e


# -- commands: the device, a model chosen and loaded -------------------------------------------------

@command
async def boot() -> dict:
    """Request the WebGPU device; describe it. Also hands the page the sampling defaults and the
    rules each setting follows (pyapp.sampling.RULES: its inputs' bounds)."""
    defaults = {**settings.sampling_defaults(), "context_length": DEFAULT_CONTEXT,
                **settings.denoise_defaults(DenoiseParams())}
    try:
        SESSION.device = await get_device_async("browser")
    except GPUError as e:
        return {"error": str(e).removeprefix("Error: "), "webgpu": False, "defaults": defaults,
                "rules": page_rules()}
    d = SESSION.device
    return {"adapter": d.describe(), "info": d.info, "f16": d.has_f16, "subgroups": d.has_subgroups,
            "limits": d.limits, "webgpu": True, "defaults": defaults, "rules": page_rules(),
            "gpu_memory": settings.default_gpu_memory(d.info), "software": settings.software_adapter(d.info)}


@command
def memory_plan(context_length: int = DEFAULT_CONTEXT, gpu_memory=None, prompt_step=None) -> dict:
    """What loading the chosen model with these settings would put on the GPU and leave in the file
    (prompt_step: the most prompt tokens a step reads; None: the model's default)."""
    try:
        chosen = SESSION.chosen()
        limits = SESSION.device.limits if SESSION.device else {}
        plan = Engine.plan(chosen.gguf, limits, int(context_length), settings.gpu_budget(gpu_memory),
                           chunk=settings.prompt_step(prompt_step),
                           beside=model.drafter_bytes(SESSION, limits, int(context_length)))
    except EXPECTED as e:        # shown beside the plan as it is: no model file's fault
        return {"error": str(e)}
    return {"lines": plan.describe(), **model.plan_figures(plan)}


@command
def open_file(blob, name: str = "") -> dict:
    """Parse a GGUF's header from a File; check it is a Gemma 4 model we can run (a LoRA adapter dropped
    instead is checked against the chosen model)."""
    shown = name or getattr(blob, "name", "") or "the file"
    if int(getattr(blob, "size", 1)) == 0:
        return {"error": f"\u201c{shown}\u201d is empty (0 bytes): it holds no model. Download or copy it again."}
    try:
        src = BlobSource(blob, name)
        g = read_gguf(src)
        if g.metadata.get("general.type") == "adapter":     # a dropped LoRA adapter, not a model
            return _choose_adapter(g, src.name)
        if g.metadata.get("general.architecture") == DRAFTER_ARCH:   # a drafter, not a model
            return {"error": f"\u201c{shown}\u201d is an assistant drafter, not a model: choose its model, then add "
                             "the drafter under Drafter, in the sidebar.", "drafter_file": True}
        info = model.describe(g, src.name)
    except EXPECTED as e:
        return _error(e, shown)
    model.choose(SESSION, g, info)
    if info["denoise"]:       # the model's own generation settings (its GGUF) are the page's defaults
        return {"model": info, "params": info["denoise"], "images": _images(), "audio": _audio()}
    if info["test_model"]:    # it talks nonsense (slowly on a CPU adapter): a short reply shows it working
        return {"model": info, "suggested": {"max_tokens": model.TEST_MODEL_MAX_TOKENS}, "images": _images(),
                "audio": _audio()}
    return {"model": info, "images": _images(), "audio": _audio()}


@command
async def open_folder(handle) -> dict:
    """List the models of an Ollama models folder (Gemma 4 ones usable, others explained)."""
    try:
        rows = await folder.open_folder(SESSION, JsDirectory(handle))
    except EXPECTED as e:
        return _error(e, str(getattr(handle, "name", "")) or "the folder")
    return {"models": rows, "folder": str(getattr(handle, "name", ""))}


@command
async def open_folder_model(name: str) -> dict:
    """Choose a model of the opened folder: {"model", "params" (its Ollama defaults), "system"}."""
    async def blob_source(path, shown):
        return BlobSource(await SESSION.folder.file(path), shown)
    try:
        return {**await folder.choose_model(SESSION, name, blob_source), "images": _images(), "audio": _audio()}
    except EXPECTED as e:
        return _error(e, name, ollama_name=name)


@command
async def load(context_length: int = DEFAULT_CONTEXT, load_id: int = 0, gpu_memory=None, f16: bool = False,
               prompt_step=None) -> dict:
    """Upload the chosen model's weights to the GPU (progress events; cancel_load(load_id) stops it);
    f16: the prompt matmuls int8 does not take in f16 tiles where the device has shader-f16; prompt_step: the
    most prompt tokens a step reads (None: the model's default)."""
    if SESSION.model is None:
        return {"error": "Choose a model first"}
    SESSION.unload()
    if SESSION.device is None or SESSION.device_lost:
        try:   # after a device loss (driver reset, GPU process crash) a fresh device usually works
            SESSION.device = await get_device_async("browser")
        except GPUError as e:
            return {"error": "This browser gives the page no WebGPU device, so the model cannot run here: use a "
                             "recent Chrome or Edge with WebGPU on (see the message at the top of the page).",
                    "detail": str(e), "no_webgpu": True}
    try:
        t = time.perf_counter()
        eng = await run_async(model.load(SESSION, EVENTS, context_length=context_length, load_id=load_id,
                                         gpu_memory_mib=settings.gpu_budget(gpu_memory), f16=bool(f16),
                                         prompt_step=settings.prompt_step(prompt_step)))
    except Exception as e:
        return _error(e)
    return {"ready": True, "seconds": time.perf_counter() - t, "context_length": eng.context_length,
            "model": SESSION.model.info, "plan": eng.memory_plan.describe(eng.load_bytes_per_s),
            "plan_figures": model.plan_figures(eng.memory_plan), "adapter": adapters.loaded_adapter(SESSION),
            "images": _images(), "audio": _audio(), "drafter": _drafter(), "prompt_step": eng.runner.chunk}


@command
def cancel_load(load_id: int = 0) -> None:
    SESSION.cancelled_load = load_id


@command
def simulate_device_loss() -> dict:
    """For tests: destroy the GPU device, as a driver reset would (device.lost fires)."""
    if SESSION.device is not None:
        SESSION.device.device.destroy()
    return {}


# -- commands: LoRA adapter ------------------------------------------------------------------------

def _choose_adapter(g, name: str) -> dict:
    try:
        return {"adapter": adapters.choose_adapter(SESSION, g, name)}
    except LoraError as e:       # made for another model, or not a LoRA: said of the adapter and the model
        shown = SESSION.model.info.get("name", "this model")
        return {"error": explain_adapter(e, name, shown), "detail": str(e), "adapter_error": True}
    except EXPECTED as e:
        return _error(e, name)


@command
def open_adapter(blob, name: str = "") -> dict:
    """Choose a LoRA adapter (llama.cpp's GGUF format) for the chosen model; it applies from the next load."""
    try:
        src = BlobSource(blob, name)
        g = read_gguf(src)
    except EXPECTED as e:
        return _error(e, name or "the adapter")
    if g.metadata.get("general.type") != "adapter":
        return {"error": f"\u201c{src.name}\u201d is not a LoRA adapter (its general.type is "
                         f"{g.metadata.get('general.type')!r}): open models with Open a GGUF file.",
                "adapter_error": True}
    return _choose_adapter(g, src.name)


@command
def set_adapter(on: bool = True, scale=1.0) -> dict:
    """Switch the adapter on or off and set its scale: applied from the next reply, no reload."""
    try:
        return {"adapter": adapters.set_adapter(SESSION, on, scale)}
    except Refused as e:
        return _error(e)


@command
def remove_adapter() -> dict:
    """Forget the adapter; the page reloads the model without it."""
    adapters.remove_adapter(SESSION)
    return {}


# -- commands: images (pyapp.app.images) ----------------------------------------------------------------
# The page picks an image; the worker (web/worker.js prepare_image) decodes it, asks image_size for the size
# to resize to, resizes it (OffscreenCanvas) and hands the page the RGBA pixels, which it keeps with the
# conversation. add_image encodes them on the GPU when a message that holds them is sent: a message's
# content then names the image by the key add_image returns.

def _images() -> dict:
    """Whether the chosen model takes images here: {"takes", "encoder": "model" (its file holds one) |
    "projector" (the file the user added), "projector": that file's name, "why": words when it takes none,
    "budgets", "default_budget"}."""
    out = {"takes": False, "encoder": None, "projector": None, "why": "", "budgets": list(BUDGETS),
           "default_budget": DEFAULT_BUDGET}
    if SESSION.model is None:
        return {**out, "why": "no model is chosen"}
    if SESSION.model.info.get("denoise"):
        return {**out, "why": "DiffusionGemma models take text only"}
    try:
        g = images.encoder_file(SESSION)
        encoder_config(g)
    except VisionError as e:
        return {**out, "why": str(e)}
    added = g is SESSION.projector
    return {**out, "takes": True, "encoder": "projector" if added else "model",
            "projector": getattr(g.source, "name", "") if added else None}


def _sentence(words: str) -> str:
    words = words.strip()
    return (words[:1].upper() + words[1:]).rstrip(".") + "." if words else words


def _image_error(e: BaseException) -> dict:
    """An image's error in words: a refusal or a lost device as any command's; an image or encoder this app
    cannot take in its own words (pyapp.app.images' VisionError: not about the model file)."""
    if isinstance(e, Refused) or SESSION.device_lost or not isinstance(e, EXPECTED):
        return _error(e)
    return {"error": _sentence(str(e)), "image_error": True}


@command
def image_size(width: int, height: int, budget: int = DEFAULT_BUDGET) -> dict:
    """The size an image of width x height pixels is resized to for the chosen model, and its soft tokens:
    {"width", "height", "tokens"}."""
    try:
        return images.image_size(SESSION, int(width), int(height), int(budget))
    except Exception as e:
        return _image_error(e)


@command
async def add_image(pixels, width: int, height: int, budget: int = DEFAULT_BUDGET) -> dict:
    """Encode an image the worker resized (pixels: a Uint8Array of width x height RGBA8, at a size image_size
    gave) with the loaded model's image encoder, once per distinct pixels: {"key", "tokens"}. A message's
    content names it as {"type": "image", "key": key}."""
    if SESSION.engine is None:
        return {"error": "Load the model first: the loaded model reads the images."}
    width, height, budget = int(width), int(height), int(budget)
    n = int(pixels.byteLength)
    if n != 4 * width * height or n == 0:
        return {"error": f"The image's pixels ({n} bytes) are not those of a {width} x {height} image.",
                "image_error": True}
    dev = SESSION.device
    staging = None
    SESSION.clear_gpu_error()              # an error from before is not this image's
    try:
        digest = (await js.crypto.subtle.digest("SHA-256", pixels)).to_bytes()     # the pixels' key, from JS
        staging = dev.buffer(n, label="image pixels")
        dev.device.queue.writeBuffer(staging.handle, 0, pixels)        # JS -> GPU: the proxy is the Uint8Array
        image = await run_async(images.encode_image(SESSION, staging, width, height, budget, digest=digest))
        SESSION.check_gpu_accepted("the image")
    except Exception as e:
        return _image_error(e)
    finally:
        if staging is not None:
            staging.handle.destroy()           # the copy into the encoder is submitted: the GPU keeps it alive
    return {"key": image.key, "tokens": image.n}


def _file_for_the_model(blob, shown: str, kind: str, flag: str):
    """A file made for the chosen model (a projector, a drafter), parsed: (gguf, None), or (None, the page's
    error with `flag` set) when no model is chosen or the file is no GGUF."""
    if SESSION.model is None:
        return None, {"error": f"Choose the model first: \u201c{shown}\u201d is {kind}, made for one model.", flag: True}
    try:
        return read_gguf(BlobSource(blob, shown)), None
    except EXPECTED as e:
        return None, {**_error(e, shown), flag: True}


@command
def add_projector(blob, name: str = "") -> dict:
    """Add the chosen model's image and audio encoders from a projector file (llama.cpp's mmproj GGUF, clip.* keys):
    checked to be Gemma 4's and made for this model's width; a projector of the audio encoder alone serves the
    model's audio. {"images", "audio"} as the model's results say them."""
    shown = name or getattr(blob, "name", "") or "the projector"
    g, refused = _file_for_the_model(blob, shown, "a projector", "projector_error")
    if refused:
        return refused
    width, quoted = model_config(SESSION.model.gguf).hidden, f"\u201c{shown}\u201d"
    try:
        try:
            check_projector(g, width, quoted)
            encoder_config(g)
        except VisionError:
            if not holds_audio(g):
                raise
            serves_audio(g, width, quoted)          # an audio projector alone: this model's?
    except (VisionError, AudioError) as e:
        return {"error": _sentence(str(e)) + " Add the mmproj file published with this model.", "detail": str(e),
                "projector_error": True}
    SESSION.projector, SESSION.projector_name = g, shown
    SESSION.forget_encoders()      # the next image or clip loads this projector's encoder
    return {"images": _images(), "audio": _audio()}


@command
def remove_projector() -> dict:
    """Forget the projector added: the model takes images again only if its own file holds an encoder."""
    SESSION.projector = SESSION.projector_name = None
    SESSION.forget_encoders()
    return {"images": _images(), "audio": _audio()}


# -- commands: an assistant drafter (pyapp.app.model.add_drafter) ------------------------------------------

def _drafter() -> dict:
    """The drafter added for the chosen model, as the page shows it: its name, whether it is on the GPU, and the
    drafts a step it suggests (the page sets Speculative drafts to it when that is 0)."""
    loaded = SESSION.engine is not None and SESSION.engine.drafter is not None
    return {"name": SESSION.drafter_name, "loaded": loaded, "drafts": DRAFTER_DRAFTS}


@command
async def add_drafter(blob, name: str = "") -> dict:
    """Add an assistant drafter for the chosen model (gemma-4-*-it-assistant, llama.cpp's converter), checked to
    be made for it; on the GPU now if the model is loaded, else when it loads."""
    shown = name or getattr(blob, "name", "") or "the drafter"
    g, refused = _file_for_the_model(blob, shown, "an assistant drafter", "drafter_error")
    if refused:
        return refused
    try:
        await run_async(model.add_drafter(SESSION, g, shown))
    except ConfigError as e:
        return {"error": f"{_sentence(str(e))} Add the assistant drafter published with this model "
                         "(gemma-4-\u2026-it-assistant).", "detail": str(e), "drafter_error": True}
    except EXPECTED as e:
        kept = {"drafter": _drafter()} if SESSION.drafter is g else {}    # (too big for the plan: loads with the model)
        return {**_error(e, shown), "drafter_error": True, **kept}
    return {"drafter": _drafter()}


@command
def remove_drafter() -> dict:
    """Forget the drafter added: speculative replies draft by prompt lookup again."""
    model.remove_drafter(SESSION)
    return {"drafter": _drafter()}


# -- commands: audio (pyapp.app.audio) ---------------------------------------------------------------------
# The page records a clip or decodes a file, resamples it to 16 kHz mono with Web Audio (web/audio.js) and keeps
# the samples with the conversation. add_audio has the GPU compute their log-mel features and soft tokens (the
# page says "Preparing audio…" meanwhile) when a message that holds the clip is sent: a message's content then
# names the clip by the key add_audio returns.

def _audio() -> dict:
    """Whether the chosen model hears audio here: {"takes", "why": words when it does not, "max_seconds",
    "sample_rate"}."""
    out = {"takes": False, "why": "", "max_seconds": features.MAX_SECONDS, "sample_rate": features.SAMPLE_RATE}
    if SESSION.model is None:
        return {**out, "why": "no model is chosen"}
    if SESSION.model.info.get("denoise"):
        return {**out, "why": "DiffusionGemma models take text only"}
    try:
        audio.encoder_file(SESSION)
    except AudioError as e:
        return {**out, "why": str(e)}
    return {**out, "takes": True}


def _clip(samples) -> array:
    """A clip's samples as floats: a JS Float32Array (its bytes) or, natively, bytes of float32."""
    data = samples.to_bytes() if hasattr(samples, "to_bytes") else bytes(samples)
    clip = array("f")
    if len(data) % clip.itemsize:
        raise AudioError(f"a clip's samples are float32: {len(data)} bytes are not a whole number of them")
    clip.frombytes(data)
    if sys.byteorder != "little":
        clip.byteswap()
    if not all(math.isfinite(x) for x in clip):
        raise AudioError("the clip holds samples that are not numbers (NaN or infinite)")
    return clip


@command
def clip_tokens(n_samples: int) -> dict:
    """The soft tokens a clip of n_samples (16 kHz) takes: {"tokens"}; a clip too short to hear is an error."""
    try:
        return {"tokens": audio.clip_tokens(min(int(n_samples), features.MAX_SAMPLES))}
    except AudioError as e:
        return {"error": _sentence(str(e)), "audio_error": True}


@command
async def add_audio(samples) -> dict:
    """Encode a clip the page resampled (samples: a Float32Array of 16 kHz mono, at most 30 s) with the loaded
    model's audio encoder, once per distinct samples: {"key", "tokens"}. A message's content names it as
    {"type": "audio", "key": key}."""
    if SESSION.engine is None:
        return {"error": "Load the model first: the loaded model hears the clips."}
    SESSION.clear_gpu_error()              # an error from before is not this clip's
    try:
        clip = _clip(samples)
        encoded = await run_async(audio.encode_clip(SESSION, clip))
        SESSION.check_gpu_accepted("the clip")
    except AudioError as e:
        if SESSION.device_lost:
            return _error(e)
        return {"error": _sentence(str(e)), "audio_error": True}
    except Exception as e:
        return _error(e)
    return {"key": encoded.key, "tokens": encoded.n}


# -- commands: replies -------------------------------------------------------------------------------

@command
def stop() -> None:
    SESSION.stop_requested = True


@command
async def chat(messages_json: str, params_json: str) -> dict:
    """Generate the next assistant reply for a conversation; tokens (DiffusionGemma: denoising steps too)
    stream as events. The page keeps the reply's ids + vocab and sends them back with the conversation: the
    next prompt then extends the cache."""
    if SESSION.engine is None:
        return {"error": "No model loaded"}
    messages, p = json.loads(messages_json), json.loads(params_json)
    thinking = bool(p.pop("thinking", False))
    try:
        return await run_async(reply(SESSION, messages, p, thinking=thinking, events=EVENTS))
    except Exception as e:
        return _error(e)


@command
def count_tokens(messages_json: str) -> dict:
    return _count_tokens(SESSION, json.loads(messages_json))


@command
async def logits(tokens_json: str) -> dict:
    """Logits for a token sequence (tests compare them with golden files)."""
    if SESSION.engine is None:
        return {"error": "No model loaded"}
    try:
        rows = await run_async(_logits(SESSION, json.loads(tokens_json)))
    except EXPECTED as e:
        return _error(e)
    return {"rows": rows.tolist()}


@command
async def generate_tokens(tokens_json: str, params_json: str = "{}") -> dict:
    """Token ids generated after a raw token sequence, from an empty cache (tests: golden outputs)."""
    if SESSION.engine is None:
        return {"error": "No model loaded"}
    p = json.loads(params_json)
    try:
        params = settings.sampling_params(p)
        res = await run_async(generate(SESSION, json.loads(tokens_json), params, stop_ids=()))
    except EXPECTED as e:
        return _error(e)
    return {"tokens": list(res.tokens), "stop_reason": res.stop_reason, "drafted": res.drafted, "accepted": res.accepted}


# -- commands: DiffusionGemma's tests ----------------------------------------------------------------

def _diffusion_refused() -> dict | None:
    try:
        diffusion_engine(SESSION)
    except Refused as e:
        return _error(e)
    return None


@command
async def diffusion_logits(prompt_json: str, canvas_json: str, prev_json: str = "null", blocks_json: str = "[]"
                           ) -> dict:
    """One denoising step's logits [canvas, vocab] after encoding the prompt (and committed blocks) from an empty
    cache; prev: the previous step's processed logits, rows of floats (tests compare them with golden files)."""
    if (refused := _diffusion_refused()):
        return refused
    prev = json.loads(prev_json)
    prev_bytes = None if prev is None else array("f", [x for row in prev for x in row]).tobytes()
    try:
        rows = await run_async(_diffusion_logits(SESSION, json.loads(prompt_json), json.loads(canvas_json),
                                                 prev_bytes, json.loads(blocks_json)))
    except EXPECTED as e:
        return _error(e)
    return {"rows": rows.tolist()}


@command
async def denoise_tokens(prompt_json: str, params_json: str = "{}", draws_json: str = "null") -> dict:
    """One generation from an empty cache with DenoiseParams' fields (the model's defaults for the rest) and, when
    given, recorded random draws {init, sample, renoise} (ReplayDraws): every step's decisions (tests replay
    transformers' generate)."""
    if (refused := _diffusion_refused()):
        return refused
    p, d = json.loads(params_json), json.loads(draws_json)
    if "eos_ids" in p:
        p["eos_ids"] = tuple(p["eos_ids"])
    try:
        res = await run_async(replay(SESSION, json.loads(prompt_json), p, d))
    except EXPECTED as e:
        return _error(e)
    return {"tokens": res.tokens, "steps": res.steps, "argmax": res.argmax,
            "accepted": [[1 if a else 0 for a in row] for row in res.accepted], "stop_reason": res.stop_reason,
            "tokens_per_forward": res.tokens_per_forward()}


# -- commands: the Fine-tune panel (pyapp.app.finetune) ----------------------------------------------

@command
def train_options() -> dict:
    """The panel's presets, targets and field rules."""
    return finetune.options()


@command
def train_data(blob, name: str = "", fields_json: str = "{}") -> dict:
    """Read a training file (blob None: the one read before, with changed settings): its statistics and
    warnings, for the panel to show before Start."""
    try:
        source = BlobSource(blob, name) if hasattr(blob, "size") else None     # JS null: None
        return finetune.preview(SESSION, source, name, json.loads(fields_json))
    except Exception as e:
        return _error(e)


@command
def train_start(fields_json: str = "{}") -> dict:
    """Make the run's Trainer: the updates it plans and the data it trains on."""
    try:
        return finetune.start(SESSION, json.loads(fields_json))
    except Exception as e:
        return _error(e)


@command
async def train_step() -> dict:
    """One update of the run (the page calls again for the next, or train_finish)."""
    try:
        return await finetune.step(SESSION)
    except Exception as e:
        return _error(e)


@command
async def train_finish() -> dict:
    """End the run: the adapter GGUF of its best parameters (bytes: the page keeps and offers it) and the
    log; the trainer's GPU memory is freed, the model stays loaded."""
    try:
        return await finetune.finish(SESSION)
    except Exception as e:
        return _error(e)
