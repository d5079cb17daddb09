"""Open a model: a GGUF chosen (its header read and described, its chat style), then loaded onto the GPU
with the memory options and the LoRA adapters chosen for it.

    model.choose(session, gguf, name)                    # the page: a file, or an Ollama folder's model
    engine = run(model.load(session, events, context_length=4096, gpu_memory_mib=6144))
"""

from __future__ import annotations

import time

from .. import ollama
from ..chat import style_for
from ..families.diffusion_gemma import DenoiseParams
from ..engine import Engine
from ..gguf import summarize
from ..families import model_config
from ..model.forms import file_form
from ..steps import Steps, call
from .events import Events
from .session import ChosenModel, Refused, Session
from .settings import denoise_defaults

TEST_MODEL_MAX_TOKENS = 64      # the default max tokens of a test model (random weights): a short reply shows it


def chat_style(gguf, n_params: int | None = None):
    """The prompt format a model's GGUF asks for: its own template's, else its size's (n_params: its
    parameter count, when known)."""
    if n_params is None:
        n_params = summarize(gguf)["n_elements"]
    return style_for(gguf.metadata, n_params)


def describe(g, source_name: str) -> dict:
    """What the page shows of a model file (and decides by): name, quantization, size, context, the parts it
    holds, whether it is a test model, a mixture of experts, has per-layer embeddings (the fine-tuning
    targets it offers), and a DiffusionGemma model's sampler defaults (None for Gemma 4). ConfigError when it
    is not a model this app runs."""
    cfg = model_config(g)
    s = summarize(g)
    main_type = max(s["by_type"].items(), key=lambda kv: kv[1]["bytes"])[0] if s["by_type"] else "?"
    ft = g.metadata.get("general.file_type")
    form = file_form(g.metadata, g.tensors)
    line = cfg.describe()
    if cfg.is_diffusion:
        line = f"DiffusionGemma (text diffusion): {line}, canvas {cfg.canvas_length}"
    return {"name": g.metadata.get("general.name") or source_name, "file": source_name,
            "parts": list(form.parts), "converter": form.converter,
            "architecture": g.architecture, "quantization": ollama.file_type_name(ft) or main_type,
            "parameters": s["n_elements"], "parameter_size": ollama.human_number(s["n_elements"]),
            "bytes": s["total_bytes"], "context_length": cfg.context_length, "config": line,
            "test_model": "test model" in str(g.metadata.get("general.name", "")) or "demo" in source_name.lower(),
            "moe": cfg.is_moe, "ple": cfg.has_ple,
            "denoise": denoise_defaults(DenoiseParams.from_config(cfg)) if cfg.is_diffusion else None}


def choose(session: Session, g, info: dict | None = None) -> ChosenModel:
    """Make a model the session's (info: what describe() says of it, when the front door shows it): the one
    loaded before is let go, and so are the adapter and the image projector added (made for another model)."""
    info = info or {}
    session.unload()
    session.model = ChosenModel(g, info, chat_style(g, info.get("parameters")))
    session.adapter = None
    session.projector = session.projector_name = session.ollama_projector = None
    session.drafter = session.drafter_name = None
    return session.model


def load(session: Session, events: Events | None = None, *, context_length: int | None = None,
         gpu_memory_mib: float | None = None, expert_cache_mib: float | None = None, ple_in_file: bool | None = None,
         int8: bool = True, f16: bool = False, lora: list | None = None, load_id: int | None = None,
         prompt_step: int | None = None) -> Steps:
    """Steps: the chosen model's weights onto the session's GPU (natively, a device of its own when it has
    none), with the chosen adapter (lora: these [(adapter, scale)] instead). Events: the memory plan before
    anything is uploaded, then the upload's progress. prompt_step: the most tokens a prompt step takes (None:
    the engine's default). load_id: the page's number for this load; cancelling
    it (session.cancelled_load) stops the upload. Returns the Engine, now the session's; a GPU that rejected
    a buffer or a kernel is a GPUError, with nothing loaded."""
    events = events or Events()
    model = session.chosen()
    session.unload()
    session.clear_gpu_error()
    last = [0.0]

    def progress(done, total, elapsed):
        now = time.perf_counter()
        if now - last[0] > 0.1 or done == total:
            last[0] = now
            rate = done / elapsed if elapsed > 0 else 0
            events.progress(done=done, total=total, eta=(total - done) / rate if rate else -1)

    cancelled = None if load_id is None else (lambda: session.cancelled_load == load_id)
    beside = 0
    if session.drafter is not None:  # its bytes by the device's own limits (natively the first load opens it here)
        if session.device is None:
            from ..gpu import get_device
            session.device = get_device("native")
        beside = drafter_bytes(session, session.device.limits, context_length)
    engine = yield call(Engine.open, model.gguf, device=session.device, context_length=context_length,
                        chunk=prompt_step, progress=progress, cancelled=cancelled, gpu_memory_mib=gpu_memory_mib,
                        expert_cache_mib=expert_cache_mib, ple_in_file=ple_in_file, on_plan=events.plan,
                        lora=session.lora() if lora is None else lora, int8=int8, f16=f16, beside=beside,
                        compiling=events.compiling)
    session.engine, session.device = engine, engine.dev
    try:
        session.check_gpu_accepted("the model")
        if session.drafter is not None:
            yield from _attach_drafter(session)
    except Exception:                # the load fails whole (a drafter stays chosen: removing it lets the model load)
        session.unload()
        raise
    return engine


