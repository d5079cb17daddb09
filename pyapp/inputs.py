"""Values that come in from outside, checked where they come in: lists of token ids, files, logits files.

One rule for every surface (issue 25): a value is checked where it enters, by the same function for the
command line (pyapp.__main__) and the page's layers; numbers are finite and within their range; files are
regular files read with a size bound (a FIFO, /dev/zero or a symlink to it is refused, never read until
memory runs out); a bad value is an InputError (a ValueError) saying what was wrong and what to do.

    ids = token_ids("2,651,1234", vocab=262144)            # strict: ASCII digits, no empty items
    x = number("2e-4", "--lr"); n = integer("16", "--rank") # options and page fields typed as text
    data = read_file("chats.jsonl", 64 << 20, "--data")    # bytes, or InputError / SourceError / OSError
    prev = load_logits("prev.npy", rows=16, cols=262144)   # float32 [rows, cols], every value finite

Other surfaces keep their checks beside their data: LoRA adapters in pyapp.model.lora (alpha, values,
the user scale), training files in pyapp.train.data, training settings in pyapp.train.trainer.RULES,
sampling settings in pyapp.sampling.RULES.

Standard library only, except load_logits (numpy: the CLI's --prev-logits, CPython).
"""

from __future__ import annotations

import io
import re

from .errors import Gemma4Error
from .source import FileSource


class InputError(Gemma4Error, ValueError):
    """An option value or input file the app cannot use; the message says what and what to do."""


_ID = re.compile(r"-?[0-9]{1,12}")        # ASCII digits only (int() would take "٤", "1_0", " 4 ")
_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")    # float() takes more, as int()
_INTEGER = re.compile(r"[-+]?[0-9]+")
_NOT_FINITE = {"nan", "inf", "infinity"}
MAX_NPY_HEADER = 1 << 16                  # numpy's own limit on a .npy header it reads (max_header_size 10000)
NPY_MAGIC = b"\x93NUMPY"


def token_ids(text: str, vocab: int, what: str = "token") -> list[int]:
    """Comma-separated token ids (spaces around an id allowed), each written in the ASCII digits 0-9 and
    inside the vocabulary: at least one, no empty item (a trailing comma), no signs, points, underscores or
    other scripts' digits."""
    if not isinstance(text, str) or not text.strip(" "):
        raise InputError(f"no {what} ids given: write them comma-separated, e.g. 2,651,1234")
    items = text.split(",")
    ids = []
    for n, item in enumerate(items, 1):
        s = item.strip(" ")
        if not s:
            where = "a trailing comma" if n == len(items) else "a leading comma" if n == 1 else "two commas in a row"
            raise InputError(f"{what} ids: item {n} of {len(items)} is empty ({where}): write the ids "
                             "comma-separated, e.g. 2,651,1234")
        if not _ID.fullmatch(s):
            raise InputError(f"{what} id {s[:24]!r} (item {n}) is not a whole number written in the digits 0-9: "
                             "write the ids comma-separated, e.g. 2,651,1234")
        t = int(s)
        if s[0] == "-" or t >= vocab:
            raise InputError(f"{what} id {s.lstrip('0') or '0'} is outside the vocabulary (0..{vocab - 1})")
        ids.append(t)
    return ids


def number(text: str, what: str = "", finite: bool = True) -> float:
    """A number typed as text (an option, a page field): ASCII digits with an optional sign, point and exponent
    (0.5, -2, 2e-4), else InputError ("1_0", other scripts' digits, "0x1p3"). nan, inf and what overflows (1e400)
    are refused too, unless finite=False: then they come back as floats, for a range rule downstream to refuse
    in its own words (the CLI's options: pyapp.sampling.RULES, pyapp.train.trainer.RULES, ...)."""
    s = text.strip(" ") if isinstance(text, str) else ""
    if s.lower().lstrip("+-") in _NOT_FINITE:
        if finite:
            raise InputError(f"{_of(what)}{s!r} is not a finite number")
        return float(s)
    if len(s) > 100 or not _NUMBER.fullmatch(s):
        raise InputError(f"{_of(what)}{_short(text)} is not a number (write it in the digits 0-9, e.g. 0.5 or 2e-4)")
    value = float(s)
    if finite and value in (float("inf"), float("-inf")):
        raise InputError(f"{_of(what)}{s[:40]!r} is not a finite number")
    return value


