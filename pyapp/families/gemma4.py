"""Gemma 4 text (E2B, E4B, 26B-A4B, 31B, the 12B): the stack every other family builds on.

Its pieces are the package's own layers, which the other families extend rather than copy:

    config      pyapp.model.config.Gemma4Config
    weights     pyapp.model.weights (every tensor name, declared once, with the flag that requires it)
    forward     pyapp.model.gemma4.Gemma4, the GPU forward op by op (pyapp/model/README.md)
    runner      pyapp.runtime.runner.Runner
    engine      pyapp.engine.Engine: next-token generation, speculative decoding
    reference   pyapp.reference.forward.ReferenceModel (numpy)
"""

from __future__ import annotations

from ..model.config import ARCH, Gemma4Config
from ..runtime.runner import Runner
from .family import Family


def reference() -> type:
    from ..reference.forward import ReferenceModel
    return ReferenceModel


FAMILY = Family(name="Gemma 4", architecture=ARCH, config=Gemma4Config, runner=Runner, reference=reference)
