"""Bad input on the newer surfaces (issue 25): each value is checked where it enters, by the same function for
the CLI and the page, and refused with a message saying what is wrong (exit status 2 from the CLI).

- LoRA adapters (pyapp.model.lora): alpha and the user scale finite and bounded, every A and B value finite
  and bounded, at least one pair; --lora-scale in exponent form reaches that check.
- Training files and settings (pyapp.train.data, pyapp.train.trainer.RULES): deep or huge JSON, NaN and
  Infinity, too-long examples, devices and FIFOs as --data, non-text or empty messages; NaN / inf options.
- DiffusionGemma's --prev-logits (pyapp.inputs.load_logits) and token-id lists (pyapp.inputs.token_ids).
- Ollama manifests with a number of thousands of digits (pyapp.ollama.parse_manifest).

Then seeded fuzzing (hypothesis, derandomized, a few seconds) of adapters, training files, training options
and previous-logits files: only our error types come out, and what is accepted is finite.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyapp import __main__ as cli
from pyapp.gguf import GGUFError, read_gguf
from pyapp.inputs import InputError, load_logits, read_file, token_ids
from pyapp.model.config import Gemma4Config
from pyapp.model.lora import (MAX_ALPHA, MAX_USER_SCALE, MAX_VALUE, LoraError, check_user_scale, check_values,
                              load_lora)
from pyapp.model.weights import bind
from pyapp.source import BytesSource, SourceError
from pyapp.train.data import DataError, MAX_EXAMPLE_CHARS, load_dataset
from pyapp.train.session import FieldError, config_from_fields
from pyapp.train.trainer import RULES, TrainConfig, TrainError

from support.paths import FIXTURES

FIX = FIXTURES
BASE = FIX / "gemma4-dense-f32.gguf"
ADAPTER = FIX / "lora" / "gemma4-dense.gguf"
DEMO = FIX / "demo.gguf"
NAN, INF = float("nan"), float("inf")


def run(*args) -> tuple[int, str]:
    """main(args) in this process: (exit status, stderr); argparse's refusals are exit status 2 too."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            rc = cli.main([str(a) for a in args])
        except SystemExit as e:
            rc = e.code
    return rc, err.getvalue()


def assert_refused(rc_err, *words):
    rc, err = rc_err
    assert rc == 2 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


# ---- LoRA adapters -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dense():
    g = read_gguf(BASE)
    cfg = Gemma4Config.from_gguf(g)
    return cfg, bind(cfg, g.tensors), g.architecture


ADAPTER_BYTES = ADAPTER.read_bytes()
ALPHA_AT = ADAPTER_BYTES.index(b"adapter.lora.alpha") + len(b"adapter.lora.alpha") + 4    # after the u32 type


def adapter_bytes(alpha: float | None = None, values: dict | None = None) -> bytes:
    """The fixture adapter's file with its f32 alpha replaced and {tensor name: {index: f32 bits}} written."""
    buf = bytearray(ADAPTER_BYTES)
    assert struct.unpack_from("<I", buf, ALPHA_AT - 4)[0] == 6                  # FLOAT32
    if alpha is not None:
        struct.pack_into("<f", buf, ALPHA_AT, alpha)
    g = read_gguf(BytesSource(ADAPTER_BYTES))
    for name, at in (values or {}).items():
        for i, bits in at.items():
            struct.pack_into("<I", buf, g.tensors[name].offset + 4 * i, bits)
    return bytes(buf)


def bind_bytes(data: bytes, dense, scale=1.0):
    cfg, bound, arch = dense
    return load_lora(read_gguf(BytesSource(data, "adapter.gguf")), cfg, bound, scale, arch)


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


@pytest.mark.parametrize("alpha", [NAN, INF, -INF, 3e38, MAX_ALPHA * 1.01])
def test_alpha_not_finite_or_huge_is_refused(dense, alpha):
    with pytest.raises(LoraError, match="adapter.lora.alpha is .*: it must be a finite number from -4096 to 4096"):
        bind_bytes(adapter_bytes(alpha=alpha), dense)


def test_alpha_at_the_bound_and_scale_at_the_bound_give_finite_logits(dense):
    """The bounds leave room for any trained adapter: at alpha 4096 and scale +-100 the fixture's (random,
    PEFT-sized) pairs still give finite logits on the reference."""
    from pyapp.reference.forward import ReferenceModel
    data = adapter_bytes(alpha=MAX_ALPHA)
    assert bind_bytes(data, dense, MAX_USER_SCALE).alpha == MAX_ALPHA
    for scale in (MAX_USER_SCALE, -MAX_USER_SCALE):
        logits = np.asarray(ReferenceModel(read_gguf(BASE), lora=[(BytesSource(data, "a.gguf"), scale)])
                            .forward([2, 40, 41, 300, 7]))
        assert np.isfinite(logits).all()


