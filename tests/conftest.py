"""Fixtures every area shares: the native GPU device (one for the session), the vendored Gemma 4 vocabulary, the tiny
DiffusionGemma converted once per output type. Each area's folder has a conftest.py for what only it shares
(tests/browser/conftest.py: the server and the pages); helpers live in tests/support/. The random test order
(--random-order, --random-order-seed) is tests/support/random_order.py."""

import sys
from pathlib import Path

import pytest

# tests/ on sys.path: every test module imports its helpers from tests/support as `support` (pytest's default
# import mode puts it there too; pyproject.toml is left alone, build.py reinstalls the environment when it changes)
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

from support.paths import DIFFUSION_HF, VOCAB, load_tool  # noqa: E402
from support.random_order import (pytest_addoption, pytest_collection_modifyitems,  # noqa: E402, F401
                                  pytest_report_header, pytest_terminal_summary)


@pytest.fixture(scope="session")
def vocab_gguf_path() -> Path:
    if not VOCAB.exists():
        pytest.skip(f"{VOCAB} missing: run `python3 build.py setup`")
    return VOCAB


@pytest.fixture(scope="session")
def vocab_gguf(vocab_gguf_path):
    from pyapp.gguf import read_gguf
    return read_gguf(vocab_gguf_path)


@pytest.fixture(scope="session")
def dev():
    """The native backend's device (Mesa lavapipe on a machine without a GPU); tests that change
    its limits restore them (monkeypatch.setitem)."""
    try:
        from pyapp.gpu import get_device
        return get_device("native")
    except Exception as e:  # no wgpu, no driver, no adapter
        pytest.skip(f"no WebGPU adapter for the native backend ({e}); apt-get install mesa-vulkan-drivers")


@pytest.fixture(scope="session")
def diffusion_gguf(tmp_path_factory):
    """outtype -> the tiny DiffusionGemma checkpoint converted by tools/convert_diffusion_gemma.py (no
    tokenizer), each outtype converted once per session for every test module that needs it."""
    converter, d, made = load_tool("convert_diffusion_gemma"), tmp_path_factory.mktemp("diffusion"), {}

    def get(outtype: str):
        if outtype not in made:
            made[outtype] = d / f"tiny-{outtype}.gguf"
            converter.convert(DIFFUSION_HF, made[outtype], outtype, vocab=None, log=lambda _msg: None)
        return made[outtype]
    return get
