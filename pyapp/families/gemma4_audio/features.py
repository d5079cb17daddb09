"""Gemma 4's audio features, standard library only (it runs in Pyodide as well as CPython).

What transformers' Gemma4AudioFeatureExtractor does to a clip before the encoder hears it (issue 30):
16 kHz mono float samples in, one row of 128 log-mel values per 10 ms out.

1. the clip: at most 30 s (480 000 samples: the processor truncates what is longer);
2. the frames: 160 zeros before the first sample ("semicausal" padding), then a frame of 320 samples
   (20 ms) every 160 (10 ms); a frame is kept only if all its samples are the clip's: there are
   (n - 1) // 160 of them (the processor also computes frames over its padding to a multiple of 128
   samples, masks them and drops their soft tokens: the encoder never uses them);
3. each frame times the periodic Hann window of 320 (float32, as numpy's `hanning(321)[:-1]`),
   zero-padded to 512, its real FFT's magnitude (257 bins: |X|, not |X|^2);
4. 128 triangular mel filters (HTK scale, 0 to 8 kHz, no area normalization: transformers'
   mel_filter_bank) over those bins, then log(mel + 0.001).

    rows = log_mel(samples)          # array('f'): frames x 128, row by row
    n = soft_tokens(len(samples))    # the soft tokens the clip takes: one per 40 ms, at most 750

The FFT is computed for all frames at once, one butterfly at a time over a column per frequency (a
list comprehension per butterfly: the loops run in C), in float64; transformers' numpy computes it
in float32, so the two agree to float32 rounding (tests/audio/test_features.py states the margin).
"""

from __future__ import annotations

import cmath
import math
from array import array

SAMPLE_RATE = 16_000
FRAME = 320                    # samples a frame (20 ms)
HOP = 160                      # samples between frames (10 ms)
FFT = 512                      # the FFT's length: the frame zero-padded
BINS = FFT // 2 + 1            # 257 frequency bins
MEL_BINS = 128
MEL_FLOOR = 1e-3
MAX_SECONDS = 30
MAX_SAMPLES = MAX_SECONDS * SAMPLE_RATE     # the processor's max_length (truncation)
MAX_TOKENS = 750               # the processor's audio_seq_length: 30 s at 40 ms a token
SUBSAMPLING = 4                # two stride-2 convolutions: a soft token per 4 frames (40 ms)


