"""Gemma 4 hyperparameters, read from GGUF metadata.

Mirrors how Ollama's model/models/gemma4 (newTextModel) and llama.cpp's gemma4
loader interpret the `gemma4.*` keys. Every value the forward pass needs is
resolved per layer here, so the reference and the GPU engine share one source
of truth and never read metadata themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import weights

ARCH = "gemma4"


class ConfigError(ValueError):
    """The GGUF does not describe a Gemma 4 text model we can run."""


def _per_layer(value, n: int, what: str) -> list:
    """Scalar -> repeated; array -> checked length (GGUF stores some keys either way)."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ConfigError(f"{what} has {len(value)} entries for {n} layers")
        return list(value)
    return [value] * n


@dataclass(frozen=True)
class LayerConfig:
    index: int
    sliding: bool            # sliding-window (local) attention, else global
    head_dim: int
    n_kv_heads: int
    ffn_dim: int
    rope_base: float
    rope_dims: int           # rotated dims (NeoX pairs i, i + rope_dims/2); global layers use freq factors
    kv_source: int           # layer whose K/V this layer attends to (itself unless KV-shared)
    has_moe: bool = False    # experts beside the dense MLP (26B-A4B)
    k_eq_v: bool = False     # no V projection: V is the raw K projection (attention_k_eq_v)
    has_ple: bool = False    # per-layer embedding gate after the FFN (E2B, E4B)
    experts_fused: bool = False   # experts' gate and up stored as one tensor (ffn_gate_up_exps)

    @property
    def shares_kv(self) -> bool:
        return self.kv_source != self.index

    @property
    def owns_kv(self) -> bool:
        return not self.shares_kv

    @property
    def has_v(self) -> bool:
        return self.owns_kv and not self.k_eq_v

    @property
    def experts_split(self) -> bool:
        return self.has_moe and not self.experts_fused