def add_drafter(session: Session, g, name: str | None = None) -> Steps:
    """Steps: an assistant drafter (a parsed `gemma4-assistant` GGUF: gemma-4-*-it-assistant) for the chosen
    model, on the GPU beside it now if it is loaded, else when it loads; its speculative replies then draft with
    it (prompt lookup still where the text repeats). A file that is no drafter, or a drafter made for another
    model, is refused (ConfigError, in a sentence) and nothing changes. Under a GPU memory budget the model's
    plan counts a drafter chosen before it loads; one added to a loaded model that does not fit what its plan
    left of the budget stays chosen, not loaded, and Refused says so: it loads with the model, whose
    plan then makes room for it, the next time the model loads."""
    from ..families.gemma4_assistant.config import DrafterConfig
    DrafterConfig.from_gguf(g).check_target(model_config(session.chosen().gguf))
    session.drafter, session.drafter_name = g, name
    if session.engine is not None:
        session.engine.drafter = None                # (a drafter added before: its plans go)
        _check_drafter_fits(session)
        try:
            yield from _attach_drafter(session)
        except Exception:
            remove_drafter(session)
            raise


def drafter_bytes(session: Session, limits: dict, context_length: int | None) -> int:
    """The GPU bytes of the drafter added for the chosen model, loaded beside it in that context (None: the
    model's own), for its memory plan (Engine.open's and Engine.plan's `beside`); 0 without one."""
    from ..families.gemma4_assistant.runner import gpu_bytes
    from ..sampling import check_context_length
    if session.drafter is None:
        return 0
    cfg = model_config(session.chosen().gguf)
    return gpu_bytes(limits, session.drafter, cfg, check_context_length(context_length, cfg.context_length))


def _check_drafter_fits(session: Session) -> None:
    """The drafter just added to the loaded model within what its memory plan left of the GPU memory budget
    (with the room it planned for a drafter, if it did), or Refused: how much it needs and what to do."""
    from ..runtime.memory import size
    plan = session.engine.memory_plan
    if plan is None or plan.budget is None:
        return
    need = drafter_bytes(session, session.engine.dev.limits, plan.context_length)
    left = plan.budget - (plan.total - plan.beside)
    if need > left:
        raise Refused(f"The assistant drafter needs {size(need)} of GPU memory; the model's plan leaves "
                      f"{size(max(0, left))} of the {size(plan.budget)} budget. It stays added and loads with the "
                      "model: load the model again, and its plan counts the drafter (more experts or the per-layer "
                      "embeddings may stay in the file), or raise GPU memory (MiB) first.")


def remove_drafter(session: Session) -> None:
    """Forget the drafter added: speculative replies draft by prompt lookup again."""
    session.drafter = session.drafter_name = None
    if session.engine is not None:
        session.engine.drafter = None


def _attach_drafter(session: Session) -> Steps:
    """Steps: the session's drafter loaded on the GPU beside its engine, the engine's draft source."""
    from ..families.gemma4_assistant.runner import GpuDrafter
    from ..families.gemma4_assistant.source import GpuDrafts
    from ..sampling import DRAFTER_DRAFTS
    engine = session.engine
    session.clear_gpu_error()
    drafter = yield call(GpuDrafter.open, session.device, session.drafter, engine.runner)
    drafter.prepare(DRAFTER_DRAFTS)
    session.check_gpu_accepted("the drafter")
    engine.drafter = GpuDrafts(drafter)


def plan_figures(plan) -> dict:
    """A memory plan's figures for the page's bar: the parts on the GPU (weights, experts or their cache,
    activations and KV cache, an assistant drafter beside the model) and what stays in the file (experts that stream, the per-layer embeddings when
    they stay there). Experts all resident are on the GPU, never in the file."""
    ple_resident = 0 if plan.ple_in_file else plan.ple_table
    return {"total": plan.total, "budget": plan.budget, "streams": plan.streams, "minimum": plan.minimum,
            "expert_each": plan.expert_each, "n_experts": plan.n_experts, "slots": plan.slots,
            "weights": plan.weights + ple_resident, "experts": 0 if plan.streams else plan.experts,
            "expert_cache": plan.expert_cache, "state": plan.state, "drafter": plan.beside,
            "resident": plan.total - plan.expert_cache,
            "in_file": (plan.experts - plan.expert_cache if plan.streams else 0)
                       + (plan.ple_table if plan.ple_in_file else 0)}
