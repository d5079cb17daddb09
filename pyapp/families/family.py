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
