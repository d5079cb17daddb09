"""The app's settings (pyapp.sampling's names: the page's fields) as the engine's parameters, and back.

The page sends its settings as one dict ({"temperature": 0.7, "max_tokens": 256, "denoise_steps": 32,
...}); the CLI builds the same parameters from its flags. Either way a bad value is refused with a
message naming it (ParamError, DenoiseError).
"""

from __future__ import annotations

import dataclasses

from ..families.diffusion_gemma import DenoiseParams
from ..gpu import software_adapter
from ..sampling import DENOISE_SETTINGS, SamplingParams, check_temperature_range, denoise_settings


def sampling_defaults(ollama_params: dict | None = None) -> dict:
    """The sampling settings' defaults from SamplingParams, the one definition (the page has none): its
    own, or those of a model's Ollama params layer."""
    return dataclasses.asdict(SamplingParams.from_ollama(ollama_params))


def sampling_params(settings: dict) -> SamplingParams:
    """The settings as SamplingParams (the keys it has; the rest are other settings), checked there."""
    return SamplingParams(**{k: v for k, v in settings.items() if k in SamplingParams.__dataclass_fields__})


def denoise_defaults(d: DenoiseParams) -> dict:
    """DenoiseParams as settings (DENOISE_SETTINGS' names) with its max new tokens as max_tokens; the GGUF
    keeps float32s: shown rounded (0.3, not 0.30000001192092896)."""
    out = {name: getattr(d, field) for name, (field, _, _) in DENOISE_SETTINGS.items()}
    return {**{k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in out.items()},
            "max_tokens": d.max_new_tokens}


def denoise_params(cfg, fields: dict, max_new_tokens: int | None = None, seed: int | None = 0) -> DenoiseParams:
    """One DiffusionGemma generation's settings: the model's defaults (its GGUF's diffusion.* keys) with the
    DenoiseParams fields given over them (None keeps a default), at most max_new_tokens (None: the model's),
    checked (DenoiseError names the bad one)."""
    d = DenoiseParams.from_config(cfg, **fields)
    if max_new_tokens is not None:
        d.max_new_tokens = max_new_tokens
    d.seed = seed
    d.validate()
    return d


def denoise_params_from_settings(cfg, settings: dict, room: int) -> DenoiseParams:
    """The settings for a DiffusionGemma reply: the model's defaults, overridden by the DiffusionGemma
    fields given, checked in the settings' own words (ParamError); max_tokens and seed as for Gemma 4
    (room: the most tokens the context has left)."""
    s = sampling_params(settings)
    fields = denoise_settings(settings)
    given = DenoiseParams.from_config(cfg, **fields)
    check_temperature_range(given.t_min, given.t_max)
    return denoise_params(cfg, fields, max(1, int(min(s.token_limit, room))), s.seed)


# WebGPU does not tell a page how much memory the GPU has: the budget is a setting. Its default
# suits an 8 GB GPU (a CPU adapter such as SwiftShader borrows system memory: less).
DEFAULT_GPU_MEMORY_MIB = 6144
CPU_ADAPTER_GPU_MEMORY_MIB = 2048


def default_gpu_memory(info: dict) -> int:
    """The GPU memory setting's default for an adapter (its WebGPU adapter info)."""
    return CPU_ADAPTER_GPU_MEMORY_MIB if software_adapter(info) else DEFAULT_GPU_MEMORY_MIB


def prompt_step(value) -> int | None:
    """The page's prompt step setting: None (empty or 0) for the model's default, else a whole number of tokens
    from 1 to MAX_CHUNK (EngineError otherwise)."""
    from ..engine.loading import check_chunk
    if value in (None, "", 0, "0"):
        return None
    return check_chunk(int(value) if isinstance(value, str) and value.isdigit() else value)


def gpu_budget(gpu_memory) -> float | None:
    """The GPU memory setting in MiB; 0 or empty: no budget (everything on the GPU)."""
    return float(gpu_memory) if gpu_memory not in (None, "") and float(gpu_memory) > 0 else None
