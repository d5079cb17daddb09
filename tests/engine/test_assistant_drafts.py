"""An assistant drafter as the engine's draft source (issue 29 goal 4): on the GPU
(pyapp/families/gemma4_assistant/runner.py, GpuDrafts) and the numpy drafter fed the target's final-normed rows
and K/V read back from the GPU (reference.ReferenceDrafts). Greedy output with either equals greedy output
without it; the GPU drafter's rounds are the numpy drafter's, round by round; its first drafts after a prompt
and its chained state are transformers' (tests/fixtures/assistant/: the GPU's rows and positions are the ones
transformers chains). The random drafter was not trained on the target: its later drafts are rarely accepted
(the rate is printed)."""

from __future__ import annotations

import numpy as np
import pytest

from support.paths import FIXTURES

TARGET = FIXTURES / "gemma4-dense-f32.gguf"
DRAFTER = FIXTURES / "assistant" / "gemma4-assistant-f32.gguf"
GOLDEN = FIXTURES / "assistant" / "gemma4-assistant-f32.golden.npz"
GREEDY_24 = dict(temperature=0, max_tokens=24)


def target_and_its_greedy_reply(dev, prompt: list[int], chunk: int):
    """(the parsed target, its engine, the greedy 24 tokens after prompt without drafts): what speculative
    generation with a drafter must give again."""
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    target = read_gguf(TARGET)
    eng = Engine.open(target, device=dev, context_length=128, chunk=chunk, int8=False)
    plain = eng.generate(prompt, SamplingParams(**GREEDY_24), stop_ids=())
    eng.reset()
    return target, eng, plain


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [5, 16])      # a sliding ring of 8 slots (drafts skipped where it lost a key), of 19
def test_greedy_output_unchanged_with_the_drafter(dev, chunk):
    from pyapp.engine import SamplingParams
    from pyapp.families.gemma4_assistant.reference import DrafterReference, ReferenceDrafts
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    golden = np.load(GOLDEN)
    prompt = golden["prompt_2"].tolist()
    target, eng, plain = target_and_its_greedy_reply(dev, prompt, chunk)
    source = ReferenceDrafts(DrafterReference(read_gguf(DRAFTER)), eng.config, ReferenceModel(target).w.token_embd)
    eng.drafter = source
    spec = eng.generate(prompt, SamplingParams(**GREEDY_24, speculate=4), stop_ids=())
    print(f"chunk {chunk}: {spec.accepted}/{spec.drafted} drafts accepted, {spec.tokens_per_step:.2f} tokens a step, "
          f"{len(source.drafts_made)} rounds drafted")
    assert spec.tokens == plain.tokens
    assert spec.drafted > 0
    assert source.drafts_made[0] == golden["tokens_2"].tolist()


def gpu_drafter(eng):
    from pyapp.families.gemma4_assistant.runner import GpuDrafter
    from pyapp.gguf import read_gguf
    return GpuDrafter.open(eng.dev, read_gguf(DRAFTER), eng.runner)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [0, 1, 2])     # prompts shorter than the drafter's window + 1, equal, longer
def test_gpu_draft_steps_equal_transformers(dev, case):
    """After the target read a prompt on the GPU, four chained draft steps on the GPU (one round) give
    transformers' draft tokens, and the state the fourth step leaves equals transformers' (f32)."""
    from pyapp.engine import Engine, SamplingParams
    from pyapp.gguf import read_gguf
    golden = np.load(GOLDEN)
    prompt = golden[f"prompt_{case}"].tolist()
    eng = Engine.open(read_gguf(TARGET), device=dev, context_length=64, chunk=16, int8=False)
    first = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=1), stop_ids=())
    assert first.tokens == golden[f"first_token_{case}"].tolist()
    drafter = gpu_drafter(eng)
    drafts = eng.drive(drafter.draft(first.tokens[0], len(prompt), None, 4))
    assert drafts == golden[f"tokens_{case}"].tolist()
    state = np.frombuffer(bytes(eng.drive(read(drafter.state.state_out))), np.float32)
    np.testing.assert_allclose(state, golden[f"states_{case}"][-1], atol=1e-4, rtol=1e-4)


