"""Gemma 4 hyperparameters, read from GGUF metadata.

Mirrors how Ollama's model/models/gemma4 (newTextModel) and llama.cpp's gemma4
loader interpret the `gemma4.*` keys. Every value the forward pass needs is
resolved per layer here, so the reference and the GPU engine share one source
of truth and never read metadata themselves.

Every value is checked before use (type, range, agreement with the other keys
and with the tensor list): a bad file raises ConfigError naming the key and the
value, never a ZeroDivisionError or a huge allocation further on. Tensor shapes
are checked against the result by pyapp.model.weights.bind.
"""

from __future__ import annotations

import reprlib
from array import array
from dataclasses import dataclass, field
from typing import ClassVar

from ..errors import Fault, Gemma4Error
from . import weights

# The most soft tokens one image takes (Gemma 4's processor's largest budget; the vision family's BUDGETS).
IMAGE_TOKENS_MAX = 1120

ARCH = "gemma4"

# Bounds: each far above any Gemma 4, and within what the kernels take. They keep a
# corrupt header from sizing per-layer tables and GPU buffers by absurd numbers.
MAX_LAYERS = 1024           # Gemma 4 has tens; per-layer tables are built from this count
MAX_WIDTH = 1 << 18         # hidden, FFN and PLE widths (Gemma 4's are in the thousands)
MAX_HEADS = 1024            # query heads (Gemma 4: tens)
MAX_HEAD_DIM = 512          # the attention kernels hold one head of at most 512 dims (gpu.kernels)
VEC = 4                     # kernels move f32 rows as vec4 and read float weights in 4-element blocks
MAX_EXPERTS = 4096          # the router kernel ranks a token's experts in one workgroup (gpu.kernels.moe_route)
MAX_CONTEXT = 1 << 24       # positions reach the shaders as f32, exact integers up to 2^24
MAX_VOCAB = 1 << 24         # 64x Gemma 4's 262,144 tokens
F32_MAX = 3.4028234663852886e38   # float hyperparameters become f32 shader constants
ARRAYS = (list, tuple, array, memoryview)   # how a GGUF array may arrive from the reader

_repr = reprlib.Repr()                   # a value in a message, bounded (a corrupt array may be huge)
_repr.maxlist = _repr.maxarray = 6
_repr.maxstring = _repr.maxother = 40
show = _repr.repr


class ConfigError(Gemma4Error, ValueError):
    """The GGUF does not describe a Gemma 4 text model we can run."""


_REQUIRED = object()         # the default of a key that must be present


