"""What the engine's loading and step loop ask of the outside world, and the two drivers' answers.

The engine's logic is written once as generators (pyapp.steps) that yield these
requests; `handler` answers them, natively (CPython: file reads, wgpu
readbacks) or in the browser (Blob -> GPU copies in JS, awaited buffer maps).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..gpu import Buffer, Device


@dataclass(frozen=True)
class FileToGpu:
    """Copy file bytes [offset, offset + n) into buffer at dst_offset, in chunks, never whole through Python."""
    buffer: Buffer
    offset: int
    n: int
    dst_offset: int = 0


@dataclass(frozen=True)
class ReadFile:
    """File bytes [offset, offset + n) (small: vectors that need converting)."""
    offset: int
    n: int


@dataclass(frozen=True)
class ReadGpu:
    """Buffer bytes [offset, offset + n), after all submitted work."""
    buffer: Buffer
    offset: int
    n: int


@dataclass(frozen=True)
class ReadMapped:
    """A readback buffer's bytes, once the plan that copied into it is done (later work may still run)."""
    buffer: Buffer
    offset: int
    n: int


@dataclass(frozen=True)
class FilesToGpu:
    """Several FileToGpu copies at once: in the browser their file reads overlap (a round of streamed experts)."""
    copies: tuple


@dataclass(frozen=True)
class ProgramsReady:
    """Wait until the GPU has compiled every program made so far (the browser's GPU process compiles them after
    the calls that made them return); progress(done, made) while it does, where the backend can tell; the wait
    ends early once cancelled() is true."""
    progress: object = None
    cancelled: object = None


def handler(dev: Device, source, asynchronous: bool = False):
    """Answers to the requests: direct calls natively; awaitables (for drive_async) in the browser,
    where file bytes go Blob -> GPU inside JS and readbacks wait for a buffer map."""
    upload = dev.upload_async if asynchronous else dev.upload
    upload_many = dev.upload_many_async if asynchronous else dev.upload_many
    read_gpu = dev.read_async if asynchronous else dev.read
    read_mapped = dev.read_mapped_async if asynchronous else dev.read_mapped
    programs_ready = dev.programs_ready_async if asynchronous else dev.programs_ready

    def handle(req):
        if isinstance(req, FileToGpu):
            return upload(req.buffer, source, req.offset, req.n, dst_offset=req.dst_offset)
        if isinstance(req, ReadFile):
            return source.read(req.offset, req.n)
        if isinstance(req, ReadGpu):
            return read_gpu(req.buffer, req.offset, req.n)
        if isinstance(req, ReadMapped):
            return read_mapped(req.buffer, req.offset, req.n)
        if isinstance(req, ProgramsReady):
            return programs_ready(req.progress, req.cancelled)
        if isinstance(req, FilesToGpu):
            return upload_many(source, [(c.buffer, c.offset, c.n, c.dst_offset) for c in req.copies])
        raise TypeError(f"unknown request {req!r}")
    return handle
