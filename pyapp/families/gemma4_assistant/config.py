"""The assistant drafter's hyperparameters, read from `gemma4-assistant.*` keys (llama.cpp's converter).

Its layers are Gemma 4 layers without K/V projections: each attends to the target's K/V of its own
kind (sliding or full), so its head widths, K/V heads and window must be the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...model.config import MAX_CONTEXT, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS, MAX_VOCAB, MAX_WIDTH, VEC, ARRAYS, \
    ConfigError, Keys
from .weights import HEAD

ARCH = "gemma4-assistant"


@dataclass(frozen=True)
class DrafterLayer:
    index: int
    sliding: bool          # attends to the target's last sliding layer's K/V (else its last full layer's)
    head_dim: int
    n_kv_heads: int
    ffn_dim: int
    rope_base: float
    rope_dims: int


@dataclass(frozen=True)
class DrafterConfig:
    n_layers: int
    hidden: int
    backbone_hidden: int       # the target's width: its hidden state and token embeddings come in, a state goes out
    n_heads: int
    vocab_size: int
    eps: float
    sliding_window: int
    layers: tuple[DrafterLayer, ...]

    @classmethod
    def from_gguf(cls, gguf) -> "DrafterConfig":
        vocab = gguf.tensors[HEAD].shape[1] if HEAD in gguf.tensors else None
        return cls.from_metadata(gguf.metadata, vocab)

    @classmethod
    def from_metadata(cls, meta: dict, vocab_size: int | None = None) -> "DrafterConfig":
        arch = meta.get("general.architecture")
        if arch != ARCH:
            raise ConfigError(f"architecture {arch!r} is not an assistant drafter ({ARCH})")
        k = Keys(meta, ARCH)
        n = k.integer("block_count", 1, MAX_LAYERS)
        hidden = k.integer("embedding_length", VEC, MAX_WIDTH, multiple=VEC)
        backbone = k.integer("embedding_length_out", VEC, MAX_WIDTH, multiple=VEC)
        n_heads = k.integer("attention.head_count", 1, MAX_HEADS)
        shared = k.integer("attention.shared_kv_layers", 0, n, n)
        if shared != n:
            k.fail("attention.shared_kv_layers", shared, f"must be the block count ({n}): every layer reads the target's K/V")
        pattern = k.per_layer_bool("attention.sliding_window_pattern", n, False)
        head_dim_full = k.integer("attention.key_length", VEC, MAX_HEAD_DIM, 512, VEC)
        head_dim_sliding = k.integer("attention.key_length_swa", VEC, MAX_HEAD_DIM, 256, VEC)
        kv_heads = k.per_layer_int("attention.head_count_kv", n, 1, n_heads, divides=n_heads)
        ffn = k.per_layer_int("feed_forward_length", n, VEC, MAX_WIDTH, VEC)
        rope_base_full = k.number("rope.freq_base", 1_000_000.0)
        rope_base_sliding = k.number("rope.freq_base_swa", 10_000.0)
        rope_dims_full = k.integer("rope.dimension_count", 2, head_dim_full, head_dim_full, multiple=2)
        rope_dims_sliding = k.integer("rope.dimension_count_swa", 2, head_dim_sliding, head_dim_sliding, multiple=2)
        window = k.integer("attention.sliding_window", 0, MAX_CONTEXT, 0)
        eps = k.number("attention.layer_norm_rms_epsilon", 1e-6, hi=1.0)
        if vocab_size is None:
            tokens = meta.get("tokenizer.ggml.tokens", ())
            vocab_size = len(tokens) if isinstance(tokens, ARRAYS) else 0
        if not 1 <= vocab_size <= MAX_VOCAB:
            raise ConfigError(f"a vocabulary of {vocab_size} tokens: expected 1 to {MAX_VOCAB}")

        def layer(i: int) -> DrafterLayer:
            sliding = pattern[i]
            return DrafterLayer(index=i, sliding=sliding,
                                head_dim=head_dim_sliding if sliding else head_dim_full,
                                n_kv_heads=kv_heads[i], ffn_dim=ffn[i],
                                rope_base=rope_base_sliding if sliding else rope_base_full,
                                rope_dims=rope_dims_sliding if sliding else rope_dims_full)

        return cls(n_layers=n, hidden=hidden, backbone_hidden=backbone, n_heads=n_heads, vocab_size=vocab_size,
                   eps=eps, sliding_window=window, layers=tuple(layer(i) for i in range(n)))

    @property
    def sliding_keys(self) -> int:
        """The keys a sliding layer's query sees, all before its position: the window + 1 (transformers'
        bidirectional window, distances 0..W, flipped onto the keys' end); 0: no window, every key."""
        return self.sliding_window + 1 if self.sliding_window else 0

    def check_target(self, target) -> None:
        """ConfigError unless this drafter can read the target's (a pyapp.model.config.Gemma4Config) K/V and state."""
        problems = []
        if target.hidden != self.backbone_hidden:
            problems.append(f"it was made for a target of width {self.backbone_hidden}, the target's is {target.hidden}")
        if target.vocab_size != self.vocab_size:
            problems.append(f"its vocabulary has {self.vocab_size} tokens, the target's {target.vocab_size}")
        if target.sliding_window != self.sliding_window:
            problems.append(f"its window is {self.sliding_window}, the target's {target.sliding_window}")
        for lc in self.layers:
            source = target.layers[kv_layer(target, lc.sliding)]
            if (source.head_dim, source.n_kv_heads) != (lc.head_dim, lc.n_kv_heads):
                problems.append(f"layer {lc.index} reads {lc.n_kv_heads} K/V heads of {lc.head_dim}, the target's "
                                f"layer {source.index} has {source.n_kv_heads} of {source.head_dim}")
            elif (source.rope_base, source.rope_dims) != (lc.rope_base, lc.rope_dims):
                problems.append(f"layer {lc.index} ropes {lc.rope_dims} dims at base {lc.rope_base:g}, the keys it "
                                f"reads {source.rope_dims} at {source.rope_base:g}")
        if problems:
            raise ConfigError("the drafter does not fit this target: " + "; ".join(problems))


def kv_layer(target, sliding: bool) -> int:
    """The target layer whose K/V a drafter layer of this kind reads: the last one of that kind that
    computes its own K/V (transformers' kv_sharing_modes 'store')."""
    owners = [lc.index for lc in target.layers if lc.owns_kv and lc.sliding == sliding]
    if not owners:
        raise ConfigError(f"the target has no {'sliding' if sliding else 'full'} attention layer with its own K/V")
    return owners[-1]
