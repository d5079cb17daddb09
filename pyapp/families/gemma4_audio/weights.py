"""Where each weight of Gemma 4's audio encoder lives in a GGUF: fields bound to tensor names, once.

The names below are llama.cpp's (its projector files, mmproj: `clip.audio.*` keys). Ollama's original
blobs hold the same tensors inline, five of them under other names, two of which are llama.cpp's names
of other tensors (`a.pre_encode.out.weight` is Ollama's input projection and llama.cpp's output
projection; `ln2` Ollama's post-attention norm and llama.cpp's block output norm). Ollama renames them
itself when it gives such a blob to llama.cpp (llama/compat/llama-ollama-compat.cpp,
handle_gemma4_clip); `OLLAMA_NAMES` is that table, applied once (`file_names`) before the fields are
bound, so nothing else reads a name twice.

Both converters apply softplus to each layer's per_dim_scale (the file holds the query's scale), squeeze
the depthwise conv to [kernel, hidden] and keep the subsampling convs as [3, 3, in, out] (ggml order).
Every clippable linear has four bound scalars (`....attn_q.input_min` ...) in both forms.
Shapes are in ggml order (row length first), as in pyapp.model.weights, whose binder checks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...model.weights import Binding, WeightsError, gguf_name, tensor

# the clippable linears of a layer: transformers' Gemma4ClippableLinear (the relative-position projection is not one)
LINEARS = ("ffn_up", "ffn_down", "attn_q", "attn_k", "attn_v", "attn_out", "conv_pw1", "conv_pw2",
           "ffn_up_1", "ffn_down_1")


@dataclass
class AudioLayerWeights:
    # the first half-step feed-forward (transformers' feed_forward1)
    ffn_norm: object = tensor("ffn_norm.weight", "hidden")
    ffn_up: object = tensor("ffn_up.weight", "hidden ff")
    ffn_down: object = tensor("ffn_down.weight", "ff hidden")
    ffn_post_norm: object = tensor("ffn_post_norm.weight", "hidden")
    # chunked local attention with relative positions (self_attn, norm_pre_attn, norm_post_attn)
    attn_pre_norm: object = tensor("attn_pre_norm.weight", "hidden")
    attn_q: object = tensor("attn_q.weight", "hidden hidden")
    attn_k: object = tensor("attn_k.weight", "hidden hidden")
    attn_v: object = tensor("attn_v.weight", "hidden hidden")
    per_dim_scale: object = tensor("per_dim_scale.weight", "hd")       # softplus(per_dim_scale): the converters'
    attn_k_rel: object = tensor("attn_k_rel.weight", "hidden hidden")   # the relative positions' key projection
    attn_out: object = tensor("attn_out.weight", "hidden hidden")
    attn_post_norm: object = tensor("attn_post_norm.weight", "hidden")
    # the light convolution (lconv1d): norm, pointwise to 2 x hidden, GLU, causal depthwise, norm, SiLU, pointwise
    conv_norm: object = tensor("conv_norm.weight", "hidden")            # before conv_pw1 (lconv1d.pre_layer_norm)
    conv_pw1: object = tensor("conv_pw1.weight", "hidden 2*hidden")
    conv_dw: object = tensor("conv_dw.weight", "kernel hidden")
    norm_conv: object = tensor("norm_conv.weight", "hidden")            # after conv_dw (lconv1d.conv_norm)
    conv_pw2: object = tensor("conv_pw2.weight", "hidden hidden")
    # the second half-step feed-forward (feed_forward2)
    ffn_norm_1: object = tensor("ffn_norm_1.weight", "hidden")
    ffn_up_1: object = tensor("ffn_up_1.weight", "hidden ff")
    ffn_down_1: object = tensor("ffn_down_1.weight", "ff hidden")
    ffn_post_norm_1: object = tensor("ffn_post_norm_1.weight", "hidden")
    # the block's output norm (norm_out)
    out_norm: object = tensor("ln2.weight", "hidden")
    # each clippable linear's (in_min, in_max, out_min, out_max) scalars
    bounds: dict = field(default_factory=dict)


@dataclass
class AudioWeights:
    # the subsampling front end: two 3 x 3 stride-2 convs over (time, mel), each with a LayerNorm over channels
    conv0: object = tensor("a.conv1d.0.weight", "3 3 1 c0")
    conv0_norm: object = tensor("a.conv1d.0.norm.weight", "c0")
    conv1: object = tensor("a.conv1d.1.weight", "3 3 c0 c1")
    conv1_norm: object = tensor("a.conv1d.1.norm.weight", "c1")
    input_proj: object = tensor("a.input_projection.weight", "mels/4*c1 hidden")
    # after the conformer layers: the output projection, then the embedder's unscaled norm and projection
    output_proj: object = tensor("a.pre_encode.out.weight", "hidden out")
    output_bias: object = tensor("a.pre_encode.out.bias", "out")
    projection: object = tensor("mm.a.input_projection.weight", "out text_hidden")
    layers: list = field(default_factory=list)


def layer_prefix(i: int) -> str:
    return f"a.blk.{i}."


# Ollama's inline names of the tensors llama.cpp names otherwise (handle_gemma4_clip): llama.cpp's -> Ollama's
OLLAMA_NAMES = {"a.input_projection.weight": "a.pre_encode.out.weight",
                "a.pre_encode.out.weight": "mm.a.fc.weight",
                "a.pre_encode.out.bias": "mm.a.fc.bias"}
OLLAMA_LAYER_NAMES = {"attn_pre_norm.weight": "ln1.weight",
                      "attn_post_norm.weight": "ln2.weight",
                      "ln2.weight": "layer_pre_norm.weight",
                      "attn_k_rel.weight": "linear_pos.weight"}

CONV0 = gguf_name(AudioWeights, "conv0")              # a file holds an audio encoder iff it has this tensor
PROJECTION = gguf_name(AudioWeights, "projection")


def is_audio_tensor(name: str) -> bool:
    """A tensor of the audio encoder or its projector (mm.a.*)."""
    return name.startswith(("a.", "mm.a."))


def file_names(tensors: dict, ollama: bool) -> dict:
    """The file's audio tensors under llama.cpp's names (Ollama's renamed when `ollama`: its inline form)."""
    if not ollama:
        return {n: t for n, t in tensors.items() if is_audio_tensor(n)}
    model_names = {o: c for c, o in OLLAMA_NAMES.items()}
    layer_names = {o: c for c, o in OLLAMA_LAYER_NAMES.items()}
    out = {}
    for name, t in tensors.items():
        if not is_audio_tensor(name):
            continue
        if name.startswith("a.blk.") and name.count(".") >= 3:
            block, leaf = name.split(".", 3)[2:]
            out[f"a.blk.{block}.{layer_names.get(leaf, leaf)}"] = t
        else:
            out[model_names.get(name, name)] = t
    return out


def bind(cfg, tensors: dict) -> AudioWeights:
    """AudioWeights of the file's tensors (TensorInfo), shapes checked, from either form (cfg.ollama: the
    names of Ollama's blobs); the encoder's tensors that no field reads are an error."""
    named = file_names(tensors, cfg.ollama)
    found = Binding(named)
    sizes = {"hidden": cfg.hidden, "hd": cfg.head_dim, "ff": cfg.ffn_dim, "2*hidden": 2 * cfg.hidden,
             "kernel": cfg.conv_kernel, "3": 3, "1": 1, "c0": cfg.channels[0], "c1": cfg.channels[1],
             "mels/4*c1": cfg.n_mels // 4 * cfg.channels[1], "out": cfg.out_dim, "text_hidden": cfg.text_hidden}
    w = found.take(AudioWeights, cfg, "", sizes)
    for i in range(cfg.n_layers):
        lw = found.take(AudioLayerWeights, cfg, layer_prefix(i), sizes)
        for lin in LINEARS:
            stem = layer_prefix(i) + gguf_name(AudioLayerWeights, lin).removesuffix(".weight")
            if (scalars := found.take_bounds(stem)) is not None:
                lw.bounds[lin] = scalars
        w.layers.append(lw)
    found.check()
    _refuse_unread(named, found.read)
    return w


@dataclass
class FrameProjectionWeights:
    """The 12B's audio input: one matrix, each frame's samples (normed without a scale) to a soft token."""
    projection: object = tensor(PROJECTION, "frame text_hidden")


def bind_frame_projection(cfg, tensors: dict) -> FrameProjectionWeights:
    """FrameProjectionWeights of the file's tensors, shape checked; audio tensors no field reads are an error."""
    found = Binding(tensors)
    w = found.take(FrameProjectionWeights, cfg, "", {"frame": cfg.frame, "text_hidden": cfg.text_hidden})
    found.check()
    _refuse_unread(tensors, found.read)
    return w


def _refuse_unread(tensors: dict, read: set) -> None:
    unread = sorted(n for n in tensors if is_audio_tensor(n) and n not in read)
    if unread:
        raise WeightsError(f"the audio encoder has tensors this app does not know how to use: {', '.join(unread[:6])}")
