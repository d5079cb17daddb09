"""LoRA adapters in llama.cpp's GGUF format, checked and bound to the model's weight fields once.

What loads is what llama.cpp (src/llama-adapter.cpp, llama-graph.cpp build_lora_mm)
loads for a Gemma 4 model, and it computes the same thing:

    y = W x + scale * B (A x),   scale = user_scale * alpha / r   (alpha absent or 0: user_scale)

- metadata: general.type = "adapter", adapter.type = "lora", general.architecture = the
  base model's; adapter.lora.alpha, when present, a FLOAT32 (llama.cpp aborts on any other
  type) within +-MAX_ALPHA; r is read per pair, from lora_b.
- numbers: every value of every pair finite and within +-MAX_VALUE, the user scale finite and
  within +-MAX_USER_SCALE (check_user_scale: the CLI's --lora-scale and the page's slider alike).
  llama.cpp takes anything here; a NaN or an overflow there turns every logit into NaN (here:
  every logit the softcap's -30), so such a file or scale is refused with a message instead.
- tensors: at least one pair; `<base tensor name>.lora_a` (ggml ne [n_in, r]: numpy [r, n_in], PEFT's lora_A)
  and `.lora_b` (ne [r, n_out]: numpy [n_out, r], PEFT's lora_B). Tensors named
  `*_norm.weight` are skipped (llama.cpp ignores them too); any other name, a half pair,
  a base tensor the model lacks or a shape that does not fit is an error naming the tensor.
- targets: the projections Gemma 4 runs through build_lora_mm (ADAPTED). The rest are
  refused, each with the reason: the token embedding / tied LM head (llama.cpp aborts),
  tensors llama.cpp loads but never applies (the result would differ from llama.cpp's),
  and, for now, the MoE expert tensors (3-D, per expert: not applied here yet).

    adapter = load_lora("tuned.gguf", cfg, bound, scale=1.0)   # bound: weights.bind(cfg, gguf.tensors)
    for t in adapter.targets: t.layer, t.field, t.rank, adapter.scale(t)
    a, b = adapter.arrays(t)    # little-endian f32 bytes, [r, n_in] and [n_out, r] row-major

Standard library only: the browser reads adapters with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import ggml
from ..errors import Fault, Gemma4Error
from ..gguf import VALUE_TYPE_NAMES, GGUFFile, read_gguf
from .config import ARCH
from .weights import names

F32_VALUE = 6             # GGUF metadata value type of a FLOAT32 (VALUE_TYPE_NAMES)
ALPHA_KEY = "adapter.lora.alpha"
# Bounds far beyond any trained adapter (alpha: our trainer's own limit; the scale: the page's slider), so
# that what passes them stays finite in f32 rather than turning the logits into NaN
MAX_ALPHA = 4096.0
MAX_USER_SCALE = 100.0
MAX_VALUE = 131072.0      # 2**17: |A| and |B| entries (f16's largest finite value, 65504, is below it)

# LayerWeights fields llama.cpp's gemma4 graph multiplies through build_lora_mm: an adapter may target these
ADAPTED = frozenset({"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "router",
                     "ple_gate", "ple_proj"})
# fields that exist in the model but take no LoRA here, with the reason given to the user
REFUSED = {
    "token_embd": "Gemma 4 ties the LM head to token_embd, and llama.cpp aborts on an adapter for it "
                  "(train without embedding / lm_head targets)",
    "output": "the LM head takes no LoRA for Gemma 4 (llama.cpp's converter refuses it)",
    "ple_model_proj": "llama.cpp loads but never applies a LoRA to per_layer_model_proj (a plain matmul in its "
                      "gemma4 graph), so it would change results here but not there",
    "ple_token_embd": "llama.cpp loads but never applies a LoRA to the per-layer embedding table (a row lookup)",
}
EXPERTS = frozenset({"experts_gate_up", "experts_gate", "experts_up", "experts_down"})
# the dtypes a pair may be stored in (converted to f32 on the way to the GPU)
PAIR_TYPES = frozenset({ggml.F32, ggml.F16, ggml.BF16})


class LoraError(Gemma4Error, ValueError):
    """The adapter is not a llama.cpp LoRA for this model; the message names the key or tensor."""


def check_user_scale(value, what: str = "the LoRA scale") -> float:
    """A user scale as a float: a finite number within +-MAX_USER_SCALE, else LoraError (1 applies the
    adapter as trained, 0 turns it off)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = math.isfinite(value) and abs(value) <= MAX_USER_SCALE
    if not ok:
        raise LoraError(f"{what} must be a number from {-MAX_USER_SCALE:g} to {MAX_USER_SCALE:g}, got {value!r} "
                        "(1 applies the adapter as trained, 0 turns it off)")
    return value


