"""pyapp.tokenizer on the real Gemma 4 vocabulary: llama.cpp's vectors, HF tokenizers, streaming, the work done
(counted; bench/tokenizer_speed.py times it)."""

import random
from pathlib import Path

import pytest

from pyapp.tokenizer import StreamDecoder, Tokenizer, TokenizerError

from support.paths import load_tool


@pytest.fixture(scope="module")
def hf(vocab_gguf):
    pytest.importorskip("tokenizers")
    return load_tool("hf_tokenizer").hf_tokenizer(vocab_gguf.metadata)


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
    "\ufeffbom \ufffd replacement \ufffe\uffff nonchars", "e\u0301 combining a\u0308\u0323 marks", "\x85nel\x7f\x1b[0m",
    "\r\rcr only\r", "tab\t\t\tindent\n\t\tmore", "\u2581 already escaped \u2581\u2581", "ａｂｃ１２３ fullwidth",
    "<|tool_response>response:x{value:1}<tool_response|>", "<turn|><turn|>", "<|turn", "turn|>", "<mask><unk><pad>",
    "🧑🏽‍💻 skin tone ZWJ", "   \n   \n\n   ", "x" * 5 + "\n" * 40 + "y",
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
    assert (tok.bos_id, tok.eos_id, tok.n_vocab) == (2, 1, 262144)
    assert tok.encode("<|turn>user\nhi<turn|>", add_bos=True)[:2] == [tok.bos_id, tok.id_of("<|turn>")]
    assert tok.encode("<|turn>user\nhi<turn|>") == [105, 2364, 107, tok.id_of("hi"), 106]
    assert tok.id_of("<|turn>") not in tok.encode("<|turn>", parse_special=False)     # control: literal text
    assert tok.encode('<|"|>', parse_special=False) == [tok.id_of('<|"|>')]            # user-defined: always
    assert tok.encode("<|channel>", parse_special=False) == [100]


def test_plain_parts_cut_no_special_token(tok):
    # user-defined <|channel> is cut even without parse_special (llama.cpp); a plain part cuts nothing
    text = '<|channel><|"|><turn|><bos>'
    plain = tok.encode_parts([(text, False)])
    assert not {100, 52, 106, 2} & set(plain) and tok.decode(plain) == text
    # markup parts parse specials; text is merged across parts as one string would be
    parts = [("<|turn>user\n", True), ("hel", False), ("lo <turn|>", True)]
    assert tok.encode_parts(parts) == tok.encode("<|turn>user\nhello <turn|>") == [105, 2364, 107, 23391, 236743, 106]
    assert tok.encode_parts([("\n", True), ("\n", False)], add_bos=True) == tok.encode("\n\n", add_bos=True)


def test_end_of_generation_tokens_as_llama_cpp(tok):
    # llama.cpp's EOG set for this vocabulary: <eos>, <turn|> and <|tool_response>
    assert tok.stop_ids == {1, 106, 50}
    # <|tool_response> is user-defined in the file, but llama.cpp makes EOG tokens control:
    # hidden when decoding, and plain text when special tokens are not parsed
    assert tok.decode([50, 236746]) == "a" and tok.decode([50], special=True) == "<|tool_response>"
    assert 50 not in tok.encode("<|tool_response>", parse_special=False)
    assert tok.encode("<|tool_response>") == [50]


def test_decode_round_trip(tok):
    for text in OUR_TEXTS:
        if "<" in text or "\u2581" in text:              # a literal ▁ decodes to a space, as in llama.cpp
            continue
        assert tok.decode(tok.encode(text)) == text, repr(text)
    assert tok.decode(tok.encode("<|turn>model\nhi<turn|>")) == "model\nhi"            # control tokens hidden
    assert tok.decode(tok.encode("<|turn>x"), special=True) == "<|turn>x"


def test_reduced_vocab_matches_hf(vocab_gguf):
    tool = load_tool("hf_tokenizer")
    small = tool.reduce_vocab(vocab_gguf.metadata, 4096)
    ours = Tokenizer.from_metadata(small)
    hf = tool.hf_tokenizer(vocab_gguf.metadata, keep=4096)
    assert ours.n_vocab == hf.get_vocab_size() == 4096
    assert 2000 < len(small["tokenizer.ggml.merges"]) < 10000
    for m in small["tokenizer.ggml.merges"]:              # every merge is between kept tokens, into a kept token
        cut = m.find(" ", 1)
        assert {m[:cut], m[cut + 1:], m[:cut] + m[cut + 1:]} <= set(small["tokenizer.ggml.tokens"])
    for text in OUR_TEXTS:
        ids = ours.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids, repr(text)
        assert max(ids) < 4096
    assert ours.decode(ours.encode("naïve🦙text")) == "naïve🦙text"        # byte fallback survives the cut
    with pytest.raises(ValueError, match="byte"):
        tool.reduce_vocab(vocab_gguf.metadata, 300)


def test_converter_reads_token_types_back(vocab_gguf, vocab_gguf_path, tmp_path, monkeypatch):
    """The tokenizer files hf_tokenizer writes for a fixture give llama.cpp's converter the GGUF's token types."""
    pytest.importorskip("transformers")
    gguf_py = vocab_gguf_path.parent.parent / "gguf-py"          # the vendored converter's own gguf-py
    if not gguf_py.exists():
        pytest.skip("vendored gguf-py missing")
    monkeypatch.syspath_prepend(str(gguf_py))
    import gguf
    tool = load_tool("hf_tokenizer")
    small = tool.reduce_vocab(vocab_gguf.metadata, 512)
    tool.write_tokenizer(small, tmp_path)
    types = [int(t) for _, _, t in gguf.LlamaHfVocab(tmp_path).all_tokens()]
    want = small["tokenizer.ggml.token_type"]
    differ = {i for i in range(512) if types[i] != want[i]}
    # the converter's Gemma4Model.set_vocab makes exactly these user-defined itself
    assert differ == {i for i in range(512) if want[i] == 4} == {48, 49, 50, 51, 52, 100, 101}
    assert [i for i in range(512) if types[i] == 3] == [0, 1, 2, 3, 4, 46, 47, 98, 105, 106]


