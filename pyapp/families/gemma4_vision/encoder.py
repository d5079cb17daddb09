"""Gemma 4's image encoder on the GPU: an image's pixels in, its soft tokens (in the text model's
width) out, in a GPU buffer the text engine reads at the image's placeholder positions.

It mirrors pyapp/families/gemma4_vision/reference.py op for op (the oracle it is tested against):

    x = patch_embd(2 * (pixels / 255 - 0.5)) + position_embd[0][px] + position_embd[1][py]
    per layer:  h = ln1(x); q, k, v = clippable linears of h; q, k = rope_2d(norm(q), norm(k));
                v = norm(v) (no scale); x += attn_post_norm(attn_out(softmax(q k^T) v))   every patch sees every patch
                h = ln2(x); x += ffn_post_norm(down(gelu(gate(h)) * up(h)))              clippable linears
    soft = projection(rms_norm(pool_3x3(x) * sqrt(hidden) [- std_bias] [* std_scale]))

    enc = yield from ImageEncoder.load(dev, gguf)            # steps (pyapp.steps): the weights to the GPU
    feats = enc.encode(rgba, across, down)                   # Buffer [across * down / 9, text hidden]

`rgba` is the image resized to across x down patches (pyapp.families.gemma4_vision.preprocess
chooses the size): RGBA8 bytes, or a GPU buffer the page filled; the patches are cut on the GPU.
One plan serves every image of up to `max_patches` patches: its kernels read the image's size from
two uniforms (the grid, and the Step of the text kernels). The buffers are sized for max_patches.

The 12B has no encoder: its patch projection (pyapp/families/gemma4_vision/projection.py) is loaded and
used the same way (gpu_encoder.py: GpuEncoder); `encoder_class(gguf)` says which of the two a file's encoder is.
"""

from __future__ import annotations

import math
import struct
from dataclasses import replace

from ...gpu import Buffer, Device
from ...gpu import kernels as K
from ...runtime.requests import ReadFile
from ...runtime.upload import f32_vector
from .config import DEFAULT_BUDGET, VisionConfig, VisionError, is_patch_projection
from .gpu_encoder import GpuEncoder, upload
from .projection import PatchProjectionEncoder
from .weights import BOUNDS, LINEARS, VisionWeights, bind

BOUNDS_STRIDE = 256          # bytes between two linears' bounds: a storage binding's offset alignment


