"""Where each Gemma 4 weight lives in a GGUF: model fields bound to tensor names, once.

Like the struct tags of Ollama's model_text.go, every field below names its GGUF
tensor (layer fields relative to `blk.N.`), its shape, and when the model needs
it. Shapes are in ggml order (shape[0] is the row length: a torch [out, in]
weight is [in, out] here, an expert tensor [in, out, experts]), written as names
of sizes the config fixes (`_sizes`, `_layer_sizes`); `bind` checks every tensor
present against them. `when` names a flag of the layer's LayerConfig (or of
Gemma4Config for the model-level fields); a field whose flag is false is absent,
one with `when=OPTIONAL` may be absent either way. This module is the only place
in pyapp that spells tensor names: the reference forward, the GPU forward and
the upload planner read fields.

    w = bind(cfg, gguf.tensors)            # ModelWeights of TensorInfo, shapes and types checked
    w.layers[3].attn_q                      # -> TensorInfo of blk.3.attn_q.weight
    w = w.map(load)                         # the same structure, any value type

A family with more tensors declares them in subclasses of ModelWeights and
LayerWeights that its config names (`Gemma4Config.weights_classes`): DiffusionGemma's
self-conditioning MLP and encoder layer scales are pyapp.families.diffusion_gemma.weights';
the image encoder's, pyapp.families.gemma4_vision.weights', bound by the same `Binding`.

Every spelling a converter writes is declared here too (README, "Supported files"):
`alt=` names the other names of one tensor (Ollama's published blobs keep the
per-expert scale as `ffn_gate_inp.per_expert_scale`, llama.cpp's files as
`ffn_down_exps.scale`; the other alternatives are those Ollama's Go engine accepted,
model/models/gemma4/model_text.go), and `FUSED` the tensors one converter stores as one
(llama.cpp's `--fuse-qkv` writes q, k and v as `attn_qkv`: `bind` cuts it into row
views). A tensor in the file that no field reads is an error, never skipped, except
the image and audio encoders' (`ENCODER_PREFIXES`), which the text model does not use.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Callable

from .. import ggml
from ..errors import Gemma4Error

OPTIONAL = "optional"        # `when` of a field that may be absent on any model
ALWAYS = None                # `when` of a field every model has
MOE_FLAGS = ("has_moe", "experts_fused", "experts_split")   # `when` of the tensors only MoE layers have

# 1-D tensors (norms, scales, frequency factors) become f32 vectors on the GPU (runtime.upload.f32_vector)
VECTOR_TYPES = frozenset({ggml.F32, ggml.F16, ggml.BF16})
INTEGER_TYPES = frozenset({ggml.I8, ggml.I16, ggml.I32, ggml.I64})     # never a weight matrix


class WeightsError(Gemma4Error, ValueError):
    """The GGUF lacks tensors this model needs, or has them in a shape or type it cannot use."""


# Tensors of the image and audio encoders and their projectors (Ollama's blobs hold them inline):
# recognised, reported by `info`, not read by the text model.
ENCODER_PREFIXES = {"v.": "vision", "mm.a.": "audio", "a.": "audio", "mm.": "vision",
                    "model.vision_tower.": "vision"}     # some published blobs keep HF's names (CMP L987-996)
# A clippable linear's bounds (the image and audio encoders'), scalars named after its weight, in this order.
CLAMP_BOUNDS = ("input_min", "input_max", "output_min", "output_max")
# One file tensor holding several fields' rows, in this order (llama.cpp's `--fuse-qkv`).
FUSED = {"attn_qkv.weight": ("attn_q", "attn_k", "attn_v")}


def tensor(name: str, shape: str, when: str | None = ALWAYS, alt: tuple[str, ...] = ()):
    """A field bound to the GGUF tensor `name` of `shape` (names of sizes, ggml order, space-separated),
    required when the config flag `when` is true; `alt` are other converters' names for it."""
    return field(default=None, metadata={"gguf": name, "alt": alt, "shape": tuple(shape.split()), "when": when})


