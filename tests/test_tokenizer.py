"""pyapp.tokenizer on the real Gemma 4 vocabulary: llama.cpp's vectors, HF tokenizers, streaming, speed."""

import importlib.util
import random
import time
from pathlib import Path

import pytest

from pyapp.tokenizer import StreamDecoder, Tokenizer, TokenizerError

ROOT = Path(__file__).resolve().parent.parent


def _hf_tool():
    spec = importlib.util.spec_from_file_location("hf_tokenizer", ROOT / "tools" / "hf_tokenizer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tok(vocab_gguf):
    return Tokenizer.from_metadata(vocab_gguf.metadata)


@pytest.fixture(scope="module")
def hf(vocab_gguf):
    pytest.importorskip("tokenizers")
    return _hf_tool().hf_tokenizer(vocab_gguf.metadata)


def llama_cpp_vectors(path: Path):
    """(text, ids) pairs as tests/test-tokenizer-0.cpp reads them."""
    texts = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    outs = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs)]


def test_every_llama_cpp_vector(tok, vocab_gguf_path):
    vectors = llama_cpp_vectors(vocab_gguf_path)
    assert len(vectors) >= 40
    for text, want in vectors:
        assert tok.encode(text, parse_special=False) == want, repr(text)


OUR_TEXTS = [
    "Hello world", " leading space", "trailing space ", "  two  spaces  between  ", "\t tabs\tand\n\nnewlines\n",
    "Ünïcödé façade naïve — “quotes” …", "日本語のテキストと漢字", "한국어 문장입니다.", "Привет, как дела?",
    "مرحبا بالعالم", "हिन्दी पाठ", "emoji 🦙🚀👩‍👩‍👧‍👦 flags 🇫🇷🇯🇵", "math ∑ ∫ √ ≠ ∞ π",
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(3))", "{\"json\": [1, 2.5, null, true]}",
    "<html><body><div class=\"x\">hi</div></body></html>", "a" * 300, " " * 37, "\n" * 9, "\r\n\r\n",
    "x\u200by\u00a0z", "0123456789 3.14159 1e-10 0xDEADBEEF", "<|turn>user\nhi<turn|>", "<start_of_turn>",
    "mixed <|\"|>quoted<|\"|> and <|channel>thought<channel|>", "zero\x00byte", "\U0010ffff private use",
]


def test_matches_hf_tokenizers(tok, hf):
    for text in OUR_TEXTS:
        want = hf.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == want, repr(text)


def test_random_text_matches_hf(tok, hf):
    rng = random.Random(0)
    alphabet = "abcdefghij klmnop\nqrs.,;:!?'\"()[]{}0123456789äöüßéèñçøåæ中文字日本한국🙂🦙\t-_/\\<>|"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80)))
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids, repr(text)


def test_special_tokens_and_bos(tok):
    assert tok.encode("<|turn>user\nhi<turn|>", add_bos=True)[:2] == [tok.bos_id, tok.id_of("<|turn>")]
    assert tok.id_of("<|turn>") not in tok.encode("<|turn>", parse_special=False)     # control: literal text
    assert tok.encode('<|"|>', parse_special=False) == [tok.id_of('<|"|>')]            # user-defined: always
    assert tok.eos_id in tok.stop_ids and tok.id_of("<turn|>") in tok.stop_ids


def test_decode_round_trip(tok):
    for text in OUR_TEXTS:
        if "<" in text:
            continue
        assert tok.decode(tok.encode(text)) == text, repr(text)
    assert tok.decode(tok.encode("<|turn>model\nhi<turn|>")) == "model\nhi"            # control tokens hidden
    assert tok.decode(tok.encode("<|turn>x"), special=True) == "<|turn>x"


def test_streaming_never_splits_a_character(tok):
    text = "naïve 🦙 日本語 " + "é" * 5 + "🇫🇷"
    ids = tok.encode(text)
    dec = tok.stream()
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # byte-fallback tokens of one emoji come out together
    byte_ids = [tok.id_of(f"<0x{b:02X}>") for b in "🦙".encode()]
    d = StreamDecoder(tok)
    assert [d.push(i) for i in byte_ids] == ["", "", "", "🦙"]


def test_speed(vocab_gguf):
    t = time.perf_counter()
    tok = Tokenizer.from_metadata(vocab_gguf.metadata)
    build = time.perf_counter() - t
    rng = random.Random(1)
    words = ["the", "model", "runs", "in", "a", "browser", "tab", "with", "WebGPU", "Pyodide", "données", "模型", "🙂"]
    text = " ".join(rng.choice(words) + rng.choice(["", ",", ".", "!\n"]) for _ in range(3000))[:10_000]
    t = time.perf_counter()
    ids = tok.encode(text)
    enc = time.perf_counter() - t
    assert len(ids) > 1000
    assert build < 2.0, f"building took {build:.2f}s"
    assert enc < 0.1, f"encoding 10 kB took {enc * 1e3:.0f} ms"


def test_not_a_gemma4_vocab():
    with pytest.raises(TokenizerError, match="gemma4"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "llama"})
