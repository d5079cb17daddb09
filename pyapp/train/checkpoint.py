"""Save and resume a LoRA training run: one file, written atomically, standard library only.

A checkpoint holds everything the next update depends on, so a resumed run continues exactly as an
uninterrupted one would (tests/train/test_checkpoint.py): the adapter tensors, AdamW's moments and update
count and its hyperparameters, the step, the learning-rate schedule, the state of the run's
random.Random, where the data order stands (the caller's dict, e.g. seed, epoch and position for
data.epoch_order), free-form metadata (base model, rank, alpha, targets, data file...) and the
loss log for the app's chart.

File layout (little-endian):

    magic "G4LORACK" | u32 version | u32 header bytes | header (UTF-8 JSON) | zero padding to 4
    | f32 data: for each tensor in header["tensors"] order, its values, then its m, then its v

The header lists the tensors ([name, count]) and the data's CRC-32, so a truncated or damaged
file is refused with a clear message rather than resuming from garbage. Written to `path + .tmp`,
flushed, then renamed over `path`: a crash mid-write leaves the previous checkpoint intact.

    save_checkpoint("run.ckpt", step=120, optimizer=opt, schedule=sched, rng=rng,
                    data={"seed": 0, "epoch": 2, "position": 17}, meta={...}, log=[...])
    ck = load_checkpoint("run.ckpt")
    ck.optimizer.params          # the adapter tensors (array('f')), moments restored in ck.optimizer
    ck.step, ck.schedule, ck.rng, ck.data, ck.meta, ck.log
"""

from __future__ import annotations

import json
import random
import struct
import sys
import zlib
from array import array
from dataclasses import asdict, dataclass, field

from ..errors import Gemma4Error
from .files import write_atomic
from .optim import AdamW, WarmupCosine

MAGIC = b"G4LORACK"
VERSION = 1
_HEAD = struct.Struct("<8sII")


class CheckpointError(Gemma4Error, ValueError):
    """The file is not a checkpoint this version reads, or it is damaged."""


@dataclass
class Checkpoint:
    step: int
    optimizer: AdamW
    schedule: WarmupCosine | None
    rng: random.Random | None
    data: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    log: list = field(default_factory=list)

    @property
    def params(self) -> dict:
        return self.optimizer.params


def _le(arr: array) -> bytes:
    if sys.byteorder == "big":
        arr = array("f", arr)
        arr.byteswap()
    return arr.tobytes()


def checkpoint_parts(step: int, optimizer: AdamW, schedule: WarmupCosine | None = None,
                     rng: random.Random | None = None, data: dict | None = None, meta: dict | None = None,
                     log: list | None = None) -> list[bytes]:
    """The checkpoint file as byte strings (header, then the tensors' data)."""
    blobs = []
    tensors = []
    for name, p in optimizer.params.items():
        tensors.append([name, len(p)])
        blobs += [_le(p), _le(optimizer.m[name]), _le(optimizer.v[name])]
    crc = 0
    for b in blobs:
        crc = zlib.crc32(b, crc)
    rng_state = None
    if rng is not None:
        version, internal, gauss = rng.getstate()
        rng_state = [version, list(internal), gauss]
    header = {
        "step": int(step),
        "optimizer": {"t": optimizer.t, "betas": [optimizer.b1, optimizer.b2], "eps": optimizer.eps,
                      "weight_decay": optimizer.weight_decay},
        "schedule": asdict(schedule) if schedule is not None else None,
        "rng": rng_state, "data": data or {}, "meta": meta or {}, "log": log or [],
        "tensors": tensors, "crc32": crc,
    }
    raw = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
    raw += b" " * (-(len(raw) + _HEAD.size) % 4)
    return [_HEAD.pack(MAGIC, VERSION, len(raw)), raw] + blobs


def save_checkpoint(path, step: int, optimizer: AdamW, schedule: WarmupCosine | None = None,
                    rng: random.Random | None = None, data: dict | None = None, meta: dict | None = None,
                    log: list | None = None) -> int:
    """Write the training state to `path` atomically; returns the file's size."""
    parts = checkpoint_parts(step, optimizer, schedule, rng, data, meta, log)
    return write_atomic(path, parts)


def checkpoint_from_bytes(buf: bytes, name: str = "checkpoint") -> Checkpoint:
    """Parse a checkpoint file's bytes; CheckpointError names what is wrong."""
    if len(buf) < _HEAD.size or buf[:8] != MAGIC:
        raise CheckpointError(f"{name} is not a training checkpoint of this app")
    _, version, n_header = _HEAD.unpack_from(buf)
    if version != VERSION:
        raise CheckpointError(f"{name} is a version {version} checkpoint; this app reads version {VERSION}")
    try:
        header = json.loads(buf[_HEAD.size:_HEAD.size + n_header].decode("utf-8"))
        tensors = [(str(n), int(c)) for n, c in header["tensors"]]
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise CheckpointError(f"{name} has a damaged header ({str(e)[:200]})") from None
    start = _HEAD.size + n_header
    need = start + 12 * sum(c for _, c in tensors)
    if len(buf) != need:
        raise CheckpointError(f"{name} is truncated or damaged: {len(buf)} bytes, expected {need}")
    if zlib.crc32(memoryview(buf)[start:]) != header.get("crc32"):
        raise CheckpointError(f"{name} is damaged: its data does not match its checksum")

    def take(count):
        nonlocal start
        a = array("f")
        a.frombytes(buf[start:start + 4 * count])
        if sys.byteorder == "big":
            a.byteswap()
        start += 4 * count
        return a

    params, m, v = {}, {}, {}
    for n, c in tensors:
        params[n], m[n], v[n] = take(c), take(c), take(c)
    o = header["optimizer"]
    opt = AdamW(params, betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"])
    opt.m, opt.v, opt.t = m, v, int(o["t"])
    sched = WarmupCosine(**header["schedule"]) if header.get("schedule") else None
    rng = None
    if header.get("rng"):
        version_, internal, gauss = header["rng"]
        rng = random.Random()
        rng.setstate((version_, tuple(internal), gauss))
    return Checkpoint(int(header["step"]), opt, sched, rng, header.get("data", {}), header.get("meta", {}),
                      header.get("log", []))


MAX_CHECKPOINT_BYTES = 16 << 30      # rank 16 on every projection of a 31B model stays well below this


def load_checkpoint(path) -> Checkpoint:
    """A checkpoint file: a regular file (not a FIFO or a device) of at most MAX_CHECKPOINT_BYTES."""
    from ..inputs import read_file
    return checkpoint_from_bytes(read_file(path, MAX_CHECKPOINT_BYTES, "checkpoint"), str(path))
