"""Loading: a GGUF onto the GPU under a memory plan, as its family (pyapp.families) declares.

    plan(gguf, limits, ...)          the family, its config, the bound weights and the MemoryPlan loading
                                     would follow, without a GPU (the page shows it before anything is uploaded)
    load(dev, gguf, ...)             steps: the plan, the LoRA adapters, every resident tensor copied to the
                                     GPU, the family's runner and the plans a generation uses; returns the
                                     family's engine (pyapp.engine.Engine unless it declares its own)

Written once as generators of requests (pyapp.runtime.requests), driven natively by Engine.open and in
the browser by Engine.open_async.
"""

from __future__ import annotations

import time

from ..errors import Fault
from ..gguf import GGUFError
from ..gpu import GPUError
from ..families import family_for
from ..model.config import ConfigError
from ..model.lora import LoraError, load_lora
from ..model.weights import WeightsError, bind
from ..runtime.adapters import GpuAdapters
from ..runtime.loaded import EngineError
from ..runtime.memory import PlanError, plan_memory
from ..runtime.requests import ProgramsReady
from ..runtime.runner import LONG_STEP, PROMPT_STEP
from ..runtime.upload import ModelError, binding_limit, perform, plan_uploads
from ..sampling import check_context_length
from ..source import SourceError

# The most tokens one prefill step takes. Long prompts need wide steps to fill a big GPU (on an
# H100, E2B prefill: 928 tok/s in steps of 64, 3026 in steps of 512; a 16,000-token prompt 3.26 s in steps
# of 512, 2.98 in 1024, 2.79 in 2048, for 242 / 724 MiB more GPU memory: bench/RESULTS.md); short ones
# take a 64-token plan. Without a --prompt-step, a context longer than LONG_STEP takes steps of LONG_STEP
# where the memory plan has room for their activations (long_step); prompts shorter than that still run
# in the DEFAULT_CHUNK plan (pyapp.runtime.runner: a plan per step size).
DEFAULT_CHUNK = PROMPT_STEP
MAX_CHUNK = 16384


def default_chunk(cfg) -> int:
    """DEFAULT_CHUNK, or more where a step must hold a whole image (its soft tokens attend each other both
    ways: 26B-A4B, 31B; Gemma4Config.whole_image_tokens)."""
    return max(DEFAULT_CHUNK, getattr(cfg, "whole_image_tokens", 0))


def check_chunk(chunk) -> int:
    """A prompt step's size (the CLI's --prompt-step): a whole number of tokens from 1 to MAX_CHUNK."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
        raise EngineError(f"a prompt step must be a whole number of tokens from 1 to {MAX_CHUNK}, got {chunk!r}")
    return chunk


def _mib(n: float | None) -> int | None:
    """MiB (fractions allowed: tests give tiny models tiny caches) -> bytes; EngineError for a size that is
    not a finite number of at least 0 (the CLI's --gpu-memory / --expert-cache and the page's field alike)."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not 0 <= n <= 1 << 40:   # NaN fails here too
        raise EngineError(f"a GPU memory size must be a number of MiB from 0 to {1 << 40}, got {n!r}")
    return int(n * 2**20)


def _check_context_fits(limits: dict, cfg, ctx: int) -> None:
    """Each global layer's K and V caches hold the whole context in one GPU binding
    (pyapp.runtime.state): refuse a context the GPU cannot bind before any upload."""
    per_token = max((4 * lc.n_kv_heads * lc.head_dim for lc in cfg.layers if lc.owns_kv and not lc.sliding),
                    default=0)
    limit = binding_limit(limits)
    if per_token and ctx * per_token > limit:
        raise EngineError(f"a context of {ctx} tokens needs {ctx * per_token / 2**20:,.0f} MiB of KV cache per "
                          f"layer in one GPU buffer; this GPU binds at most {limit / 2**20:,.0f} MiB: choose a "
                          f"context of at most {limit // per_token} tokens", fault=Fault.DOES_NOT_FIT)


def plan(gguf, limits: dict, context_length: int | None = None, chunk: int | None = None,
         gpu_memory_mib: float | None = None, expert_cache_mib: float | None = None, ple_in_file: bool | None = None,
         beside: int = 0, int8: bool = True):
    """(family, config, bound weights, MemoryPlan) of a load with these options (see load), without a GPU.
    chunk: the most tokens a prefill step takes (None: default_chunk, or LONG_STEP where long_step allows;
    the plan's prompt_step says which)."""
    family = family_for(gguf)
    try:
        cfg = family.config.from_gguf(gguf)
        chosen = chunk is not None
        chunk = check_chunk(chunk) if chosen else default_chunk(cfg)
        bound = bind(cfg, gguf.tensors)
        ctx = check_context_length(context_length, cfg.context_length)
        _check_context_fits(limits, cfg, ctx)

        def memory(step: int):
            return plan_memory(limits, cfg, bound, ctx, step, _mib(gpu_memory_mib), _mib(expert_cache_mib),
                               ple_in_file, state_class=family.runner.state_class, beside=beside, int8=int8)
        mem = memory(chunk)
        if not chosen and chunk < LONG_STEP < ctx:
            mem = long_step(mem, memory, binding_limit(limits))
    except (ConfigError, WeightsError, ModelError, PlanError, GPUError) as e:
        raise EngineError(str(e)) from e
    return family, cfg, bound, mem