@dataclass(frozen=True)
class Gemma4Config:
    n_layers: int
    hidden: int
    n_heads: int
    vocab_size: int
    context_length: int
    eps: float
    sliding_window: int
    final_softcap: float          # 0 = off
    ple_dim: int                  # per-layer embedding width, 0 = no PLE
    n_shared_kv_layers: int
    n_experts: int                # 0 = dense model
    n_experts_used: int
    expert_ffn_dim: int
    layers: tuple[LayerConfig, ...] = field(repr=False)

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def has_ple(self) -> bool:
        return self.ple_dim > 0

    @property
    def first_shared_layer(self) -> int:
        return self.n_layers - self.n_shared_kv_layers

    @classmethod
    def from_gguf(cls, gguf) -> "Gemma4Config":
        """Hyperparameters from the metadata; per-layer kinds (MoE, K=V) from which tensors exist."""
        emb = gguf.tensors.get(weights.gguf_name(weights.ModelWeights, "token_embd"))
        return cls.from_metadata(gguf.metadata, vocab_size=emb.shape[1] if emb is not None else None,
                                 tensors=gguf.tensors)

    @classmethod
    def from_metadata(cls, meta: dict, vocab_size: int | None = None, tensors=None) -> "Gemma4Config":
        """`tensors` (names of the GGUF's tensors), when given, resolves the layer kinds that only
        the tensor list tells; without it every layer of an MoE model counts as MoE."""
        arch = meta.get("general.architecture")
        if arch != ARCH:
            raise ConfigError(f"architecture is {arch!r}, not {ARCH!r}: this app runs Gemma 4 models only")

        def get(key, default=None, required=False):
            full = f"{ARCH}.{key}"
            if full not in meta:
                if required:
                    raise ConfigError(f"GGUF metadata lacks {full}")
                return default
            return meta[full]

        n = int(get("block_count", required=True))
        hidden = int(get("embedding_length", required=True))
        n_heads = int(get("attention.head_count", required=True))
        pattern = [bool(x) for x in _per_layer(get("attention.sliding_window_pattern", False), n,
                                               "attention.sliding_window_pattern")]
        head_dim_global = int(get("attention.key_length", 512))
        head_dim_swa = int(get("attention.key_length_swa", 256))
        kv_heads = [int(x) for x in _per_layer(get("attention.head_count_kv", required=True), n,
                                               "attention.head_count_kv")]
        global_kv = get("attention.global_head_count_kv")  # Ollama's converter writes this scalar
        if global_kv:
            kv_heads = [h if s else int(global_kv) for h, s in zip(kv_heads, pattern)]
        ffn = [int(x) for x in _per_layer(get("feed_forward_length", required=True), n, "feed_forward_length")]

        rope_base = float(get("rope.freq_base", 1_000_000.0))
        rope_base_swa = float(get("rope.freq_base_swa", get("rope.local.freq_base", 10_000.0)))
        rope_dims_global = int(get("rope.dimension_count", 0)) or int(
            head_dim_global * float(get("rope.partial_rotary_factor", 1.0)))
        rope_dims_swa = int(get("rope.dimension_count_swa", 0)) or head_dim_swa

        n_experts = int(get("expert_count", 0) or 0)
        ple_dim = int(get("embedding_length_per_layer_input", 0) or 0)
        n_shared = int(get("attention.shared_kv_layers", 0))
        first_shared = n - n_shared
        if not 0 <= n_shared < n:
            raise ConfigError(f"attention.shared_kv_layers={n_shared} with {n} layers")

        def kv_source(i: int) -> int:
            # A shared layer reuses the K/V of the last non-shared layer of its own kind.
            if i < first_shared:
                return i
            for j in range(first_shared - 1, -1, -1):
                if pattern[j] == pattern[i]:
                    return j
            raise ConfigError(f"shared layer {i} has no earlier {'sliding' if pattern[i] else 'global'} layer")

        layers = tuple(
            LayerConfig(
                index=i,
                sliding=pattern[i],
                head_dim=head_dim_swa if pattern[i] else head_dim_global,
                n_kv_heads=kv_heads[i],
                ffn_dim=ffn[i],
                rope_base=rope_base_swa if pattern[i] else rope_base,
                rope_dims=rope_dims_swa if pattern[i] else rope_dims_global,
                kv_source=kv_source(i),
                has_moe=n_experts > 0 and (tensors is None or weights.present(tensors, "router", i)),
                k_eq_v=kv_source(i) == i and tensors is not None and not weights.present(tensors, "attn_v", i),
                has_ple=ple_dim > 0,
                experts_fused=tensors is not None and weights.present(tensors, "experts_gate_up", i),
            )
            for i in range(n)
        )
        for lc in layers:
            if n_heads % lc.n_kv_heads:
                raise ConfigError(f"layer {lc.index}: {n_heads} heads not a multiple of {lc.n_kv_heads} KV heads")

        return cls(
            n_layers=n,
            hidden=hidden,
            n_heads=n_heads,
            vocab_size=int(vocab_size or len(meta.get("tokenizer.ggml.tokens", ()))),
            context_length=int(get("context_length", 131072)),
            eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            sliding_window=int(get("attention.sliding_window", 0)),
            final_softcap=float(get("final_logit_softcapping", 0.0) or 0.0),
            ple_dim=ple_dim,
            n_shared_kv_layers=n_shared,
            n_experts=n_experts,
            n_experts_used=int(get("expert_used_count", 0) or 0),
            expert_ffn_dim=int(get("expert_feed_forward_length", 0) or 0),
            layers=layers,
        )

    def describe(self) -> str:
        kinds = "".join("S" if lc.sliding else "G" for lc in self.layers)
        parts = [f"{self.n_layers} layers ({kinds})", f"hidden {self.hidden}", f"{self.n_heads} heads",
                 f"vocab {self.vocab_size}", f"window {self.sliding_window}"]
        if self.ple_dim:
            parts.append(f"PLE {self.ple_dim}")
        if self.n_shared_kv_layers:
            parts.append(f"{self.n_shared_kv_layers} KV-shared layers")
        if self.is_moe:
            parts.append(f"MoE {self.n_experts_used}/{self.n_experts} experts x {self.expert_ffn_dim}")
        return ", ".join(parts)
