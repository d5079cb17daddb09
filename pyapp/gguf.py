"""GGUF reader (versions 2 and 3) over a random-access byte source.

Reads the header (metadata key/values and tensor infos) and nothing else;
tensor bytes are read only when asked for (`GGUFFile.read_tensor`) or handed
to the GPU as (offset, size) ranges. Layout, from ggml's gguf.cpp:

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key, u32 type, value)          strings: u64 length + utf-8
    n_tensors x (string name, u32 n_dims, n_dims x u64 ne, u32 ggml type, u64 offset)
    padding to general.alignment (default 32), then the tensor data block;
    tensor offsets are relative to that block and aligned.

Every malformed input raises GGUFError naming the problem and the byte offset.
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass

from . import ggml
from .errors import Fault, Gemma4Error, fault_of
from .source import ByteSource, SourceError, open_source

MAGIC = b"GGUF"
# Number arrays longer than this are kept as array.array: a Python list costs ~8x the file's
# bytes (a 64 MiB u8 array took 546 MB). Shorter ones stay lists, as callers have had them.
LIST_MAX = 1024
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
READ_CHUNK = 1 << 20
# Header reads start small and double: a small header costs one small read and a
# 30 MB vocabulary a dozen, with little read past the header into tensor data.
FIRST_READ, MAX_READ = 2 << 10, 4 << 20

# metadata value type id -> struct format of a scalar (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
VALUE_TYPE_NAMES = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool",
                    8: "string", 9: "array", 10: "u64", 11: "i64", 12: "f64"}


class GGUFError(Gemma4Error, ValueError):
    """The file is not a GGUF this reader accepts; the message says why and where."""

    def __init__(self, message: str, offset: int | None = None, fault: Fault | None = None):
        self.offset = offset
        super().__init__(message if offset is None else f"{message} (at byte {offset})", fault=fault)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]   # ggml order: shape[0] is the contiguous row length
    type: int                # ggml type id
    offset: int              # absolute offset of the data in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return ggml.name(self.type)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def row_bytes(self) -> int:
        return ggml.row_bytes(self.type, self.shape[0])


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        # ggml does not validate; keep the bytes readable rather than failing the whole file
        return raw.decode("utf-8", errors="replace")


class GGUFFile:
    """A parsed header plus the source it came from. Metadata arrays of more than LIST_MAX
    numbers are array.array (bools as u8 0/1); other arrays are lists."""

    def __init__(self, source: ByteSource, version: int, metadata: dict, tensors: dict[str, TensorInfo],
                 alignment: int, data_offset: int, metadata_types: dict | None = None):
        self.source = source
        self.version = version
        self.metadata = metadata
        # key -> GGUF value type id (VALUE_TYPE_NAMES): where a reader must tell f32 from f64 (LoRA alpha)
        self.metadata_types = metadata_types or {}
        self.tensors = tensors
        self.alignment = alignment
        self.data_offset = data_offset

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"tensor {name!r} is not in this GGUF") from None

    def read_tensor(self, name: str) -> bytes:
        t = self.tensor(name)
        return self.source.read(t.offset, t.nbytes)

    def __repr__(self):
        return f"GGUFFile(v{self.version}, {self.architecture}, {len(self.tensors)} tensors)"


class _Cursor:
    """Sequential reads from a byte source, fetched in chunks."""

    def __init__(self, source: ByteSource):
        self.src = source
        self.size = source.size
        self.pos = 0
        self.buf = b""
        self.base = 0  # file offset of buf[0]
        self.chunk = FIRST_READ

    def need(self, n: int, what: str) -> None:
        """Ensure n bytes at pos are buffered, or fail naming what was being read."""
        end = self.pos + n
        if end > self.size:
            raise GGUFError(f"truncated: {what} needs {n} bytes but the file ends at byte {self.size}", self.pos,
                            Fault.INCOMPLETE)
        if end > self.base + len(self.buf):
            want = min(self.size - self.pos, max(n, self.chunk))
            self.chunk = min(self.chunk * 2, MAX_READ)
            try:
                self.buf = self.src.read(self.pos, want)
            except SourceError as e:
                raise GGUFError(f"could not read {what}: {e}", self.pos, fault_of(e)) from e
            self.base = self.pos

    def scalar(self, fmt: str, what: str):
        size = struct.calcsize("<" + fmt)
        self.need(size, what)
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos - self.base)
        self.pos += size
        return v

    def scalars(self, fmt: str, count: int, what: str) -> list:
        size = struct.calcsize("<" + fmt)
        self.need(size * count, what)
        vals = list(struct.unpack_from(f"<{count}{fmt}", self.buf, self.pos - self.base))
        self.pos += size * count
        return vals

    def string(self, what: str) -> str:
        start = self.pos
        n = self.scalar("Q", f"length of {what}")
        if n > self.size - self.pos:
            raise GGUFError(f"{what}: string length {n} runs past the end of the file", start, Fault.INCOMPLETE)
        self.need(n, what)
        raw = self.buf[self.pos - self.base:self.pos - self.base + n]
        self.pos += n
        return _decode(raw)

    def strings(self, count: int, what: str) -> list[str]:
        out = []
        for i in range(count):
            # fast path: length and body already buffered
            off = self.pos - self.base
            if off + 8 <= len(self.buf):
                (n,) = struct.unpack_from("<Q", self.buf, off)
                if off + 8 + n <= len(self.buf):
                    self.pos += 8 + n
                    out.append(_decode(self.buf[off + 8:off + 8 + n]))
                    continue
            out.append(self.string(f"{what}[{i}]"))
        return out

    def number_array(self, fmt: str, count: int, what: str) -> array:
        """count little-endian scalars as an array.array (bools as u8), filled chunk by chunk."""
        size = struct.calcsize("<" + fmt)
        out = array("B" if fmt == "?" else fmt, [0]) * count
        view = memoryview(out).cast("B")
        done, per = 0, max(size, READ_CHUNK // size * size)
        while done < size * count:
            n = min(per, size * count - done)
            self.need(n, what)
            view[done:done + n] = self.buf[self.pos - self.base:self.pos - self.base + n]
            self.pos += n
            done += n
        if sys.byteorder == "big":
            out.byteswap()
        return out


def _value(cur: _Cursor, vtype: int, key: str, depth: int = 0):
    if vtype in _SCALARS:
        return cur.scalar(_SCALARS[vtype], f"value of {key}")
    if vtype == _STRING:
        return cur.string(f"value of {key}")
    if vtype == _ARRAY:
        if depth > 8:
            raise GGUFError(f"{key}: arrays nested too deeply", cur.pos)
        at = cur.pos
        etype = cur.scalar("I", f"array type of {key}")
        count = cur.scalar("Q", f"array length of {key}")
        if etype not in VALUE_TYPE_NAMES:
            raise GGUFError(f"{key}: unknown array element type {etype}", at)
        min_size = struct.calcsize("<" + _SCALARS[etype]) if etype in _SCALARS else (8 if etype == _STRING else 12)
        if count * min_size > cur.size - cur.pos:
            raise GGUFError(f"{key}: array of {count} {VALUE_TYPE_NAMES[etype]} runs past the end of the file", at,
                           Fault.INCOMPLETE)
        if etype in _SCALARS:
            return _chunked_scalars(cur, _SCALARS[etype], count, key)
        if etype == _STRING:
            return cur.strings(count, key)
        return [_value(cur, etype, f"{key}[{i}]", depth + 1) for i in range(count)]
    raise GGUFError(f"{key}: unknown metadata value type {vtype}", cur.pos - 4)


def _chunked_scalars(cur: _Cursor, fmt: str, count: int, key: str) -> list | array:
    if count > LIST_MAX:
        return cur.number_array(fmt, count, f"value of {key}")
    size = struct.calcsize("<" + fmt)
    per = max(1, READ_CHUNK // size)
    out: list = []
    for start in range(0, count, per):
        out.extend(cur.scalars(fmt, min(per, count - start), f"value of {key}"))
    return out


def read_gguf(path_or_source) -> GGUFFile:
    """Parse the header of a GGUF file (a path or a ByteSource)."""
    src = open_source(path_or_source)
    cur = _Cursor(src)
    if src.size < 4:
        raise GGUFError(f"not a GGUF file: only {src.size} bytes", 0, Fault.NOT_GGUF)
    cur.need(4, "magic")
    magic = cur.buf[:4]
    cur.pos = 4
    if magic != MAGIC:
        if magic == MAGIC[::-1]:
            raise GGUFError("big-endian GGUF files are not supported", 0, Fault.GGUF_KIND)
        raise GGUFError(f"not a GGUF file: magic is {magic!r}, expected b'GGUF'", 0, Fault.NOT_GGUF)
    version = cur.scalar("I", "version")
    if version not in (2, 3):
        hint = " (byte-swapped: a big-endian file?)" if version >= 1 << 16 else ""
        raise GGUFError(f"unsupported GGUF version {version}{hint}; this reader handles versions 2 and 3", 4,
                        Fault.GGUF_KIND)
    n_tensors = cur.scalar("Q", "tensor count")
    n_kv = cur.scalar("Q", "metadata count")
    # each key/value takes at least 8 + 4 + 1 bytes, each tensor info at least 8 + 4 + 8 + 4 + 8
    if n_kv * 13 > src.size:
        raise GGUFError(f"absurd metadata count {n_kv}: cannot fit in a {src.size}-byte file (truncated or corrupt)",
                        16, Fault.INCOMPLETE)
    if n_tensors * 32 > src.size:
        raise GGUFError(f"absurd tensor count {n_tensors}: cannot fit in a {src.size}-byte file (truncated or "
                        "corrupt)", 8, Fault.INCOMPLETE)

    metadata: dict = {}
    types: dict = {}
    for i in range(n_kv):
        at = cur.pos
        key = cur.string(f"key of metadata entry {i}")
        vtype = cur.scalar("I", f"type of {key}")
        if vtype not in VALUE_TYPE_NAMES:
            raise GGUFError(f"{key}: unknown metadata value type {vtype}", cur.pos - 4)
        if key in metadata:
            raise GGUFError(f"duplicate metadata key {key!r}", at)
        metadata[key] = _value(cur, vtype, key)
        types[key] = vtype

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"general.alignment must be a power of two, got {alignment!r}")

    infos = []
    for i in range(n_tensors):
        at = cur.pos
        name = cur.string(f"name of tensor {i}")
        n_dims = cur.scalar("I", f"dimension count of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"tensor {name!r}: {n_dims} dimensions (ggml allows 1..{MAX_DIMS})", cur.pos - 4)
        shape = tuple(cur.scalars("Q", n_dims, f"shape of {name}"))
        ttype = cur.scalar("I", f"type of {name}")
        rel = cur.scalar("Q", f"offset of {name}")
        if ttype not in ggml.TYPES:
            raise GGUFError(f"tensor {name!r}: unknown ggml type {ttype}", cur.pos - 12)
        infos.append((at, name, shape, ttype, rel))

    data_offset = -(-cur.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for at, name, shape, ttype, rel in infos:
        gt = ggml.TYPES[ttype]
        tname, block, bsize = gt.name, gt.block, gt.block_bytes
        if name in tensors:
            raise GGUFError(f"duplicate tensor name {name!r}", at)
        n = 1
        for d in shape:
            if d <= 0 or d > 1 << 40:
                raise GGUFError(f"tensor {name!r}: absurd shape {shape}", at)
            n *= d
        if shape[0] % block:
            raise GGUFError(f"tensor {name!r}: row length {shape[0]} is not a multiple of the {tname} block ({block})", at)
        nbytes = n // block * bsize
        if rel % alignment:
            raise GGUFError(f"tensor {name!r}: data offset {rel} is not aligned to {alignment}", at)
        start = data_offset + rel
        if start + nbytes > src.size:
            raise GGUFError(f"tensor {name!r} ({tname} {list(shape)}, {nbytes} bytes at byte {start}) extends past "
                            f"the end of the file ({src.size} bytes): truncated download?", at, Fault.INCOMPLETE)
        tensors[name] = TensorInfo(name, shape, ttype, start, nbytes)
    return GGUFFile(src, version, metadata, tensors, alignment, data_offset, types)


class _PrefixSource:
    """The first bytes of an async source, posing as the whole source: the
    parser is synchronous, so async callers fetch a prefix and grow it on demand."""

    def __init__(self, data: bytes, size: int):
        self.data, self.size, self.wanted = data, size, 0

    def read(self, offset: int, n: int) -> bytes:
        end = offset + n
        # a read outside the file is an error, not a reason to fetch more
        if offset < 0 or n < 0 or end > self.size:
            raise SourceError(f"read of {n} bytes at offset {offset} is outside the file ({self.size} bytes)",
                              fault=Fault.INCOMPLETE)
        if end > len(self.data):
            self.wanted = max(self.wanted, end)
            raise SourceError("header runs past the bytes fetched so far")
        return self.data[offset:end]


async def read_gguf_async(source, first: int = 4 << 20) -> GGUFFile:
    """read_gguf for an async source (`size`, `await read(offset, n)`), e.g. a browser File.

    The returned GGUFFile's `source` is the async source (read tensors with await source.read)."""
    n = min(source.size, first)
    while True:
        prefix = _PrefixSource(await source.read(0, n), source.size)
        try:
            g = read_gguf(prefix)
        except GGUFError:  # the reader wraps our SourceError; only a short prefix is worth a retry
            if not prefix.wanted or n >= source.size:
                raise
            n = min(source.size, max(prefix.wanted + READ_CHUNK, 4 * n))
            continue
        g.source = source
        return g


def summarize(g: GGUFFile) -> dict:
    """Totals per ggml type: {'total_bytes', 'n_elements', 'by_type': {name: {'count', 'bytes', 'n_elements'}}}."""
    by_type: dict[str, dict] = {}
    for t in g.tensors.values():
        row = by_type.setdefault(t.type_name, {"count": 0, "bytes": 0, "n_elements": 0})
        row["count"] += 1
        row["bytes"] += t.nbytes
        row["n_elements"] += t.n_elements
    return {"total_bytes": sum(r["bytes"] for r in by_type.values()),
            "n_elements": sum(r["n_elements"] for r in by_type.values()),
            "by_type": by_type}