def runtime(doc: str):
    """A field the runtime fills (fused groups); never read from the GGUF."""
    return field(default=None, metadata={"runtime": doc})


@dataclass
class LayerWeights:
    # attention
    attn_norm: object = tensor("attn_norm.weight", "hidden")
    attn_q: object = tensor("attn_q.weight", "hidden heads*hd")
    attn_q_norm: object = tensor("attn_q_norm.weight", "hd")
    attn_k: object = tensor("attn_k.weight", "hidden kv_heads*hd", when="owns_kv")   # shared layers: another's K/V
    attn_v: object = tensor("attn_v.weight", "hidden kv_heads*hd", when="has_v")     # absent: V is the raw K (k_eq_v)
    attn_k_norm: object = tensor("attn_k_norm.weight", "hd", when="owns_kv")
    attn_output: object = tensor("attn_output.weight", "heads*hd hidden")
    post_attention_norm: object = tensor("post_attention_norm.weight", "hidden", alt=("attn_post_norm.weight",))
    # dense MLP (every layer; on MoE layers it runs beside the experts)
    ffn_norm: object = tensor("ffn_norm.weight", "hidden", alt=("ffn_pre_norm.weight",))
    ffn_gate: object = tensor("ffn_gate.weight", "hidden ff")
    ffn_up: object = tensor("ffn_up.weight", "hidden ff")
    ffn_down: object = tensor("ffn_down.weight", "ff hidden")
    post_ffw_norm: object = tensor("post_ffw_norm.weight", "hidden", alt=("ffn_post_norm.weight",))
    # mixture of experts
    router: object = tensor("ffn_gate_inp.weight", "hidden experts", when="has_moe")   # a layer has experts iff this
    post_ffw_norm_1: object = tensor("post_ffw_norm_1.weight", "hidden", when="has_moe",
                                   alt=("ffn_post_norm_1.weight",))
    router_scale: object = tensor("ffn_gate_inp.scale", "hidden", when=OPTIONAL)
    pre_ffw_norm_2: object = tensor("pre_ffw_norm_2.weight", "hidden", when="has_moe",
                                  alt=("ffn_pre_norm_2.weight",))
    experts_gate_up: object = tensor("ffn_gate_up_exps.weight", "hidden 2*expert_ff experts", when="experts_fused")
    experts_gate: object = tensor("ffn_gate_exps.weight", "hidden expert_ff experts", when="experts_split")
    experts_up: object = tensor("ffn_up_exps.weight", "hidden expert_ff experts", when="experts_split")
    experts_down: object = tensor("ffn_down_exps.weight", "expert_ff hidden experts", when="has_moe")
    experts_down_scale: object = tensor("ffn_down_exps.scale", "experts", when=OPTIONAL,
                                        alt=("ffn_gate_inp.per_expert_scale",))      # Ollama's blobs
    post_ffw_norm_2: object = tensor("post_ffw_norm_2.weight", "hidden", when="has_moe",
                                   alt=("ffn_post_norm_2.weight",))
    # per-layer embeddings (PLE)
    ple_gate: object = tensor("inp_gate.weight", "hidden ple", when="has_ple")
    ple_proj: object = tensor("proj.weight", "ple hidden", when="has_ple")
    ple_post_norm: object = tensor("post_norm.weight", "hidden", when="has_ple")
    # the layer's output scale (Gemma 4's layer_scalar; DiffusionGemma: the decoder's)
    output_scale: object = tensor("layer_output_scale.weight", "1", when=OPTIONAL, alt=("layer_scalar",))
    # filled by the GPU upload planner (pyapp.runtime.upload), absent in the GGUF
    qkv: object = runtime("q, k (and v) rows in one buffer: one matvec per decode step")
    ffn_gate_up: object = runtime("ffn_gate and ffn_up rows in one buffer: one GeGLU matvec")


