"""pyapp/train/session.py: the Fine-tune panel's run, natively (the browser test drives the same code in Pyodide).

The panel's fields become the TrainConfig the preset and the typed values ask for, each bad one a FieldError
naming it in plain words; the page's rules are the ones checked here; the preview is pyapp.train.data's; a run
to its end keeps the parameters with the best validation loss and one stopped before any validation keeps its
latest (not the untrained start); closing the run gives the engine back its base model; a model the trainer
refuses says why.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from pyapp.chat import style_for
from pyapp.engine import Engine
from pyapp.gguf import GGUFFile, read_gguf
from pyapp.source import BytesSource
from pyapp.train.data import DataError, load_dataset
from pyapp.train.session import FIELDS, FieldError, TrainingSession, config_from_fields, options
from pyapp.train.trainer import PRESETS, TrainError

from support.paths import FIXTURES

FIX = FIXTURES
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
DATA = "\n".join(json.dumps({"messages": [{"role": "user", "content": f"Say {n}."},
                                          {"role": "assistant", "content": w}]})
                 for n, w in enumerate(WORDS, 1)).encode()


def test_fields_become_the_preset_with_the_typed_values():
    cfg = config_from_fields({"preset": "thorough", "rank": "4", "lr": "1e-3", "steps": "", "epochs": "",
                              "targets": ["down", "q"]})
    want = PRESETS["thorough"]
    assert (cfg.rank, cfg.lr, cfg.steps, cfg.epochs, cfg.batch, cfg.seq_len) == \
        (4, 1e-3, None, want.epochs, want.batch, want.seq_len)
    assert cfg.targets == "q,down"                               # in --targets order
    assert config_from_fields({"preset": "quick", "steps": "12"}).steps == 12
    assert config_from_fields({}) == PRESETS["quick"]            # nothing typed: the quick preset


@pytest.mark.parametrize("fields, field, message", [
    ({"rank": "0"}, "rank", "Rank must be an integer from 1 to 16"),
    ({"rank": "17"}, "rank", "Rank must be an integer from 1 to 16"),
    ({"rank": "2.5"}, "rank", "Rank must be an integer"),
    ({"alpha": "0"}, "alpha", "Alpha must be a number above 0"),
    ({"lr": "abc"}, "lr", "Learning rate must be a number above 0 and at most 0.1"),
    ({"lr": "nan"}, "lr", "Learning rate must be a number"),
    ({"steps": "0"}, "steps", "Steps must be an integer from 1"),
    ({"epochs": "-1"}, "epochs", "Epochs must be a number above 0"),
    ({"batch": "65"}, "batch", "Batch must be an integer from 1 to 64"),
    ({"seq_len": "4"}, "seq_len", "Sequence length must be an integer from 8"),
    ({"seq_len": "8192"}, "seq_len", "Sequence length must be at most 4096, the context the model is loaded with"),
    ({"targets": []}, "targets", "Choose at least one projection to adapt."),
    ({"targets": ["embed"]}, "targets", "Choose at least one projection to adapt."),
    ({"preset": "fast"}, "preset", "Unknown preset 'fast'"),
])
def test_a_bad_field_is_named_in_plain_words(fields, field, message):
    with pytest.raises(FieldError) as e:
        config_from_fields({"preset": "quick", **fields}, context_length=4096)
    assert e.value.field == field and str(e.value).startswith(message), str(e.value)


def test_the_page_gets_the_rules_checked_here():
    opts = options()
    assert set(opts["presets"]) == set(PRESETS) and opts["presets"]["quick"]["rank"] == PRESETS["quick"].rank
    assert [t for t, _ in opts["targets"]][:7] == ["q", "k", "v", "o", "gate", "up", "down"]
    for key, (_, label, rule) in FIELDS.items():
        page = opts["rules"][f"ft_{key}"]
        assert (page["lo"], page["max"], page["integer"], page["above_lo"]) == (rule.lo, rule.hi, rule.integer,
                                                                                  rule.above_lo)
        with pytest.raises(FieldError, match=label):          # the page's bound is the one refused here
            config_from_fields({key: str(rule.hi * 2)})
    json.dumps(opts)                                          # plain data for the worker's answer


@pytest.fixture(scope="module")
def engine():
    try:
        return Engine.open(str(FIX / "demo.gguf"), context_length=256)
    except Exception as e:                                    # no WebGPU adapter
        pytest.skip(f"no native GPU backend ({e})")


def _style(engine):
    from pyapp.gguf import summarize
    return style_for(engine.gguf.metadata, summarize(engine.gguf)["n_elements"])


def test_the_preview_is_the_datasets(engine):
    run = TrainingSession()
    got = run.load_data(engine, DATA, "words.jsonl", {"seq_len": "64"}, _style(engine))
    want = load_dataset(DATA, "words.jsonl", engine.tokenizer, 64, style=_style(engine), val_fraction=0.1, seed=0)
    assert got == {"name": "words.jsonl", "stats": want.stats.as_dict(), "warnings": want.warnings, "format": "chat"}
    again = run.load_data(engine, None, "", {"seq_len": "38"}, _style(engine))  # the same file, other settings
    want = load_dataset(DATA, "words.jsonl", engine.tokenizer, 38, style=_style(engine), val_fraction=0.1, seed=0)
    assert again["stats"] == want.stats.as_dict() and want.stats.n_cut == 7
    assert again["warnings"][0] == "7 example(s) longer than seq_len 38 (longest 40 tokens) were cut to it"
    with pytest.raises(DataError, match="bad.jsonl line 1: not valid JSON"):
        run.load_data(engine, b"{oops\n", "bad.jsonl", {}, _style(engine))
    with pytest.raises(FieldError, match="at most 256, the context"):
        run.load_data(engine, DATA, "words.jsonl", {"seq_len": "512"}, _style(engine))
    with pytest.raises(FieldError, match="MiB: the app takes training files of up to 64 MiB"):
        run.load_data(engine, bytes(65 << 20), "huge.txt", {}, _style(engine))


def _adapter(data: bytes) -> GGUFFile:
    return read_gguf(BytesSource(data, "adapter.gguf"))


def _b_max(a: GGUFFile) -> float:
    return max(float(np.abs(np.frombuffer(a.read_tensor(n), np.float32)).max()) for n in a.tensors
               if n.endswith(".lora_b"))


def test_a_run_to_its_end_and_a_run_stopped_early(engine):
    run, style = TrainingSession(), _style(engine)
    run.load_data(engine, DATA, "words.jsonl", {"seq_len": "64"}, style)
    fields = {"preset": "quick", "steps": "2", "batch": "2", "seq_len": "64", "lr": "0.01", "targets": ["q", "down"]}
    started = run.start(engine, fields, style)
    assert started["total_steps"] == 2 and started["config"]["rank"] == 8 and run.running
    reports = [asyncio.run(run.step()) for _ in range(2)]
    assert [r["step"] for r in reports] == [1, 2] and reports[0]["val_loss"] is None
    assert reports[1]["val_loss"] is not None and reports[1]["best_step"] == 2   # measured after the last update
    assert all(r["loss"] > 0 and r["tokens_per_s"] > 0 for r in reports)
    out = asyncio.run(run.finish())
    assert not run.running and out["steps"] == out["kept_step"] == out["best_step"] == 2
    assert out["best_val_loss"] == pytest.approx(reports[1]["val_loss"])
    assert [row["loss"] for row in out["log"]] == pytest.approx([r["loss"] for r in reports])
    a = _adapter(out["adapter"])
    assert a.metadata["general.type"] == "adapter" and len(a.tensors) == 2 * 2 * engine.config.n_layers
    assert _b_max(a) > 0
    # stopped after one update, before any validation: the latest parameters, not the zero-B start
    run.start(engine, {**fields, "steps": "5"}, style)
    first = asyncio.run(run.step())
    assert first["val_loss"] is None and first["best_step"] == 0
    out = asyncio.run(run.finish())
    assert out["steps"] == out["kept_step"] == 1 and out["best_val_loss"] is None and out["best_step"] == 0
    assert _b_max(_adapter(out["adapter"])) > 0
    # the engine is the base model again: its logits are those of a fresh load
    fresh = Engine.open(str(FIX / "demo.gguf"), context_length=256)
    ids = engine.tokenizer.encode("Say one.")
    assert np.abs(np.asarray(engine.forward(ids)) - np.asarray(fresh.forward(ids))).max() < 1e-5


def test_a_model_that_cannot_be_trained_says_why(engine):
    moe = Engine.open(str(FIX / "gemma4-moe-q8_0.gguf"), context_length=128, expert_cache_mib=0.2)
    assert moe.runner.experts is not None                     # experts streamed: the trainer needs them all
    run = TrainingSession()
    run.load_data(moe, DATA, "words.jsonl", {"seq_len": "64"}, style_for(moe.gguf.metadata))
    with pytest.raises(TrainError, match="mixture-of-experts model needs every expert in GPU memory"):
        run.start(moe, {"seq_len": "64"}, style_for(moe.gguf.metadata))
    assert not run.running
    with pytest.raises(FieldError, match="Choose a training file first"):
        TrainingSession().start(engine, {}, _style(engine))
