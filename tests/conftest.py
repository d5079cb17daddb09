"""Shared fixtures: the native GPU device, where the vendored llama.cpp files are (build.py setup puts them there)."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENDORED = Path(os.environ.get("GEMMA4_VENDORED", ROOT / ".cache" / "llama.cpp"))
VOCAB = VENDORED / "models" / "ggml-vocab-gemma-4.gguf"


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
    except Exception as e:
        pytest.skip(f"no WebGPU adapter for the native backend ({e})")


def load_tool(name: str):
    """A script from tools/ as a module (tools/ is not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


DIFFUSION_HF = ROOT / "tests" / "fixtures" / "diffusion-tiny-hf"


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