@dataclass
class ModelWeights:
    token_embd: object = tensor("token_embd.weight", "hidden vocab")             # also the tied head
    output: object = tensor("output.weight", "hidden vocab", when=OPTIONAL)      # absent: the head is token_embd
    output_norm: object = tensor("output_norm.weight", "hidden")
    rope_freqs: object = tensor("rope_freqs.weight", "global_hd/2", when=OPTIONAL)   # global layers' frequency factors
    ple_token_embd: object = tensor("per_layer_token_embd.weight", "layers*ple vocab", when="has_ple")
    ple_model_proj: object = tensor("per_layer_model_proj.weight", "hidden layers*ple", when="has_ple")
    ple_proj_norm: object = tensor("per_layer_proj_norm.weight", "ple", when="has_ple")
    layers: list = field(default_factory=list)

    @property
    def head(self):
        """The output projection (tied to the embedding table when output.weight is absent)."""
        return self.output if self.output is not None else self.token_embd

    def map(self, fn: Callable) -> "ModelWeights":
        """The same structure with every present tensor replaced by fn(value)."""
        def conv(obj):
            return replace(obj, **{f.name: fn(getattr(obj, f.name)) for f in fields(obj)
                                   if "gguf" in f.metadata and getattr(obj, f.name) is not None})
        out = conv(self)
        out.layers = [conv(lw) for lw in self.layers]
        return out


def _bound(cls):
    return [f for f in fields(cls) if "gguf" in f.metadata]


def layer_prefix(index: int) -> str:
    return f"blk.{index}."


def _field(cls, field_name: str):
    return next(f for f in fields(cls) if f.name == field_name)


def gguf_name(cls, field_name: str, layer: int | None = None) -> str:
    """The GGUF tensor name of a declared field (for messages and lookups)."""
    name = _field(cls, field_name).metadata["gguf"]
    return name if layer is None else layer_prefix(layer) + name


def declared_shape(cls, field_name: str) -> tuple[str, ...]:
    """The names of a declared field's dimensions, ggml order."""
    return _field(cls, field_name).metadata["shape"]


def spellings(f) -> tuple[str, ...]:
    """Every name a converter gives the tensor of field f (relative to `blk.N.` for layer fields)."""
    return (f.metadata["gguf"], *f.metadata["alt"])


def _fused_into(field_name: str) -> str | None:
    return next((name for name, parts in FUSED.items() if field_name in parts), None)


def present(tensors, field_name: str, layer: int | None = None) -> bool:
    """Whether the GGUF has the tensor of this field under any spelling, alone or fused (config flags
    are resolved from this)."""
    cls = ModelWeights if layer is None else LayerWeights
    prefix = "" if layer is None else layer_prefix(layer)
    fused = _fused_into(field_name) if layer is not None else None
    return (any(prefix + name in tensors for name in spellings(_field(cls, field_name)))
            or (fused is not None and prefix + fused in tensors))


def other_spellings(tensor_names) -> list[tuple[str, str]]:
    """(the file's name, llama.cpp's) for each tensor a file spells another way than llama.cpp's own
    files (an alternative name, or a fused tensor: `blk.N.` left out), once each: for `info`."""
    rel = {n.split(".", 2)[2] if n.startswith("blk.") and n.count(".") >= 2 else n for n in tensor_names}
    found = [(alt, f.metadata["gguf"]) for cls in (ModelWeights, LayerWeights) for f in _bound(cls)
             for alt in f.metadata["alt"] if alt in rel]
    found += [(name, " + ".join(gguf_name(LayerWeights, p) for p in parts)) for name, parts in FUSED.items()
              if name in rel]
    return sorted(found)


def stores_split_experts(tensor_names) -> bool:
    """Whether a file keeps its experts' gate and up apart (llama.cpp's files fuse them)."""
    split = "." + gguf_name(LayerWeights, "experts_gate")
    return any(n.endswith(split) for n in tensor_names)


def encoder_part(name: str) -> str | None:
    """'vision' or 'audio' for a tensor of an image or audio encoder (or its projector), else None."""
    return next((part for prefix, part in ENCODER_PREFIXES.items() if name.startswith(prefix)), None)


