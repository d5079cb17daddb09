"""The numpy assistant drafter (pyapp/families/gemma4_assistant/reference.py, issue 29 goal 4) against
transformers' Gemma4AssistantForCausalLM on the tiny drafter fixture (tools/make_assistant_fixture.py):
4 chained draft steps after prompts of 3, 5 and 13 tokens (shorter than the drafter's sliding view of
window + 1 keys, equal to it, longer), first from transformers' own target K/V and state, then from
the numpy target's (pyapp/reference/forward.py) on the same file."""

from __future__ import annotations

import numpy as np
import pytest

from support.paths import FIXTURES

DRAFTER = FIXTURES / "assistant" / "gemma4-assistant-f32.gguf"
TARGET = FIXTURES / "gemma4-dense-f32.gguf"
GOLDEN = FIXTURES / "assistant" / "gemma4-assistant-f32.golden.npz"
CASES = range(3)


@pytest.fixture(scope="module")
def models():
    from pyapp.families.gemma4_assistant.reference import DrafterReference
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    return DrafterReference(read_gguf(DRAFTER)), ReferenceModel(read_gguf(TARGET)), np.load(GOLDEN)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("case", CASES)
def test_draft_steps_match_transformers(models, case):
    from pyapp.families.gemma4_assistant.reference import TargetKV, target_embedder
    drafter, target, golden = models
    kv = TargetKV(*(golden[f"{name}_{case}"] for name in ("k_sliding", "v_sliding", "k_full", "v_full")))
    prompt = golden[f"prompt_{case}"]
    steps = drafter.draft(target_embedder(target.w.token_embd), int(golden[f"first_token_{case}"][0]),
                          golden[f"target_state_{case}"], len(prompt), kv, len(golden[f"tokens_{case}"]))
    logits = np.stack([s.logits for s in steps])
    states = np.stack([s.state for s in steps])
    print(f"case {case}: logits max abs diff {np.abs(logits - golden[f'logits_{case}']).max():.2e}, "
          f"states {np.abs(states - golden[f'states_{case}']).max():.2e}")
    assert relative_error(logits, golden[f"logits_{case}"]) < 1e-5
    assert relative_error(states, golden[f"states_{case}"]) < 1e-5
    assert [s.token for s in steps] == golden[f"tokens_{case}"].tolist()


@pytest.mark.parametrize("case", CASES)
def test_numpy_target_gives_the_drafter_what_transformers_does(models, case):
    """The numpy target's K/V (its last layer of each kind with its own K/V) equal transformers' shared_kv_states."""
    from pyapp.families.gemma4_assistant.config import kv_layer
    from pyapp.reference.forward import KVCache
    drafter, target, golden = models
    drafter.cfg.check_target(target.cfg)
    cache = KVCache()
    target.forward(golden[f"prompt_{case}"].tolist(), cache)
    sliding, full = kv_layer(target.cfg, True), kv_layer(target.cfg, False)
    assert relative_error(cache.k[sliding], golden[f"k_sliding_{case}"]) < 1e-5
    assert relative_error(cache.v[sliding], golden[f"v_sliding_{case}"]) < 1e-5
    assert relative_error(cache.k[full], golden[f"k_full_{case}"]) < 1e-5
    assert relative_error(cache.v[full], golden[f"v_full_{case}"]) < 1e-5


@pytest.mark.parametrize("n_drafts", [1, 4])
def test_speculation_with_the_drafter_keeps_greedy_output(models, n_drafts):
    """Greedy tokens with the drafter's drafts checked by the numpy target equal plain greedy decoding.
    The random drafter was not trained on this target: its drafts are rarely right (the rate is printed)."""
    from pyapp.families.gemma4_assistant.reference import speculative_greedy
    drafter, target, golden = models
    prompt = golden["prompt_2"].tolist()
    plain = target.generate_greedy(prompt, 24)
    result = speculative_greedy(target, drafter, prompt, 24, n_drafts)
    print(f"{n_drafts} drafts a step: {result.accepted}/{result.drafted} accepted ({result.acceptance:.0%}), "
          f"{len(result.tokens) / (result.steps + 1):.2f} tokens a target step")
    assert result.tokens == plain


def test_speculation_keeps_greedy_output_when_drafts_are_partly_right(models, monkeypatch):
    """The cut-back of the target's cache after partly accepted drafts: drafts that are the greedy
    continuation with every third position wrong."""
    from pyapp.families.gemma4_assistant import reference
    drafter, target, golden = models
    prompt = golden["prompt_1"].tolist()
    plain = target.generate_greedy(prompt, 30)
    history = prompt + plain

    def partly_right(target_embed, token, state, position, kv, n):
        right = history[position + 1:position + 1 + n]
        wrong = [(t + 1) % drafter.cfg.vocab_size if (position + i) % 3 == 0 else t for i, t in enumerate(right)]
        return [reference.DraftStep(logits=np.eye(drafter.cfg.vocab_size, dtype=np.float32)[t], state=state)
                for t in wrong]
    monkeypatch.setattr(drafter, "draft", partly_right)
    result = reference.speculative_greedy(target, drafter, prompt, 30, 4)
    assert result.tokens == plain
    assert 0 < result.accepted < result.drafted


def test_a_drafter_refuses_a_target_it_was_not_made_for(models):
    from pyapp.families.gemma4_assistant.config import DrafterConfig
    from pyapp.gguf import read_gguf
    from pyapp.model.config import ConfigError, Gemma4Config
    drafter, _, _ = models
    moe = Gemma4Config.from_gguf(read_gguf(FIXTURES / "gemma4-moe-f32.gguf"))
    with pytest.raises(ConfigError, match="width 256, the target's is 128"):
        drafter.cfg.check_target(moe)
    meta = dict(read_gguf(DRAFTER).metadata)
    meta["gemma4-assistant.attention.shared_kv_layers"] = 2
    with pytest.raises(ConfigError, match="every layer reads the target's K/V"):
        DrafterConfig.from_metadata(meta)
    with pytest.raises(ConfigError, match="not an assistant drafter"):
        DrafterConfig.from_metadata(read_gguf(TARGET).metadata)
