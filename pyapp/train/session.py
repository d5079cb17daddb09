"""A fine-tuning run as the app's "Fine-tune" panel drives it: the panel's fields, checked; the training
file, previewed; then one update per call, so the page decides between updates whether to go on (Stop).

    run = TrainingSession()
    run.load_data(engine, data, "chats.jsonl", fields, style)   # the preview: stats, warnings (DataError)
    run.start(engine, fields, style)                            # the Trainer (TrainError: e.g. an MoE model)
    report = await run.step()                                   # one update: the StepReport's figures
    out = await run.finish()                                    # the best adapter's GGUF bytes, the log

The panel's fields are a preset's TrainConfig with the fields the user filled in (an empty field keeps
the preset's value, except Steps: empty means "by epochs"). Each is checked here by a pyapp.sampling Rule, the
one definition the page also gets (page_rules) to check them as they are typed. A bad value is a
FieldError naming the field in plain words.

Standard library only (runs in Pyodide).
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import Gemma4Error
from ..inputs import number
from ..sampling import ParamError
from .adapter_out import DEFAULT_TARGETS, TARGETS, parse_targets
from .data import MAX_DATA_BYTES, load_dataset
from .trainer import PRESETS, RULES, TrainConfig, Trainer, TrainError

MAX_RANK = RULES["rank"].hi

# the panel's number fields: (TrainConfig field, label, rule); the page's ids are "ft_" + the key. The rules
# are TrainConfig.check's own (pyapp.train.trainer.RULES): the CLI's options and the page take the same values.
FIELDS = {key: (key, label, RULES[key]) for key, label in (
    ("rank", "Rank"), ("alpha", "Alpha"), ("lr", "Learning rate"), ("steps", "Steps"), ("epochs", "Epochs"),
    ("batch", "Batch"), ("seq_len", "Sequence length"))}
TARGET_LABELS = {"q": "attention query", "k": "attention key", "v": "attention value", "o": "attention output",
                 "gate": "MLP gate", "up": "MLP up", "down": "MLP down", "ple_gate": "per-layer input gate",
                 "ple_proj": "per-layer input projection", "router": "MoE router"}
assert set(TARGET_LABELS) == set(TARGETS)
REPORT = ("step", "total_steps", "loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s", "eta_s")


class FieldError(Gemma4Error, ValueError):
    """A panel field the run cannot use; `field` is its key in FIELDS (or "targets", "preset", "data")."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def options() -> dict:
    """What the panel offers: the presets' values, the targets, and each field's rule as the page takes it
    (pyapp.sampling.page_rules' form, keyed by the input's id)."""
    rules = {f"ft_{k}": {"min": r.lo, "max": r.hi, "rule": r.describe(), "lo": r.lo, "above_lo": r.above_lo,
                         "integer": r.integer, "special": r.special} for k, (_, _, r) in FIELDS.items()}
    return {"presets": {name: _preset_fields(cfg) for name, cfg in PRESETS.items()},
            "targets": [[t, TARGET_LABELS[t]] for t in TARGETS], "default_targets": DEFAULT_TARGETS.split(","),
            "rules": rules, "max_data_bytes": MAX_DATA_BYTES}


def _preset_fields(cfg) -> dict:
    out = {k: getattr(cfg, attr) for k, (attr, _, _) in FIELDS.items()}
    out["targets"] = [t.strip() for t in str(cfg.targets).split(",") if t.strip()]
    return out


def config_from_fields(fields: dict, context_length: int | None = None) -> TrainConfig:
    """The TrainConfig the panel's fields ask for: {"preset", number fields (None or "" = the preset's),
    "targets": [names]}; FieldError names the first bad one."""
    preset = fields.get("preset") or "quick"
    if not isinstance(preset, str) or preset not in PRESETS:
        shown = repr(preset) if len(repr(preset)) <= 40 else repr(preset)[:37] + "..."
        raise FieldError("preset", f"Unknown preset {shown}: choose {' or '.join(PRESETS)}.")
    changes = {}
    for key, (attr, label, rule) in FIELDS.items():
        value = fields.get(key)
        if value is None or value == "":
            if key == "steps" and key in fields:     # an empty Steps field: by epochs
                changes[attr] = None
            continue
        try:
            value = number(value, label) if isinstance(value, str) else value      # the CLI's rule for typed text
            changes[attr] = rule.check(label, value)
        except (ValueError, ParamError):
            raise FieldError(key, f"{label} must be {rule.describe()}.") from None
    targets = fields.get("targets")
    if targets is not None:
        try:
            if not isinstance(targets, (list, tuple)) or not all(isinstance(t, str) for t in targets):
                raise ValueError(targets)
            parse_targets(targets)
        except ValueError:
            raise FieldError("targets", "Choose at least one projection to adapt.") from None
        changes["targets"] = ",".join(t for t in TARGETS if t in targets)
    cfg = dataclasses.replace(PRESETS[preset], **changes)
    if context_length and cfg.seq_len > context_length:
        raise FieldError("seq_len", f"Sequence length must be at most {context_length}, the context the model "
                                    "is loaded with (a longer context needs a reload).")
    try:
        cfg.check()                   # the trainer's own limits (the rules above keep within them)
    except TrainError as e:
        raise FieldError("", f"These settings cannot be used: {e}.") from None
    return cfg


