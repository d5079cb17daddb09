"""Logits: every position's next-token logits for a token sequence (Gemma 4), or one denoising step's canvas
logits (DiffusionGemma), from an empty cache. The CLI writes them to .npy; the page's tests compare them with
golden files."""

from __future__ import annotations

from ..engine import EngineError
from ..model.config import DIFFUSION_NOT_AUTOREGRESSIVE
from ..steps import Steps, call
from .denoise import diffusion_engine
from .session import Session


def logits(session: Session, tokens: list[int], soft=()) -> Steps:
    """Steps: the Logits [n_tokens, vocab] (softcap applied) of the loaded model for `tokens`; soft: images'
    soft tokens in place of their placeholder runs (pyapp.app.images.soft_runs)."""
    eng = session.loaded()
    if eng.config.is_diffusion:              # it scores a canvas (diffusion_logits), not a next token
        raise EngineError(DIFFUSION_NOT_AUTOREGRESSIVE)
    return (yield call(eng.forward, tokens, soft))


def diffusion_logits(session: Session, prompt: list[int], canvas: list[int], prev_logits: bytes | None = None,
                     blocks=()) -> Steps:
    """Steps: one denoising step's canvas Logits [canvas, vocab] after encoding the prompt (and the committed
    blocks); prev_logits: the previous step's processed logits, float32 rows (None: the first step)."""
    eng = diffusion_engine(session)
    return (yield call(eng.decoder_logits, prompt, canvas, prev_logits, blocks))