def integer(text: str, what: str = "") -> int:
    """A whole number typed as text: ASCII digits with an optional sign (at most 30 of them); InputError
    otherwise ("1_0", "4.0", other scripts' digits)."""
    s = text.strip(" ") if isinstance(text, str) else ""
    if len(s) > 30 or not _INTEGER.fullmatch(s):
        raise InputError(f"{_of(what)}{_short(text)} is not a whole number written in the digits 0-9")
    return int(s)


def _of(what: str) -> str:
    return f"{what}: " if what else ""


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def read_file(path, max_bytes: int, what: str = "file", hint: str = "") -> bytes:
    """The whole of a regular file of at most max_bytes bytes. A FIFO, a device (/dev/zero, /dev/urandom, a
    symlink to one) or a directory is a SourceError; a larger file an InputError naming both sizes (hint:
    what to do instead); a missing one the OSError saying so."""
    with FileSource(path) as f:
        if f.size > max_bytes:
            raise InputError(f"{what} {f.path} is {_mib(f.size)}: at most {_mib(max_bytes)} is read"
                             + (f" ({hint})" if hint else ""))
        return f.read(0, f.size)


def load_logits(path, rows: int, cols: int, what: str = "--prev-logits"):
    """A .npy file of [rows, cols] logits (numpy.save of a float16, float32 or float64 array) as float32,
    every value finite. Read by hand, not with numpy.load: the header is checked before a byte of data is
    taken (a lying header, a pickle, an object or structured dtype, a text file, a truncated file: each an
    InputError), and the file is a regular one of at most the size such an array can have."""
    import numpy as np
    from numpy.lib import format as npf

    want = f"a .npy file of float32 logits shaped ({rows}, {cols}) (numpy.save of the previous step's logits)"
    data = read_file(path, MAX_NPY_HEADER + 16 + rows * cols * 8, what, f"this canvas needs {want}")
    name = f"{what} {path}"
    if not data.startswith(NPY_MAGIC):
        kind = "is empty" if not data else "is not a .npy file"
        raise InputError(f"{name} {kind}: give {want}")
    fp = io.BytesIO(data)
    try:
        version = npf.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = npf.read_array_header_1_0(fp, max_header_size=MAX_NPY_HEADER)
        elif version == (2, 0):
            shape, fortran, dtype = npf.read_array_header_2_0(fp, max_header_size=MAX_NPY_HEADER)
        else:
            raise ValueError(f"format version {version[0]}.{version[1]} (this reads 1.0 and 2.0)")
    except Exception as e:             # numpy's header parser: ValueError, SyntaxError, EOFError, ...
        raise InputError(f"{name} has a damaged .npy header ({str(e)[:200] or type(e).__name__}): give "
                         f"{want}") from None
    if dtype.kind != "f" or dtype.itemsize not in (2, 4, 8) or dtype.fields is not None or dtype.shape:
        raise InputError(f"{name} holds {dtype} values: logits are floating-point numbers (float16, float32 or "
                         f"float64); give {want}")
    if tuple(shape) != (rows, cols):
        raise InputError(f"{name} holds an array shaped {tuple(shape)}; this canvas needs ({rows}, {cols})")
    start, need = fp.tell(), rows * cols * dtype.itemsize
    if len(data) - start != need:
        how = "is truncated" if len(data) - start < need else "has bytes after its array"
        raise InputError(f"{name} {how}: its header describes {need:,} bytes of data, the file holds "
                         f"{len(data) - start:,}; save the logits again")
    arr = np.frombuffer(data, dtype, rows * cols, start).reshape((rows, cols), order="F" if fortran else "C")
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(np.float32)
    bad = ~np.isfinite(out)
    if bad.any():
        r, c = (int(i) for i in np.argwhere(bad)[0])
        raise InputError(f"{name} holds {int(bad.sum()):,} values that are NaN, infinite or beyond float32's range "
                         f"(the first at row {r}, column {c}, {arr[r, c]!r}): previous logits must be finite")
    return np.ascontiguousarray(out)
