"""WAV files, standard library only: a RIFF/WAVE file's samples as one channel of floats at 16 kHz.

    clip = read_wav(data)            # Clip: samples (array('f'), 16 kHz mono), and what the file held
    clip.samples, clip.seconds

Reads what people's recorders and converters write: PCM of 8 (unsigned), 16, 24 or 32 bits and IEEE
float of 32 or 64 bits, in a plain `fmt ` chunk or WAVE_FORMAT_EXTENSIBLE, any number of channels,
any sample rate from 1 kHz to 384 kHz. Values are scaled as soundfile and librosa read them (PCM16 / 32768,
PCM24 / 2^23, PCM32 / 2^31, PCM8 (x - 128) / 128); channels are averaged into one (librosa's
`mono=True`, what transformers' load_audio does); another rate than 16 kHz is resampled
(pyapp.families.gemma4_audio.resample). Compressed WAV (ADPCM, mu-law, MP3 in RIFF) and other
containers are refused in words (AudioError: the CLI exits 2), as are files cut short and files without
samples.
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass

from .config import AudioError
from .features import SAMPLE_RATE
from .resample import resample

PCM, IEEE_FLOAT, EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
OTHER_FORMATS = {0x0002: "Microsoft ADPCM", 0x0006: "A-law", 0x0007: "mu-law", 0x0011: "IMA ADPCM",
                 0x0055: "MP3", 0x0050: "MPEG", 0x0031: "GSM 6.10"}
# WAVE_FORMAT_EXTENSIBLE's SubFormat GUIDs are the format code followed by this
KSDATAFORMAT_TAIL = bytes.fromhex("000000001000800000aa00389b71")
UNKNOWN_SIZE = (0, 0xFFFFFFFF)        # a data size streaming writers leave when they cannot seek back
MIN_RATE, MAX_RATE = 1_000, 384_000


@dataclass(frozen=True)
class Clip:
    samples: array                   # float32, 16 kHz, one channel
    source_rate: int                 # the file's sample rate (resampled when not 16 kHz)
    channels: int                    # the file's channels (averaged into one)
    encoding: str                    # "PCM 16-bit", "float 32-bit", ...
    source_seconds: float            # the file's length (samples may hold less: read_wav's max_seconds)

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def _chunks(data: bytes):
    """(id, body) of each chunk after the RIFF/WAVE header; a data chunk of unknown size runs to the end."""
    pos = 12
    while pos + 8 <= len(data):
        cid, size = struct.unpack_from("<4sI", data, pos)
        body_at = pos + 8
        if cid == b"data" and size in UNKNOWN_SIZE:
            size = len(data) - body_at
        if body_at + size > len(data):
            raise AudioError(f"the WAV file ends inside its {cid.decode('latin-1')!r} chunk ({len(data) - body_at} of "
                             f"{size} bytes): an incomplete file")
        yield cid, data[body_at:body_at + size]
        pos = body_at + size + (size & 1)          # chunks are padded to an even length


@dataclass(frozen=True)
class Format:
    code: int
    channels: int
    rate: int
    bits: int
    block: int                        # bytes a frame (one sample of every channel)


def _format(body: bytes) -> Format:
    if len(body) < 16:
        raise AudioError(f"the WAV file's fmt chunk is {len(body)} bytes, expected at least 16")
    code, channels, rate, _, block, bits = struct.unpack_from("<HHIIHH", body)
    if code == EXTENSIBLE:
        if len(body) < 40 or body[26:40] != KSDATAFORMAT_TAIL:
            raise AudioError("the WAV file's extensible format names no PCM or float samples")
        code = struct.unpack_from("<H", body, 24)[0]
    return Format(code, channels, rate, bits, block)


def _encoding(fmt: Format) -> str:
    """'PCM 16-bit' or 'float 32-bit' for a format this reader decodes; AudioError naming any other."""
    if fmt.code == PCM and fmt.bits in (8, 16, 24, 32):
        return f"PCM {fmt.bits}-bit"
    if fmt.code == IEEE_FLOAT and fmt.bits in (32, 64):
        return f"float {fmt.bits}-bit"
    if fmt.code in (PCM, IEEE_FLOAT):
        kind = "PCM" if fmt.code == PCM else "float"
        raise AudioError(f"the WAV file holds {kind} samples of {fmt.bits} bits; this app reads PCM of 8, 16, 24 or "
                         "32 bits and float of 32 or 64", hint=CONVERT_HINT)
    what = OTHER_FORMATS.get(fmt.code, f"format code 0x{fmt.code:04x}")
    raise AudioError(f"the WAV file is compressed ({what}); this app reads PCM and float WAV", hint=CONVERT_HINT)


CONVERT_HINT = "convert it first, e.g. ffmpeg -i FILE -ar 16000 -ac 1 out.wav (16 kHz mono PCM 16-bit)"


def _values(raw: bytes, fmt: Format) -> array:
    """Every sample of every channel, interleaved, as float32 in [-1, 1] (float files as stored)."""
    width = fmt.bits // 8
    if fmt.code == IEEE_FLOAT:
        values = array("f" if width == 4 else "d", raw)
        if sys.byteorder == "big":
            values.byteswap()
        return values if width == 4 else array("f", values)
    if width == 1:
        return array("f", [(b - 128) / 128 for b in raw])
    if width == 3:                    # each sample into the top three bytes of an int32: value * 256
        wide = bytearray(4 * (len(raw) // 3))
        wide[1::4], wide[2::4], wide[3::4] = raw[0::3], raw[1::3], raw[2::3]
        raw, width = bytes(wide), 4
    ints = array("h" if width == 2 else "i", raw)
    if sys.byteorder == "big":
        ints.byteswap()
    scale = 1.0 / (1 << (8 * width - 1))
    return array("f", [x * scale for x in ints])


def _mono(values: array, channels: int) -> array:
    """The channels' mean at each instant (one channel: the values themselves)."""
    if channels == 1:
        return values
    columns = [values[c::channels] for c in range(channels)]
    return array("f", [sum(frame) / channels for frame in zip(*columns)])