@pytest.mark.parametrize("scale", [NAN, INF, -INF, 1e30, -1e30, MAX_USER_SCALE + 1, True, "1"])
def test_user_scale_not_finite_or_huge_is_refused(dense, scale):
    with pytest.raises(LoraError, match="the LoRA scale must be a number from -100 to 100"):
        bind_bytes(ADAPTER_BYTES, dense, scale)
    with pytest.raises(LoraError):
        check_user_scale(scale)
    assert check_user_scale(-2) == -2.0 and check_user_scale(0) == 0.0


@pytest.mark.parametrize("value", [NAN, INF, -INF, 1e30, -MAX_VALUE * 1.5])
@pytest.mark.parametrize("name", ["blk.0.attn_q.weight.lora_a", "blk.3.ffn_down.weight.lora_b"])
def test_values_not_finite_or_huge_are_refused_by_name(dense, name, value):
    data = adapter_bytes(values={name: {5: f32_bits(value)}})
    with pytest.raises(LoraError, match=f"LoRA tensor '{name}' holds a value that is NaN, infinite or beyond "
                                        r"\+-131072 \(at index 5\)"):
        bind_bytes(data, dense)


def test_value_check_reads_each_type():
    """f32 and bf16 by their exponent (|v| < 2**17 passes), f16 by its all-ones exponent (65504 passes)."""
    ok32 = np.array([0, -0.0, 1e-30, 131071, -131071], np.float32).tobytes()
    check_values(ok32, 0, "t")
    for bad in (131072.0, -3e38, NAN, INF):
        with pytest.raises(LoraError, match="'t' holds a value"):
            check_values(ok32 + np.float32(bad).tobytes(), 0, "t")
    check_values(np.array([65504, -65504, 1e-7, 0], np.float16).tobytes(), 1, "t")
    for bad in (INF, -INF, NAN):
        with pytest.raises(LoraError):
            check_values(np.array([1, bad], np.float16).tobytes(), 1, "t")
    bf16 = lambda xs: (np.array(xs, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()   # noqa: E731
    check_values(bf16([1, -100000, 3e-20]), 30, "t")
    for bad in (NAN, INF, 1e6):
        with pytest.raises(LoraError):
            check_values(bf16([1, bad]), 30, "t")
    check_values(b"", 0, "t")


def test_an_adapter_without_pairs_is_refused(dense, tmp_path):
    from support.adapters import write_adapter
    cfg, bound, arch = dense
    empty = write_adapter(tmp_path / "empty.gguf", {})
    with pytest.raises(LoraError, match="the adapter holds no tensors: no .lora_a/.lora_b pair to apply"):
        load_lora(str(empty), cfg, bound, 1.0, arch)
    norms = write_adapter(tmp_path / "norms.gguf", {"blk.0.attn_norm.weight": np.ones(256, np.float32)})
    with pytest.raises(LoraError, match="holds only 1 norm tensor"):
        load_lora(str(norms), cfg, bound, 1.0, arch)


@pytest.mark.parametrize("args, words", [
    (["--lora-scale", "nan"], ["the LoRA scale must be a number from -100 to 100, got nan"]),
    (["--lora-scale", "inf"], ["the LoRA scale must be a number from -100 to 100, got inf"]),
    (["--lora-scale", "1e400"], ["the LoRA scale must be a number from -100 to 100, got inf"]),
    (["--lora-scale", "-inf"], ["the LoRA scale must be a number from -100 to 100, got -inf"]),
    (["--lora-scale", "1e30"], ["the LoRA scale must be a number from -100 to 100, got 1e+30"]),
    (["--lora-scale", "-1e30"], ["the LoRA scale must be a number from -100 to 100, got -1e+30"]),
    (["--lora-scale", "1_0"], ["argument --lora-scale: '1_0' is not a number (write it in the digits 0-9"]),
    (["--lora-scale", "\u0661"], ["argument --lora-scale: '\u0661' is not a number"]),
])
def test_cli_lora_scale(args, words):
    assert_refused(run("logits", BASE, "--tokens", "2,5", "--out", os.devnull, "--backend", "reference",
                       "--lora", ADAPTER, *args), *words)


def test_cli_bad_adapter_values(tmp_path):
    for alpha in (NAN, 3e38):
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(adapter_bytes(alpha=alpha))
        assert_refused(run("logits", BASE, "--tokens", "2,5", "--out", tmp_path / "o.npy", "--backend", "reference",
                           "--lora", bad), "error: ", "adapter.lora.alpha is")
    bad.write_bytes(adapter_bytes(values={"blk.1.attn_v.weight.lora_b": {0: f32_bits(NAN)}}))
    assert_refused(run("logits", BASE, "--tokens", "2,5", "--out", tmp_path / "o.npy", "--backend", "reference",
                       "--lora", bad), "'blk.1.attn_v.weight.lora_b' holds a value that is NaN")
    assert not (tmp_path / "o.npy").exists()


@pytest.mark.gpu
def test_engine_set_lora_scale_refuses_what_the_page_could_send(dev):
    from pyapp.engine import Engine
    eng = Engine.open(read_gguf(BASE), device=dev, context_length=64, lora=[(str(ADAPTER), 1.0)])
    for bad in (NAN, INF, 1e30, -101):
        with pytest.raises(LoraError, match="the LoRA scale must be a number from -100 to 100"):
            eng.set_lora_scale(0, bad)
    assert eng.adapters.adapters[0].user_scale == 1.0
    eng.set_lora_scale(0, -100)
    assert eng.adapters.adapters[0].user_scale == -100.0


# ---- training files and settings ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok():
    from pyapp.tokenizer import Tokenizer
    return Tokenizer.from_metadata(read_gguf(BASE).metadata)


def chat(*messages) -> dict:
    return {"messages": list(messages)}


USER, REPLY = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}
BAD_DATA = {
    "nested 3000 deep": ('{"messages": ' + "[" * 3000 + "]" * 3000 + "}", "JSON nested more than 64 levels deep"),
    "nested in a value": (json.dumps(chat(USER, REPLY))[:-1] + ', "x": ' + "{\"a\":" * 3000 + "1" + "}" * 3001,
                          "nested more than 64 levels deep"),
    "100,000-digit integer": (json.dumps(chat(USER, REPLY))[:-1] + ', "n": ' + "7" * 100_000 + "}",
                              "an integer of 100,000 digits (at most 100 are read)"),
    "NaN": (json.dumps(chat(USER, REPLY))[:-1] + ', "x": NaN}', "NaN is not a JSON number"),
    "-Infinity": (json.dumps(chat(USER, REPLY))[:-1] + ', "x": [-Infinity]}', "-Infinity is not a JSON number"),
    "1e999": (json.dumps(chat(USER, REPLY))[:-1] + ', "x": 1e999}', "the number 1e999 is beyond a float's range"),
    "only an image": (json.dumps(chat({"role": "user", "content": [{"type": "image", "image": "x.png"}]}, REPLY)),
                      "message 1 (user), part 1 is of type 'image': fine-tuning here trains on text only"),
    "text and audio": (json.dumps(chat({"role": "user", "content": [{"type": "text", "text": "a"},
                                                                     {"type": "audio"}]}, REPLY)),
                       "message 1 (user), part 2 is of type 'audio'"),
    "non-string text part": (json.dumps(chat(USER, {"role": "assistant", "content": [{"type": "text", "text": 5}]})),
                             "message 2 (assistant), part 1 has no text"),
    "empty user message": (json.dumps(chat({"role": "user", "content": ""}, REPLY)), "message 1 (user) is empty"),
    "empty reply": (json.dumps(chat(USER, {"role": "assistant", "content": "  "})), "message 2 (assistant) is empty"),
    "empty part list": (json.dumps(chat({"role": "user", "content": []}, REPLY)), "message 1 (user) is empty"),
    "reply only thought": (json.dumps(chat(USER, {"role": "assistant", "content": "<|channel>thought x<channel|>"})),
                           "a reply of only a thought channel trains nothing"),
    "empty text example": ('{"text": " "}', "\"text\" is empty"),
    "long role": (json.dumps(chat({"role": "r" * 10_000, "content": "a"}, REPLY)), "has role 'rrrrrrrrrrrrrrr"),
}


@pytest.mark.parametrize("case", list(BAD_DATA))
def test_bad_training_lines_are_refused_by_line(tok, case):
    text, words = BAD_DATA[case]
    data = json.dumps(chat(USER, REPLY)) + "\n" + text + "\n"
    with pytest.raises(DataError) as e:
        load_dataset(data.encode(), "d.jsonl", tok, 64)
    assert str(e.value).startswith("d.jsonl line 2: ") and words in str(e.value), str(e.value)
    assert len(str(e.value)) < 400


def test_an_example_too_long_is_refused_before_it_is_tokenized(tok, monkeypatch):
    """A line (or paragraph) of more than MAX_EXAMPLE_CHARS is refused without parsing or tokenizing a byte of
    it (counted, not timed: the tokenizer is never called)."""
    calls = []
    monkeypatch.setattr(tok, "encode_parts", lambda *a, **k: calls.append(a) or [])
    long_line = json.dumps(chat(USER, {"role": "assistant", "content": "x" * MAX_EXAMPLE_CHARS}))
    with pytest.raises(DataError, match=r"d.jsonl line 1: a line of 1,048,6\d\d characters; an example may have at "
                                        r"most 1,048,576 .*split it into several examples"):
        load_dataset(long_line.encode(), "d.jsonl", tok, 64)
    with pytest.raises(DataError, match="notes.txt line 3: a paragraph of 1,048,577 characters"):
        load_dataset(b"short\n\n" + b"y" * (MAX_EXAMPLE_CHARS + 1), "notes.txt", tok, 64)
    assert calls == []


def test_a_training_file_over_the_limit_is_refused(tok, monkeypatch):
    import pyapp.train.data as data
    monkeypatch.setattr(data, "MAX_DATA_BYTES", 1000)
    with pytest.raises(DataError, match="big.txt is 0 MiB: training files are at most 0 MiB"):
        load_dataset(b"a\n" * 600, "big.txt", tok, 64)


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "link", "fifo", "dir"])
def test_cli_data_must_be_a_regular_file(tmp_path, target):
    if target == "link":
        (tmp_path / "link").symlink_to("/dev/zero")
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")
    if target == "dir":
        (tmp_path / "dir").mkdir()
    path = target if target.startswith("/") else tmp_path / target
    if not os.path.exists(path):
        pytest.skip(f"{path} is not on this system")
    assert_refused(run("finetune", DEMO, "--data", path, "--out", tmp_path / "a.gguf"), "error: ",
                   "is not a regular file")
    with pytest.raises(SourceError, match="is not a regular file"):
        read_file(path, 1 << 20, "--data")


