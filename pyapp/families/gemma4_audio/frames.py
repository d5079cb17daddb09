"""The 12B's audio features, standard library only (it runs in Pyodide as well as CPython): the clip's raw
samples cut into frames, as transformers' Gemma4UnifiedAudioFeatureExtractor does (issue 30).

16 kHz mono float samples in, frames of `frame` samples out (640 for the 12B: one soft token per 40 ms),
the last frame zero-padded: ceil(n / frame) of them, the count Gemma4UnifiedProcessor writes placeholders
for (_compute_audio_num_tokens). No scaling, no window: the projection's RMSNorm sees the samples as they
are. The app hears the first 30 s of a clip for every model (750 frames on the 12B, its processor's
audio_seq_length); transformers' unified processor itself does not cut a longer clip (that cap is
documented there but not applied), so past 30 s the two differ by design.

    n = soft_tokens(len(samples), 640)     # the frames, one soft token each
    rows = frames(samples, 640)            # array('f'): n x 640, frame by frame
"""

from __future__ import annotations

from array import array

from .features import MAX_SAMPLES


def soft_tokens(n_samples: int, frame: int) -> int:
    """The frames (soft tokens) of a clip of n_samples, after truncation to 30 s: ceil(n / frame)."""
    return -(-min(n_samples, MAX_SAMPLES) // frame)


def frames(samples, frame: int) -> array:
    """The clip's first 30 s as float32 frames of `frame` samples, the last one padded with zeros."""
    clip = array("f", samples[:MAX_SAMPLES])
    clip.extend(array("f", [0.0]) * (soft_tokens(len(clip), frame) * frame - len(clip)))
    return clip