# the high byte of each value (its sign and top exponent bits) with the sign cleared
_ABS_HIGH = bytes(b & 0x7F for b in range(256))


def check_values(raw: bytes, ggml_type: int, name: str) -> None:
    """LoraError unless every value of a stored F32, F16 or BF16 tensor is finite and within +-MAX_VALUE.
    Read from each value's top byte (C-speed bytes operations, no numpy: this runs in the browser):
    f32 and bf16 keep sign + 7 exponent bits there, and 0x47 or below means |v| < 2**17; f16 keeps sign,
    5 exponent bits and 2 mantissa bits, and 0x7C or more is an all-ones exponent (inf, NaN)."""
    step = 4 if ggml_type == ggml.F32 else 2
    high = raw[step - 1::step].translate(_ABS_HIGH)
    limit = 0x7B if ggml_type == ggml.F16 else 0x47
    if high and max(high) > limit:
        at = next(i for i, b in enumerate(high) if b > limit)
        raise LoraError(f"LoRA tensor {name!r} holds a value that is NaN, infinite or beyond +-{MAX_VALUE:g} (at "
                        f"index {at}); a trained adapter's values are small: the file is damaged, train or convert "
                        "it again")


@dataclass
class LoraTarget:
    """One adapted weight: the pair for GGUF base tensor `name`, bound to a weights field."""
    name: str                 # the base tensor, e.g. blk.3.attn_q.weight
    layer: int | None         # LayerWeights index (None: a ModelWeights field)
    field: str                # pyapp.model.weights field name
    a: object                 # TensorInfo of .lora_a, ne [n_in, r]
    b: object                 # TensorInfo of .lora_b, ne [r, n_out]

    @property
    def rank(self) -> int:
        return self.b.shape[0]

    @property
    def n_in(self) -> int:
        return self.a.shape[0]

    @property
    def n_out(self) -> int:
        return self.b.shape[1]


@dataclass
class LoraAdapter:
    gguf: GGUFFile
    alpha: float              # 0: scale = user_scale
    user_scale: float
    targets: list = field(default_factory=list)      # [LoraTarget], in file order of their lora_a
    skipped: list = field(default_factory=list)      # *_norm.weight tensors llama.cpp ignores too
    label: str = "adapter"

    def scale(self, t: LoraTarget, user_scale: float | None = None) -> float:
        """llama.cpp's rule: user_scale * alpha / r, or user_scale when alpha is absent or 0."""
        s = self.user_scale if user_scale is None else user_scale
        return s * self.alpha / t.rank if self.alpha else s

    def arrays(self, t: LoraTarget) -> tuple[bytes, bytes]:
        """A [r, n_in] and B [n_out, r], row-major little-endian f32 bytes."""
        src = self.gguf.source
        return (ggml.float_bytes_to_f32(src.read(t.a.offset, t.a.nbytes), t.a.type),
                ggml.float_bytes_to_f32(src.read(t.b.offset, t.b.nbytes), t.b.type))

    def describe(self) -> list[str]:
        """Lines for `info` and the app: the adapter, its scale rule and targets."""
        ranks = sorted({t.rank for t in self.targets})
        if not self.alpha:
            rule = f"no alpha, scale = user scale {self.user_scale:g}"
        elif len(ranks) == 1:
            rule = (f"scale = {self.user_scale:g} * alpha {self.alpha:g} / rank {ranks[0]} = "
                    f"{self.scale(self.targets[0]):g}")
        else:
            rule = f"scale = {self.user_scale:g} * alpha {self.alpha:g} / rank (per tensor)"
        kinds: dict[str, list] = {}
        for t in self.targets:
            kinds.setdefault(t.field, []).append(t.layer)
        lines = [f"LoRA adapter:  {self.label}: {len(self.targets)} adapted tensors, "
                 f"rank {'/'.join(map(str, ranks))}, {rule}"]
        for f_name, layers in kinds.items():
            lines.append(f"  {f_name:<12} layers {', '.join(str(i) for i in layers)}")
        if self.skipped:
            lines.append(f"  skipped (norm vectors, ignored by llama.cpp too): {len(self.skipped)}")
        return lines