def moe_tensor(tensors, layer: int) -> str | None:
    """The name of a tensor only MoE layers have that this layer has in the GGUF, else None."""
    for f in _bound(LayerWeights):
        if f.metadata["when"] in MOE_FLAGS and present(tensors, f.name, layer):
            return next(layer_prefix(layer) + n for n in spellings(f) if layer_prefix(layer) + n in tensors)
    return None


def _required(when, flags) -> bool:
    return when is ALWAYS or (when != OPTIONAL and bool(getattr(flags, when)))


def _sizes(cfg) -> dict:
    """Every model-wide size the declared shapes name."""
    global_hd = next((lc.head_dim for lc in cfg.layers if not lc.sliding), None)
    return {"1": 1, "hidden": cfg.hidden, "vocab": cfg.vocab_size, "ple": cfg.ple_dim,
            "layers*ple": cfg.n_layers * cfg.ple_dim, "experts": cfg.n_experts,
            "expert_ff": cfg.expert_ffn_dim, "2*expert_ff": 2 * cfg.expert_ffn_dim,
            **cfg.weight_sizes(),          # a family's own sizes (DiffusionGemma's self-conditioning width)
            # one frequency factor per rotated pair of a global head (any length without global layers)
            "global_hd/2": global_hd // 2 if global_hd else None}


def _layer_sizes(cfg, lc) -> dict:
    """The sizes that differ from layer to layer."""
    return {"hd": lc.head_dim, "heads*hd": cfg.n_heads * lc.head_dim, "kv_heads*hd": lc.n_kv_heads * lc.head_dim,
            "ff": lc.ffn_dim}


def _misfit(t, shape: tuple[str, ...], sizes: dict) -> str | None:
    """Why tensor t does not fit its declared shape and the types its use allows; None if it fits."""
    want = [sizes[d] for d in shape]
    if len(t.shape) != len(want) or any(w is not None and w != n for w, n in zip(want, t.shape)):
        shown = ", ".join(d if w is None or d == str(w) else f"{d}={w}" for d, w in zip(shape, want))
        return f"has shape {list(t.shape)}, expected [{shown}]"
    vector = len(shape) == 1
    if not (t.type in VECTOR_TYPES if vector else t.type not in INTEGER_TYPES):
        kind = "F32, F16 or BF16" if vector else "a float or quantized type"
        return f"is stored as {getattr(ggml.TYPES.get(t.type), 'name', t.type)}, expected {kind}"
    return None


def _listing(items: list, sep: str = ", ") -> str:
    return sep.join(items[:6]) + (f" and {len(items) - 6} more" if len(items) > 6 else "")


def _rows(shape: tuple[str, ...], sizes: dict) -> int | None:
    """The row count a declared 2-D shape gives (its second dimension)."""
    return sizes.get(shape[1]) if len(shape) == 2 else None


def _cut_fused(t, prefix: str, parts: tuple[str, ...], sizes: dict) -> tuple[dict, str | None]:
    """Row views of the fused tensor t, one per field in `parts` (in that order), or why it does not
    split into them. A row is whole blocks, so a view is a byte range of the file."""
    rows = [_rows(declared_shape(LayerWeights, p), sizes) for p in parts]
    if len(t.shape) != 2 or None in rows or sum(rows) != t.shape[1]:
        return {}, f"has shape {list(t.shape)}, expected [hidden, {' + '.join(map(str, rows))}]"
    views, row0 = {}, 0
    for part, n in zip(parts, rows):
        views[part] = replace(t, name=prefix + gguf_name(LayerWeights, part), shape=(t.shape[0], n),
                              offset=t.offset + row0 * t.row_bytes, nbytes=n * t.row_bytes)
        row0 += n
    return views, None


@dataclass
class Binding:
    """What binding the fields of one or more dataclasses to a file's tensors found: the names read, and
    what is missing or misfits (each a line of the error that names them all)."""
    tensors: dict
    missing: list = field(default_factory=list)
    misfits: list = field(default_factory=list)
    read: set = field(default_factory=set)

    def take(self, cls, flags, prefix: str, sizes: dict, fused: dict | None = None):
        """An instance of cls whose declared fields are the tensors `prefix + name` (None when absent),
        checked against `sizes`; `fused`: tensors holding several fields' rows (FUSED)."""
        tensors, values = self.tensors, {}
        for fused_name, parts in (fused or {}).items():
            if (t := tensors.get(prefix + fused_name)) is not None:
                self.read.add(prefix + fused_name)
                views, why = _cut_fused(t, prefix, parts, sizes)
                values.update(views or dict.fromkeys(parts))     # present, even when it does not fit
                if why:
                    self.misfits.append(f"{prefix + fused_name} {why}")
        for f in _bound(cls):
            if f.name in values:
                continue
            name = next((prefix + n for n in spellings(f) if prefix + n in tensors), prefix + f.metadata["gguf"])
            t = values[f.name] = tensors.get(name)
            if t is None:
                if _required(f.metadata["when"], flags):
                    self.missing.append(name)
                continue
            self.read.add(name)
            if why := _misfit(t, f.metadata["shape"], sizes):
                self.misfits.append(f"{name} {why}")
        return cls(**values)

    def take_bounds(self, stem: str) -> list | None:
        """The four clamp bounds of the clippable linear whose weight is `stem.weight` (the scalars
        `stem.input_min`, `.input_max`, `.output_min`, `.output_max`, in that order), read; None when the
        file has none of them (a misfit when it has some, or ones that are not scalars)."""
        scalars = [self.tensors.get(f"{stem}.{b}") for b in CLAMP_BOUNDS]
        if all(t is None for t in scalars):
            return None
        if any(t is None or t.shape != (1,) for t in scalars):
            self.misfits.append(f"{stem}: its clamp bounds are not four scalars")
        self.read.update(f"{stem}.{b}" for b in CLAMP_BOUNDS)
        return scalars

    def check(self) -> None:
        """WeightsError naming every missing and misfitting tensor, if any."""
        if self.missing:
            raise WeightsError(f"the GGUF lacks {_listing(self.missing)}")
        if self.misfits:
            raise WeightsError("tensors that do not fit the model's hyperparameters (shapes in ggml order, row "
                               f"length first): {_listing(self.misfits, '; ')}")


def bind(cfg, tensors: dict) -> ModelWeights:
    """ModelWeights whose fields are tensors[name] (None when absent), checked against the config
    before anything uses them: missing required tensors, present ones of the wrong shape or
    type, and tensors no field reads raise WeightsError naming each.

    `tensors` maps GGUF names to TensorInfo (or anything with its `shape`, ggml order, and `type`;
    fused tensors are cut with dataclasses.replace, so a TensorInfo for those)."""
    found = Binding(tensors)
    sizes = _sizes(cfg)
    model_class, layer_class = cfg.weights_classes()
    w = found.take(model_class, cfg, "", sizes)
    w.layers = [found.take(layer_class, lc, layer_prefix(lc.index), sizes | _layer_sizes(cfg, lc), FUSED)
                for lc in cfg.layers]
    found.check()
    unread = sorted(n for n in tensors if n not in found.read and encoder_part(n) is None)
    if unread:
        raise WeightsError(f"the GGUF has tensors this app does not know how to use: {_listing(unread)}. "
                           "Running without them would give wrong answers; the file may come from a newer "
                           "converter or another model family")
    return w


def names(cfg, weights: ModelWeights):
    """(GGUF name, field owner, field name) for every present tensor: messages and planners."""
    for f in _bound(type(weights)):
        if getattr(weights, f.name) is not None:
            yield f.metadata["gguf"], weights, f.name
    for lc, lw in zip(cfg.layers, weights.layers):
        for f in _bound(type(lw)):
            if getattr(lw, f.name) is not None:
                yield layer_prefix(lc.index) + f.metadata["gguf"], lw, f.name
