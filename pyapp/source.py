"""Random-access byte sources: the only way pyapp reads model files.

A source has `size` (bytes) and `read(offset, n) -> bytes`. Readers ask only for
the ranges they need, so a 20 GB model never passes through Python's heap.
CPython uses `FileSource`; the browser wraps a Blob/File (see pyapp.gpu.browser
and web/worker.js) with the same two members, sync via FileReaderSync in the
worker, or async (`AsyncSource`, `await read(...)`).
"""

from __future__ import annotations

import os
from typing import Protocol


class ByteSource(Protocol):
    size: int

    def read(self, offset: int, n: int) -> bytes: ...


class SourceError(Exception):
    """A read outside the source or an I/O failure."""


class FileSource:
    """A local file opened for random access."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._f = open(self.path, "rb")
        self.size = os.fstat(self._f.fileno()).st_size

    def read(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise SourceError(f"read of {n} bytes at offset {offset} is outside {self.path} ({self.size} bytes)")
        self._f.seek(offset)
        data = self._f.read(n)
        if len(data) != n:
            raise SourceError(f"short read at offset {offset} of {self.path}: file changed on disk?")
        return data

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"FileSource({self.path!r}, size={self.size})"


class BytesSource:
    """In-memory bytes (tests, small fixtures)."""

    def __init__(self, data: bytes, name: str = "<bytes>"):
        self._data = bytes(data)
        self.size = len(self._data)
        self.name = name

    def read(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise SourceError(f"read of {n} bytes at offset {offset} is outside {self.name} ({self.size} bytes)")
        return self._data[offset:offset + n]


def open_source(path_or_source) -> ByteSource:
    """Accept a path or an object that already is a byte source."""
    if hasattr(path_or_source, "read") and hasattr(path_or_source, "size"):
        return path_or_source
    return FileSource(path_or_source)
