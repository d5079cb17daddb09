"""Where each weight of Gemma 4's image encoder lives in a GGUF: fields bound to tensor names, once.

The same names in Ollama's original blobs (inline beside the text model) and llama.cpp's projector
files; what differs is the clippable linears' bounds: four scalars per linear
(`v.blk.N.attn_q.input_min` ...) in projector files and today's Ollama converter, all of them packed in
`v.clamp_data` in the original library tags (7 linears x 4 a layer, in LINEARS' order).
Shapes are in ggml order, as in pyapp.model.weights, whose binder checks them.

The 12B's patch projection (PatchProjectionWeights) has no layers: three LayerNorms (weight and bias)
around the patch embedding (with its bias) and the position table, then the same projection; llama.cpp's
projector files name its LayerNorms `v.patch_norm.{1,2,3}` (3: transformers' pos_norm).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...model.weights import CLAMP_BOUNDS, OPTIONAL, Binding, WeightsError, gguf_name, tensor

LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")   # v.clamp_data's order
BOUNDS = CLAMP_BOUNDS


@dataclass
class VisionLayerWeights:
    # attention: every patch sees every patch (q, k normed and rotated in 2-D; v normed without a scale)
    attn_norm: object = tensor("ln1.weight", "hidden")
    attn_q: object = tensor("attn_q.weight", "hidden heads*hd")
    attn_k: object = tensor("attn_k.weight", "hidden kv_heads*hd")
    attn_v: object = tensor("attn_v.weight", "hidden kv_heads*hd")
    attn_q_norm: object = tensor("attn_q_norm.weight", "hd")
    attn_k_norm: object = tensor("attn_k_norm.weight", "hd")
    attn_output: object = tensor("attn_out.weight", "heads*hd hidden")
    post_attention_norm: object = tensor("attn_post_norm.weight", "hidden")
    # GeGLU MLP
    ffn_norm: object = tensor("ln2.weight", "hidden")
    ffn_gate: object = tensor("ffn_gate.weight", "hidden ff")
    ffn_up: object = tensor("ffn_up.weight", "hidden ff")
    ffn_down: object = tensor("ffn_down.weight", "ff hidden")
    post_ffw_norm: object = tensor("ffn_post_norm.weight", "hidden")
    # each clippable linear's (in_min, in_max, out_min, out_max), the scalars' tensors when the file has them
    bounds: dict = field(default_factory=dict)


@dataclass
class VisionWeights:
    patch_embd: object = None        # [p, p, 3, n] (a conv weight) or [p * p * 3, n]: checked in bind
    position_embd: object = tensor("v.position_embd.weight", "hidden positions 2")
    std_bias: object = tensor("v.std_bias", "hidden", when="has_std")
    std_scale: object = tensor("v.std_scale", "hidden", when="has_std")
    clamp_data: object = tensor("v.clamp_data", "packed", when=OPTIONAL)
    projection: object = tensor("mm.input_projection.weight", "hidden text_hidden")
    layers: list = field(default_factory=list)


def layer_prefix(i: int) -> str:
    return f"v.blk.{i}."


PATCH_EMBD = "v.patch_embd.weight"       # a file holds an image encoder iff it has this tensor
POSITIONS = gguf_name(VisionWeights, "position_embd")
PROJECTION = gguf_name(VisionWeights, "projection")
STD_BIAS = gguf_name(VisionWeights, "std_bias")       # the larger encoders' standardization after pooling


@dataclass
class PatchProjectionWeights:
    """The 12B's: each patch's values (3 * patch^2 of them) normed, embedded, normed, positioned, normed."""
    patch_norm: object = tensor("v.patch_norm.1.weight", "values")
    patch_norm_bias: object = tensor("v.patch_norm.1.bias", "values")
    patch_embd: object = tensor(PATCH_EMBD, "values hidden")
    patch_embd_bias: object = tensor("v.patch_embd.bias", "hidden")
    embd_norm: object = tensor("v.patch_norm.2.weight", "hidden")
    embd_norm_bias: object = tensor("v.patch_norm.2.bias", "hidden")
    position_embd: object = tensor("v.position_embd.weight", "hidden positions 2")
    position_norm: object = tensor("v.patch_norm.3.weight", "hidden")
    position_norm_bias: object = tensor("v.patch_norm.3.bias", "hidden")
    projection: object = tensor("mm.input_projection.weight", "hidden text_hidden")


PATCH_NORM = gguf_name(PatchProjectionWeights, "patch_norm")    # only the 12B's patch projection has it


def layer_tensor(i: int, field_name: str) -> str:
    """The GGUF name of a layer field of the encoder (config reads widths off their shapes)."""
    return layer_prefix(i) + gguf_name(VisionLayerWeights, field_name)


def is_vision_tensor(name: str) -> bool:
    """A tensor of the image encoder or its projector (the audio's are mm.a.* and a.*)."""
    return name.startswith("v.") or name.startswith("mm.") and not name.startswith("mm.a.")


def bind(cfg, tensors: dict) -> VisionWeights:
    """VisionWeights of the file's tensors (TensorInfo), shapes checked; the encoder's tensors that no
    field reads are an error, as in the text model."""
    found = Binding(tensors)
    sizes = {"hidden": cfg.hidden, "heads*hd": cfg.n_heads * cfg.head_dim, "kv_heads*hd": cfg.n_kv_heads * cfg.head_dim,
             "hd": cfg.head_dim, "ff": cfg.ffn_dim, "positions": cfg.n_positions, "2": 2,
             "text_hidden": cfg.text_hidden, "packed": None, "1": 1}
    w = found.take(VisionWeights, cfg, "", sizes)
    w.patch_embd = tensors[PATCH_EMBD]
    p, n = cfg.patch, cfg.hidden
    if tuple(w.patch_embd.shape) not in ((p, p, 3, n), (p * p * 3, n)):
        found.misfits.append(f"{PATCH_EMBD} has shape {list(w.patch_embd.shape)}, expected "
                             f"[{p}, {p}, 3, {n}] or [{p * p * 3}, {n}]")
    found.read.add(PATCH_EMBD)
    for i in range(cfg.n_layers):
        lw = found.take(VisionLayerWeights, cfg, layer_prefix(i), sizes)
        for lin in LINEARS:
            if (scalars := found.take_bounds(layer_prefix(i) + _gguf_stem(lin))) is not None:
                lw.bounds[lin] = scalars
        w.layers.append(lw)
    found.check()
    _refuse_unread(tensors, found.read)
    return w


def bind_patch_projection(cfg, tensors: dict) -> PatchProjectionWeights:
    """PatchProjectionWeights of the file's tensors, shapes checked; image tensors no field reads are an error."""
    found = Binding(tensors)
    sizes = {"values": 3 * cfg.patch * cfg.patch, "hidden": cfg.hidden, "positions": cfg.n_positions, "2": 2,
             "text_hidden": cfg.text_hidden}
    w = found.take(PatchProjectionWeights, cfg, "", sizes)
    found.check()
    _refuse_unread(tensors, found.read)
    return w


def _refuse_unread(tensors: dict, read: set) -> None:
    unread = sorted(n for n in tensors if is_vision_tensor(n) and n not in read)
    if unread:
        raise WeightsError(f"the image encoder has tensors this app does not know how to use: {', '.join(unread[:6])}")


def _gguf_stem(field_name: str) -> str:
    """The GGUF name of a linear's weight, less `.weight` (its bounds are named after it)."""
    return next(f.metadata["gguf"] for f in VisionLayerWeights.__dataclass_fields__.values()
                if f.name == field_name).removesuffix(".weight")