class Keys:
    """Typed, range-checked reads of an architecture's keys (`gemma4.*`, a family's own); a failure names key and value."""

    def __init__(self, meta: dict, arch: str = ARCH):
        self.meta, self.arch = meta, arch

    def raw(self, key: str, default):
        full = f"{self.arch}.{key}"
        if full in self.meta:
            return self.meta[full]
        if default is _REQUIRED:
            raise ConfigError(f"GGUF metadata lacks {full}")
        return default

    def fail(self, key: str, value, problem: str, index: int | None = None):
        where = f"{self.arch}.{key}" + (f"[{index}]" if index is not None else "")
        raise ConfigError(f"{where} = {show(value)}: {problem}")

    def check_int(self, key, v, lo, hi, multiple=1, index=None, divides=None) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            self.fail(key, v, "must be an integer", index)
        if not lo <= v <= hi:
            self.fail(key, v, f"must be between {lo} and {hi}", index)
        if v % multiple:
            self.fail(key, v, f"must be a multiple of {multiple}", index)
        if divides is not None and divides % v:
            self.fail(key, v, f"must divide {divides}", index)
        return v

    def integer(self, key, lo, hi, default=_REQUIRED, multiple=1) -> int:
        return self.check_int(key, self.raw(key, default), lo, hi, multiple)

    def number(self, key, default, hi=F32_MAX, zero_ok=False, alias=None) -> float:
        """A finite number in (0, hi], or [0, hi] with zero_ok."""
        if alias and f"{self.arch}.{key}" not in self.meta:
            key = alias
        v = self.raw(key, default)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            self.fail(key, v, "must be a number")
        if not (0 <= v <= hi if zero_ok else 0 < v <= hi):     # NaN fails both
            self.fail(key, v, f"must be {'>= 0' if zero_ok else '> 0'} and at most {hi:g}")
        return float(v)

    def per_layer(self, key, n: int, default, check) -> list:
        """Scalar -> checked once, repeated; array -> checked length and entries (GGUF stores some keys
        either way). check(value, index) validates one value."""
        v = self.raw(key, default)
        if not isinstance(v, ARRAYS):
            return [check(v, None)] * n
        if len(v) != n:
            self.fail(key, v, f"has {len(v)} entries for {n} layers")
        return [check(x, i) for i, x in enumerate(v)]

    def per_layer_int(self, key, n, lo, hi, multiple=1, divides=None) -> list[int]:
        return self.per_layer(key, n, _REQUIRED, lambda v, i: self.check_int(key, v, lo, hi, multiple, i, divides))

    def per_layer_bool(self, key, n, default) -> list[bool]:
        def check(v, i):
            if v not in (0, 1) or isinstance(v, float):      # bools, or 0/1 from a u8 array
                self.fail(key, v, "must be true or false", i)
            return bool(v)
        return self.per_layer(key, n, default, check)


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
    # ids never sampled (tokenizer.ggml.suppress_tokens: the 12B's generation_config.json lists them)
    suppress_tokens: tuple[int, ...] = ()
    # the id an image's soft tokens take for their per-layer embeddings (transformers' Gemma4Model)
    pad_id: int = 0

    # a DiffusionGemma model (it writes by denoising: what next-token use cases ask before they start)
    is_diffusion: ClassVar[bool] = False

    @classmethod
    def weights_classes(cls) -> tuple[type, type]:
        """The model's and a layer's weights (pyapp.model.weights): a family with more tensors subclasses them."""
        return weights.ModelWeights, weights.LayerWeights

    def weight_sizes(self) -> dict:
        """Sizes the family's own weight declarations name, beside weights._sizes' (none for Gemma 4 text)."""
        return {}

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def has_ple(self) -> bool:
        return self.ple_dim > 0

    @property
    def image_attention_both_ways(self) -> bool:
        """Whether an image's soft tokens see each other both ways on the sliding layers (transformers'
        use_bidirectional_attention == "vision": 26B-A4B, 31B). The GGUF does not say; the models that do
        are those without per-layer embeddings (llama.cpp's mtmd tells them by their width, 1536 and
        2560 being E2B's and E4B's, the two with PLE)."""
        return not self.has_ple

    @property
    def whole_image_tokens(self) -> int:
        """Soft tokens a prompt step must hold at least: where an image attends both ways, all of its
        tokens are computed in one step, so the largest image (IMAGE_TOKENS_MAX); else none."""
        return IMAGE_TOKENS_MAX if self.image_attention_both_ways else 0

    @property
    def first_shared_layer(self) -> int:
        return self.n_layers - self.n_shared_kv_layers

    @classmethod
    def from_gguf(cls, gguf) -> "Gemma4Config":
        """Hyperparameters from the metadata, the vocabulary size from the embedding table; per-layer
        kinds (MoE, K=V) from which tensors exist."""
        emb_field = "token_embd"
        emb = gguf.tensors.get(weights.gguf_name(weights.ModelWeights, emb_field))
        dims = weights.declared_shape(weights.ModelWeights, emb_field)
        if emb is not None and len(emb.shape) != len(dims):    # the vocabulary size is its second dimension
            raise ConfigError(f"{emb.name} has shape {list(emb.shape)}; expected [{', '.join(dims)}]")
        return cls.from_metadata(gguf.metadata, vocab_size=emb.shape[1] if emb is not None else None,
                                 tensors=gguf.tensors)

    @classmethod
    def _architecture(cls, arch) -> str:
        """The prefix of this config's keys, after checking the file's architecture is this config's."""
        if arch == DIFFUSION_ARCH:       # what needs next-token logits (reference forward, `logits`) says this
            raise UnsupportedModelError(DIFFUSION_NOT_AUTOREGRESSIVE)
        if arch != ARCH:
            raise ConfigError(f"architecture is {show(arch)}, not {ARCH!r}: this app runs Gemma 4 models only",
                              **({"fault": Fault.OTHER_MODEL, "arch": arch} if isinstance(arch, str) else {}))
        return ARCH

    @classmethod
    def from_metadata(cls, meta: dict, vocab_size: int | None = None, tensors=None) -> "Gemma4Config":
        """`tensors` (names of the GGUF's tensors), when given, resolves the layer kinds that only
        the tensor list tells; without it every layer of an MoE model counts as MoE."""
        k = Keys(meta, cls._architecture(meta.get("general.architecture")))

        n = k.integer("block_count", 1, MAX_LAYERS)
        hidden = k.integer("embedding_length", VEC, MAX_WIDTH, multiple=VEC)
        n_heads = k.integer("attention.head_count", 1, MAX_HEADS)
        pattern = k.per_layer_bool("attention.sliding_window_pattern", n, False)
        head_dim_global = k.integer("attention.key_length", VEC, MAX_HEAD_DIM, 512, VEC)
        head_dim_swa = k.integer("attention.key_length_swa", VEC, MAX_HEAD_DIM, 256, VEC)
        for key, hd in (("attention.value_length", head_dim_global), ("attention.value_length_swa", head_dim_swa)):
            if k.raw(key, hd) != hd:      # the KV cache and the attention kernels give K and V one width
                k.fail(key, k.raw(key, hd), f"must equal the key length ({hd})")
        # grouped-query attention: each KV head serves a whole number of query heads
        kv_heads = k.per_layer_int("attention.head_count_kv", n, 1, n_heads, divides=n_heads)
        global_kv = k.raw("attention.global_head_count_kv", 0)  # Ollama's converter writes this scalar; 0: absent
        if global_kv != 0:
            global_kv = k.check_int("attention.global_head_count_kv", global_kv, 1, n_heads, divides=n_heads)
            kv_heads = [h if s else global_kv for h, s in zip(kv_heads, pattern)]
        ffn = k.per_layer_int("feed_forward_length", n, VEC, MAX_WIDTH, VEC)

        rope_base = k.number("rope.freq_base", 1_000_000.0)
        rope_base_swa = k.number("rope.freq_base_swa", 10_000.0, alias="rope.local.freq_base")
        # NeoX RoPE rotates pairs of dims within a head: an even count, at most the head
        rope_dims_global = k.integer("rope.dimension_count", 0, head_dim_global, 0, multiple=2)
        if not rope_dims_global:
            factor = k.number("rope.partial_rotary_factor", 1.0, hi=1.0)
            rope_dims_global = int(head_dim_global * factor)
            if rope_dims_global < 2 or rope_dims_global % 2:
                k.fail("rope.partial_rotary_factor", factor,
                       f"rotates {rope_dims_global} of {head_dim_global} dims; RoPE rotates pairs")
        rope_dims_swa = k.integer("rope.dimension_count_swa", 0, head_dim_swa, 0, multiple=2) or head_dim_swa

        n_experts = k.integer("expert_count", 0, MAX_EXPERTS, 0)
        n_used = expert_ffn = 0
        if n_experts:
            n_used = k.integer("expert_used_count", 1, n_experts)      # distinct experts per token
            expert_ffn = k.integer("expert_feed_forward_length", VEC, MAX_WIDTH, multiple=VEC)

        def has_moe(i: int) -> bool:
            return n_experts > 0 and (tensors is None or weights.present(tensors, "router", i))

        # a layer's experts must not be left out silently: MoE tensors without the router or the count
        for i in range(n if tensors is not None else 0):
            if not has_moe(i) and (name := weights.moe_tensor(tensors, i)):
                if not n_experts:
                    k.fail("expert_count", n_experts, f"no experts, yet the GGUF has {name}")
                router = weights.gguf_name(weights.LayerWeights, "router", i)
                raise ConfigError(f"the GGUF has {name} but lacks {router}")
        ple_dim = k.integer("embedding_length_per_layer_input", 0, MAX_WIDTH, 0, VEC)     # 0: no PLE
        n_shared = k.integer("attention.shared_kv_layers", 0, n - 1, 0)
        first_shared = n - n_shared
        context_length = k.integer("context_length", 1, MAX_CONTEXT, 131072)
        sliding_window = k.integer("attention.sliding_window", 0, MAX_CONTEXT, 0)        # 0: no window
        eps = k.number("attention.layer_norm_rms_epsilon", 1e-6, hi=1.0)   # a stabilizer beside mean(x^2)
        final_softcap = k.number("final_logit_softcapping", 0.0, zero_ok=True)         # 0: off
        if vocab_size is None:
            tokens = meta.get("tokenizer.ggml.tokens", ())
            vocab_size = len(tokens) if isinstance(tokens, ARRAYS) else 0
        if not 1 <= vocab_size <= MAX_VOCAB:
            raise ConfigError(f"a vocabulary of {vocab_size} tokens: expected 1 to {MAX_VOCAB}")
        suppress = _suppress_tokens(meta, vocab_size)
        pad_id = meta.get("tokenizer.ggml.padding_token_id", 0)
        if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < vocab_size:
            raise ConfigError(f"tokenizer.ggml.padding_token_id is {pad_id!r}: expected an id below {vocab_size}")

        def kv_source(i: int) -> int:
            # A shared layer reuses the K/V of the last non-shared layer of its own kind.
            if i < first_shared:
                return i
            for j in range(first_shared - 1, -1, -1):
                if pattern[j] == pattern[i]:
                    return j
            k.fail("attention.shared_kv_layers", n_shared,
                   f"layer {i} shares K/V but no earlier layer is {'sliding' if pattern[i] else 'global'}")

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
                has_moe=has_moe(i),
                k_eq_v=kv_source(i) == i and tensors is not None and not weights.present(tensors, "attn_v", i),
                has_ple=ple_dim > 0,
                experts_fused=has_moe(i) and tensors is not None and weights.present(tensors, "experts_gate_up", i),
            )
            for i in range(n)
        )
        return cls._make(
            k, ffn,
            n_layers=n,
            hidden=hidden,
            n_heads=n_heads,
            vocab_size=vocab_size,
            context_length=context_length,
            eps=eps,
            sliding_window=sliding_window,
            final_softcap=final_softcap,
            ple_dim=ple_dim,
            n_shared_kv_layers=n_shared,
            n_experts=n_experts,
            n_experts_used=n_used,
            expert_ffn_dim=expert_ffn,
            layers=layers,
            suppress_tokens=suppress,
            pad_id=pad_id,
        )

    @classmethod
    def _make(cls, k: Keys, ffn: list[int], **values) -> "Gemma4Config":
        return cls(**values)

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