def test_cli_data_over_the_limit_is_refused_unread(tmp_path):
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate((64 << 20) + 1)            # sparse: nothing is written, nothing needs reading to refuse it
    assert_refused(run("finetune", DEMO, "--data", big, "--out", tmp_path / "a.gguf"),
                   f"error: --data {big} is 64.0 MiB: at most 64.0 MiB is read")


@pytest.mark.parametrize("option, value, words", [
    ("--max-grad-norm", "nan", "gradient norm limit must be a number from 0 to 1000000 (gradient clipping; 0: off), "
                               "got nan"),
    ("--weight-decay", "nan", "weight decay must be a number from 0 to 1 (AdamW's decoupled decay; 0: none), got nan"),
    ("--alpha", "inf", "alpha must be a number above 0 and at most 4096 (scale = alpha / rank; often twice the "
                       "rank), got inf"),
    ("--lr", "1e400", "learning rate must be a number above 0 and at most 0.1 (2e-4 is usual for LoRA), got inf"),
    ("--lr", "ten", "argument --lr: 'ten' is not a number"),
    ("--rank", "1_6", "argument --rank: '1_6' is not a whole number written in the digits 0-9"),
    ("--alpha", "-1e30", "alpha must be a number above 0 and at most 4096"),
    ("--alpha", "5000", "alpha must be a number above 0 and at most 4096"),
    ("--weight-decay", "-1", "weight decay must be a number from 0 to 1"),
    ("--max-grad-norm", "1e300", "gradient norm limit must be a number from 0 to 1000000"),
    ("--val-fraction", "1", "validation fraction must be a number from 0 to 0.9"),
    ("--seq-len", "4", "sequence length must be an integer from 8 to 32768"),
])
def test_cli_training_options(tmp_path, option, value, words):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(chat(USER, REPLY)) + "\n")
    assert_refused(run("finetune", DEMO, "--data", data, "--out", tmp_path / "a.gguf", option, value), words)
    assert not (tmp_path / "a.gguf").exists()