def _toy(tokens, merges, types=None):
    return Tokenizer.from_metadata({"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens,
                                    "tokenizer.ggml.token_type": types or [1] * len(tokens),
                                    "tokenizer.ggml.merges": merges})


def test_bpe_rules_on_a_toy_vocabulary():
    # leftmost pair first when ranks tie; a repeated merge keeps its first (lower) rank
    tok = _toy(["<pad>", "<eos>", "<bos>", "a", "b", "aa", "ab", "▁", "▁a"], ["a a", "a b", "▁ a", "a a"],
               [3, 3, 3, 1, 1, 1, 1, 1, 1])
    assert tok.encode("aaa") == [5, 3]                    # (a a) a, not a (a a)
    assert tok.encode("aab") == [5, 4]                    # "a a" outranks "a b"
    assert tok.encode(" ab") == [7, 6]                    # spaces become ▁; "a b" outranks "▁ a"
    assert tok.encode(" a") == [8]
    assert tok.ranks["a a"] == 0 and tok.ranks["a b"] == 1 and "b a" not in tok.ranks
    # no token and no byte tokens for "c": llama.cpp drops it
    assert tok.encode("ca") == [3]
    assert tok.decode([7, 6]) == " ab"


def test_stop_ids_from_metadata():
    meta = {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": ["<pad>", "<eos>", "<bos>", "a", "<x>"],
            "tokenizer.ggml.token_type": [3, 3, 3, 1, 3], "tokenizer.ggml.merges": [],
            "tokenizer.ggml.eot_token_id": 4, "tokenizer.ggml.eos_token_ids": [3, 99]}
    assert Tokenizer.from_metadata(meta).stop_ids == {1, 3, 4}          # out-of-range ids are ignored


def test_lone_surrogates_become_replacement_characters(tok):
    assert tok.encode("a\ud800b") == tok.encode("a\ufffdb")


def test_streaming_decode_fuzz(tok):
    rng = random.Random(2)
    pool = "".join(OUR_TEXTS).replace("\u2581", "") + "日本語🦙🇫🇷é"
    for _ in range(100):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 60)))
        ids = tok.encode(text, parse_special=False)
        dec = tok.stream()
        pieces = [dec.push(i) for i in ids] + [dec.flush()]
        assert "".join(pieces) == tok.decode(ids) == text, repr(text)
        assert all("\ufffd" not in p for p in pieces if "\ufffd" not in text)


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


def test_work_is_bounded(vocab_gguf, monkeypatch):
    """Building and encoding, checked by the work they do rather than by a clock (bench/tokenizer_speed.py
    times them): building decodes no token and keeps one rank per merge; BPE considers at most 3 candidate
    pairs per character (the initial pairs, then at most two per merge), so encoding is n log n; a run seen
    before is not merged again."""
    import heapq
    import types

    import pyapp.tokenizer as tokenizer_module
    meta = vocab_gguf.metadata
    tok = Tokenizer.from_metadata(meta)
    assert tok.n_vocab == len(tok.ids) == len(meta["tokenizer.ggml.tokens"])
    assert len(tok.ranks) <= len(meta["tokenizer.ggml.merges"])
    assert all(p is None for p in tok._pieces)                     # nothing decoded ahead of need
    count = {"push": 0, "pop": 0, "bpe": 0}

    def heapify(h):
        count["push"] += len(h)
        heapq.heapify(h)

    def heappush(h, item):
        count["push"] += 1
        heapq.heappush(h, item)

    def heappop(h):
        count["pop"] += 1
        return heapq.heappop(h)

    monkeypatch.setattr(tokenizer_module, "heapq", types.SimpleNamespace(heapify=heapify, heappush=heappush,
                                                                         heappop=heappop))
    bpe = tok._bpe
    monkeypatch.setattr(tok, "_bpe", lambda word: count.__setitem__("bpe", count["bpe"] + 1) or bpe(word))
    rng = random.Random(1)
    words = ["the", "model", "runs", "in", "a", "browser", "tab", "with", "WebGPU", "Pyodide", "données", "模型", "🙂"]
    text = " ".join(rng.choice(words) + rng.choice(["", ",", ".", "!\n"]) for _ in range(3000))[:10_000]
    ids = tok.encode(text)
    assert len(ids) > 1000
    assert 0 < count["pop"] <= count["push"] <= 3 * len(text), count
    assert count["bpe"] <= text.count("\n") + 1                   # one per run of the text, not per word
    seen = dict(count)
    assert tok.encode(text) == ids and count == seen               # the runs come from the cache


def test_not_a_gemma4_vocab():
    with pytest.raises(TokenizerError, match="gemma4"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "llama"})


def test_unused_placeholders_decode_to_nothing(tok):
    """<unusedN> tokens (typed NORMAL in the GGUF) never show as text, streamed or not; typed as
    text they stay plain characters, as before."""
    unused = tok.id_of("<unused85>")
    ids = tok.encode("Hi") + [unused] + tok.encode(" there")
    assert tok.decode(ids) == "Hi there"
    stream = tok.stream()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == "Hi there"
    assert unused not in tok.encode("<unused85>", parse_special=False)
    assert tok.decode(tok.encode("<unused85>", parse_special=False)) == "<unused85>"
