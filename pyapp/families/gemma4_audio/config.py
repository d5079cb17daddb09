"""Gemma 4's audio encoder: its hyperparameters, read from the file that holds it."""

from __future__ import annotations

from ...errors import Gemma4Error


class AudioError(Gemma4Error, ValueError):
    """A clip, an audio file or an audio encoder this app cannot turn into soft tokens."""
