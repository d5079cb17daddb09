"""What the engine tests share: toy GGUFs with the real models' structure (tools/make_bench_model.py), written once
per session for every module that asks for the same shape and type."""

from pathlib import Path

import pytest

from support.paths import load_tool


@pytest.fixture(scope="session")
def toy(tmp_path_factory):
    """make(shape, quant="Q8_0") -> path of a toy GGUF of that shape (make_bench_model's seed 1)."""
    tool, made = load_tool("make_bench_model"), {}

    def make(shape: str, quant: str = "Q8_0") -> Path:
        if (shape, quant) not in made:
            path = tmp_path_factory.mktemp("toy") / f"{shape}-{quant}.gguf"
            tool.write(shape, tool.T[quant], str(path), seed=1)
            made[shape, quant] = path
        return made[shape, quant]
    return make