def long_step(mem, memory, binding: int):
    """The plan with prompt steps of LONG_STEP tokens where it costs nothing but GPU memory the budget has
    spare: the same experts cached and the per-layer embeddings in the same place (no budget: everything
    resident, as fast as it gets), and no activation buffer past what the device allows (its largest buffer,
    or one it binds whole: `binding` bytes) that the usual step's stays within; else `mem`, the model's usual
    step. memory(step): the plan for a step."""
    try:
        wide = memory(LONG_STEP)
    except (PlanError, GPUError):          # over the budget, or a buffer over the device's largest
        return mem
    if wide.largest_state_buffer > max(binding, mem.largest_state_buffer):
        return mem
    return wide if (wide.slots, wide.ple_in_file) == (mem.slots, mem.ple_in_file) else mem


def load(dev, gguf, next_token_engine, context_length: int | None, chunk: int | None, progress, cancelled,
         gpu_memory_mib: int | None = None, expert_cache_mib: int | None = None,
         ple_in_file: bool | None = None, on_plan=None, lora=(), int8: bool = True, f16: bool = False,
         beside: int = 0, compiling=None):
    """Steps: plan the memory and the layout, copy every resident tensor to the GPU, build the
    plans; returns the engine. gpu_memory_mib: the GPU memory budget (None: everything
    resident); expert_cache_mib: the streamed experts' cache, directly; ple_in_file: keep the
    per-layer embedding table (E2B/E4B) in the file, one row read per token (None: the plan
    decides); on_plan(MemoryPlan) sees the plan before anything is uploaded; lora: [(adapter, user
    scale)], each adapter a path, a synchronous ByteSource or a parsed GGUF of llama.cpp's LoRA format
    (pyapp.model.lora), applied in every projection it targets (set_lora_scale changes a scale);
    int8: steps of more than 64 tokens multiply Q4_K, Q4_0, Q5_0 and Q8_0 weights by int8 activations,
    and one-token steps their Q4_K matvecs and experts (K.int8_matvec), as llama.cpp does (faster prefill
    and decode, logits within int8's rounding); False keeps every matmul and matvec in f32.
    f16: the chunk matmuls int8 does not take (other weight types, steps of at most 64 tokens) in f16
    tiles where the device has shader-f16 (K.MatmulTile.half: activations rounded to f16, so they must stay
    within +-65504); False (default): in f32. beside: bytes the caller loads on the GPU beside the model (an
    assistant drafter: pyapp.app.model, gpu_bytes of pyapp.families.gemma4_assistant): the plan counts them within
    the budget (MemoryPlan.beside); loading them stays the caller's. compiling(done, made): the GPU programs
    compiled so far, while the load waits for them (the browser's; natively they are compiled when made).
    next_token_engine: the engine class of the families that declare none (pyapp.engine.Engine)."""
    family, cfg, bound, mem = plan(gguf, dev.limits, context_length, chunk, gpu_memory_mib, expert_cache_mib,
                                   ple_in_file, beside, int8)
    try:
        adapters = [load_lora(src, cfg, bound, scale, gguf.architecture) for src, scale in lora]
    except (LoraError, GGUFError, SourceError, OSError) as e:
        raise EngineError(f"LoRA adapter: {e}") from e
    if on_plan:
        on_plan(mem)
    try:
        layout, uploads = plan_uploads(dev, cfg, bound, mem.ple_in_file, mem.slots)
    except GPUError as e:
        raise EngineError(f"out of GPU memory while allocating the weights ({mem.total / 2**20:,.0f} MiB "
                          f"planned): {e}. Set a GPU memory budget (--gpu-memory) below what the GPU "
                          "has free.", fault=Fault.DOES_NOT_FIT) from e
    except ModelError as e:
        raise EngineError(str(e)) from e

    total, done, t0 = sum(u.n for u in uploads), 0, time.perf_counter()
    for u in uploads:
        if cancelled and cancelled():
            raise EngineError("loading cancelled")
        try:
            yield from perform(dev, u)
        except ModelError as e:
            raise EngineError(str(e)) from e
        done += u.n
        if progress:
            progress(done, total, time.perf_counter() - t0)
    load_s = time.perf_counter() - t0

    try:
        gpu_adapters = None
        if adapters:
            gpu_adapters = GpuAdapters(dev, adapters)
            gpu_adapters.attach(layout)        # before the plans are recorded: they include the deltas
        runner = family.runner(dev, cfg, layout, gguf.source, mem.context_length, mem.prompt_step, expert_slots=mem.slots,
                               int8=int8, f16=f16)
        runner.prepare()
        yield ProgramsReady(compiling, cancelled)    # a load is done when its programs are, not at the first reply
        if cancelled and cancelled():
            raise EngineError("loading cancelled")
    except ModelError as e:
        raise EngineError(str(e)) from e
    except GPUError as e:
        raise EngineError(f"the GPU rejected the model: {e}") from e
    engine_class = family.engine or next_token_engine
    return engine_class(dev, gguf, runner, family, memory_plan=mem, adapters=gpu_adapters,
                        load_bytes_per_s=total / load_s if load_s > 0 else 0.0)