def check_metadata(g: GGUFFile, arch: str = ARCH) -> float:
    """The adapter's alpha (0 when absent) after llama.cpp's metadata checks; LoraError otherwise."""
    meta, types = g.metadata, g.metadata_types

    def text(key):
        v = meta.get(key)
        if v is not None and not isinstance(v, str):
            raise LoraError(f"{key} must be a string, got {v!r} (llama.cpp aborts on this file)")
        return v

    gtype = text("general.type")
    if gtype != "adapter":
        what = "is missing" if gtype is None else f"is {gtype!r}"
        raise LoraError(f"not a LoRA adapter: general.type {what}, expected 'adapter' (is this a model file?)")
    if text("general.architecture") != arch:
        raise LoraError(f"the adapter is for architecture {meta.get('general.architecture')!r}, the model is {arch!r}",
                        fault=Fault.OTHER_BASE)
    atype = text("adapter.type")
    if atype != "lora":
        raise LoraError(f"adapter.type is {atype!r}, expected 'lora' (only LoRA adapters are supported)")
    if "adapter.alora.invocation_tokens" in meta:
        raise LoraError("an activated LoRA (adapter.alora.invocation_tokens: applied only after its invocation "
                        "tokens) is not supported")
    if ALPHA_KEY not in meta:
        return 0.0
    if types.get(ALPHA_KEY) != F32_VALUE:
        raise LoraError(f"{ALPHA_KEY} is stored as {VALUE_TYPE_NAMES.get(types.get(ALPHA_KEY), '?')}; llama.cpp "
                        "requires FLOAT32 (it aborts on any other type): rewrite the adapter with an f32 alpha")
    alpha = float(meta[ALPHA_KEY])
    if not (math.isfinite(alpha) and abs(alpha) <= MAX_ALPHA):
        raise LoraError(f"{ALPHA_KEY} is {alpha!r}: it must be a finite number from {-MAX_ALPHA:g} to {MAX_ALPHA:g} "
                        "(PEFT's lora_alpha, often twice the rank): the file is damaged, convert it again")
    return alpha


def _pairs(g: GGUFFile) -> tuple[dict, list]:
    """{base name: [lora_a, lora_b]} and the skipped norm tensors; unknown names and half pairs raise."""
    pairs: dict[str, list] = {}
    skipped = []
    for name, t in g.tensors.items():
        for i, suffix in enumerate((".lora_a", ".lora_b")):
            if name.endswith(suffix):
                pairs.setdefault(name[:-len(suffix)], [None, None])[i] = t
                break
        else:
            if name.endswith("_norm.weight"):
                skipped.append(name)
                continue
            raise LoraError(f"adapter tensor {name!r} has an unexpected name: LoRA tensors end in .lora_a or .lora_b")
    for base, (a, b) in pairs.items():
        if a is None or b is None:
            raise LoraError(f"the LoRA pair for {base!r} lacks its {'lora_a' if a is None else 'lora_b'} tensor")
    return pairs, skipped


