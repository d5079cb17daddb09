"""What the text tests share: the tokenizer of the real Gemma 4 vocabulary (llama.cpp's ggml-vocab-gemma-4.gguf)."""

import pytest


@pytest.fixture(scope="module")
def tok(vocab_gguf):
    from pyapp.tokenizer import Tokenizer
    return Tokenizer.from_metadata(vocab_gguf.metadata)
