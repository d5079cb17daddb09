"""DiffusionGemma's hyperparameters and generation defaults, read from its GGUF's metadata.

tools/convert_diffusion_gemma.py writes `diffusion-gemma` GGUFs: Gemma 4 26B-A4B's keys and tensor
names under another architecture name, plus `diffusion-gemma.diffusion.*` (canvas length, generation
defaults) and the extra tensors of shared/notes/diffusion_gemma.md, declared in .weights (the
classes `weights_classes` names). The Gemma 4 keys are read as Gemma4Config reads
them (one text stack: the causal encoder over the prompt and the bidirectional decoder over the canvas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...model.config import (ARRAYS, DIFFUSION_ARCH, MAX_CONTEXT, ConfigError, Gemma4Config, Keys, show)

ARCH = DIFFUSION_ARCH        # the name next-token code refuses (pyapp.model.config) is this family's
MAX_STEPS = 1 << 16          # denoising steps per block (the real model's default is 48)


@dataclass(frozen=True)
class DiffusionGemmaConfig(Gemma4Config):
    """A DiffusionGemma GGUF: the Gemma 4 fields (one text stack, run as a causal encoder over the prompt and
    as a bidirectional decoder over the canvas), the self-conditioning MLP's width and the generation
    defaults of `diffusion-gemma.diffusion.*` (shared/notes/diffusion_gemma.md (a), (d))."""
    self_cond_ffn_dim: int = 0            # the self-conditioning MLP's width (the dense MLP's)
    canvas_length: int = 256              # C: the decoder always refines C tokens
    max_new_tokens: int = 256
    max_denoising_steps: int = 48
    t_min: float = 0.4                    # temperature of the last step is t_min + (t_max - t_min) / steps
    t_max: float = 0.8                    # ... and of the first one t_max
    entropy_bound: float = 0.1
    stability_threshold: int = 1
    confidence_threshold: float = 0.005

    is_diffusion: ClassVar[bool] = True

    @classmethod
    def weights_classes(cls) -> tuple[type, type]:
        from .weights import DiffusionLayerWeights, DiffusionWeights
        return DiffusionWeights, DiffusionLayerWeights

    def weight_sizes(self) -> dict:
        return {"self_cond_ff": self.self_cond_ffn_dim}

    @classmethod
    def _architecture(cls, arch) -> str:
        if arch != ARCH:
            raise ConfigError(f"architecture is {show(arch)}, not {ARCH!r}: not a DiffusionGemma model")
        return ARCH

    @classmethod
    def _make(cls, k: Keys, ffn: list[int], **values) -> "DiffusionGemmaConfig":
        if len(set(ffn)) != 1:            # HF has one intermediate_size, for the dense MLPs and self-conditioning
            k.fail("feed_forward_length", ffn, "must be one width for every layer")
        if not values["n_experts"]:
            k.fail("expert_count", 0, "DiffusionGemma has experts in every layer")
        d = "diffusion."
        if k.raw(d + "shift_logits", False) not in (0, False):
            k.fail(d + "shift_logits", k.raw(d + "shift_logits", False), "must be false (logit j scores canvas "
                   "position j)")
        t_min, t_max = k.number(d + "t_min", 0.4), k.number(d + "t_max", 0.8)
        if t_min > t_max:
            k.fail(d + "t_min", t_min, f"must be at most {d}t_max ({t_max:g})")
        return cls(
            **values,
            self_cond_ffn_dim=ffn[0],
            canvas_length=k.integer(d + "canvas_length", 1, MAX_CONTEXT),
            max_new_tokens=k.integer(d + "max_new_tokens", 1, MAX_CONTEXT, 256),
            max_denoising_steps=k.integer(d + "max_denoising_steps", 1, MAX_STEPS, 48),
            t_min=t_min, t_max=t_max,
            entropy_bound=k.number(d + "entropy_bound", 0.1, zero_ok=True),
            stability_threshold=k.integer(d + "stability_threshold", 0, MAX_STEPS, 1),
            confidence_threshold=k.number(d + "confidence_threshold", 0.005, zero_ok=True),
        )


def diffusion_summary(meta: dict) -> str | None:
    """One line on a DiffusionGemma GGUF (its shape and generation defaults) for `info`; None for any
    other architecture. It only describes: values are shown as the file has them, unchecked."""
    if meta.get("general.architecture") != ARCH:
        return None

    def key(name, default="?"):
        return meta.get(f"{ARCH}.{name}", default)

    pattern = key("attention.sliding_window_pattern", ())
    kinds = "".join("S" if s else "G" for s in pattern) if isinstance(pattern, ARRAYS) else "?"
    return (f"DiffusionGemma, text diffusion on the Gemma 4 26B-A4B: {key('block_count')} layers ({kinds}), "
            f"hidden {key('embedding_length')}, {key('attention.head_count')} heads, "
            f"MoE {key('expert_used_count')}/{key('expert_count')} experts x {key('expert_feed_forward_length')}, "
            f"window {key('attention.sliding_window')}; canvas of {key('diffusion.canvas_length')} tokens, "
            f"up to {key('diffusion.max_denoising_steps')} denoising steps, temperature "
            f"{_num(key('diffusion.t_max'))} -> {_num(key('diffusion.t_min'))}, "
            f"entropy bound {_num(key('diffusion.entropy_bound'))}")


def _num(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
