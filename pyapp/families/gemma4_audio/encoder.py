"""Gemma 4's audio encoder on the GPU: a clip's log-mel rows in, its soft tokens (in the text model's
width) out, in a GPU buffer the text engine reads at the clip's placeholder positions.

It mirrors pyapp/families/gemma4_audio/reference.py op for op (the oracle it is tested against):

    x = input_proj(flatten(subsample(subsample(mel))))          two 3 x 3 stride-2 convs, LayerNorm, ReLU
    per layer:  x += 0.5 post_norm(down(silu(up(norm(x)))))       clippable linears
                x += attn_post_norm(attn_out(attention(q, k, v)))  12-frame causal window, relative positions
                x += pw2(silu(norm_conv(depthwise(glu(pw1(conv_norm(x)))))))
                x += 0.5 post_norm_1(down_1(silu(up_1(norm_1(x)))))
                x = out_norm(x)
    soft = projection(rms_norm(output_proj(x) + bias))

    enc = yield from AudioEncoder.load(dev, gguf)          # steps (pyapp.steps): the weights to the GPU
    soft = enc.encode_clip(samples)                         # Buffer [soft tokens, text hidden]: the features too
    soft = enc.encode(mel, frames)                          # from log-mel rows computed elsewhere

One plan serves every clip of up to `max_frames` frames (30 s by default): its kernels read the clip's
length from uniforms (the frames of each conv's input, the Step of the rest).
"""

from __future__ import annotations

import math
import struct
from array import array
from dataclasses import fields, replace

from ...gguf import TensorInfo
from ...gpu import Buffer, Device
from ...gpu import kernels as K
from ...runtime.requests import ReadFile
from ...runtime.upload import encoder_tensor, f32_vector
from ..family import LoadedInSteps
from . import features
from .config import (EPS, LOGIT_CAP, PAST, RESIDUAL_WEIGHT, WINDOW, AudioConfig, AudioError, is_frame_projection,
                     relative_positions)
from .projection import FrameProjectionEncoder
from .weights import LINEARS, AudioWeights, bind

BOUNDS_STRIDE = 256          # bytes between two linears' bounds: a storage binding's offset alignment
# tensors the encoder's own kernels read as f32 whatever the file stores (the matrices stay as stored)
F32_TENSORS = ("conv0", "conv1", "conv_dw")
# the half-step feed-forwards' post norms: their residual weight (0.5) folded into the weights (exact)
HALF_STEP_NORMS = ("ffn_post_norm", "ffn_post_norm_1")


def soft_tokens_of(frames: int) -> int:
    """The soft tokens of a clip of `frames` log-mel frames: halved twice, rounding up."""
    return (frames + 3) // 4


