"""Where each weight of an assistant drafter lives in its GGUF (llama.cpp's converter): fields bound once.

Shapes in ggml order (row length first), checked by pyapp.model.weights' binder. The head is the
tied token_embd; the drafter's own embedding is never looked up (its input is the target's).
llama.cpp's converter leaves out the masked embedding (centroids and token ordering): a file that
holds them is refused as holding tensors no field reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...model.weights import OPTIONAL, Binding, WeightsError, tensor


@dataclass
class DrafterLayerWeights:
    attn_norm: object = tensor("attn_norm.weight", "hidden")
    attn_q: object = tensor("attn_q.weight", "hidden heads*hd")
    attn_q_norm: object = tensor("attn_q_norm.weight", "hd")
    attn_output: object = tensor("attn_output.weight", "heads*hd hidden")
    post_attention_norm: object = tensor("post_attention_norm.weight", "hidden")
    ffn_norm: object = tensor("ffn_norm.weight", "hidden")
    ffn_gate: object = tensor("ffn_gate.weight", "hidden ff")
    ffn_up: object = tensor("ffn_up.weight", "hidden ff")
    ffn_down: object = tensor("ffn_down.weight", "ff hidden")
    post_ffw_norm: object = tensor("post_ffw_norm.weight", "hidden")
    output_scale: object = tensor("layer_output_scale.weight", "1")


HEAD = "token_embd.weight"     # the tied head: its shape gives the vocabulary (config.py)


@dataclass
class DrafterWeights:
    pre_projection: object = tensor("nextn.pre_projection.weight", "2*backbone hidden")
    post_projection: object = tensor("nextn.post_projection.weight", "hidden backbone")
    token_embd: object = tensor(HEAD, "hidden vocab")      # the head
    output_norm: object = tensor("output_norm.weight", "hidden")
    rope_freqs: object = tensor("rope_freqs.weight", "full_hd/2", when=OPTIONAL)   # full layers' frequency factors
    layers: list = field(default_factory=list)

    def map(self, fn) -> "DrafterWeights":
        """The same fields, each tensor t replaced by fn(t) (None stays None)."""
        def each(obj):
            return {name: fn(value) if value is not None else None for name, value in vars(obj).items()
                    if name != "layers"}
        return DrafterWeights(**each(self), layers=[DrafterLayerWeights(**each(lw)) for lw in self.layers])


def bind(cfg, tensors: dict) -> DrafterWeights:
    """DrafterWeights of the file's tensors (TensorInfo), shapes checked; tensors no field reads are an error."""
    found = Binding(tensors)
    full_head_dim = next((lc.head_dim for lc in cfg.layers if not lc.sliding), None)
    sizes = {"1": 1, "hidden": cfg.hidden, "vocab": cfg.vocab_size, "backbone": cfg.backbone_hidden,
             "2*backbone": 2 * cfg.backbone_hidden, "full_hd/2": full_head_dim // 2 if full_head_dim else None}
    w = found.take(DrafterWeights, cfg, "", sizes)
    for lc in cfg.layers:
        layer_sizes = {"hd": lc.head_dim, "heads*hd": cfg.n_heads * lc.head_dim, "ff": lc.ffn_dim}
        w.layers.append(found.take(DrafterLayerWeights, lc, f"blk.{lc.index}.", sizes | layer_sizes))
    found.check()
    unread = sorted(n for n in tensors if n not in found.read)
    if unread:
        raise WeightsError(f"the drafter has tensors this app does not know how to use: {', '.join(unread[:6])}")
    return w