class ImageEncoder(GpuEncoder):
    def __init__(self, dev: Device, cfg: VisionConfig, weights: VisionWeights, bounds: Buffer, clamped: set,
                 max_patches: int):
        self.dev, self.cfg, self.w = dev, cfg, weights
        self.bounds, self.clamped = bounds, clamped      # (layer, linear) pairs whose bounds are finite
        self.max_patches = max_patches
        self.max_soft = max_patches // (cfg.pool * cfg.pool)
        T, d, f = max_patches, cfg.hidden, cfg.ffn_dim

        def f32(n: int, label: str) -> Buffer:
            return dev.buffer(4 * n, label=f"vision {label}")
        # every buffer, with its shape (T patches, d hidden, f ffn, N soft tokens)
        self.grid = dev.buffer(K.GRID_BYTES, kind="uniform", label="vision grid")
        self.step = dev.buffer(K.STEP_BYTES, kind="uniform", label="vision step")        # n_tokens = patches
        self.soft_step = dev.buffer(K.STEP_BYTES, kind="uniform", label="vision soft step")   # n_tokens = N
        self.pixels = f32(T * cfg.patch * cfg.patch, "pixels")      # u32 [T * p * p] RGBA8
        self.patches = f32(T * 3 * cfg.patch * cfg.patch, "patches")   # [T, 3 p^2] in [-1, 1]
        self.x = f32(T * d, "x")                # [T, d] the residual stream
        self.h = f32(T * d, "h")                # [T, d] a block's normed input
        self.proj = f32(T * d, "projection")    # [T, d] a linear's output (q, k, v raw; attn_out; down)
        self.q = f32(T * d, "q")                # [T, heads, hd] normed and rotated
        self.k = f32(T * cfg.n_kv_heads * cfg.head_dim, "k")
        self.v = f32(T * cfg.n_kv_heads * cfg.head_dim, "v")
        self.kc = f32(T * cfg.n_kv_heads * cfg.head_dim, "k by head")   # [kv heads, T, hd]: attention's layout
        self.vc = f32(T * cfg.n_kv_heads * cfg.head_dim, "v by head")
        self.attn = f32(T * d, "attention")     # [T, heads * hd]
        self.gate = f32(T * f, "gate")          # [T, f]
        self.up = f32(T * f, "up")              # [T, f]
        self.act = f32(T * f, "act")            # [T, f] gelu(gate) * up
        self.pooled = f32(self.max_soft * d, "pooled")       # [N, d]
        self.pooled_norm = f32(self.max_soft * d, "pooled norm")
        self.soft = f32(self.max_soft * cfg.text_hidden, "soft tokens")   # [N, text hidden]
        self.plan = self._record()

    # -- loading -------------------------------------------------------------------
    @classmethod
    def load(cls, dev: Device, gguf, budget: int = DEFAULT_BUDGET):
        """Steps (pyapp.steps; FileToGpu and ReadFile on the file that holds the encoder): bind the
        encoder's weights, copy them to the GPU, read the clamp bounds, record the plan for images of up
        to `budget` soft tokens. Returns the ImageEncoder."""
        cfg = VisionConfig.from_gguf(gguf)
        bound = bind(cfg, gguf.tensors)
        weights = replace(bound, layers=[replace(lw) for lw in bound.layers])    # its fields become GpuTensors
        yield from upload(dev, [weights, *weights.layers])
        bounds, clamped = yield from _bounds(dev, cfg, bound)
        return cls(dev, cfg, weights, bounds, clamped, cfg.max_patches(budget))

    # -- the plan ------------------------------------------------------------------
    def _record(self):
        dev, cfg, w, T = self.dev, self.cfg, self.w, self.max_patches
        d, step = cfg.hidden, self.step
        plan = dev.plan()
        K.patchify(dev, cfg.patch, cfg.channel_first, self.grid, self.pixels, self.patches, T, plan=plan)
        self._matmul(plan, w.patch_embd, 3 * cfg.patch * cfg.patch, d, self.patches, self.x)
        K.add_positions(dev, w.position_embd.qtype, d, cfg.n_positions, w.position_embd.buffer, self.grid, self.x, T,
                        plan=plan)
        for i, lw in enumerate(w.layers):
            K.rms_norm(dev, d, self.x, self.h, lw.attn_norm.buffer, step, T, eps=cfg.eps, plan=plan)
            self.attention(plan, i, lw)
            K.add_normed(dev, d, self.proj, self.x, lw.post_attention_norm.buffer, step, T, eps=cfg.eps, plan=plan)
            K.rms_norm(dev, d, self.x, self.h, lw.ffn_norm.buffer, step, T, eps=cfg.eps, plan=plan)
            self.mlp(plan, i, lw)
            K.add_normed(dev, d, self.proj, self.x, lw.post_ffw_norm.buffer, step, T, eps=cfg.eps, plan=plan)
        std = (w.std_bias.buffer, w.std_scale.buffer) if cfg.has_std else None
        K.pool(dev, d, cfg.pool, math.sqrt(d), self.grid, self.x, self.pooled, self.max_soft, std=std, plan=plan)
        K.rms_norm(dev, d, self.pooled, self.pooled_norm, None, self.soft_step, self.max_soft, eps=cfg.eps, plan=plan)
        K.matmul(dev, w.projection.qtype, d, cfg.text_hidden, w.projection.buffer, self.pooled_norm, self.soft,
                 self.soft_step, self.max_soft, plan=plan)
        return plan

    def attention(self, plan, i: int, lw) -> None:
        """reference: VisionEncoder.attention, h -> proj."""
        dev, cfg, T, step = self.dev, self.cfg, self.max_patches, self.step
        d, heads, kv_heads, hd = cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        for name, out, rows, norm in (("attn_q", self.q, heads, lw.attn_q_norm.buffer), ("attn_k", self.k, kv_heads, lw.attn_k_norm.buffer),
                                      ("attn_v", self.v, kv_heads, None)):
            self.linear(plan, i, name, getattr(lw, name), d, rows * hd, self.h, self.proj)
            K.rms_norm(dev, hd, self.proj, out, norm, step, T, rows_per_token=rows, eps=cfg.eps, plan=plan)
        K.rope_2d(dev, heads, hd, cfg.theta, self.grid, self.q, T, plan=plan)
        K.rope_2d(dev, kv_heads, hd, cfg.theta, self.grid, self.k, T, plan=plan)
        K.kv_store(dev, self.k, self.v, self.kc, self.vc, step, kv_heads, hd, T, T, plan=plan)
        K.attention(dev, self.q, self.kc, self.vc, self.attn, step, heads, kv_heads, hd, T, T, scale=1.0,
                    all_keys=True, plan=plan)
        self.linear(plan, i, "attn_output", lw.attn_output, heads * hd, d, self.attn, self.proj)

    def mlp(self, plan, i: int, lw) -> None:
        """reference: VisionEncoder.mlp, h -> proj."""
        dev, cfg, d, f = self.dev, self.cfg, self.cfg.hidden, self.cfg.ffn_dim
        self.linear(plan, i, "ffn_gate", lw.ffn_gate, d, f, self.h, self.gate)
        self.linear(plan, i, "ffn_up", lw.ffn_up, d, f, self.h, self.up)
        K.elementwise(dev, "geglu", f, self.gate, self.step, self.max_patches, b=self.up, out=self.act, plan=plan)
        self.linear(plan, i, "ffn_down", lw.ffn_down, f, d, self.act, self.proj)

    def linear(self, plan, i: int, name: str, wt, k: int, n: int, x: Buffer, y: Buffer) -> None:
        """A clippable linear: y = clamp(clamp(x, in) @ W^T, out), the clamps inside the matmul (bounds that
        are all infinite: a plain matmul)."""
        bounds = (self.bounds, (i * len(LINEARS) + LINEARS.index(name)) * BOUNDS_STRIDE, 16)
        self._matmul(plan, wt, k, n, x, y, bounds if (i, name) in self.clamped else None)

    def _matmul(self, plan, wt, k: int, n: int, x: Buffer, y: Buffer, clamp=None) -> None:
        K.matmul(self.dev, wt.qtype, k, n, wt.buffer, x, y, self.step, self.max_patches, plan=plan, clamp=clamp)

    # -- one image -------------------------------------------------------------------
    def set_size(self, across: int, down: int) -> int:
        """GpuEncoder.set_size: patches in multiples of the pool, the soft tokens' step too."""
        cfg = self.cfg
        n = across * down
        if across % cfg.pool or down % cfg.pool or not 0 < n <= self.max_patches:
            raise VisionError(f"an image of {across} x {down} patches does not fit this encoder (multiples of "
                              f"{cfg.pool}, at most {self.max_patches} patches)")
        soft = n // (cfg.pool * cfg.pool)
        self.dev.write(self.grid, K.pack_grid(across, down))
        K.write_step(self.dev, self.step, n, 0)
        K.write_step(self.dev, self.soft_step, soft, 0)
        return soft


