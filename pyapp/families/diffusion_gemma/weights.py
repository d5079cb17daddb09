"""DiffusionGemma's tensors beyond Gemma 4's: the self-conditioning MLP (the previous step's soft
embeddings -> a signal added to the canvas input) and the encoder's per-layer output scale (the only
weight its two passes do not share). Declared as pyapp.model.weights declares Gemma 4's, bound by its
`bind` (the config names these classes: DiffusionGemmaConfig.weights_classes)."""

from __future__ import annotations

from dataclasses import dataclass

from ...model.weights import LayerWeights, ModelWeights, tensor


@dataclass
class DiffusionLayerWeights(LayerWeights):
    enc_output_scale: object = tensor("enc_layer_output_scale.weight", "1")


@dataclass
class DiffusionWeights(ModelWeights):
    self_cond_pre_norm: object = tensor("self_cond_pre_norm.weight", "hidden")
    self_cond_gate: object = tensor("self_cond_gate.weight", "hidden self_cond_ff")
    self_cond_up: object = tensor("self_cond_up.weight", "hidden self_cond_ff")
    self_cond_down: object = tensor("self_cond_down.weight", "self_cond_ff hidden")
