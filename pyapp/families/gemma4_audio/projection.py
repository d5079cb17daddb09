"""The 12B's audio input on the GPU: a clip's raw samples in, its soft tokens (in the text model's width) out,
one per frame of 640 samples (40 ms), each frame alone (no encoder: transformers'
Gemma4UnifiedMultimodalEmbedder over the waveform, llama.cpp's projector type gemma4ua). The text model's
RMSNorm and matmul kernels.

It mirrors pyapp/families/gemma4_audio/reference.py FrameProjection (the oracle it is tested against):

    soft = projection(rms_norm(frame))           the frame's samples as they are, the norm without a scale

    enc = yield from FrameProjectionEncoder.load(dev, gguf)     # steps (pyapp.steps): the weights to the GPU
    soft = enc.encode_clip(samples)                             # Buffer [soft tokens, text hidden]

As AudioEncoder (pyapp.families.gemma4_audio.encoder), whose `soft_tokens` and `encode_clip` it has: one plan
serves every clip of up to 30 s (`max_frames`), its kernels reading the clip's frames from the Step uniform.
The frames are cut in Python (frames.py, standard library: it runs in Pyodide).
"""

from __future__ import annotations

from ...gpu import Buffer, Device
from ...gpu import kernels as K
from ...runtime.upload import encoder_tensor
from ..family import LoadedInSteps
from . import frames as waveform_frames
from .config import AudioError, FrameProjectionConfig
from .features import MAX_SAMPLES
from .weights import FrameProjectionWeights, bind_frame_projection


class FrameProjectionEncoder(LoadedInSteps):
    def __init__(self, dev: Device, cfg: FrameProjectionConfig, weights: FrameProjectionWeights, max_frames: int):
        self.dev, self.cfg, self.w = dev, cfg, weights
        self.max_frames = T = max_frames
        # every buffer, with its shape (T frames, f samples a frame)
        self.step = dev.buffer(K.STEP_BYTES, kind="uniform", label="audio frames step")   # n_tokens = frames
        self.frames = dev.buffer(4 * T * cfg.frame, label="audio frames")                # [T, f]
        self.normed = dev.buffer(4 * T * cfg.frame, label="audio frames normed")         # [T, f]
        self.soft = dev.buffer(4 * T * cfg.text_hidden, label="audio soft tokens")       # [T, text hidden]
        self.plan = self._record()

    @classmethod
    def load(cls, dev: Device, gguf, max_frames: int | None = None):
        """Steps (pyapp.steps; FileToGpu on the file that holds it): bind the projection, copy it to the GPU,
        record the plan for clips of up to `max_frames` frames (30 s by default)."""
        cfg = FrameProjectionConfig.from_gguf(gguf)
        weights = bind_frame_projection(cfg, gguf.tensors)                 # its field becomes a GpuTensor
        weights.projection = yield from encoder_tensor(dev, weights.projection)
        return cls(dev, cfg, weights, max_frames or waveform_frames.soft_tokens(MAX_SAMPLES, cfg.frame))

    def _record(self):
        dev, cfg, w, T = self.dev, self.cfg, self.w, self.max_frames
        plan = dev.plan()
        K.rms_norm(dev, cfg.frame, self.frames, self.normed, None, self.step, T, eps=cfg.eps, plan=plan)
        K.matmul(dev, w.projection.qtype, cfg.frame, cfg.text_hidden, w.projection.buffer, self.normed, self.soft,
                 self.step, T, plan=plan)
        return plan

    def soft_tokens(self, n_samples: int) -> int:
        """The soft tokens of a clip of n_samples (16 kHz): a frame each, of its first 30 s."""
        return waveform_frames.soft_tokens(n_samples, self.cfg.frame)

    def encode_clip(self, samples) -> Buffer:
        """The soft tokens of a clip of 16 kHz float samples (its first 30 s): a new buffer
        [soft tokens, text hidden], float32, the caller's to keep."""
        n = self.soft_tokens(len(samples))
        if not 0 < n <= self.max_frames:
            raise AudioError(f"a clip of {n} frames does not fit this projection (1 to {self.max_frames})")
        K.write_step(self.dev, self.step, n, 0)
        self.dev.write(self.frames, waveform_frames.frames(samples, self.cfg.frame).tobytes())
        self.dev.submit(self.plan)
        size = 4 * n * self.cfg.text_hidden
        out = self.dev.buffer(size, label="audio soft tokens")
        self.dev.submit(self.dev.plan().copy(self.soft, 0, out, 0, size))
        return out