@pytest.mark.parametrize("field", [f for f, r in RULES.items() if not r.integer])
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_every_float_setting_refuses_non_finite(field, value):
    from dataclasses import replace
    with pytest.raises(TrainError, match=f"must be .*, got {value}"):
        replace(TrainConfig(), **{field: value}).check()


@pytest.mark.parametrize("option", ["--gpu-memory", "--expert-cache"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e400"])
def test_cli_memory_options(option, value):
    """`info` shows the memory plan it cannot make; Engine.open (the CLI's and the page's load) raises."""
    from pyapp.engine import EngineError
    from pyapp.engine.loading import _mib
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["info", str(BASE), option, value]) == 0
    assert "not runnable here: a GPU memory size must be a number of MiB from 0 to" in out.getvalue()
    with pytest.raises(EngineError, match="a GPU memory size must be a number of MiB"):
        _mib(float(value))


@pytest.mark.parametrize("value", ["0", "-5", "16385"])
def test_cli_prompt_step_out_of_range(value):
    """--prompt-step: `info` shows the plan it cannot make; loading raises the same EngineError."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["info", str(BASE), "--prompt-step", value]) == 0
    assert f"not runnable here: a prompt step must be a whole number of tokens from 1 to 16384, got {int(value)}" \
        in out.getvalue()
    from pyapp.engine import EngineError
    from pyapp.engine.loading import check_chunk
    with pytest.raises(EngineError, match="a prompt step must be a whole number of tokens from 1 to 16384"):
        check_chunk(int(value))


@pytest.mark.parametrize("value", ["1.5", "nan", "٤"])
def test_cli_prompt_step_not_a_whole_number(value, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["info", str(BASE), "--prompt-step", value])
    assert e.value.code == 2 and "--prompt-step" in capsys.readouterr().err


def test_cli_prompt_step_sizes_the_activations():
    """A wider prompt step holds more tokens' activations: `info`'s memory plan grows with it."""
    def state_mib(step):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main(["info", str(BASE), "--prompt-step", str(step)]) == 0
        m = re.search(r"activations and KV cache ([\d.,]+) (KiB|MiB)", out.getvalue())
        assert m, out.getvalue()
        return float(m.group(1).replace(",", "")) * (1 / 1024 if m.group(2) == "KiB" else 1)
    assert state_mib(8) < state_mib(64) < state_mib(512)


def test_the_page_and_the_cli_share_the_rules():
    from pyapp.train.session import FIELDS
    assert all(rule is RULES[attr] for attr, _, rule in FIELDS.values())
    for text in ("nan", "inf", "-inf", "1e400"):
        with pytest.raises(FieldError, match="Alpha must be a number above 0 and at most 4096"):
            config_from_fields({"alpha": text})


# ---- DiffusionGemma: previous logits and token ids --------------------------------------------------------

ROWS, COLS = 2, 16


def npy(tmp_path, arr, name="prev.npy", **kw) -> Path:
    path = tmp_path / name
    np.save(path, arr, **kw)
    return path


def npy_header(shape, descr="<f4", fortran=False) -> bytes:
    head = repr({"descr": descr, "fortran_order": fortran, "shape": tuple(shape)}).encode()
    head += b" " * (-(len(head) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head


GOOD = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS) / 7


def bad_logits(tmp_path) -> dict:
    """case -> (path, what the message must say)."""
    def p(name, data):
        (tmp_path / name).write_bytes(data)
        return tmp_path / name

    full = npy(tmp_path, GOOD, "full.npy").read_bytes()
    return {
        "text file": (p("t.npy", b"0.1 0.2\n0.3 0.4\n"), "is not a .npy file"),
        "empty": (p("e.npy", b""), "is empty"),
        "truncated": (p("tr.npy", full[:-5]), "is truncated: its header describes 128 bytes of data, the file holds 123"),
        "extra bytes": (p("x.npy", full + b"\0" * 4), "has bytes after its array"),
        "pickled": (p("pk.npy", pickle.dumps(GOOD)), "is not a .npy file"),
        "object dtype": (npy(tmp_path, np.array([[None] * COLS] * ROWS, dtype=object), "o.npy", allow_pickle=True),
                         "holds object values"),
        "string dtype": (npy(tmp_path, np.full((ROWS, COLS), "abc"), "s.npy"), "holds <U3 values"),
        "bool": (npy(tmp_path, np.ones((ROWS, COLS), bool), "b.npy"), "holds bool values"),
        "complex": (npy(tmp_path, GOOD.astype(np.complex64), "c.npy"), "holds complex64 values"),
        "int": (npy(tmp_path, np.ones((ROWS, COLS), np.int32), "i.npy"), "holds int32 values"),
        "structured": (npy(tmp_path, np.zeros((ROWS, COLS), [("a", "<f4"), ("b", "<f4")]), "st.npy"), "values"),
        "float128": (p("q.npy", npy_header((ROWS, COLS), "<f16") + b"\0" * (ROWS * COLS * 16)), "holds float128"),
        "header lies big": (p("hb.npy", npy_header((ROWS, COLS * 1000)) + GOOD.tobytes()), "shaped (2, 16000)"),
        "header lies small": (p("hs.npy", npy_header((ROWS, COLS)) + GOOD.tobytes()[:40]), "is truncated"),
        "header garbage": (p("hg.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': __impo\n"), "has a damaged .npy header"),
        "header huge": (p("hh.npy", b"\x93NUMPY\x02\x00" + struct.pack("<I", 1 << 30) + b"{"), "damaged .npy header"),
        "version 9": (p("v9.npy", b"\x93NUMPY\x09\x00" + full[8:]), "damaged .npy header"),
        "wrong shape": (npy(tmp_path, GOOD[:1], "ws.npy"), "holds an array shaped (1, 16); this canvas needs (2, 16)"),
        "all NaN": (npy(tmp_path, np.full((ROWS, COLS), NAN, np.float32), "n.npy"),
                    "holds 32 values that are NaN, infinite or beyond float32's range (the first at row 0, column 0"),
        "one inf": (npy(tmp_path, np.where(np.arange(ROWS * COLS).reshape(ROWS, COLS) == 17, INF, GOOD), "inf.npy"),
                    "holds 1 values that are NaN, infinite or beyond float32's range (the first at row 1, column 1"),
        "f64 beyond f32": (npy(tmp_path, np.full((ROWS, COLS), 1e300), "big.npy"), "beyond float32's range"),
    }


def test_previous_logits_files_are_checked(tmp_path):
    for case, (path, words) in bad_logits(tmp_path).items():
        with pytest.raises(InputError) as e:
            load_logits(path, ROWS, COLS)
        assert words in str(e.value) and str(e.value).startswith("--prev-logits "), (case, str(e.value))
    for arr in (GOOD, GOOD.astype(np.float16), GOOD.astype(np.float64), GOOD.astype(">f4"), np.asfortranarray(GOOD)):
        got = load_logits(npy(tmp_path, arr), ROWS, COLS)
        assert got.dtype == np.float32 and got.flags.c_contiguous and np.allclose(got, GOOD, rtol=1e-3, atol=1e-3)
    with pytest.raises(SourceError, match="not a regular file"):
        load_logits("/dev/zero", ROWS, COLS)
    with pytest.raises(InputError, match="at most"):
        load_logits(npy(tmp_path, np.zeros((ROWS, COLS * 5000), np.float64)), ROWS, COLS)


@pytest.fixture(scope="module")
def diffusion_model(diffusion_gguf):
    return diffusion_gguf("f32")


def test_cli_diffusion_logits_refuses_bad_previous_logits(diffusion_model, tmp_path):
    from pyapp.families.diffusion_gemma import DiffusionGemmaConfig
    vocab = DiffusionGemmaConfig.from_gguf(read_gguf(diffusion_model)).vocab_size
    base = ["diffusion-logits", diffusion_model, "--prompt-tokens", "2,3", "--canvas-tokens", "4,5",
            "--out", tmp_path / "out.npy", "--backend", "reference"]
    for name, arr, words in [("nan.npy", np.full((2, vocab), NAN, np.float32), "that are NaN, infinite"),
                             ("int.npy", np.zeros((2, vocab), np.int64), "holds int64 values"),
                             ("text.npy", None, "is not a .npy file")]:
        path = tmp_path / name
        if arr is None:
            path.write_text("1, 2, 3\n")
        else:
            np.save(path, arr)
        assert_refused(run(*base, "--prev-logits", path), "error: --prev-logits ", words)
    assert not (tmp_path / "out.npy").exists()
    np.save(tmp_path / "ok.npy", np.zeros((2, vocab), np.float32))
    assert run(*base, "--prev-logits", tmp_path / "ok.npy")[0] == 0


@pytest.mark.parametrize("text, words", [
    ("4,5,", "item 3 of 3 is empty (a trailing comma)"),
    (",4", "item 1 of 2 is empty (a leading comma)"),
    ("4,,5", "item 2 of 3 is empty (two commas in a row)"),
    ("", "no canvas token ids given"),
    ("  ", "no canvas token ids given"),
    ("\u0664,\u0665", "canvas token id '\u0664' (item 1) is not a whole number written in the digits 0-9"),
    ("1_0", "'1_0' (item 1) is not a whole number"),
    ("4.0", "'4.0' (item 1) is not a whole number"),
    ("+4", "'+4' (item 1)"),
    ("0x10", "'0x10' (item 1)"),
    ("\uff14", "is not a whole number"),                           # a fullwidth 4
    ("4\t", "'4\\t' (item 1)"),
    ("9" * 5000, "is not a whole number"),
    ("-1", "canvas token id -1 is outside the vocabulary (0..511)"),
    ("512", "canvas token id 512 is outside the vocabulary (0..511)"),
])
def test_token_ids_are_ascii_digits(text, words):
    with pytest.raises(InputError) as e:
        token_ids(text, 512, "canvas token")
    assert words in str(e.value) and len(str(e.value)) < 200, str(e.value)


def test_token_ids_accepted():
    assert token_ids("4,5", 512) == [4, 5]
    assert token_ids(" 4 , 05 ,511", 512) == [4, 5, 511]


def test_cli_token_ids(tmp_path):
    for ids in ("4,5,", "\u0664,\u0665", "1_0"):
        assert_refused(run("logits", DEMO, "--tokens", ids, "--out", tmp_path / "o.npy", "--backend", "reference"),
                       "error: token ")
    assert not (tmp_path / "o.npy").exists()


# ---- Ollama manifests -----------------------------------------------------------------------------------------

def test_manifest_with_a_number_of_thousands_of_digits():
    from pyapp.ollama import parse_manifest
    layer = '{"digest": "sha256:' + "a" * 64 + '", "size": %s}'
    with pytest.raises(ValueError) as e:
        parse_manifest(('{"layers": [' + layer % ("9" * 5000) + "]}").encode())
    assert str(e.value) == ("manifest holds a number too long to read (thousands of digits): the file is damaged; "
                            "pull the model again")
    with pytest.raises(ValueError, match=r"has a bad size 99999.*\.\.\. \(4000 characters\)$"):
        parse_manifest(('{"layers": [' + layer % ("9" * 4000) + "]}").encode())


# ---- fuzzing: only our errors come out; what is accepted is finite --------------------------------------------

FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                   st.sampled_from([NAN, INF, -INF, 3e38, -3e38, 1e-45, 0.0, -0.0, 65504.0, 131072.0, 4096.0, 4097.0]))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(data=st.data())
def test_fuzz_adapters(dense, data):
    """Alpha, values anywhere in the pairs (as floats or raw bit patterns), the user scale and random bytes of
    the header: load_lora binds a finite adapter or raises LoraError / GGUFError."""
    names = sorted(read_gguf(BytesSource(ADAPTER_BYTES)).tensors)
    values = {}
    for name in data.draw(st.lists(st.sampled_from(names), max_size=3, unique=True)):
        at = data.draw(st.integers(0, 255))
        bits = data.draw(st.one_of(FLOATS.map(f32_bits), st.integers(0, 2**32 - 1)))
        values[name] = {at: bits}
    buf = bytearray(adapter_bytes(data.draw(st.one_of(st.none(), FLOATS)), values))
    for _ in range(data.draw(st.integers(0, 2))):                     # anywhere in the metadata and tensor infos
        buf[data.draw(st.integers(0, ALPHA_AT + 4000))] = data.draw(st.integers(0, 255))
    scale = data.draw(st.one_of(FLOATS, st.integers(-1000, 1000)))
    try:
        a = bind_bytes(bytes(buf), dense, scale)
    except (LoraError, GGUFError):
        return
    assert math.isfinite(a.alpha) and abs(a.alpha) <= MAX_ALPHA and abs(a.user_scale) <= MAX_USER_SCALE
    for t in a.targets:
        for raw in a.arrays(t):
            v = np.frombuffer(raw, np.float32)
            assert np.isfinite(v).all() and np.abs(v).max(initial=0) < MAX_VALUE
        assert math.isfinite(a.scale(t))


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), FLOATS, st.text(max_size=8),
                      st.sampled_from(["user", "assistant", "system", "text", "image", "messages", "content"]))
JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.sampled_from(
                                                         ["messages", "role", "content", "type", "text", "x"]),
                                                         inner, max_size=3)), max_leaves=12)
MESSAGE = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "assistant", "system", "model"]), JSON),
                                 "content": st.one_of(st.text(max_size=12), JSON, st.lists(
                                     st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "audio"]),
                                                            "text": st.one_of(st.text(max_size=8), JSON)}),
                                     max_size=3))})
LINE = st.one_of(st.lists(MESSAGE, max_size=4).map(lambda m: json.dumps({"messages": m})), JSON.map(json.dumps),
                 st.text(max_size=40), st.just("{" * 200), st.just('{"n": ' + "1" * 5000 + "}"),
                 st.just('{"text": ' + "[" * 2000 + "]" * 2000 + "}"))


@settings(max_examples=120, deadline=None, derandomize=True)
@given(lines=st.lists(LINE, min_size=1, max_size=4), name=st.sampled_from(["d.jsonl", "d.txt", "upload"]),
       seq_len=st.sampled_from([8, 64]))
def test_fuzz_training_files(tok, lines, name, seq_len):
    text = "\n".join(lines)
    try:
        ds = load_dataset(text.encode("utf-8", "surrogatepass"), name, tok, seq_len)
    except DataError as e:
        assert str(e).startswith(name) or str(e).startswith("no training example"), str(e)
        assert len(str(e)) < 1000
        return
    assert ds.train and all(0 <= t < tok.n_vocab for s in ds.train + ds.val for t in s.ids)


SETTING = st.one_of(FLOATS, st.integers(-2**64, 2**64), st.none(), st.booleans(), st.text(max_size=6))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(data=st.data())
def test_fuzz_training_settings(data):
    """TrainConfig.check (the CLI and the page) and the page's fields: TrainError / FieldError, or a config
    whose every number is finite and within its rule."""
    from dataclasses import replace
    changes = {name: data.draw(SETTING) for name in data.draw(st.lists(st.sampled_from(sorted(RULES)), max_size=4))}
    cfg = replace(TrainConfig(), **changes)
    try:
        cfg.check()
    except TrainError:
        pass
    else:
        for name, rule in RULES.items():
            v = getattr(cfg, name)
            assert v is None or rule.check(name, v) == v
    fields = {k: data.draw(st.one_of(st.text(max_size=8), FLOATS.map(repr), SETTING))
              for k in data.draw(st.lists(st.sampled_from(["rank", "alpha", "lr", "steps", "epochs", "batch",
                                                           "seq_len", "targets", "preset"]), max_size=3))}
    try:
        got = config_from_fields(fields)
    except FieldError:
        return
    for name, rule in RULES.items():
        v = getattr(got, name)
        assert v is None or (not isinstance(v, float) or math.isfinite(v))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(option=st.sampled_from(["--alpha", "--lr", "--epochs", "--weight-decay", "--max-grad-norm", "--val-fraction",
                               "--rank", "--steps", "--seq-len", "--batch"]),
       value=st.one_of(FLOATS.map(repr), st.text(max_size=6), st.integers(-10**30, 10**30).map(str),
                       st.sampled_from(["-1e30", "1e400", "-inf", "nan", "-.5", "1_0", "\u0664"])))
def test_fuzz_cli_training_options(tmp_path_factory, option, value):
    """Any value of a training option: exit status 2 with a message (the data file is missing, so nothing trains)."""
    missing = tmp_path_factory.getbasetemp() / "missing.jsonl"
    rc, err = run("finetune", DEMO, "--data", missing, "--out", os.devnull, option, value)
    assert rc == 2 and "Traceback" not in err and "error" in err, err


@settings(max_examples=100, deadline=None, derandomize=True)
@given(data=st.data())
def test_fuzz_previous_logits(tmp_path_factory, data):
    """np.save of arrays of many dtypes and shapes, then bytes changed, cut or added: load_logits gives a finite
    float32 [ROWS, COLS] array or raises InputError."""
    dtype = data.draw(st.sampled_from(["<f4", ">f4", "<f2", "<f8", "<i4", "|b1", "<c8", "<U2", "|u1", "<f4"]))
    shape = data.draw(st.sampled_from([(ROWS, COLS), (ROWS, COLS), (COLS, ROWS), (ROWS * COLS,), (ROWS, COLS, 1), ()]))
    arr = np.asarray(data.draw(st.lists(FLOATS, min_size=1, max_size=4)) * (ROWS * COLS))[:max(1, math.prod(shape))]
    with np.errstate(all="ignore"):
        arr = arr.astype(np.float64).reshape(shape) if shape else np.float64(arr[0])
        arr = np.asarray(arr).astype(dtype) if dtype != "<U2" else np.asarray(arr).astype(str).astype("<U2")
    out = io.BytesIO()
    np.save(out, arr)
    buf = bytearray(out.getvalue())
    for _ in range(data.draw(st.integers(0, 3))):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(buf))))
    buf = buf[:cut] + data.draw(st.binary(max_size=8))
    path = tmp_path_factory.getbasetemp() / "fuzz.npy"
    path.write_bytes(bytes(buf))
    try:
        got = load_logits(path, ROWS, COLS)
    except InputError as e:
        assert str(e).startswith("--prev-logits ") and len(str(e)) < 600, str(e)
        return
    assert got.dtype == np.float32 and got.shape == (ROWS, COLS) and np.isfinite(got).all()


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.one_of(st.text(max_size=12), st.lists(st.integers(-5, 600).map(str), max_size=5).map(",".join)))
def test_fuzz_token_ids(text):
    try:
        ids = token_ids(text, 512)
    except InputError:
        return
    assert ids and all(0 <= t < 512 for t in ids)
    assert all(item.strip(" ").isascii() and item.strip(" ").isdigit() for item in text.split(","))