class AudioEncoder(LoadedInSteps):
    def __init__(self, dev: Device, cfg: AudioConfig, weights: AudioWeights, bounds: Buffer, clamped: set,
                 max_frames: int):
        self.dev, self.cfg, self.w = dev, cfg, weights
        self.bounds, self.clamped = bounds, clamped      # (layer, linear) pairs whose bounds are finite
        self.max_frames = max_frames
        self.max_tokens = T = soft_tokens_of(max_frames)
        d, ff = cfg.hidden, cfg.ffn_dim
        c0, c1 = cfg.channels

        def f32(n: int, label: str) -> Buffer:
            return dev.buffer(4 * n, label=f"audio {label}")

        def uniform(label: str) -> Buffer:
            return dev.buffer(K.STEP_BYTES, kind="uniform", label=f"audio {label}")
        # the uniforms: each conv's input rows, the soft tokens' Step, the positions'
        self.frames0, self.frames1, self.step = uniform("frames"), uniform("half frames"), uniform("step")
        self.rel_step = uniform("positions")
        K.write_step(dev, self.rel_step, PAST + 1, 0)
        # the features' inputs: the clip, and features.py's tables (the DFT's roots, the window, the filters)
        if cfg.n_mels != K.LOG_MEL_BINS:
            raise AudioError(f"an audio encoder of {cfg.n_mels} mel bins: Gemma 4's features have {K.LOG_MEL_BINS}")
        self.clip_step = uniform("clip")                    # n_tokens: the clip's frames, pos0: its samples
        self.clip = f32(features.HOP * (max_frames + 1), "clip")                 # [samples] 16 kHz
        self.roots = f32(2 * features.FFT, "dft roots")                          # [512, 2] cos, sin
        self.window = f32(features.FRAME, "window")                              # [320]
        self.filters = f32(features.MEL_BINS * features.BINS, "mel filters")     # [128, 257]
        dev.write(self.roots, struct.pack(f"<{2 * features.FFT}f", *(v for r in features.dft_roots() for v in r)))
        dev.write(self.window, features.hann_window().tobytes())
        dev.write(self.filters, struct.pack(f"<{features.MEL_BINS * features.BINS}f", *features.filter_matrix()))
        # every buffer, with its shape (T soft tokens, d hidden, ff the feed-forwards' width)
        self.mel = f32(max_frames * cfg.n_mels, "mel")                            # [frames, 128]
        self.sub0 = f32((max_frames + 1) // 2 * (cfg.n_mels // 2) * c0, "conv 0")   # [frames / 2, 64, c0]
        self.sub1 = f32(T * cfg.frequencies * c1, "conv 1")                        # [T, 32, c1]
        self.x = [f32(T * d, "x"), f32(T * d, "x'")]   # [T, d] the residual stream, ping-pong over layers
        self.h = f32(T * d, "h")                # [T, d] a block's normed input
        self.up = f32(T * ff, "up")             # [T, ff]
        self.proj = f32(T * d, "projection")    # [T, d] a linear's output (down, attn_out, pw2)
        self.q, self.k, self.v = f32(T * d, "q"), f32(T * d, "k"), f32(T * d, "v")
        self.attn = f32(T * d, "attention")     # [T, heads * hd]
        self.positions = f32((PAST + 1) * d, "positions")     # [13, d] sinusoids of distances 0..12
        dev.write(self.positions, struct.pack(f"<{(PAST + 1) * d}f", *relative_positions(d)))
        self.rel = f32((PAST + 1) * d, "relative keys")        # [13, heads * hd]
        self.pw1 = f32(T * 2 * d, "pw1")        # [T, 2d]
        self.conv = f32(T * d, "conv")          # [T, d]
        self.out = f32(T * cfg.out_dim, "output")            # [T, out]
        self.out_norm = f32(T * cfg.out_dim, "output norm")
        self.soft = f32(T * cfg.text_hidden, "soft tokens")  # [T, text hidden]
        self.features_plan = K.log_mel(dev, self.clip, self.roots, self.window, self.filters, self.mel,
                                       self.clip_step, max_frames, floor=features.MEL_FLOOR)
        self.plan = self._record()

    # -- loading -------------------------------------------------------------------
    @classmethod
    def load(cls, dev: Device, gguf, max_frames: int = features.frames(features.MAX_SAMPLES)):
        """Steps (pyapp.steps; FileToGpu and ReadFile on the file that holds the encoder): bind the
        encoder's weights, copy them to the GPU, read the clamp bounds, record the plan for clips of up
        to `max_frames` frames. Returns the AudioEncoder."""
        cfg = AudioConfig.from_gguf(gguf)
        bound = bind(cfg, gguf.tensors)
        weights = replace(bound, layers=[replace(lw) for lw in bound.layers])    # its fields become GpuTensors
        for owner, name, t in _tensors(weights):
            scale = RESIDUAL_WEIGHT if name in HALF_STEP_NORMS else 1.0
            setattr(owner, name, (yield from encoder_tensor(dev, t, name in F32_TENSORS, scale)))
        bounds, clamped = yield from _bounds(dev, cfg, bound)
        return cls(dev, cfg, weights, bounds, clamped, max_frames)

    # -- the plan ------------------------------------------------------------------
    def _record(self):
        dev, cfg, w, T = self.dev, self.cfg, self.w, self.max_tokens
        d, step = cfg.hidden, self.step
        c0, c1 = cfg.channels
        plan = dev.plan()
        K.subsample(dev, cfg.n_mels, 1, c0, self.frames0, self.mel, w.conv0.buffer, w.conv0_norm.buffer, self.sub0,
                    self.max_frames, eps=EPS, plan=plan)
        K.subsample(dev, cfg.n_mels // 2, c0, c1, self.frames1, self.sub0, w.conv1.buffer, w.conv1_norm.buffer,
                    self.sub1, (self.max_frames + 1) // 2, eps=EPS, plan=plan)
        self._matmul(plan, w.input_proj, cfg.frequencies * c1, d, self.sub1, self.x[0])
        for i, lw in enumerate(w.layers):
            x, x_next = self.x[i % 2], self.x[(i + 1) % 2]
            self.feed_forward(plan, i, lw, x, "")
            self.attention(plan, i, lw, x)
            self.light_conv(plan, i, lw, x)
            self.feed_forward(plan, i, lw, x, "_1")
            K.rms_norm(dev, d, x, x_next, lw.out_norm.buffer, step, T, eps=EPS, plan=plan)
        x = self.x[len(w.layers) % 2]
        self._matmul(plan, w.output_proj, d, cfg.out_dim, x, self.out)
        K.add_bias(dev, cfg.out_dim, self.out, w.output_bias.buffer, step, T, plan=plan)
        K.rms_norm(dev, cfg.out_dim, self.out, self.out_norm, None, step, T, eps=EPS, plan=plan)
        self._matmul(plan, w.projection, cfg.out_dim, cfg.text_hidden, self.out_norm, self.soft)
        return plan

    def feed_forward(self, plan, i: int, lw, x: Buffer, suffix: str) -> None:
        """reference: AudioEncoder.feed_forward, x += 0.5 post_norm(down(silu(up(norm(x)))))."""
        dev, cfg, T, step = self.dev, self.cfg, self.max_tokens, self.step
        d, ff = cfg.hidden, cfg.ffn_dim
        K.rms_norm(dev, d, x, self.h, getattr(lw, "ffn_norm" + suffix).buffer, step, T, eps=EPS, plan=plan)
        self.linear(plan, i, "ffn_up" + suffix, lw, d, ff, self.h, self.up)
        K.silu(dev, ff, self.up, step, T, plan=plan)
        self.linear(plan, i, "ffn_down" + suffix, lw, ff, d, self.up, self.proj)
        post = getattr(lw, "ffn_post_norm" + suffix).buffer       # holds 0.5 x the file's weight
        K.add_normed(dev, d, self.proj, x, post, step, T, eps=EPS, plan=plan)

    def attention(self, plan, i: int, lw, x: Buffer) -> None:
        """reference: AudioEncoder.attention, x += attn_post_norm(attn_out(attention))."""
        dev, cfg, T, step = self.dev, self.cfg, self.max_tokens, self.step
        d, heads, hd = cfg.hidden, cfg.n_heads, cfg.head_dim
        K.rms_norm(dev, d, x, self.h, lw.attn_pre_norm.buffer, step, T, eps=EPS, plan=plan)
        for name, out in (("attn_q", self.q), ("attn_k", self.k), ("attn_v", self.v)):
            self.linear(plan, i, name, lw, d, d, self.h, out)
        K.matmul(dev, lw.attn_k_rel.qtype, d, d, lw.attn_k_rel.buffer, self.positions, self.rel, self.rel_step,
                 PAST + 1, plan=plan)
        K.audio_attention(dev, heads, hd, WINDOW, hd ** -0.5 / math.log(2), math.log(1 + math.e) / math.log(2),
                          LOGIT_CAP, self.q, self.k, self.v, self.rel, lw.per_dim_scale.buffer, self.attn, step, T,
                          plan=plan)
        self.linear(plan, i, "attn_out", lw, d, d, self.attn, self.proj)
        K.add_normed(dev, d, self.proj, x, lw.attn_post_norm.buffer, step, T, eps=EPS, plan=plan)

    def light_conv(self, plan, i: int, lw, x: Buffer) -> None:
        """reference: AudioEncoder.light_conv, x += pw2(silu(norm_conv(depthwise(glu(pw1(conv_norm(x)))))))."""
        dev, cfg, T, step = self.dev, self.cfg, self.max_tokens, self.step
        d = cfg.hidden
        K.rms_norm(dev, d, x, self.h, lw.conv_norm.buffer, step, T, eps=EPS, plan=plan)
        self.linear(plan, i, "conv_pw1", lw, d, 2 * d, self.h, self.pw1)
        K.glu_depthwise(dev, d, cfg.conv_kernel, self.pw1, lw.conv_dw.buffer, self.conv, step, T, plan=plan)
        K.rms_norm(dev, d, self.conv, self.h, lw.norm_conv.buffer, step, T, eps=EPS, plan=plan)
        K.silu(dev, d, self.h, step, T, plan=plan)
        self.linear(plan, i, "conv_pw2", lw, d, d, self.h, self.proj)
        K.elementwise(dev, "add", d, x, step, T, b=self.proj, plan=plan)

    def linear(self, plan, i: int, name: str, lw, k: int, n: int, x: Buffer, y: Buffer) -> None:
        """A clippable linear: y = clamp(clamp(x, in) @ W^T, out), the clamps inside the matmul (bounds that
        are all infinite: a plain matmul)."""
        bounds = (self.bounds, (i * len(LINEARS) + LINEARS.index(name)) * BOUNDS_STRIDE, 16)
        self._matmul(plan, getattr(lw, name), k, n, x, y, bounds if (i, name) in self.clamped else None)

    def _matmul(self, plan, wt, k: int, n: int, x: Buffer, y: Buffer, clamp=None) -> None:
        K.matmul(self.dev, wt.qtype, k, n, wt.buffer, x, y, self.step, self.max_tokens, plan=plan, clamp=clamp)

    # -- one clip ----------------------------------------------------------------------
    def soft_tokens(self, n_samples: int) -> int:
        """The soft tokens of a clip of n_samples (16 kHz): one per 40 ms of its first 30 s."""
        return features.soft_tokens(n_samples)

    def encode_clip(self, samples) -> Buffer:
        """The soft tokens of a clip of 16 kHz float samples (its first 30 s): its log-mel rows computed on
        the GPU (shaders/log_mel.wgsl, by features.py's rules), then the encoder's plan."""
        clip = array("f", samples[:features.MAX_SAMPLES])
        n = len(clip)
        frames = features.frames(n)
        if not 0 < frames <= self.max_frames:
            raise AudioError(f"a clip of {n} samples ({frames} frames) does not fit this encoder "
                             f"(1 to {self.max_frames} frames)")
        self.dev.write(self.clip, clip.tobytes())
        K.write_step(self.dev, self.clip_step, frames, n)
        self.dev.submit(self.features_plan)
        return self._encode(frames)

    def encode(self, mel, frames: int) -> Buffer:
        """The soft tokens of a clip's log-mel rows (float32 bytes of `frames` x 128, features.log_mel's):
        a new buffer [soft tokens, text hidden], float32, the caller's to keep."""
        cfg = self.cfg
        if not 0 < frames <= self.max_frames:
            raise AudioError(f"a clip of {frames} frames does not fit this encoder (1 to {self.max_frames})")
        if len(mel) != 4 * frames * cfg.n_mels:
            raise AudioError(f"{len(mel)} bytes of features for {frames} frames of {cfg.n_mels} mel bins")
        self.dev.write(self.mel, bytes(mel))
        return self._encode(frames)

    def _encode(self, frames: int) -> Buffer:
        """The plan over the log-mel rows in self.mel: the soft tokens copied into a buffer of their own."""
        cfg = self.cfg
        n = soft_tokens_of(frames)
        K.write_step(self.dev, self.frames0, frames, 0)
        K.write_step(self.dev, self.frames1, (frames + 1) // 2, 0)
        K.write_step(self.dev, self.step, n, 0)
        self.dev.submit(self.plan)
        out = self.dev.buffer(4 * n * cfg.text_hidden, label="audio soft tokens")
        self.dev.submit(self.dev.plan().copy(self.soft, 0, out, 0, 4 * n * cfg.text_hidden))
        return out


def encoder_class(gguf) -> type[AudioEncoder | FrameProjectionEncoder]:
    """The GPU encoder of the audio input the file holds: the 12B's frames projection, else AudioEncoder."""
    return FrameProjectionEncoder if is_frame_projection(gguf) else AudioEncoder


def _tensors(w: AudioWeights):
    """(owner, field name, TensorInfo) of every tensor the encoder uploads (the bounds are read apart)."""
    for owner in (w, *w.layers):
        for f in fields(owner):
            t = getattr(owner, f.name)
            if isinstance(t, TensorInfo):
                yield owner, f.name, t


def _bounds(dev: Device, cfg: AudioConfig, w: AudioWeights):
    """Steps: every clippable linear's (in_min, in_max, out_min, out_max) in one buffer, BOUNDS_STRIDE apart;
    returns it and the (layer, linear) pairs with a finite bound (a linear without scalars: unbounded)."""
    data = bytearray(BOUNDS_STRIDE * cfg.n_layers * len(LINEARS))
    clamped = set()
    for i, lw in enumerate(w.layers):
        for j, name in enumerate(LINEARS):
            values = [-math.inf, math.inf, -math.inf, math.inf]
            for b, t in enumerate(lw.bounds.get(name, ())):
                values[b] = struct.unpack("<f", f32_vector((yield ReadFile(t.offset, t.nbytes)), t.type))[0]
            if any(math.isnan(v) for v in values):
                raise AudioError(f"the audio encoder's layer {i} {name} has a NaN clamp bound")
            if any(math.isfinite(v) for v in values):
                clamped.add((i, name))
            struct.pack_into("<4f", data, (i * len(LINEARS) + j) * BOUNDS_STRIDE, *values)
    buf = dev.buffer(len(data), label="audio clamp bounds")
    dev.write(buf, bytes(data))
    return buf, clamped
