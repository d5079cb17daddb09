"""WAV files in the standard library (pyapp.families.gemma4_audio.wav) and the resampler it uses
(pyapp.families.gemma4_audio.resample): each encoding against numpy's reading of the same bytes, channels
averaged, other rates resampled (windowed sinc: a tone of speech's band comes through within 1.5e-3, one
above 8 kHz is gone), and every file this app does not read refused in words."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest

from pyapp.families.gemma4_audio.config import AudioError
from pyapp.families.gemma4_audio.resample import resample
from pyapp.families.gemma4_audio.wav import KSDATAFORMAT_TAIL, read_wav

RATE = 16_000


def riff(fmt: bytes, data: bytes, extra: bytes = b"", data_size: int | None = None) -> bytes:
    """A RIFF/WAVE file of these chunks (fmt, optional others, data)."""
    size = len(data) if data_size is None else data_size
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra + b"data" + struct.pack("<I", size) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def fmt_chunk(code: int, channels: int, rate: int, bits: int, extensible: bool = False) -> bytes:
    block = channels * bits // 8
    base = struct.pack("<HHIIHH", 0xFFFE if extensible else code, channels, rate, rate * block, block, bits)
    if not extensible:
        return base
    return base + struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", code) + KSDATAFORMAT_TAIL


def pcm_wav(ints: np.ndarray, width: int, rate: int = RATE) -> bytes:
    """A WAV file written by the standard library's wave module (interleaved int samples)."""
    channels = ints.shape[1] if ints.ndim == 2 else 1
    flat = ints.reshape(-1)
    if width == 1:
        raw = (flat + 128).astype(np.uint8).tobytes()
    elif width == 3:
        raw = b"".join(int(v).to_bytes(3, "little", signed=True) for v in flat)
    else:
        raw = flat.astype(f"<i{width}").tobytes()
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)
    return out.getvalue()


def samples(clip) -> np.ndarray:
    return np.array(clip.samples, np.float32)


@pytest.mark.parametrize("width,scale", [(1, 128), (2, 32768), (3, 1 << 23), (4, 1 << 31)])
def test_pcm(width, scale):
    rng = np.random.default_rng(width)
    ints = rng.integers(-scale, scale, 1001)
    clip = read_wav(pcm_wav(ints, width))
    assert clip.encoding == f"PCM {8 * width}-bit" and clip.channels == 1 and clip.source_rate == RATE
    assert np.array_equal(samples(clip), (ints / scale).astype(np.float32))


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("extensible", [False, True])
def test_float_and_extensible(bits, extensible):
    values = np.random.default_rng(bits).uniform(-1, 1, 777)
    data = values.astype(f"<f{bits // 8}").tobytes()
    clip = read_wav(riff(fmt_chunk(3, 1, RATE, bits, extensible), data))
    assert clip.encoding == f"float {bits}-bit"
    assert np.array_equal(samples(clip), values.astype(np.float32))


def test_extensible_pcm_and_other_chunks_and_odd_padding():
    ints = np.arange(-500, 501, dtype=np.int64) * 30
    data = ints.astype("<i2").tobytes()
    extra = b"LIST" + struct.pack("<I", 3) + b"abc" + b"\0"          # an odd chunk, padded to even
    clip = read_wav(riff(fmt_chunk(1, 1, RATE, 16, extensible=True), data, extra))
    assert np.array_equal(samples(clip), (ints / 32768).astype(np.float32))


def test_stereo_is_averaged():
    rng = np.random.default_rng(2)
    ints = rng.integers(-30000, 30000, (500, 2))
    clip = read_wav(pcm_wav(ints, 2))
    assert clip.channels == 2 and len(clip.samples) == 500
    assert np.abs(samples(clip) - ints.mean(1) / 32768).max() < 1e-7


def test_other_rates_are_resampled():
    t = np.arange(44_100) / 44_100
    ints = np.round(20000 * np.sin(2 * np.pi * 1000 * t)).astype(np.int64)
    clip = read_wav(pcm_wav(ints, 2, rate=44_100))
    assert clip.source_rate == 44_100 and len(clip.samples) == RATE and clip.seconds == 1.0
    ideal = 20000 / 32768 * np.sin(2 * np.pi * 1000 * np.arange(RATE) / RATE)
    assert np.abs(samples(clip) - ideal)[100:-100].max() < 1.5e-3


@pytest.mark.parametrize("rate,hz,margin", [(44_100, 1000, 1.5e-3), (48_000, 3000, 1.5e-3), (8_000, 440, 1.5e-3),
                                           (11_025, 2000, 1.5e-3), (22_050, 5000, 6e-3)])
def test_resampling_keeps_the_pass_band(rate, hz, margin):
    """Speech's band comes through within 1.5e-3 (the window's ripple); 5 kHz droops by 0.5%."""
    x = np.sin(2 * np.pi * hz * np.arange(rate) / rate)
    y = np.array(resample(x.tolist(), rate, RATE), np.float32)
    assert len(y) == RATE
    ideal = np.sin(2 * np.pi * hz * np.arange(RATE) / RATE)
    assert np.abs(y - ideal)[200:-200].max() < margin


@pytest.mark.parametrize("rate,hz", [(44_100, 10_000), (48_000, 12_000), (32_000, 11_000)])
def test_resampling_removes_what_16_khz_cannot_hold(rate, hz):
    x = np.sin(2 * np.pi * hz * np.arange(rate) / rate)
    y = np.array(resample(x.tolist(), rate, RATE), np.float32)
    assert np.sqrt(np.mean(y[200:-200] ** 2)) < 0.01          # from 0.707: below -37 dB


def test_resampling_lengths_and_identity():
    assert len(resample([0.1] * 1001, 44_100, RATE)) == -(-1001 * 160 // 441)
    assert len(resample([0.1] * 7, 8_000, RATE)) == 14
    assert list(resample([0.25, -0.5], RATE, RATE)) == [0.25, -0.5]


def refused(data: bytes) -> str:
    with pytest.raises(AudioError) as e:
        read_wav(data)
    return str(e.value)


def test_bad_files_are_refused_in_words():
    good = pcm_wav(np.zeros(100, np.int64), 2)
    assert "not a WAV file (an MP3 file)" in refused(b"ID3\x04" + bytes(100))
    assert "not a WAV file (an Ogg file)" in refused(b"OggS" + bytes(100))
    assert "no RIFF/WAVE header" in refused(b"hello, world")
    assert "incomplete" in refused(good[:-20])
    assert "mu-law" in refused(riff(fmt_chunk(7, 1, RATE, 8), bytes(100)))
    assert "PCM samples of 12 bits" in refused(riff(fmt_chunk(1, 1, RATE, 12), bytes(100)))
    assert "no samples" in refused(riff(fmt_chunk(1, 1, RATE, 16), b""))
    assert "no data chunk" in refused(good[:36])
    assert "sample rate is 100 Hz" in refused(riff(fmt_chunk(1, 1, 100, 16), bytes(100)))
    assert "0 channels" in refused(riff(fmt_chunk(1, 0, RATE, 16), bytes(100)))
    assert "RIFX" in refused(b"RIFX" + good[4:])


def test_streaming_writers_unknown_data_size():
    ints = np.arange(300, dtype=np.int64)
    data = ints.astype("<i2").tobytes()
    clip = read_wav(riff(fmt_chunk(1, 1, RATE, 16), data, data_size=0xFFFFFFFF))
    assert np.array_equal(samples(clip), (ints / 32768).astype(np.float32))
