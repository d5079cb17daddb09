"""Audio the browser tests make: a chirp as a WAV file (the fake microphone's, tests/browser/conftest.py; the files
test_browser_audio attaches)."""

from __future__ import annotations

import math
import struct
from array import array


def wav(rate: int, seconds: float, channels: int = 1, hz=(300.0, 1200.0)) -> bytes:
    """A 16-bit PCM WAV of a chirp from hz[0] to hz[1] (each channel a little different)."""
    n = int(rate * seconds)
    frames = array("h")
    for i in range(n):
        t = i / rate
        phase = 2 * math.pi * (hz[0] * t + (hz[1] - hz[0]) * t * t / (2 * seconds))
        for c in range(channels):
            frames.append(int(12000 * math.sin(phase + c)))
    data = frames.tobytes()
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * 2 * channels, 2 * channels, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body