def frames(n_samples: int) -> int:
    """Mel frames of a clip of n_samples (after truncation to 30 s): those whose samples are all the clip's."""
    n = min(n_samples, MAX_SAMPLES)
    return max(0, (n - 1) // HOP)


def soft_tokens(n_samples: int) -> int:
    """The soft tokens a clip of n_samples takes: its frames halved twice (rounding up), as the
    processor's replace_audio_token counts the encoder's mask; 750 for 30 s and longer."""
    n = frames(n_samples)
    for _ in range(2):
        n = (n + 1) // 2
    return n


def hann_window(length: int = FRAME) -> array:
    """The periodic Hann window, float32: 0.5 - 0.5 cos(2 pi i / length)."""
    return array("f", [0.5 - 0.5 * math.cos(2.0 * math.pi * i / length) for i in range(length)])


def _hz_to_mel(hz: float) -> float:
    return 2595.0 * math.log10(1.0 + hz / 700.0)


def _mel_to_hz(mel: float) -> float:
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def mel_filters(n_mels: int = MEL_BINS, low: float = 0.0, high: float = SAMPLE_RATE / 2) -> list[list[tuple[int, float]]]:
    """Each mel filter as (bin, weight) pairs of its nonzero weights: transformers' mel_filter_bank
    (HTK scale, triangles in Hz between mel-spaced corners, norm None)."""
    mel_low, mel_high = _hz_to_mel(low), _hz_to_mel(high)
    corners = [_mel_to_hz(mel_low + (mel_high - mel_low) * i / (n_mels + 1)) for i in range(n_mels + 2)]
    bin_hz = [(SAMPLE_RATE // 2) * k / (BINS - 1) for k in range(BINS)]
    filters = []
    for m in range(n_mels):
        left, center, right = corners[m], corners[m + 1], corners[m + 2]
        weights = []
        for k, hz in enumerate(bin_hz):
            down = (hz - left) / (center - left)       # the rising edge: transformers' -slopes / diff
            up = (right - hz) / (right - center)       # the falling edge
            w = max(0.0, min(down, up))
            if w > 0.0:
                weights.append((k, w))
        filters.append(weights)
    return filters


def dft_roots(n: int = FFT) -> list[tuple[float, float]]:
    """(cos, sin) of 2 pi j / n for j in 0..n-1: the GPU's DFT table (shaders/log_mel.wgsl)."""
    return [(math.cos(2.0 * math.pi * j / n), math.sin(2.0 * math.pi * j / n)) for j in range(n)]


def filter_matrix() -> list[float]:
    """The mel filters dense, row-major [128, 257] (zeros off each triangle): the GPU's filter bank."""
    dense = [0.0] * (MEL_BINS * BINS)
    for m, weights in enumerate(_FILTERS):
        for k, w in weights:
            dense[m * BINS + k] = w
    return dense


def _bit_reversed(n: int) -> list[int]:
    bits = n.bit_length() - 1
    return [int(f"{i:0{bits}b}"[::-1], 2) for i in range(n)]


HALF_FFT = FFT // 2            # the real FFT of 512 as a complex FFT of 256 (even samples real, odd imaginary)
_ORDER = _bit_reversed(HALF_FFT)
_TWIDDLES = {size: [cmath.exp(-2j * math.pi * k / size) for k in range(size // 2)]
             for size in (2 ** s for s in range(1, HALF_FFT.bit_length()))}
_UNTANGLE = [cmath.exp(-2j * math.pi * k / FFT) for k in range(HALF_FFT + 1)]
_WINDOW = hann_window()
_FILTERS = mel_filters()


def _fft_columns(columns: list[list[complex]]) -> list[list[complex]]:
    """The complex FFT of len(columns) points, of every frame at once: columns[j] holds sample j of
    each frame. Iterative radix 2 over bit-reversed columns, a butterfly per comprehension."""
    a = [columns[i] for i in _ORDER]
    size = 2
    while size <= len(a):
        half = size // 2
        twiddles = _TWIDDLES[size]
        for start in range(0, len(a), size):
            for k in range(half):
                top, bottom = a[start + k], a[start + k + half]
                w = twiddles[k]
                if k:
                    bottom = [x * w for x in bottom]
                a[start + k] = [u + v for u, v in zip(top, bottom)]
                a[start + k + half] = [u - v for u, v in zip(top, bottom)]
        size *= 2
    return a


def _frame_columns(samples, n_frames: int) -> list[list[complex]]:
    """The windowed frames as HALF_FFT complex columns: sample 2j + i * (2j + 1) of every frame in
    column j (zero past the frame's 320 samples), the frames starting HOP apart after 160 zeros."""
    padded = array("f", bytes(4 * (FRAME // 2))) + samples
    zeros = [0j] * n_frames
    columns = []
    for j in range(HALF_FFT):
        even, odd = 2 * j, 2 * j + 1
        if even >= FRAME:
            columns.append(zeros)
            continue
        we, wo = _WINDOW[even], _WINDOW[odd]
        re = padded[even:even + HOP * n_frames:HOP]
        im = padded[odd:odd + HOP * n_frames:HOP]
        columns.append([complex(x * we, y * wo) for x, y in zip(re, im)])
    return columns


def _magnitudes(z: list[list[complex]]) -> list[list[float]]:
    """|X[k]| for k in 0..256 of the real signal whose packed complex FFT is z (columns over frames)."""
    out = []
    for k in range(HALF_FFT + 1):
        zk, zc = z[k % HALF_FFT], z[(HALF_FFT - k) % HALF_FFT]
        w = _UNTANGLE[k]
        # X[k] = (Z[k] + conj Z[N-k]) / 2 - i w (Z[k] - conj Z[N-k]) / 2
        out.append([abs(0.5 * (a + b.conjugate()) - 0.5j * w * (a - b.conjugate())) for a, b in zip(zk, zc)])
    return out


def log_mel(samples) -> array:
    """The log-mel rows of a 16 kHz mono clip (floats, any sequence; rounded to float32 as the processor
    casts them; truncated to 30 s): frames(len(samples)) rows of 128 float32, row-major."""
    clip = array("f", samples[:MAX_SAMPLES])
    n_frames = frames(len(clip))
    if n_frames == 0:
        return array("f")
    spectrum = _magnitudes(_fft_columns(_frame_columns(clip, n_frames)))
    mel = []
    for weights in _FILTERS:
        total = [0.0] * n_frames
        for k, w in weights:
            total = [t + w * m for t, m in zip(total, spectrum[k])]
        mel.append([math.log(t + MEL_FLOOR) for t in total])
    rows = array("f", bytes(4 * n_frames * MEL_BINS))
    for m, column in enumerate(mel):
        rows[m::MEL_BINS] = array("f", column)
    return rows