SUPPRESS_KEY = "tokenizer.ggml.suppress_tokens"


def _suppress_tokens(meta: dict, vocab_size: int) -> tuple[int, ...]:
    """The token ids never to sample, each checked against the vocabulary."""
    ids = meta.get(SUPPRESS_KEY, ())
    if not isinstance(ids, ARRAYS):
        raise ConfigError(f"{SUPPRESS_KEY} = {show(ids)}: must be a list of token ids")
    for i in ids:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < vocab_size:
            raise ConfigError(f"{SUPPRESS_KEY} holds {show(i)}: token ids are integers from 0 to {vocab_size - 1}")
    return tuple(sorted(set(ids)))


# ---- other families built on this stack -----------------------------------------------------------
# DiffusionGemma's files (pyapp.families.diffusion_gemma) carry Gemma 4 26B-A4B's keys and tensor names
# under their own architecture name. Next-token code (this config: the numpy forward, `logits`) refuses
# them with this sentence rather than a config error about the wrong architecture.
DIFFUSION_ARCH = "diffusion-gemma"
DIFFUSION_NOT_AUTOREGRESSIVE = ("DiffusionGemma (text diffusion on the Gemma 4 26B-A4B) has no next-token logits: "
                                "it writes by denoising a canvas (diffusion-logits, generate, chat, the app)")


class UnsupportedModelError(ConfigError):
    """A model this app recognises that this code path cannot run (a DiffusionGemma file given where a
    next-token Gemma 4 model is needed)."""