def read_wav(data: bytes, max_seconds: float | None = None) -> Clip:
    """The clip a WAV file holds, as 16 kHz mono float32 (see the module's docstring); AudioError for a file
    that is not a WAV this app reads, saying why. max_seconds: decode about that much (a second more, so
    the resampler's last samples see the signal that follows), not a long file's whole length."""
    data = bytes(data)
    if len(data) < 12 or data[:4] not in (b"RIFF", b"RIFX", b"RF64") or data[8:12] != b"WAVE":
        kind = _sniff(data)
        raise AudioError(f"not a WAV file ({kind})" if kind else "not a WAV file (no RIFF/WAVE header)",
                         hint=CONVERT_HINT)
    if data[:4] != b"RIFF":
        raise AudioError(f"a {data[:4].decode()} WAV file (big-endian or over 4 GiB): this app reads RIFF WAV",
                         hint=CONVERT_HINT)
    fmt = raw = None
    for cid, body in _chunks(data):
        if cid == b"fmt ":
            fmt = _format(body)
        elif cid == b"data" and raw is None:
            raw = body
    if fmt is None or raw is None:
        raise AudioError(f"the WAV file has no {'fmt ' if fmt is None else 'data'} chunk")
    encoding = _encoding(fmt)
    if not 1 <= fmt.channels <= 64:
        raise AudioError(f"the WAV file says it has {fmt.channels} channels")
    if not MIN_RATE <= fmt.rate <= MAX_RATE:
        raise AudioError(f"the WAV file's sample rate is {fmt.rate} Hz; this app reads {MIN_RATE} to {MAX_RATE} Hz")
    if fmt.block != fmt.channels * fmt.bits // 8:
        raise AudioError(f"the WAV file's frames are {fmt.block} bytes; {fmt.channels} channels of {fmt.bits} bits "
                         f"take {fmt.channels * fmt.bits // 8}")
    frames = len(raw) // fmt.block
    if frames == 0:
        raise AudioError("the WAV file holds no samples")
    kept = frames if max_seconds is None else min(frames, int((max_seconds + 1) * fmt.rate))
    samples = _mono(_values(raw[:kept * fmt.block], fmt), fmt.channels)
    if fmt.rate != SAMPLE_RATE:
        samples = resample(samples, fmt.rate, SAMPLE_RATE)
    return Clip(samples, fmt.rate, fmt.channels, encoding, frames / fmt.rate)


SIGNATURES = ((b"ID3", "an MP3 file"), (b"\xff\xfb", "an MP3 file"), (b"\xff\xf3", "an MP3 file"),
              (b"OggS", "an Ogg file"), (b"fLaC", "a FLAC file"), (b"\x1a\x45\xdf\xa3", "a WebM/Matroska file"))


def _sniff(data: bytes) -> str:
    """What a file that is not WAV looks like, by its first bytes ('' when unknown)."""
    if data[4:8] == b"ftyp":
        return "an MP4/M4A file"
    return next((what for magic, what in SIGNATURES if data.startswith(magic)), "")
