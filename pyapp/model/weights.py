"""Where each Gemma 4 weight lives in a GGUF: model fields bound to tensor names, once.

Like the struct tags of Ollama's model_text.go, every field below names its GGUF
tensor (layer fields relative to `blk.N.`) and says when the model needs it:
`when` names a flag of the layer's LayerConfig (or of Gemma4Config for the
model-level fields); a field whose flag is false is absent, one with
`when=OPTIONAL` may be absent either way. This module is the only place in
pyapp that spells tensor names: the reference forward, the GPU forward and the
upload planner read fields.

    w = bind(cfg, gguf.tensors)            # ModelWeights of TensorInfo
    w.layers[3].attn_q                      # -> TensorInfo of blk.3.attn_q.weight
    w = w.map(load)                         # the same structure, any value type

A new feature's tensors (DiffusionGemma's extras, LoRA pairs) are a few more
declared fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Callable

OPTIONAL = "optional"        # `when` of a field that may be absent on any model
ALWAYS = None                # `when` of a field every model has


class WeightsError(ValueError):
    """The GGUF lacks tensors this model needs."""


def tensor(name: str, when: str | None = ALWAYS):
    """A field bound to the GGUF tensor `name`, required when the config flag `when` is true."""
    return field(default=None, metadata={"gguf": name, "when": when})


def runtime(doc: str):
    """A field the runtime fills (fused groups); never read from the GGUF."""
    return field(default=None, metadata={"runtime": doc})


@dataclass
class LayerWeights:
    # attention
    attn_norm: object = tensor("attn_norm.weight")
    attn_q: object = tensor("attn_q.weight")
    attn_q_norm: object = tensor("attn_q_norm.weight")
    attn_k: object = tensor("attn_k.weight", when="owns_kv")            # KV-shared layers reuse another's K/V
    attn_v: object = tensor("attn_v.weight", when="has_v")              # absent: V is the raw K (k_eq_v)
    attn_k_norm: object = tensor("attn_k_norm.weight", when="owns_kv")
    attn_output: object = tensor("attn_output.weight")
    post_attention_norm: object = tensor("post_attention_norm.weight")
    # dense MLP (every layer; on MoE layers it runs beside the experts)
    ffn_norm: object = tensor("ffn_norm.weight")
    ffn_gate: object = tensor("ffn_gate.weight")
    ffn_up: object = tensor("ffn_up.weight")
    ffn_down: object = tensor("ffn_down.weight")
    post_ffw_norm: object = tensor("post_ffw_norm.weight")
    # mixture of experts
    post_ffw_norm_1: object = tensor("post_ffw_norm_1.weight", when="has_moe")
    router: object = tensor("ffn_gate_inp.weight", when="has_moe")                 # [E, hidden]
    router_scale: object = tensor("ffn_gate_inp.scale", when=OPTIONAL)           # [hidden]
    pre_ffw_norm_2: object = tensor("pre_ffw_norm_2.weight", when="has_moe")
    experts_gate_up: object = tensor("ffn_gate_up_exps.weight", when="experts_fused")  # [E, 2*eff, hidden]
    experts_gate: object = tensor("ffn_gate_exps.weight", when="experts_split")        # [E, eff, hidden]
    experts_up: object = tensor("ffn_up_exps.weight", when="experts_split")
    experts_down: object = tensor("ffn_down_exps.weight", when="has_moe")              # [E, hidden, eff]
    experts_down_scale: object = tensor("ffn_down_exps.scale", when=OPTIONAL)        # [E]
    post_ffw_norm_2: object = tensor("post_ffw_norm_2.weight", when="has_moe")
    # per-layer embeddings (PLE)
    ple_gate: object = tensor("inp_gate.weight", when="has_ple")       # [ple_dim, hidden]
    ple_proj: object = tensor("proj.weight", when="has_ple")           # [hidden, ple_dim]
    ple_post_norm: object = tensor("post_norm.weight", when="has_ple")
    output_scale: object = tensor("layer_output_scale.weight", when=OPTIONAL)    # [1]
    # filled by the GPU upload planner (pyapp.runtime.upload), absent in the GGUF
    qkv: object = runtime("q, k (and v) rows in one buffer: one matvec per decode step")
    ffn_gate_up: object = runtime("ffn_gate and ffn_up rows in one buffer: one GeGLU matvec")


@dataclass
class ModelWeights:
    token_embd: object = tensor("token_embd.weight")                   # [vocab, hidden]; also the tied head
    output: object = tensor("output.weight", when=OPTIONAL)            # absent: the head is token_embd
    output_norm: object = tensor("output_norm.weight")
    rope_freqs: object = tensor("rope_freqs.weight", when=OPTIONAL)    # global layers' frequency factors
    ple_token_embd: object = tensor("per_layer_token_embd.weight", when="has_ple")   # [vocab, L*ple_dim]
    ple_model_proj: object = tensor("per_layer_model_proj.weight", when="has_ple")   # [L*ple_dim, hidden]
    ple_proj_norm: object = tensor("per_layer_proj_norm.weight", when="has_ple")     # [ple_dim]
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


def gguf_name(cls, field_name: str, layer: int | None = None) -> str:
    """The GGUF tensor name of a declared field (for messages and lookups)."""
    name = next(f.metadata["gguf"] for f in fields(cls) if f.name == field_name)
    return name if layer is None else layer_prefix(layer) + name


def present(tensors, field_name: str, layer: int | None = None) -> bool:
    """Whether the GGUF has the tensor of this field (config flags are resolved from this)."""
    cls = ModelWeights if layer is None else LayerWeights
    return gguf_name(cls, field_name, layer) in tensors


def _required(when, flags) -> bool:
    return when is ALWAYS or (when != OPTIONAL and bool(getattr(flags, when)))


def bind(cfg, tensors: dict) -> ModelWeights:
    """ModelWeights whose fields are tensors[name] (None when absent); missing required ones raise.

    `tensors` maps GGUF names to anything (TensorInfo, arrays): only the lookup is done here."""
    missing = []

    def take(cls, flags, prefix):
        values = {}
        for f in _bound(cls):
            name = prefix + f.metadata["gguf"]
            values[f.name] = tensors.get(name)
            if values[f.name] is None and _required(f.metadata["when"], flags):
                missing.append(name)
        return cls(**values)

    w = take(ModelWeights, cfg, "")
    w.layers = [take(LayerWeights, lc, layer_prefix(lc.index)) for lc in cfg.layers]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise WeightsError(f"the GGUF lacks {shown}")
    return w


def names(cfg, weights: ModelWeights):
    """(GGUF name, field owner, field name) for every present tensor: messages and planners."""
    for f in _bound(ModelWeights):
        if getattr(weights, f.name) is not None:
            yield f.metadata["gguf"], weights, f.name
    for lc, lw in zip(cfg.layers, weights.layers):
        for f in _bound(LayerWeights):
            if getattr(lw, f.name) is not None:
                yield layer_prefix(lc.index) + f.metadata["gguf"], lw, f.name
