"""An assistant drafter as the engine's draft source (issue 29 goal 4): the numpy drafter
(pyapp/families/gemma4_assistant/source.py) fed the target's final-normed rows and K/V read back from
the GPU. Greedy output with it equals greedy output without it, and its first drafts after the prompt
are transformers' (tests/fixtures/assistant/: the GPU's rows and positions are the ones transformers
chains). The random drafter was not trained on the target: its later drafts are rarely accepted (the
rate is printed)."""

from __future__ import annotations

import numpy as np
import pytest

from support.paths import FIXTURES

TARGET = FIXTURES / "gemma4-dense-f32.gguf"
DRAFTER = FIXTURES / "assistant" / "gemma4-assistant-f32.gguf"
GOLDEN = FIXTURES / "assistant" / "gemma4-assistant-f32.golden.npz"


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [5, 16])      # a sliding ring of 8 slots (drafts skipped where it lost a key), of 19
def test_greedy_output_unchanged_with_the_drafter(dev, chunk):
    from pyapp.engine import Engine, SamplingParams
    from pyapp.families.gemma4_assistant.reference import DrafterReference
    from pyapp.families.gemma4_assistant.source import ReferenceDrafts
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    golden = np.load(GOLDEN)
    prompt = golden["prompt_2"].tolist()
    target = read_gguf(TARGET)
    eng = Engine.open(target, device=dev, context_length=128, chunk=chunk, int8=False)
    plain = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=24), stop_ids=())
    source = ReferenceDrafts(DrafterReference(read_gguf(DRAFTER)), eng.config, ReferenceModel(target).w.token_embd)
    eng.drafter = source
    eng.reset()
    spec = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=24, speculate=4), stop_ids=())
    print(f"chunk {chunk}: {spec.accepted}/{spec.drafted} drafts accepted, {spec.tokens_per_step:.2f} tokens a step, "
          f"{len(source.drafts_made)} rounds drafted")
    assert spec.tokens == plain.tokens
    assert spec.drafted > 0
    assert source.drafts_made[0] == golden["tokens_2"].tolist()