def bind_lora(g: GGUFFile, cfg, bound, user_scale: float = 1.0, arch: str = ARCH, label: str = "adapter"
              ) -> LoraAdapter:
    """The adapter in `g` checked against the model (cfg, bound = weights.bind(cfg, tensors)) and bound
    to its weight fields."""
    alpha = check_metadata(g, arch)
    user_scale = check_user_scale(user_scale)
    pairs, skipped = _pairs(g)
    if not pairs:
        what = f"only {len(skipped)} norm tensor(s), which llama.cpp ignores" if skipped else "no tensors"
        raise LoraError(f"the adapter holds {what}: no .lora_a/.lora_b pair to apply (an empty or unfinished "
                        "adapter file?)")
    layer_of = {id(lw): lc.index for lc, lw in zip(cfg.layers, bound.layers)}
    where = {name: (layer_of.get(id(owner)), f_name, getattr(owner, f_name))
             for name, owner, f_name in names(cfg, bound)}
    targets = []
    for base, (a, b) in pairs.items():
        if base not in where:
            raise LoraError(f"LoRA tensor {base!r} does not exist in the base model{_missing_hint(cfg, base)}",
                            fault=Fault.OTHER_BASE)
        layer, f_name, w = where[base]
        if f_name in REFUSED:
            raise LoraError(f"LoRA for {base!r} refused: {REFUSED[f_name]}")
        if f_name in EXPERTS:
            raise LoraError(f"LoRA for {base!r} refused: the MoE expert tensors (3-D, one LoRA per expert) are "
                            "applied by llama.cpp but not by this runner yet")
        if f_name not in ADAPTED:
            raise LoraError(f"LoRA for {base!r} refused: llama.cpp applies no LoRA to this tensor")
        if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[0] != w.shape[0] or b.shape[1] != w.shape[1]:
            raise LoraError(f"LoRA pair for {base!r} has incorrect shape (lora_a {list(a.shape)}, lora_b "
                            f"{list(b.shape)}, ggml order; the base tensor is {list(w.shape)}, so lora_a must be "
                            f"[{w.shape[0]}, r] and lora_b [r, {w.shape[1]}]): wrong base model?",
                            fault=Fault.OTHER_BASE)
        if a.shape[1] != b.shape[0]:
            raise LoraError(f"LoRA pair for {base!r}: lora_a is {list(a.shape)} and lora_b {list(b.shape)}; their "
                            "ranks differ (lora_a not transposed? adapters of the old finetune example are not "
                            "supported)")
        for t in (a, b):
            if t.type not in PAIR_TYPES:
                raise LoraError(f"{t.name} is stored as {t.type_name}; adapters must be F32, F16 or BF16 "
                                "(convert_lora_to_gguf.py --outtype f32)")
        targets.append(LoraTarget(base, layer, f_name, a, b))
    for t in targets:                     # the values, once the names and shapes are right: before any upload
        for info in (t.a, t.b):
            check_values(g.source.read(info.offset, info.nbytes), info.type, info.name)
    return LoraAdapter(g, alpha, user_scale, targets, skipped, label)


def _missing_hint(cfg, name: str) -> str:
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in ("attn_k", "attn_v"):
        i = int(parts[1])
        if i < len(cfg.layers) and not cfg.layers[i].owns_kv:
            return f" (layer {i} reuses layer {cfg.layers[i].kv_source}'s keys and values: it has no {parts[2]})"
        if i < len(cfg.layers) and parts[2] == "attn_v" and not cfg.layers[i].has_v:
            return f" (layer {i} has no V projection: its values are its raw keys)"
    return " (hint: an adapter for another base model?)"


def load_lora(path_or_source, cfg, bound, scale: float = 1.0, arch: str = ARCH) -> LoraAdapter:
    """Read and bind an adapter GGUF (a path, a ByteSource or a parsed GGUFFile)."""
    g = path_or_source if isinstance(path_or_source, GGUFFile) else read_gguf(path_or_source)
    label = path_or_source if isinstance(path_or_source, str) else getattr(g.source, "name", "adapter")
    return bind_lora(g, cfg, bound, scale, arch, str(label))