def read(buffer):
    """Steps: a buffer's bytes."""
    from pyapp.runtime.requests import ReadGpu
    return (yield ReadGpu(buffer, 0, buffer.size))


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [5, 16])      # a sliding ring of 8 slots (drafts skipped where it lost a key), of 19
def test_gpu_drafter_drafts_what_the_numpy_drafter_drafts(dev, chunk):
    """Speculative greedy generation with the drafter on the GPU: the target's greedy tokens unchanged, and
    each round's drafts the numpy drafter's from the same target rows and K/V (its source run alongside, the
    GPU's rounds read back first); then with the GPU's rounds drafting straight into the checking steps (their
    ids read back with the step's greedy ids, one readback): the same tokens and the same rounds."""
    from pyapp.engine import SamplingParams
    from pyapp.families.gemma4_assistant.reference import DrafterReference, ReferenceDrafts
    from pyapp.families.gemma4_assistant.source import GpuDrafts
    from pyapp.gguf import read_gguf
    from pyapp.reference.forward import ReferenceModel
    golden = np.load(GOLDEN)
    prompt = golden["prompt_2"].tolist()
    target, eng, plain = target_and_its_greedy_reply(dev, prompt, chunk)
    numpy_source = ReferenceDrafts(DrafterReference(read_gguf(DRAFTER)), eng.config, ReferenceModel(target).w.token_embd)
    drafter = gpu_drafter(eng)
    gpu_source = GpuDrafts(drafter)

    class Both:
        """The GPU's drafts, with the numpy drafter's from the same rows and K/V beside them."""
        def __call__(self, prompt):
            return self

        def append(self, token):
            pass

        def draft(self, eng, tok, fed, limit, state_row):
            want = yield from numpy_source.draft(eng, tok, fed, limit, state_row)
            got = yield from gpu_source.draft(eng, tok, fed, limit, state_row)
            if not isinstance(got, list):           # a round on the GPU: run and read it here
                got.submit(None)
                drafts = yield from drafter.read(got.n)
                got.made(drafts)
                got = drafts
            assert got == want, f"round {len(gpu_source.drafts_made)}: GPU {got}, numpy {want}"
            return got

    eng.drafter = Both()
    spec = eng.generate(prompt, SamplingParams(**GREEDY_24, speculate=4), stop_ids=())
    print(f"chunk {chunk}: {spec.accepted}/{spec.drafted} drafts accepted, {len(gpu_source.drafts_made)} rounds, "
          f"{gpu_source.skipped_rounds} skipped")
    assert spec.tokens == plain.tokens
    assert len(gpu_source.drafts_made) > 3
    assert list(gpu_source.drafts_made) == list(numpy_source.drafts_made)
    # a ring of window + chunk - 1 = 8 slots loses the keys of rounds after rejected drafts moved its end on
    assert (gpu_source.skipped_rounds > 0) == (chunk == 5)
    eng.drafter = into_steps = GpuDrafts(drafter, lookup=False)

    def read_alone(n):
        raise AssertionError("a round drafted into the checking step comes back with its greedy ids")
        yield
    drafter.read = read_alone
    eng.reset()
    again = eng.generate(prompt, SamplingParams(**GREEDY_24, speculate=4), stop_ids=())
    assert again.tokens == plain.tokens and again.drafted == spec.drafted
    assert list(into_steps.drafts_made) == list(gpu_source.drafts_made)


