"""DiffusionGemma's generation settings and random draws, shared by the GPU engine and the numpy reference.

Standard library only. Mirrors transformers 5.23's generation_diffusion_gemma (shared/notes/
diffusion_gemma.md (d)): the linear temperature schedule, the entropy-bound sampler's settings and the
stable-and-confident stop. The random draws of a generation come in this order, per block: the initial
canvas (C uniform ids), then per step the C per-position sampling draws and the C renoise ids. `Draws`
yields them; `SeededDraws` makes them from a seed, `ReplayDraws` replays recorded ones (a transformers
trace: its multinomial picks are given as ids, since torch's generator cannot be reproduced here).
"""

from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass, field, replace

from ...errors import Gemma4Error


class DenoiseError(Gemma4Error, ValueError):
    """Settings a denoising generation cannot use."""


def f32(x: float) -> float:
    """x rounded to float32 (transformers does the schedule in float32 tensor arithmetic)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def temperature(cur: int, steps: int, t_min: float, t_max: float) -> float:
    """The step's temperature, as LinearTemperatureScheduleLogitsProcessor computes it in float32:
    t_min + (t_max - t_min) * (cur / steps), cur = steps remaining (steps .. 1)."""
    return f32(f32(t_min) + f32(f32(t_max - t_min) * f32(f32(cur) / f32(steps))))


@dataclass
class DenoiseParams:
    """One generation's settings; `from_config` takes the model's defaults (the GGUF's diffusion.* keys)."""
    max_new_tokens: int = 256
    steps: int = 48                       # max_denoising_steps per block
    t_min: float = 0.4
    t_max: float = 0.8
    entropy_bound: float = 0.1
    stability_threshold: int = 1
    confidence_threshold: float = 0.005
    eos_ids: tuple = (1, 106, 50)
    pad_id: int = 0
    seed: int | None = 0

    @classmethod
    def from_config(cls, cfg, **overrides) -> "DenoiseParams":
        p = cls(max_new_tokens=cfg.max_new_tokens, steps=cfg.max_denoising_steps, t_min=cfg.t_min, t_max=cfg.t_max,
                entropy_bound=cfg.entropy_bound, stability_threshold=cfg.stability_threshold,
                confidence_threshold=cfg.confidence_threshold)
        return replace(p, **{k: v for k, v in overrides.items() if v is not None})

    def validate(self) -> None:
        if not 1 <= self.max_new_tokens <= 1 << 24:
            raise DenoiseError(f"max new tokens must be 1 or more, got {self.max_new_tokens}")
        if not 1 <= self.steps <= 1 << 16:
            raise DenoiseError(f"denoising steps must be between 1 and 65536, got {self.steps}")
        for name in ("t_min", "t_max", "entropy_bound", "confidence_threshold"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise DenoiseError(f"{name.replace('_', ' ')} must be a number >= 0, got {v}")
        if self.t_min > self.t_max or self.t_max <= 0:
            raise DenoiseError(f"temperatures must satisfy 0 <= t_min <= t_max, t_max > 0 (got {self.t_min}, "
                               f"{self.t_max})")
        if not 0 <= self.stability_threshold <= 1 << 16:
            raise DenoiseError(f"stability threshold must be between 0 and 65536, got {self.stability_threshold}")


class Draws:
    """A generation's random draws, in the order generate makes them."""

    def canvas(self) -> list[int]:
        """A block's initial canvas: C ids."""
        raise NotImplementedError

    def step(self) -> tuple[list[float] | None, list[int] | None, list[int]]:
        """One step's draws: (C uniforms in [0, 1) for sampling, or None) or (None, the C sampled ids given),
        and the C renoise ids."""
        raise NotImplementedError


@dataclass
class SeededDraws(Draws):
    """Draws from Python's Mersenne Twister: ids uniform over the vocabulary, uniforms for inverse-CDF sampling."""
    seed: int | None
    vocab: int
    canvas_length: int
    rng: random.Random = field(init=False)

    def __post_init__(self):
        self.rng = random.Random(self.seed)

    def _ids(self) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(self.canvas_length)]

    def canvas(self) -> list[int]:
        return self._ids()

    def step(self):
        return [self.rng.random() for _ in range(self.canvas_length)], None, self._ids()


@dataclass
class ReplayDraws(Draws):
    """Recorded draws: init[b] per block, sample[s] and renoise[s] per step of all blocks in order."""
    init: list
    sample: list
    renoise: list
    _block: int = 0
    _step: int = 0

    def canvas(self) -> list[int]:
        self._block += 1
        return [int(t) for t in self.init[self._block - 1]]

    def step(self):
        self._step += 1
        s = self._step - 1
        return None, [int(t) for t in self.sample[s]], [int(t) for t in self.renoise[s]]


@dataclass
class DenoiseResult:
    """What a generation did: the committed tokens (pad after an eos), and per step its decisions."""
    tokens: list = field(default_factory=list)      # generated ids, whole blocks (pad after the first eos)
    blocks: list = field(default_factory=list)      # each committed block
    steps: list = field(default_factory=list)       # denoising steps each block took
    accepted: list = field(default_factory=list)    # per step: the acceptance mask (C bools)
    argmax: list = field(default_factory=list)      # per step: the argmax draft (C ids)
    stop_reason: str = ""                           # stop (an eos) | length
    text: str = ""
    seconds: float = 0.0
    step_seconds: list = field(default_factory=list)     # GPU engine: each step, params written -> result read
    encode_seconds: list = field(default_factory=list)   # GPU engine, timed runs: each block's encoder pass

    @property
    def decoder_passes(self) -> int:
        return sum(self.steps)

    def tokens_per_forward(self, pad_id: int = 0) -> float:
        """transformers' tokens_per_forward: generated non-pad tokens per decoder pass."""
        n = sum(t != pad_id for t in self.tokens)
        return n / self.decoder_passes if self.decoder_passes else 0.0


def finish_block(block: list[int], eos_ids, pad_id: int) -> tuple[list[int], bool]:
    """A committed block with the tokens after its first eos replaced by pad; whether it had an eos."""
    for i, t in enumerate(block):
        if t in eos_ids:
            return block[:i + 1] + [pad_id] * (len(block) - i - 1), True
    return list(block), False
