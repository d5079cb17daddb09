"""Random-access byte sources: the only way pyapp reads model files.

A source has `size` (bytes) and `read(offset, n) -> bytes`. Readers ask only for
the ranges they need, so a 20 GB model never passes through Python's heap.
CPython uses `FileSource`; the browser wraps a Blob/File (see pyapp.gpu.browser
and web/worker.js) with the same two members, sync via FileReaderSync in the
worker, or async (`AsyncSource`, `await read(...)`).
"""

from __future__ import annotations

import os
import stat
from typing import Protocol

from .errors import Fault, Gemma4Error


class ByteSource(Protocol):
    size: int

    def read(self, offset: int, n: int) -> bytes: ...


class SourceError(Gemma4Error):
    """A read outside the source (fault INCOMPLETE: the file is shorter than its header says) or an I/O
    failure (CHANGED: the file changed or went away since it was opened)."""


_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class FileSource:
    """A local regular file opened for random access. Anything else (a FIFO, a device, a
    directory) is a SourceError: opening a FIFO would wait for a writer forever."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        nonblock = getattr(os, "O_NONBLOCK", 0)     # so that open() of a FIFO returns at once
        fd = os.open(self.path, os.O_RDONLY | nonblock | getattr(os, "O_BINARY", 0))
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a file")
                raise SourceError(f"{self.path} is not a regular file ({kind})")
            if nonblock:
                os.set_blocking(fd, True)
            self._f = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        self.size = os.fstat(fd).st_size

    def read(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise SourceError(f"read of {n} bytes at offset {offset} is outside {self.path} ({self.size} bytes)",
                              fault=Fault.INCOMPLETE)
        self._f.seek(offset)
        data = self._f.read(n)
        if len(data) != n:
            raise SourceError(f"short read at offset {offset} of {self.path}: file changed on disk?",
                              fault=Fault.CHANGED)
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
            raise SourceError(f"read of {n} bytes at offset {offset} is outside {self.name} ({self.size} bytes)",
                              fault=Fault.INCOMPLETE)
        return self._data[offset:offset + n]


def open_source(path_or_source) -> ByteSource:
    """Accept a path or an object that already is a byte source."""
    if hasattr(path_or_source, "read") and hasattr(path_or_source, "size"):
        return path_or_source
    return FileSource(path_or_source)