def test_a_round_needs_the_window_and_one_key_before_its_position_in_the_ring():
    """DraftSource.holds / keeps_keys (no GPU): a sliding ring of `slots` positions keeps the last slots written
    (kv_end past the cached tokens when rejected drafts were written); a round at p reads p - W - 1 .. p - 1."""
    from types import SimpleNamespace
    from pyapp.families.gemma4_assistant.source import DraftSource
    from pyapp.gguf import read_gguf
    from pyapp.families import model_config
    cfg = model_config(read_gguf(TARGET))                    # window 4: a round reads 5 keys before it
    source = DraftSource(cfg, cfg.sliding_window + 1)
    ring = {source.sliding_source: SimpleNamespace(slots=8), source.full_source: SimpleNamespace(slots=128)}
    eng = SimpleNamespace(kv_end=20, runner=SimpleNamespace(state=SimpleNamespace(kv=ring)))
    assert source.first_sliding(17) == 12 and source.first_sliding(3) == 0
    assert source.holds(eng, source.sliding_source, 12)        # the ring holds 12..19
    assert not source.holds(eng, source.sliding_source, 11)
    assert source.keeps_keys(eng, 17) and source.skipped_rounds == 0
    eng.kv_end = 21                                              # one more position written past them: 12 is gone
    assert not source.keeps_keys(eng, 17) and source.skipped_rounds == 1
    assert source.holds(eng, source.full_source, 0)             # the full layer keeps the whole context


@pytest.mark.gpu
def test_repeated_text_drafts_by_prompt_lookup(dev):
    """With the drafter as the source, rounds after a token whose last 3 tokens occurred before draft by prompt
    lookup instead (free); the greedy tokens stay the target's, and in a prompt repeated three times the
    looked-up drafts are accepted."""
    from pyapp.engine import SamplingParams
    from pyapp.families.gemma4_assistant.source import GpuDrafts
    prompt = np.load(GOLDEN)["prompt_2"].tolist() * 3
    _, eng, plain = target_and_its_greedy_reply(dev, prompt, 16)
    eng.drafter = source = GpuDrafts(gpu_drafter(eng))
    spec = eng.generate(prompt, SamplingParams(**GREEDY_24, speculate=4), stop_ids=())
    print(f"{source.lookup_rounds} lookup rounds, {len(source.drafts_made)} drafter rounds, "
          f"{spec.accepted}/{spec.drafted} accepted")
    assert spec.tokens == plain.tokens
    assert source.lookup_rounds > 0 and spec.accepted > 0


# -- the drafter within the memory plan ---------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_bytes_are_what_loading_the_drafter_allocates(dev, monkeypatch):
    """gpu_bytes (counted on a MemoryCounter, nothing read) equals the bytes of every buffer GpuDrafter.open
    creates beside a loaded target."""
    from pyapp.families.gemma4_assistant.runner import gpu_bytes
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    eng = Engine.open(read_gguf(TARGET), device=dev, context_length=96, chunk=16, int8=False)
    made = []
    create = dev._create_buffer
    monkeypatch.setattr(dev, "_create_buffer", lambda size, kind, label: made.append(size) or create(size, kind, label))
    gpu_drafter(eng)
    drafter = read_gguf(DRAFTER)
    assert sum(made) == gpu_bytes(dev.limits, drafter, eng.config, 96) > 0


def test_the_plan_counts_a_drafter_chosen_before_the_model_loads():
    """A drafter's bytes given to the plan (`beside`: the app passes the chosen drafter's gpu_bytes) are counted
    within the budget: a budget the model alone fits but not with the drafter is refused with the drafter's share
    named; the plan says it."""
    from pyapp.engine import Engine
    from pyapp.families.gemma4_assistant.runner import gpu_bytes
    from pyapp.gguf import read_gguf
    from pyapp.runtime.loaded import EngineError
    from pyapp.families import model_config
    limits = {"max_storage_buffer_binding_size": 128 << 20, "max_buffer_size": 256 << 20}
    target, drafter = read_gguf(TARGET), read_gguf(DRAFTER)
    alone = Engine.plan(target, limits, 64)
    need = gpu_bytes(limits, drafter, model_config(target), 64)
    both = Engine.plan(target, limits, 64, beside=need)
    assert both.beside == need > 0 and both.total == alone.total + need and both.minimum == alone.minimum + need
    assert any("assistant drafter" in line for line in both.describe())
    budget_mib = alone.total / 2**20 + 0.01                 # the model alone fits, not the drafter beside it
    assert Engine.plan(target, limits, 64, gpu_memory_mib=budget_mib).total <= budget_mib * 2**20
    with pytest.raises(EngineError, match="the assistant drafter"):
        Engine.plan(target, limits, 64, gpu_memory_mib=budget_mib, beside=need)


