"""What Gemma 4's image encoders on the GPU share: ImageEncoder (pyapp.families.gemma4_vision.encoder) and the
12B's PatchProjectionEncoder (projection.py) load the same way (steps, driven natively or in the browser), upload
their weights the same way, and encode an image the same way: its RGBA8 pixels (bytes, or a GPU buffer the page
filled) into the encoder's `pixels`, its `plan` submitted, its `soft` rows copied into a buffer of their own.
"""

from __future__ import annotations

from dataclasses import fields

from ...gguf import TensorInfo
from ...gpu import Buffer, Device
from ...runtime.upload import encoder_tensor
from ..family import LoadedInSteps
from .config import DEFAULT_BUDGET, VisionError


class GpuEncoder(LoadedInSteps):
    """What the app layer loads for a model's images: `load(dev, gguf, budget)` (steps), driven natively
    (`open`) or in the browser (`open_async`)."""

    @classmethod
    def load(cls, dev: Device, gguf, budget: int = DEFAULT_BUDGET):
        raise NotImplementedError

    def set_size(self, across: int, down: int) -> int:
        """Check that an image of across x down patches fits, write the plan's uniforms for it; its soft tokens."""
        raise NotImplementedError

    def encode(self, rgba, across: int, down: int) -> Buffer:
        """The soft tokens of an image of across x down patches (RGBA8 bytes of its across * patch x
        down * patch pixels, or a GPU buffer holding them): a new buffer [soft tokens, text hidden],
        float32, the caller's to keep. The encoder's `pixels`, `plan` and `soft` do the work."""
        soft = self.set_size(across, down)
        p = self.cfg.patch
        size = 4 * across * down * p * p
        if isinstance(rgba, Buffer):
            self.dev.submit(self.dev.plan().copy(rgba, 0, self.pixels, 0, size))
        else:
            if len(rgba) != size:
                raise VisionError(f"{len(rgba)} bytes of pixels for {across * p} x {down * p} RGBA pixels")
            self.dev.write(self.pixels, rgba)
        self.dev.submit(self.plan)
        out_size = 4 * soft * self.cfg.text_hidden
        out = self.dev.buffer(out_size, label="image soft tokens")
        self.dev.submit(self.dev.plan().copy(self.soft, 0, out, 0, out_size))
        return out


def upload(dev: Device, owners: list):
    """Steps: every TensorInfo field of the owners (weights dataclasses, whose fields become GpuTensors) to the
    GPU: 1-D tensors (norms, biases, std) as f32 vectors, matrices as stored (the kernels dequantize).
    The clamp bounds are read apart (_bounds)."""
    for owner in owners:
        for f in fields(owner):
            t = getattr(owner, f.name)
            if not isinstance(t, TensorInfo) or f.name == "clamp_data":
                continue
            setattr(owner, f.name, (yield from encoder_tensor(dev, t)))
