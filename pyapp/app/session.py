"""What a front door keeps from one use case to the next.

The page's worker keeps one Session for its life (pyapp.webapp); a CLI command makes its own
(pyapp.__main__). The use cases (the other modules of pyapp.app) read and change it; nothing
else holds state between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import Gemma4Error
from ..gpu import GPUError


class Refused(Gemma4Error):
    """A use case that cannot run in the session as it is (no model chosen or loaded, a run in progress, a
    conversation that fills the context): the message says what to do. Facts the page uses go with it
    (field: the setting at fault; adapter_error: about the LoRA adapter)."""


@dataclass
class ChosenModel:
    """A model file chosen (its header read, nothing on the GPU yet): the parsed GGUF, what the page shows of
    it (pyapp.app.model.describe), and its chat template's style."""
    gguf: object
    info: dict
    style: object


@dataclass
class Session:
    device: object = None                     # the GPU device (pyapp.gpu.Device); natively, the engine's
    model: ChosenModel | None = None
    engine: object = None                     # the Engine (or DiffusionEngine) the model is loaded in
    adapter: object = None                    # the LoRA adapter chosen (a parsed GGUF), applied from the next load
    adapter_on: bool = True                   # its switch and user scale (S * alpha / rank * B A): they apply
    adapter_scale: float = 1.0                # from the next reply, and stay when the adapter is removed
    training: object = None                   # the Fine-tune run (pyapp.train.session.TrainingSession)
    stop_requested: bool = False              # Stop: the reply being generated ends at its next step
    cancelled_load: int = 0                   # the id of the load the user cancelled (the page numbers them)
    prefill_rate: dict = field(default_factory=dict)   # id(engine) -> prompt tokens/s of its last reply
    folder: object = None                     # an Ollama models folder opened (pyapp.ollama.AsyncDirectory)
    folder_models: dict = field(default_factory=dict)  # its models by name (pyapp.ollama.OllamaModel)
    projector: object = None                  # the image encoder's file added beside the model (a parsed GGUF)
    projector_name: str | None = None         # its name, as the user knows it
    ollama_projector: object = None           # the chosen Ollama tag's projector layer (a parsed GGUF), if any
    drafter: object = None                    # an assistant drafter added for the chosen model (a parsed GGUF)
    drafter_name: str | None = None           # its name, as the user knows it
    image_encoder: object = None              # the loaded ImageEncoder (pyapp.app.images), on first use
    encoded_images: dict = field(default_factory=dict)   # digest -> EncodedImage: each image encoded once
    audio_encoder: object = None              # the loaded AudioEncoder (pyapp.app.audio), on first use
    encoded_clips: dict = field(default_factory=dict)    # digest -> EncodedClip: each clip encoded once

    def chosen(self) -> ChosenModel:
        if self.model is None:
            raise Refused("Choose a model first")
        return self.model

    def loaded(self, what: str = "No model loaded"):
        if self.engine is None:
            raise Refused(what)
        return self.engine

    def should_stop(self) -> bool:
        return self.stop_requested

    @property
    def applied_scale(self) -> float:
        """The chosen adapter's scale as applied: 0 when it is switched off (so switching needs no reload)."""
        return self.adapter_scale if self.adapter_on else 0.0

    def lora(self) -> list:
        """The engine's lora option for the chosen adapter: [(adapter, applied scale)], or none."""
        return [(self.adapter, self.applied_scale)] if self.adapter is not None else []

    @property
    def device_lost(self) -> str | None:
        """Why the GPU device was lost, or None."""
        return self.device.lost_reason if self.device is not None else None

    def clear_gpu_error(self) -> None:
        if self.device is not None:
            self.device.clear_error()

    def check_gpu_accepted(self, what: str) -> None:
        """A GPUError if the GPU rejected a command since clear_gpu_error(): a rejected buffer or dispatch
        leaves its output unwritten, so what was computed (the weights, a reply's tokens) would be wrong
        without a word."""
        err = self.device.last_error if self.device is not None else None
        if err:
            raise GPUError(f"the GPU rejected {what}: {err}")

    def unload(self) -> None:
        """Let go of the engine (and a run training it); a lost device's buffers are gone anyway."""
        if self.training is not None:
            self.training.close()
        if self.engine is not None:
            try:
                self.engine.close()
            except Exception:
                pass
        self.engine = None
        self.prefill_rate = {}
        self.forget_encoders()

    def forget_encoders(self) -> None:
        """Let go of the image and audio encoders and what they encoded (another projector, another model)."""
        self.image_encoder, self.encoded_images = None, {}
        self.audio_encoder, self.encoded_clips = None, {}
