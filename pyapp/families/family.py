"""What a model family declares: the pieces the engine needs to run its files, found by its architecture.

A family's config reads the GGUF's metadata (its flags say which of pyapp.model.weights' fields the
file must hold: the one place tensor names are spelled); its runner owns the GPU's plans and buffers
(runner.model_class: its GPU forward, op by op; runner.state_class: its buffers); its engine generates
(pyapp.engine.Engine, token by token, unless it declares its own); its reference is the numpy oracle
the GPU forward is checked against (CPython only, so it is imported when asked for).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..runtime.requests import handler
from ..steps import drive, drive_async


@dataclass(frozen=True)
class Family:
    name: str                          # as people call it: "Gemma 4", "DiffusionGemma"
    architecture: str                  # its files' general.architecture
    config: type                       # .from_gguf(gguf): hyperparameters and per-layer flags, checked
    runner: type                       # pyapp.runtime.runner.Runner or a subclass: plans, buffers, its forward
    reference: Callable[[], type]      # () -> the numpy reference model class (imports numpy)
    engine: type | None = None         # its engine when it does not generate token by token (None: Engine)
    trains: bool = True                # LoRA fine-tuning (pyapp.train) runs on it

    @property
    def forward(self) -> type:
        """The GPU forward its runner records its plans from (pyapp.model.gemma4.Gemma4 or a subclass)."""
        return self.runner.model_class


class LoadedInSteps:
    """A part of a model loaded by steps (pyapp.steps: `load(dev, gguf, ...)`, a generator of file and GPU
    requests), driven natively or in the browser: the image and audio encoders."""

    @classmethod
    def load(cls, dev, gguf, *args):
        raise NotImplementedError

    @classmethod
    def open(cls, dev, gguf, *args):
        """load, natively (gguf: the parsed file that holds it)."""
        return drive(cls.load(dev, gguf, *args), handler(dev, gguf.source))

    @classmethod
    async def open_async(cls, dev, gguf, *args):
        """load in the browser: file bytes go Blob -> GPU inside JS; returns once the GPU has compiled the
        programs its plans made (there the GPU process compiles them after the calls return: the load waits,
        not its first use)."""
        part = await drive_async(cls.load(dev, gguf, *args), handler(dev, gguf.source, asynchronous=True))
        await dev.programs_ready_async()
        return part
