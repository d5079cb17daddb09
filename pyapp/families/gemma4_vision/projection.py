"""The 12B's image input on the GPU: an image's pixels in, its soft tokens (in the text model's width) out,
one per 48 x 48 patch, each patch alone (no encoder: transformers' Gemma4UnifiedVisionEmbedder, llama.cpp's
projector type gemma4uv). The text model's and the image encoder's kernels, and LayerNorm.

It mirrors pyapp/families/gemma4_vision/reference.py PatchProjection op for op (the oracle it is tested
against):

    x = layer_norm(pixels / 255)                  the patch's 3 * 48^2 values, (c, y, x) as the file orders them
    x = layer_norm(patch_embd(x) + bias)
    x = layer_norm(x + position_embd[0][px] + position_embd[1][py])
    soft = projection(rms_norm(x))

    enc = yield from PatchProjectionEncoder.load(dev, gguf)     # steps (pyapp.steps): the weights to the GPU
    feats = enc.encode(rgba, across, down)                      # Buffer [across * down, text hidden]

As ImageEncoder (pyapp.families.gemma4_vision.encoder, whose loading and `encode` it shares: gpu_encoder.py):
`rgba` the image resized to across x down patches (RGBA8 bytes, or a GPU buffer the page filled); one plan
serves every image of up to `max_patches` patches, its kernels reading the image's size from two uniforms.
"""

from __future__ import annotations

from dataclasses import replace

from ...gpu import Buffer, Device
from ...gpu import kernels as K
from .config import DEFAULT_BUDGET, PatchProjectionConfig, VisionError
from .gpu_encoder import GpuEncoder, upload
from .weights import PatchProjectionWeights, bind_patch_projection


class PatchProjectionEncoder(GpuEncoder):
    def __init__(self, dev: Device, cfg: PatchProjectionConfig, weights: PatchProjectionWeights, max_patches: int):
        self.dev, self.cfg, self.w = dev, cfg, weights
        self.max_patches = self.max_soft = max_patches
        T, d, values = max_patches, cfg.hidden, 3 * cfg.patch * cfg.patch

        def f32(n: int, label: str) -> Buffer:
            return dev.buffer(4 * n, label=f"patch projection {label}")
        # every buffer, with its shape (T patches, d the embedding's width)
        self.grid = dev.buffer(K.GRID_BYTES, kind="uniform", label="patch projection grid")
        self.step = dev.buffer(K.STEP_BYTES, kind="uniform", label="patch projection step")   # n_tokens = patches
        self.pixels = f32(T * cfg.patch * cfg.patch, "pixels")     # u32 [T * p * p] RGBA8
        self.patches = f32(T * values, "patches")                 # [T, 3 p^2] in [0, 1]
        self.patches_normed = f32(T * values, "patches normed")
        self.x = f32(T * d, "x")                                  # [T, d]
        self.normed = f32(T * d, "normed")                        # [T, d]
        self.soft = f32(T * cfg.text_hidden, "soft tokens")       # [T, text hidden]
        self.plan = self._record()

    @classmethod
    def load(cls, dev: Device, gguf, budget: int = DEFAULT_BUDGET):
        """Steps (pyapp.steps; FileToGpu and ReadFile on the file that holds it): bind the weights, copy
        them to the GPU, record the plan for images of up to `budget` soft tokens."""
        cfg = PatchProjectionConfig.from_gguf(gguf)
        weights = replace(bind_patch_projection(cfg, gguf.tensors))      # its fields become GpuTensors
        yield from upload(dev, [weights])
        return cls(dev, cfg, weights, cfg.max_patches(budget))

    def _record(self):
        dev, cfg, w, T, step = self.dev, self.cfg, self.w, self.max_patches, self.step
        d, values, eps = cfg.hidden, 3 * cfg.patch * cfg.patch, cfg.norm_eps
        plan = dev.plan()
        K.patchify(dev, cfg.patch, cfg.channel_first, self.grid, self.pixels, self.patches, T, signed=False,
                   plan=plan)
        K.layer_norm(dev, values, self.patches, self.patches_normed, w.patch_norm.buffer, w.patch_norm_bias.buffer,
                     step, T, eps=eps, plan=plan)
        K.matmul(dev, w.patch_embd.qtype, values, d, w.patch_embd.buffer, self.patches_normed, self.x, step, T,
                 plan=plan)
        K.elementwise(dev, "add_bias", d, self.x, step, T, b=w.patch_embd_bias.buffer, plan=plan)
        K.layer_norm(dev, d, self.x, self.normed, w.embd_norm.buffer, w.embd_norm_bias.buffer, step, T, eps=eps,
                     plan=plan)
        K.add_positions(dev, w.position_embd.qtype, d, cfg.n_positions, w.position_embd.buffer, self.grid,
                        self.normed, T, plan=plan)
        K.layer_norm(dev, d, self.normed, self.x, w.position_norm.buffer, w.position_norm_bias.buffer, step, T,
                     eps=eps, plan=plan)
        K.rms_norm(dev, d, self.x, self.normed, None, step, T, eps=cfg.eps, plan=plan)
        K.matmul(dev, w.projection.qtype, d, cfg.text_hidden, w.projection.buffer, self.normed, self.soft, step, T,
                 plan=plan)
        return plan

    def set_size(self, across: int, down: int) -> int:
        """GpuEncoder.set_size: a soft token per patch, within the position table."""
        n = across * down
        if not 0 < n <= self.max_patches:
            raise VisionError(f"an image of {across} x {down} patches does not fit this encoder (at most "
                              f"{self.max_patches} patches)")
        if max(across, down) > self.cfg.n_positions:
            raise VisionError(f"an image of {across} x {down} patches: this encoder's position table holds "
                              f"{self.cfg.n_positions} a side")
        self.dev.write(self.grid, K.pack_grid(across, down))
        K.write_step(self.dev, self.step, n, 0)
        return n
