"""What the DiffusionGemma test modules share: the engine on a module's converted f32 fixture (each module's
`gguf_files` fixture says which; a golden case's logits on it: support.diffusion.decoder_step)."""

import pytest

from pyapp.gguf import read_gguf


@pytest.fixture(scope="module")
def engine(gguf_files, dev):
    """The module's f32 fixture on the native GPU; chunk 16 (= the canvas): 20-token prompts take two steps."""
    from pyapp.engine import Engine
    return Engine.open(read_gguf(gguf_files["f32"]), device=dev, context_length=96, chunk=16)

