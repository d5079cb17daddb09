"""The engine: loading, the step loop, speculation; written once, driven sync or async.

    engine.py        Engine: Engine.open / open_async (the door: a GGUF onto the GPU), generate, forward
    loading.py       the memory plan, the uploads, the runner and its plans
    decode.py        the next-token step loop (prefill, decode ahead)
    speculative.py   the same loop with prompt-lookup drafts checked in one step

What every engine is built on, returns and raises (LoadedModel, GenerationResult, EngineError) is
pyapp.runtime.loaded's; benchmarks are bench/engine_bench.py's, through this public API.
"""

from ..runtime.loaded import EngineError, GenerationResult, LoadedModel
from ..sampling import DEFAULT_CONTEXT, ParamError, SamplingParams, check_context_length
from .engine import Engine
from .loading import DEFAULT_CHUNK, LONG_STEP

__all__ = ["DEFAULT_CHUNK", "DEFAULT_CONTEXT", "Engine", "EngineError", "GenerationResult", "LONG_STEP", "LoadedModel",
           "ParamError", "SamplingParams", "check_context_length"]