@pytest.mark.gpu
def test_a_drafter_added_to_a_loaded_model_fits_its_budget_or_waits_for_the_next_load(dev):
    """The app: a model loaded with a budget its plan fills leaves no room for a drafter added afterwards: it is
    refused on the GPU (saying what it needs and what to do) but stays added, and the next load counts it (this
    dense model cannot make room: the same budget is refused naming the drafter's share, a larger one loads both);
    within what the plan left, it loads at once."""
    from pyapp.app import model
    from pyapp.app.session import Refused, Session
    from pyapp.engine import Engine
    from pyapp.gguf import read_gguf
    from pyapp.runtime.loaded import EngineError
    from pyapp.steps import run
    target, drafter = read_gguf(TARGET), read_gguf(DRAFTER)
    session = Session(device=dev)
    model.choose(session, target)
    alone = Engine.plan(target, dev.limits, 64).total / 2**20
    run(model.load(session, context_length=64, gpu_memory_mib=alone + 0.01, int8=False))
    with pytest.raises(Refused, match=r"drafter needs 1\.\d MiB .* leaves 0\.01 MiB .* It stays added and loads with the model"):
        run(model.add_drafter(session, drafter, "drafter.gguf"))
    assert session.drafter is drafter and session.engine.drafter is None
    with pytest.raises(EngineError, match=r"the assistant drafter 1\.\d MiB\); the budget is"):
        run(model.load(session, context_length=64, gpu_memory_mib=alone + 0.01, int8=False))   # the same budget
    with_it = Engine.plan(target, dev.limits, 64, beside=model.drafter_bytes(session, dev.limits, 64))
    run(model.load(session, context_length=64, gpu_memory_mib=with_it.total / 2**20 + 0.01, int8=False))
    assert session.engine.memory_plan.beside == with_it.beside > 0 and session.engine.drafter is not None
    model.remove_drafter(session)
    run(model.load(session, context_length=64, gpu_memory_mib=with_it.total / 2**20 + 0.01, int8=False))
    run(model.add_drafter(session, drafter, "drafter.gguf"))            # room left by the plan: on the GPU now
    assert session.engine.drafter is not None


@pytest.mark.gpu
def test_the_first_native_load_counts_the_drafter_by_the_devices_limits(monkeypatch):
    """Natively the app's first load has no device yet: with a drafter chosen it opens the device first, so the
    drafter's bytes (a tensor's row blocks depend on the binding limits) are counted by that device's limits, not
    WebGPU's defaults, and the engine loads on that device."""
    from pyapp.app import model
    from pyapp.app.session import Session
    from pyapp.gguf import read_gguf
    from pyapp.steps import run
    asked = []
    counted = model.drafter_bytes

    def drafter_bytes(session, limits, context_length):
        asked.append(limits)
        return counted(session, limits, context_length)
    monkeypatch.setattr(model, "drafter_bytes", drafter_bytes)
    session = Session()
    model.choose(session, read_gguf(TARGET))
    run(model.add_drafter(session, read_gguf(DRAFTER), "drafter.gguf"))
    run(model.load(session, context_length=64, int8=False))
    assert session.device is not None and session.engine.dev is session.device
    assert asked[-1] is session.device.limits and asked[-1]["max_storage_buffer_binding_size"] > 0
    assert session.engine.drafter is not None and session.engine.memory_plan.beside > 0
