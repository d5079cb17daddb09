"""Sampling parameters and the context length: their one definition and their rules.

The CLI, the engine and the browser page all build a `SamplingParams` and pick a
context with `check_context_length`, so a value is checked once, here, and a bad
one is a `ParamError` naming the parameter, its value and the allowed range (the
page also gets RULES, for its inputs' bounds). Each parameter means what Ollama's
option of the same name means (README.md, "Sampling parameters"), within what
the GPU sampler (shaders/sample.wgsl) holds: it keeps at most SAMPLE_MAX_K
candidates and sees the last MAX_RECENT tokens. One is ours, not Ollama's:
`speculate`, the drafts per step of speculative decoding (greedy only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import Gemma4Error
from .gpu.kernels import HEAD_ROWS, MAX_RECENT, SAMPLE_MAX_K

DEFAULT_CONTEXT = 4096
MIN_CONTEXT = 2              # one prompt token and one generated token
MAX_TEMPERATURE = 100        # far past the point where the pick is uniform over the top k
MAX_REPEAT_PENALTY = 100
MAX_SPECULATE = HEAD_ROWS - 1   # drafts a speculative step checks: its rows (the token + drafts) fit the greedy head
DRAFTER_DRAFTS = 4              # drafts a step by default with an assistant drafter (--draft-model)


class ParamError(Gemma4Error, ValueError):
    """A sampling parameter or context length outside its allowed range."""


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Rule:
    """What one parameter takes: a number from lo to hi (above lo if above_lo; hi None: no bound),
    whole if integer, or `special` (Ollama's -1 for "no limit" and the like)."""
    lo: int | float
    hi: int | float | None = None
    integer: bool = False
    above_lo: bool = False
    special: int | None = None
    note: str = ""

    def check(self, name: str, value):
        """value as an int or a finite float, else a ParamError naming it, its value and the range."""
        ok = _is_number(value)
        if ok and isinstance(value, float):
            # NaN and inf fail here; an integer parameter takes a float only if it is whole (JSON 64.0)
            ok = value.is_integer() if self.integer else math.isfinite(value)
        if ok and value != self.special:
            ok = (value > self.lo if self.above_lo else value >= self.lo) and (self.hi is None or value <= self.hi)
        if not ok:
            raise ParamError(f"{name} must be {self.describe()}, got {value!r}")
        return int(value) if self.integer else float(value)

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.hi is None:
            span = f"above {self.lo}" if self.above_lo else f"of at least {self.lo}"
        else:
            span = f"above {self.lo} and at most {self.hi}" if self.above_lo else f"from {self.lo} to {self.hi}"
        return f"{kind} {span}" + (f" ({self.note})" if self.note else "")


# Ollama's meaning of each; README.md's table says the same.
RULES = {
    "temperature": Rule(0, MAX_TEMPERATURE, note="0 = greedy"),
    "top_k": Rule(0, SAMPLE_MAX_K, integer=True,
                  note=f"0 = no limit; the GPU sampler keeps at most {SAMPLE_MAX_K} candidates"),
    "top_p": Rule(0, 1, note="1 = off, 0 = only the most likely token"),
    "min_p": Rule(0, 1, note="0 = off"),
    "repeat_penalty": Rule(0, MAX_REPEAT_PENALTY, above_lo=True, note="1 = off"),
    "repeat_last_n": Rule(-1, MAX_RECENT, integer=True,
                          note=f"0 = off, -1 = as many as the GPU sampler sees, {MAX_RECENT}"),
    "seed": Rule(-2**63, 2**63 - 1, integer=True, note="-1 = random"),
    "max_tokens": Rule(1, integer=True, special=-1, note="or -1: until a stop token or the end of the context"),
    "speculate": Rule(0, MAX_SPECULATE, integer=True,
                      note="tokens drafted by prompt lookup and checked in one step; 0 = off; greedy only: "
                           "off when temperature > 0 or repeat_penalty != 1"),
}
CONTEXT_RULE = Rule(MIN_CONTEXT, integer=True)

# A DiffusionGemma model's sampler settings as the page names them: (DenoiseParams' field, the words an error
# uses, the rule). Their defaults are the model's own (its GGUF's diffusion.* keys: DenoiseParams.from_config).
DENOISE_SETTINGS = {
    "denoise_steps": ("steps", "max steps", Rule(1, 1 << 16, integer=True,
                                                 note="per block of text; a block stops sooner once it settles")),
    "denoise_t_min": ("t_min", "lowest temperature", Rule(0, MAX_TEMPERATURE, note="the last step's")),
    "denoise_t_max": ("t_max", "highest temperature", Rule(0, MAX_TEMPERATURE, above_lo=True,
                                                           note="the first step's")),
    "denoise_entropy_bound": ("entropy_bound", "entropy bound",
                              Rule(0, note="higher accepts more positions per step: faster, rougher")),
}
DENOISE_RULES = {name: rule for name, (_, _, rule) in DENOISE_SETTINGS.items()}


@dataclass
class SamplingParams:
    """Ollama's options of the same names (max_tokens is num_predict), and speculate (ours: speculative
    decoding, pyapp.engine); checked on creation and by the engine before each generation (validate())."""
    temperature: float = 1.0
    top_k: int = 64
    top_p: float = 0.95
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    max_tokens: int = 512
    speculate: int = 0      # not Ollama's: speculative decoding's drafts per step (Engine.generate), 0 = off

    def __post_init__(self):
        self.validate()

    def validate(self) -> "SamplingParams":
        """Check every field (ParamError) and bring Ollama's special values to the form the engine
        uses: repeat_last_n -1 -> MAX_RECENT, seed -1 -> None (random). Returns self."""
        for name, rule in RULES.items():
            value = getattr(self, name)
            if not (name == "seed" and value is None):
                setattr(self, name, rule.check(name, value))
        if self.repeat_last_n == -1:
            self.repeat_last_n = MAX_RECENT
        if self.seed == -1:
            self.seed = None
        return self

    @property
    def speculates(self) -> bool:
        """Whether generation drafts and checks tokens: only greedy decoding without a repeat penalty
        (then every token is the argmax of logits that depend only on the tokens before it)."""
        return self.speculate > 0 and self.temperature == 0 and self.repeat_penalty == 1

    @property
    def token_limit(self) -> float:
        """The most tokens to generate (max_tokens -1: no limit but the context)."""
        return math.inf if self.max_tokens == -1 else self.max_tokens

    @classmethod
    def from_ollama(cls, params: dict | None) -> "SamplingParams":
        """Defaults from an Ollama params layer ({"temperature": 1, "top_k": 64, ...}), read as Ollama
        reads them: what Ollama clamps is clamped alike, and top_k or repeat_last_n beyond what the
        GPU sampler holds becomes its maximum (which the page's settings then show); num_predict 0
        or absent keeps our default. Values of the wrong type are a ParamError."""
        p = {k: v for k, v in (params or {}).items() if k != "speculate"}    # ours, not an Ollama option
        clamps = {"temperature": (0, None), "top_k": (0, SAMPLE_MAX_K), "top_p": (0, 1), "min_p": (0, 1),
                  "repeat_last_n": (-1, MAX_RECENT), "max_tokens": (-1, None)}
        kw = {}
        for name in RULES:
            v = p.get("num_predict" if name == "max_tokens" else name)
            if v is None or (name == "max_tokens" and v == 0):
                continue
            if name in clamps and _is_number(v) and not math.isnan(v):
                lo, hi = clamps[name]
                v = max(v, lo) if hi is None else min(max(v, lo), hi)
            kw[name] = v
        return cls(**kw)


def check_context_length(requested, model_max: int) -> int:
    """The KV cache size for a requested context length (Ollama's num_ctx; None: DEFAULT_CONTEXT).
    A request beyond the model's trained context gets that context, as in Ollama."""
    if requested is None:
        return min(DEFAULT_CONTEXT, model_max)
    return min(CONTEXT_RULE.check("context length", requested), model_max)


def denoise_settings(page: dict) -> dict:
    """The page's DiffusionGemma settings (DENOISE_SETTINGS' names; absent ones keep the model's defaults)
    checked, as DenoiseParams fields: a bad one is a ParamError in the page's words."""
    out = {}
    for name, (field_name, words, rule) in DENOISE_SETTINGS.items():
        if page.get(name) is not None:
            out[field_name] = rule.check(words, page[name])
    return out


def check_temperature_range(t_min: float, t_max: float) -> None:
    """The schedule goes from t_max down to t_min: a ParamError in plain words when they are the wrong way round."""
    if t_min > t_max:
        raise ParamError(f"The lowest temperature ({t_min:g}) must not be above the highest ({t_max:g})")


def page_rules() -> dict:
    """The rules as the page takes them: {name: {min, max, rule, lo, above_lo, integer, special}}: min and
    max for its number inputs (max None: none), the rest to check a value as Rule.check does."""
    rules = {**RULES, "context_length": CONTEXT_RULE, **DENOISE_RULES}
    return {name: {"min": min(r.lo, r.special if r.special is not None else r.lo), "max": r.hi,
                   "rule": r.describe(), "lo": r.lo, "above_lo": r.above_lo, "integer": r.integer,
                   "special": r.special}
            for name, r in rules.items()}
