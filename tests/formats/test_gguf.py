"""pyapp.gguf: the header reader against files gguf-py writes, bad input, fuzzing."""

import asyncio
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyapp.gguf import GGUFError, read_gguf, read_gguf_async, summarize
from pyapp.source import BytesSource, SourceError

gguf = pytest.importorskip("gguf")


def make_gguf(tmp_path, alignment=None, name="m.gguf") -> bytes:
    path = tmp_path / name
    w = gguf.GGUFWriter(str(path), arch="gemma4")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -300)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -7)
    w.add_float32("t.f32", 0.5)
    w.add_uint64("t.u64", 2**60)
    w.add_int64("t.i64", -(2**60))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_str", ["a", "", "ü"])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_tensor("a", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("b", np.ones((2, 32), dtype=np.float16))
    q = gguf.quants.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("c", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.fixture
def good(tmp_path):
    return make_gguf(tmp_path)


def test_reads_every_value_type(good):
    g = read_gguf(BytesSource(good))
    m = g.metadata
    assert g.version == 3 and g.architecture == "gemma4"
    assert (m["t.u8"], m["t.i8"], m["t.u16"], m["t.i16"]) == (200, -5, 65000, -300)
    assert (m["t.u32"], m["t.i32"], m["t.u64"], m["t.i64"]) == (4_000_000_000, -7, 2**60, -(2**60))
    assert m["t.f32"] == 0.5 and m["t.f64"] == 1e-300 and m["t.bool"] is True
    assert m["t.str"] == "héllo ✓"
    assert m["t.arr_i32"] == [1, -2, 3] and m["t.arr_str"] == ["a", "", "ü"]
    assert m["t.nested"] == [[1, 2], [3]]


def test_tensor_infos_and_data_agree_with_gguf_py(tmp_path, good):
    g = read_gguf(BytesSource(good))
    ref = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    assert list(g.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        mine = g.tensors[t.name]
        assert mine.shape == tuple(int(d) for d in t.shape)
        assert mine.type == int(t.tensor_type)
        assert mine.offset == t.data_offset and mine.nbytes == t.n_bytes
        assert g.read_tensor(t.name) == bytes(np.asarray(t.data).view(np.uint8).reshape(-1))
    a = np.frombuffer(g.read_tensor("a"), np.float32)
    assert a.tolist() == list(range(12))
    s = summarize(g)
    assert s["by_type"]["F32"] == {"count": 1, "bytes": 48, "n_elements": 12}
    assert s["by_type"]["Q8_0"]["bytes"] == 68
    assert s["total_bytes"] == 48 + 128 + 68


def test_custom_alignment(tmp_path):
    data = make_gguf(tmp_path, alignment=64, name="a64.gguf")
    g = read_gguf(BytesSource(data))
    assert g.alignment == 64 and g.data_offset % 64 == 0
    assert all((t.offset - g.data_offset) % 64 == 0 for t in g.tensors.values())


def test_reads_only_the_header():
    """A source whose tensor bytes are unreadable still parses."""
    class HeaderOnly(BytesSource):
        def read(self, offset, n):
            if offset >= self.limit:
                raise AssertionError(f"read tensor data at {offset}")
            return super().read(offset, min(n, self.size - offset))
    import tempfile, pathlib
    with tempfile.TemporaryDirectory() as d:
        data = make_gguf(pathlib.Path(d))
    src = HeaderOnly(data)
    src.limit = read_gguf(BytesSource(data)).data_offset
    g = read_gguf(src)
    assert len(g.tensors) == 3


def test_async_reader(good):
    class Async:
        def __init__(self, data):
            self.data, self.size, self.reads = data, len(data), 0

        async def read(self, offset, n):
            self.reads += 1
            return self.data[offset:offset + n]
    src = Async(good)
    g = asyncio.run(read_gguf_async(src, first=64))  # forces the prefix to grow
    assert g.metadata["t.str"] == "héllo ✓" and src.reads >= 2


@pytest.mark.parametrize("mutate, message", [
    (lambda d: b"GGML" + d[4:], "not a GGUF file"),
    (lambda d: b"FUGG" + d[4:], "big-endian"),
    (lambda d: d[:4] + struct.pack("<I", 1) + d[8:], "unsupported GGUF version 1"),
    (lambda d: d[:4] + struct.pack("<I", 7) + d[8:], "unsupported GGUF version 7"),
    (lambda d: d[:8] + struct.pack("<Q", 10**12) + d[16:], "absurd tensor count"),
    (lambda d: d[:16] + struct.pack("<Q", 10**12) + d[24:], "absurd metadata count"),
    (lambda d: d[:24] + struct.pack("<Q", 10**9) + d[32:], "runs past the end"),
    (lambda d: d[:100], "truncated"),
    (lambda d: d[:-40], "extends past the end of the file"),
    (lambda d: d[:2], "only 2 bytes"),
])
def test_bad_input_is_a_precise_error(good, mutate, message):
    with pytest.raises(GGUFError, match=message) as e:
        read_gguf(BytesSource(mutate(good)))
    assert "byte" in str(e.value) or "only" in str(e.value)


def test_unknown_tensor_type(good):
    g = read_gguf(BytesSource(good))
    # the type field of the last tensor info sits 12 bytes before the data padding
    info_end = good.index(b"c", g.data_offset - 64)  # name of tensor "c"
    at = info_end + 1 + 4 + 2 * 8  # name, n_dims, two dims
    bad = good[:at] + struct.pack("<I", 99) + good[at + 4:]
    with pytest.raises(GGUFError, match="unknown ggml type 99"):
        read_gguf(BytesSource(bad))


def test_real_vocab_file_parses_in_few_reads(vocab_gguf_path):
    """Its 262,144 tokens and 514,906 merges come in chunks of READ_CHUNK: each byte of the header read once,
    in a handful of reads (counted, not timed: bench/tokenizer_speed.py times the parse)."""
    from pyapp.gguf import READ_CHUNK
    from pyapp.source import FileSource
    reads = []

    class Counted(FileSource):
        def read(self, offset, n):
            reads.append(n)
            return super().read(offset, n)

    with Counted(vocab_gguf_path) as src:
        g = read_gguf(src)
    assert len(reads) <= g.data_offset // READ_CHUNK + 8 and sum(reads) <= g.data_offset + READ_CHUNK, \
        (len(reads), sum(reads), g.data_offset)
    assert g.architecture == "gemma4"
    assert len(g.metadata["tokenizer.ggml.tokens"]) == 262144
    assert len(g.metadata["tokenizer.ggml.merges"]) == 514906


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_mutations_only_raise_gguf_error(good, data):
    buf = bytearray(good)
    for _ in range(data.draw(st.integers(1, 8))):
        kind = data.draw(st.sampled_from(["byte", "u64", "cut"]))
        at = data.draw(st.integers(0, len(buf) - 1))
        if kind == "byte":
            buf[at] = data.draw(st.integers(0, 255))
        elif kind == "u64" and at + 8 <= len(buf):
            buf[at:at + 8] = struct.pack("<Q", data.draw(st.sampled_from([0, 1, 2**31, 2**63, 2**64 - 1])))
        elif kind == "cut":
            del buf[at:]
            if not buf:
                buf += b"G"
    try:
        g = read_gguf(BytesSource(bytes(buf)))
    except GGUFError:
        return
    for t in g.tensors.values():  # whatever parsed must be readable
        assert t.offset + t.nbytes <= len(buf)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(blob):
    try:
        read_gguf(BytesSource(b"GGUF" + blob))
    except GGUFError:
        pass


# ---- large arrays stay compact ----------------------------------------------------
# A Python list costs ~6-8x the file's bytes (a 64 MiB u8 array took 546 MB of RSS).

def gguf_with_arrays(arrays: dict) -> bytes:
    """A tensor-less GGUF v3 whose metadata are the given arrays: {key: (element type, count, payload)}."""
    out = [b"GGUF", struct.pack("<IQQ", 3, 0, len(arrays))]
    for key, (etype, count, payload) in arrays.items():
        k = key.encode()
        out += [struct.pack("<Q", len(k)), k, struct.pack("<IIQ", 9, etype, count), payload]
    return b"".join(out)


def parse_measured(data: bytes):
    """(GGUFFile, peak bytes Python allocated while parsing)."""
    import tracemalloc
    src = BytesSource(data)
    tracemalloc.start()
    try:
        g = read_gguf(src)
        return g, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_number_array_is_an_array_not_a_list():
    from array import array
    n = 16 << 20
    payload = bytes(range(256)) * (n // 256)
    f32 = np.linspace(-1, 1, 100_000, dtype=np.float32)
    flags = bytes([1, 0, 0]) * 1000
    g, peak = parse_measured(gguf_with_arrays({"big.u8": (0, n, payload), "big.f32": (6, len(f32), f32.tobytes()),
                                               "big.bool": (7, 3000, flags), "small.i32": (5, 3, struct.pack("<3i", 1, -2, 3))}))
    m = g.metadata
    assert isinstance(m["big.u8"], array) and m["big.u8"].typecode == "B" and len(m["big.u8"]) == n
    assert m["big.u8"].tobytes() == payload and m["big.u8"][257] == 1
    assert m["big.f32"].typecode == "f" and np.array_equal(np.frombuffer(m["big.f32"], np.float32), f32)
    assert m["big.bool"].typecode == "B" and list(m["big.bool"][:4]) == [1, 0, 0, 1]
    assert m["small.i32"] == [1, -2, 3] and isinstance(m["small.i32"], list)     # small ones: lists, as before
    assert peak < n + (8 << 20), f"parsing a {n >> 20} MiB array peaked at {peak / 2**20:.0f} MiB"


def gguf_py_reader_in_memory(path):
    """gguf-py's GGUFReader, its parse unchanged, over the file's bytes read into a plain array rather than an
    np.memmap: every one of its ~2M small slices of a 262k-token vocabulary then skips memmap's Python-level
    __getitem__ / __array_finalize__ (a few times faster)."""
    from unittest import mock
    in_memory = lambda file, mode="r": np.fromfile(file, dtype=np.uint8)   # noqa: E731
    with mock.patch.object(gguf.gguf_reader.np, "memmap", in_memory):
        return gguf.GGUFReader(str(path))


def test_real_vocab_arrays_are_compact_and_the_tokenizer_reads_them(vocab_gguf_path):
    from array import array

    from pyapp.tokenizer import Tokenizer
    ref = gguf_py_reader_in_memory(vocab_gguf_path)
    m = read_gguf(vocab_gguf_path).metadata
    types, scores = m["tokenizer.ggml.token_type"], m["tokenizer.ggml.scores"]
    assert isinstance(types, array) and types.typecode == "i" and isinstance(scores, array) and scores.typecode == "f"
    assert types.tolist() == ref.fields["tokenizer.ggml.token_type"].contents()     # gguf-py's reader agrees
    assert scores.tolist() == ref.fields["tokenizer.ggml.scores"].contents()
    assert m["tokenizer.ggml.tokens"][:3] == ["<pad>", "<eos>", "<bos>"] and types[2] == 3
    tok = Tokenizer.from_metadata(m)
    assert tok.n_vocab == 262144 and tok.decode(tok.encode("Hello world")) == "Hello world"
