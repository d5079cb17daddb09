"""DiffusionGemma's golden cases on the GPU engine, for the test modules under tests/diffusion/."""

import numpy as np


def decoder_step(eng, case) -> tuple[np.ndarray, np.ndarray]:
    """(the GPU's canvas logits, the golden ones) of one golden case (prompt, canvas, previous logits or None,
    committed blocks, wanted logits)."""
    prompt, canvas, prev, blocks, want = case
    return np.asarray(eng.decoder_logits(prompt, canvas, None if prev is None else prev.tobytes(), blocks)), want