class TrainingSession:
    """The panel's one run: the chosen data (kept, so a changed sequence length re-reads it), the dataset
    made from it, and the Trainer while one runs."""

    def __init__(self):
        self.data: bytes | None = None
        self.name = ""
        self.ds = None
        self._ds_key = None           # what the dataset was made with: (engine, seq_len, val_fraction, seed)
        self.cfg = None
        self.trainer = None

    def load_data(self, engine, data: bytes | None, name: str, fields: dict, style) -> dict:
        """Read a training file (or the one chosen before, when data is None) with the panel's settings:
        what the panel shows before Start. DataError / FieldError say what is wrong."""
        if data is not None:
            if len(data) > MAX_DATA_BYTES:
                raise FieldError("data", f"\u201c{name}\u201d is {len(data) / 2**20:.0f} MiB: the app takes training "
                                         f"files of up to {MAX_DATA_BYTES >> 20} MiB.")
            self.data, self.name, self.ds, self._ds_key = bytes(data), name, None, None
        if self.data is None:
            raise FieldError("data", "Choose a training file first.")
        cfg = config_from_fields(fields, engine.context_length)
        ds = self._dataset(engine, cfg, style)
        return {"name": self.name, **self.describe(ds)}

    def _dataset(self, engine, cfg, style):
        key = (id(engine), cfg.seq_len, cfg.val_fraction, cfg.seed)
        if self.ds is None or self._ds_key != key:
            self.ds = None        # a file that fails to read leaves no stale preview behind
            self.ds = load_dataset(self.data, self.name, engine.tokenizer, cfg.seq_len, style=style,
                                   val_fraction=cfg.val_fraction, seed=cfg.seed)
            self._ds_key = key
        return self.ds

    @staticmethod
    def describe(ds) -> dict:
        s = ds.stats
        return {"stats": s.as_dict(), "warnings": list(ds.warnings), "format": s.format}

    @property
    def running(self) -> bool:
        return self.trainer is not None

    def start(self, engine, fields: dict, style) -> dict:
        """Make the Trainer for the panel's settings (TrainError when this model cannot be trained)."""
        self.close()
        if self.data is None:
            raise FieldError("data", "Choose a training file first.")
        self.cfg = config_from_fields(fields, engine.context_length)
        ds = self._dataset(engine, self.cfg, style)
        self.trainer = Trainer(engine, ds, self.cfg)
        return {"total_steps": self.trainer.total_steps, "config": dataclasses.asdict(self.cfg), **self.describe(ds)}

    async def step(self) -> dict:
        """One update; its figures, with the best validation loss so far."""
        tr = self.trainer
        rep = await tr.train_step_async()
        out = {k: _number(getattr(rep, k)) for k in REPORT}
        out.update(best_val_loss=_number(tr.best_val_loss), best_step=tr.best_step)
        return out

    async def finish(self) -> dict:
        """The run's result (the adapter of the best parameters, the log); the Trainer lets go of the engine."""
        tr = self.trainer
        try:
            # the best by validation loss once one was measured (without held-out data the trainer keeps the
            # latest as the best); stopped before the first validation, the latest: the initial ones (a zero
            # delta) are not worth keeping
            best = tr.best_step > 0
            adapter = await tr.adapter_gguf_async(best=best)
            return {"adapter": adapter, "log": [{k: _number(v) for k, v in row.items()} for row in tr.log],
                    "steps": tr.step, "total_steps": tr.total_steps, "best_val_loss": _number(tr.best_val_loss),
                    "best_step": tr.best_step, "kept_step": tr.best_step if best else tr.step,
                    "config": dataclasses.asdict(self.cfg), "data": self.name, **self.describe(self.ds)}
        finally:
            self.close()

    def close(self) -> None:
        """Close the Trainer: the engine runs the base model again."""
        tr, self.trainer = self.trainer, None
        if tr is not None:
            try:
                tr.close()
            except Exception:     # a lost device: its buffers are gone anyway
                pass


def _number(v):
    """A figure for the page: None for a missing or non-finite one (JSON has no NaN)."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    return v if math.isfinite(v) else None