def encoder_class(gguf) -> type[GpuEncoder]:
    """The GPU encoder of the image encoder the file holds: the 12B's patch projection, else ImageEncoder."""
    return PatchProjectionEncoder if is_patch_projection(gguf) else ImageEncoder


def _bounds(dev: Device, cfg: VisionConfig, w: VisionWeights):
    """Steps: every clippable linear's (in_min, in_max, out_min, out_max) in one buffer, BOUNDS_STRIDE
    apart; returns it and the (layer, linear) pairs with a finite bound. From the per-linear scalars,
    else v.clamp_data's rows, else unbounded."""
    packed = None
    if w.clamp_data is not None:
        t = w.clamp_data
        packed = struct.unpack(f"<{t.shape[0]}f", f32_vector((yield ReadFile(t.offset, t.nbytes)), t.type))
    data = bytearray(BOUNDS_STRIDE * cfg.n_layers * len(LINEARS))
    clamped = set()
    for i, lw in enumerate(w.layers):
        for j, name in enumerate(LINEARS):
            row = i * len(LINEARS) + j
            if name in lw.bounds:
                values = []
                for t in lw.bounds[name]:
                    values += struct.unpack("<f", f32_vector((yield ReadFile(t.offset, t.nbytes)), t.type))
            elif packed is not None and 4 * row + 4 <= len(packed):
                values = packed[4 * row:4 * row + 4]
            else:
                values = (-math.inf, math.inf, -math.inf, math.inf)
            if any(math.isnan(v) for v in values):
                raise VisionError(f"the image encoder's layer {i} {name} has a NaN clamp bound")
            if any(math.isfinite(v) for v in values):
                clamped.add((i, name))
            struct.pack_into("<4f", data, row * BOUNDS_STRIDE, *values)
    buf = dev.buffer(len(data), label="vision clamp bounds")
    dev.write(buf, bytes(data))
    return buf, clamped
