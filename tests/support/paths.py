"""Where things are: the checkout, the committed fixtures, the vendored llama.cpp files (build.py setup puts them
in .cache/llama.cpp; GEMMA4_VENDORED points elsewhere), and tools/ scripts loaded as modules."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
VENDORED = Path(os.environ.get("GEMMA4_VENDORED", ROOT / ".cache" / "llama.cpp"))
VOCAB = VENDORED / "models" / "ggml-vocab-gemma-4.gguf"
DIFFUSION_HF = FIXTURES / "diffusion-tiny-hf"


def load_tool(name: str):
    """A script from tools/ as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
