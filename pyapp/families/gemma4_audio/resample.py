"""Sample-rate conversion, standard library only: band-limited (windowed-sinc) interpolation.

The method of torchaudio.functional.resample with its defaults (`sinc_interp_hann`): the rates reduced
by their greatest common divisor to orig and new; a low-pass at rolloff 0.99 of the lower Nyquist
frequency; a sinc of 6 zero crossings each side, under a Hann window (cos^2 of pi t / 12); one kernel
per output phase, the output n * new / orig samples long (rounded up), the signal zero beyond its ends.

    out = resample(samples, 44_100, 16_000)          # array('f')

The CLI resamples WAV files with it (the page leaves decoding and resampling to Web Audio). A 30 s
clip at 44.1 kHz takes a few seconds of CPython: each output sample is a dot product of ~35 taps.
"""

from __future__ import annotations

import math
from array import array
from operator import mul

ZERO_CROSSINGS = 6             # torchaudio's lowpass_filter_width
ROLLOFF = 0.99


def _kernels(orig: int, new: int) -> tuple[int, list[tuple[int, list[float]]]]:
    """(width, [(first tap, weights)] per output phase): output sample b * new + p is the dot product of
    weights with the zero-padded input from b * orig + first (the input padded by `width` zeros)."""
    cutoff = min(orig, new) * ROLLOFF
    width = math.ceil(ZERO_CROSSINGS * orig / cutoff)
    phases = []
    for p in range(new):
        taps = []
        for j in range(2 * width + orig):
            t = ((j - width) / orig - p / new) * cutoff       # in the low-pass's periods
            if abs(t) >= ZERO_CROSSINGS:                       # the window's zeros
                taps.append(0.0)
                continue
            window = math.cos(t * math.pi / ZERO_CROSSINGS / 2) ** 2
            sinc = 1.0 if t == 0 else math.sin(math.pi * t) / (math.pi * t)
            taps.append(sinc * window * cutoff / orig)
        first = next(j for j, w in enumerate(taps) if w)
        last = max(j for j, w in enumerate(taps) if w)
        phases.append((first, taps[first:last + 1]))
    return width, phases


def resample(samples, orig_rate: int, new_rate: int) -> array:
    """The samples (floats at orig_rate) at new_rate, float32 (see the module's docstring)."""
    if orig_rate == new_rate:
        return array("f", samples)
    g = math.gcd(orig_rate, new_rate)
    orig, new = orig_rate // g, new_rate // g
    width, phases = _kernels(orig, new)
    n_out = -(-len(samples) * new // orig)
    blocks = -(-n_out // new)
    padded = [0.0] * width + list(samples) + [0.0] * (width + orig * (blocks + 1))
    out = array("f", bytes(4 * blocks * new))
    for p, (first, taps) in enumerate(phases):
        span = len(taps)
        out[p::new] = array("f", [sum(map(mul, taps, padded[b * orig + first:b * orig + first + span]))
                                  for b in range(blocks)])
    return out[:n_out]
