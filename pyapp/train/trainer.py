"""LoRA fine-tuning on the GPU: the training loop, written once, driven sync (CLI) or async (the app).

An update takes `batch` sequences of the training split in a seeded order (pyapp.train.data), runs
each through the recorded forward and backward plans (pyapp.train.backward: gradients summed over
the sequences, each row weighted by 1 / the update's targets, so the sum is the gradient of the
update's mean loss), then AdamW with global-norm clipping on the GPU (pyapp.train.gpu_optim) and a
warmup + cosine learning rate (pyapp.train.optim.WarmupCosine). One readback per update: the
sequences' losses and the gradient norm. Every `val_every` updates (and after the last) the held-out
split's mean loss is measured; the parameters with the best validation loss are kept on the GPU, so
Stop loses nothing: `adapter_gguf(best=True)` writes them.

    tr = Trainer(engine, dataset, TrainConfig(rank=8, steps=100))
    while not tr.done:
        report = tr.train_step()                 # or await tr.train_step_async() in the browser
    open("adapter.gguf", "wb").write(tr.adapter_gguf())
    tr.close()

The trained pairs ride on the engine's loaded weights (their deltas are put on its layout while the
trainer is open: `close` takes them off), so the model is not loaded twice.
"""

from __future__ import annotations

import math
import time
from array import array
from dataclasses import asdict, dataclass, fields

from ..errors import Gemma4Error
from ..gpu import GPUError
from ..model.weights import bind
from ..sampling import ParamError, Rule
from ..runtime.requests import ReadGpu, handler
from ..steps import drive, drive_async
from .adapter_out import DEFAULT_TARGETS, adapter_gguf, lora_targets
from .backward import LoraBackward
from .checkpoint import Checkpoint, checkpoint_parts
from .data import Dataset, epoch_order
from .gpu_optim import GpuAdamW
from .optim import AdamW, WarmupCosine
from .params import LoraParams
from .state import TrainState

VOCAB_CHUNK = 8192          # head rows per loss chunk: T x 8192 floats of logits at a time
MAX_LOSS_SLOTS = 64         # sequences whose losses one readback collects


class TrainError(Gemma4Error):
    """Training cannot start or go on; the message says why in plain words."""


# Each setting's range, defined once: TrainConfig.check applies them (the CLI's options, the page's run),
# and the page's Fine-tune fields (pyapp.train.session.FIELDS) show and check the same Rule objects.
# NaN and inf fail every rule; warmup and steps may also be None (a tenth of the updates; by epochs).
RULES = {
    "rank": Rule(1, 16, integer=True, note="the adapter's size: 8 or 16 is usual"),
    "alpha": Rule(0, 4096, above_lo=True, note="scale = alpha / rank; often twice the rank"),
    "lr": Rule(0, 0.1, above_lo=True, note="2e-4 is usual for LoRA"),
    "steps": Rule(1, 1_000_000, integer=True, note="empty: as many as the epochs take"),
    "epochs": Rule(0, 1000, above_lo=True, note="passes over the training examples"),
    "batch": Rule(1, MAX_LOSS_SLOTS, integer=True, note="examples per update"),
    "seq_len": Rule(8, 32768, integer=True, note="tokens per example; longer ones are cut"),
    "warmup": Rule(0, 1_000_000, integer=True, note="updates of rising learning rate"),
    "weight_decay": Rule(0, 1, note="AdamW's decoupled decay; 0: none"),
    "max_grad_norm": Rule(0, 1_000_000, note="gradient clipping; 0: off"),
    "val_fraction": Rule(0, 0.9, note="the share of examples held out for the validation loss"),
    "val_every": Rule(1, 1_000_000, integer=True, note="updates between validation losses and checkpoints"),
    "seed": Rule(-2**63, 2**63 - 1, integer=True),
}
LABELS = {"lr": "learning rate", "seq_len": "sequence length", "weight_decay": "weight decay",
          "max_grad_norm": "gradient norm limit", "val_fraction": "validation fraction",
          "val_every": "validation interval"}


@dataclass
class TrainConfig:
    rank: int = 8
    alpha: float = 16.0
    targets: str = DEFAULT_TARGETS
    steps: int | None = None          # updates; None: `epochs` passes over the training split
    epochs: float = 1.0
    lr: float = 2e-4
    batch: int = 4                    # sequences per update (their gradients summed)
    seq_len: int = 256
    warmup: int | None = None         # warmup updates; None: a tenth of the updates
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0        # 0: no clipping
    val_fraction: float = 0.1
    val_every: int = 10               # updates between validation losses (and after the last)
    seed: int = 0

    def check(self) -> None:
        """TrainError naming every setting outside its RULES range (NaN and inf included), and the reason."""
        problems = []
        for name, rule in RULES.items():
            value = getattr(self, name)
            if value is None and name in ("steps", "warmup"):
                continue
            try:
                rule.check(LABELS.get(name, name), value)
            except ParamError as e:
                problems.append(str(e))
        if not isinstance(self.targets, str):
            problems.append(f"targets must be a comma-separated string of projections, got {self.targets!r}")
        if problems:
            raise TrainError("; ".join(problems))

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise TrainError(f"unknown training setting(s): {', '.join(unknown)}")
        return cls(**d)


PRESETS = {
    # a first look: one pass, a small adapter
    "quick": TrainConfig(rank=8, alpha=16.0, epochs=1.0, lr=2e-4, batch=4),
    # more passes at a gentler rate, a larger adapter
    "thorough": TrainConfig(rank=16, alpha=32.0, epochs=3.0, lr=1e-4, batch=8),
}


@dataclass
class StepReport:
    step: int                  # updates done
    total_steps: int
    loss: float                # this update's mean training loss
    val_loss: float | None     # measured after this update, or None
    lr: float
    grad_norm: float           # before clipping
    tokens_per_s: float        # tokens (padding excluded) through forward + backward per second
    elapsed_s: float           # since the trainer started
    eta_s: float               # estimated time to the last update

    def as_dict(self) -> dict:
        return asdict(self)


class Trainer:
    def __init__(self, engine, dataset: Dataset, config: TrainConfig, checkpoint: Checkpoint | None = None):
        config.check()
        cfg, runner = engine.config, engine.runner
        if not engine.family.trains:
            raise TrainError(f"fine-tuning {engine.family.name} is not supported: choose a Gemma 4 chat model")
        if cfg.is_moe and runner.experts is not None:
            raise TrainError("fine-tuning a mixture-of-experts model needs every expert in GPU memory, but this load "
                             "streams them from the file into a cache (the GPU memory budget is smaller than the "
                             "model): raise the budget (--gpu-memory, --expert-cache) or use a larger GPU")
        if engine.adapters is not None:
            raise TrainError("a LoRA adapter is applied to this model: load it without the adapter to train a new one")
        if not dataset.train:
            raise TrainError("the training data has no usable example")
        self.engine, self.dev, self.cfg, self.config, self.data = engine, engine.dev, cfg, config, dataset
        self.source = engine.gguf.source
        seqs = dataset.train + dataset.val
        self.T = max(len(s.ids) for s in seqs)              # the longest sequence (<= seq_len) sizes the buffers
        if self.T > config.seq_len:
            raise TrainError(f"a sequence has {self.T} tokens, more than the sequence length {config.seq_len}")
        self.total_steps = config.steps or max(1, math.ceil(config.epochs * len(dataset.train) / config.batch))
        warmup = config.warmup if config.warmup is not None else self.total_steps // 10
        self.schedule = WarmupCosine(config.lr, min(warmup, self.total_steps), self.total_steps)
        try:
            specs = lora_targets(cfg, bind(cfg, engine.gguf.tensors), config.targets)
        except ValueError as e:
            raise TrainError(str(e)) from e
        layout = runner.layout
        try:
            self.params = LoraParams(self.dev, specs, config.rank, config.alpha)
            self.best = self.dev.buffer(4 * self.params.n_floats, label="lora best params")
            self.state = TrainState(self.dev, cfg, layout, self.T, min(VOCAB_CHUNK, -(-cfg.vocab_size // 256) * 256))
            self.opt = GpuAdamW(self.dev, self.params.n_floats, weight_decay=config.weight_decay)
            self.losses = self.dev.buffer(4 * MAX_LOSS_SLOTS, label="sequence losses")
            self.params.attach(layout)
            self.model = LoraBackward(self.dev, cfg, layout, self.state, self.params)
            self._record_plans()
        except GPUError as e:
            self.close()
            raise TrainError(f"the GPU could not hold the training buffers ({e}): lower the sequence length, "
                             "the rank or the targets") from e
        self.step, self.log = 0, []
        self.best_val_loss, self.best_step = math.inf, 0
        self.epoch, self.position = 0, 0                    # where the data order stands
        self.order = epoch_order(len(dataset.train), config.seed, 0)
        self.elapsed_s = 0.0
        if checkpoint is None:
            self.params.initialize(config.seed)
        else:
            self._resume(checkpoint)
        self.dev.submit(self._copy_best)

    def _record_plans(self) -> None:
        dev, t = self.dev, self.state
        self._forward, self._backward = dev.plan(), dev.plan()
        self.model.forward(self._forward)
        self.model.backward(self._backward)
        self._keep_loss = []
        for i in range(MAX_LOSS_SLOTS):
            self._keep_loss.append(dev.plan().copy(t.loss, 0, self.losses, 4 * i, 4))
        self._update = self.opt.record(dev.plan(), self.params.params, self.params.grads, zero_grads=True)
        self._copy_best = dev.plan().copy(self.params.params, 0, self.best, 0, 4 * self.params.n_floats)

    @property
    def done(self) -> bool:
        return self.step >= self.total_steps

    # -- the loop -------------------------------------------------------------------------------------

    def _next_batch(self) -> list:
        out = []
        while len(out) < self.config.batch:
            if self.position >= len(self.order):
                self.epoch, self.position = self.epoch + 1, 0
                self.order = epoch_order(len(self.data.train), self.config.seed, self.epoch)
            out.append(self.data.train[self.order[self.position]])
            self.position += 1
        return out

    def _losses(self, seqs: list, backward: bool):
        """Steps: the sequences through the forward (and backward); returns their summed loss (their
        rows weighted by 1 / their targets together: the mean over those targets)."""
        n_targets = sum(s.n_targets for s in seqs)
        total = 0.0
        for g0 in range(0, len(seqs), MAX_LOSS_SLOTS):
            group = seqs[g0:g0 + MAX_LOSS_SLOTS]
            for i, s in enumerate(group):
                self.state.write_sequence(s.ids, s.mask, n_targets, self.source)
                self.dev.submit(self._forward)
                if backward:
                    self.dev.submit(self._backward)
                self.dev.submit(self._keep_loss[i])
            data = yield ReadGpu(self.losses, 0, 4 * len(group))
            total += math.fsum(array("f", data))
        return total

    def _update_steps(self):
        """Steps of one update; returns its StepReport."""
        if self.done:
            raise TrainError(f"training is done ({self.total_steps} updates)")
        t0 = time.perf_counter()
        batch = self._next_batch()
        loss = yield from self._losses(batch, backward=True)
        lr = self.schedule.lr(self.step)
        self.opt.prepare(self.step, lr, self.config.max_grad_norm or None)
        self.dev.submit(self._update)
        norm = array("f", (yield ReadGpu(self.opt.norm_buffer, 0, 8)))
        if not math.isfinite(loss) or not math.isfinite(norm[0]):
            raise TrainError(f"training diverged at update {self.step + 1} (loss {loss}, gradient norm {norm[0]}): "
                             "lower the learning rate")
        train_s = time.perf_counter() - t0
        self.step += 1
        val_loss = None
        if self.data.val and (self.step % self.config.val_every == 0 or self.done):
            val_loss = yield from self._losses(self.data.val, backward=False)
            if val_loss < self.best_val_loss:
                self.best_val_loss, self.best_step = val_loss, self.step
                self.dev.submit(self._copy_best)
        elif not self.data.val:
            self.dev.submit(self._copy_best)         # no held-out data: the latest parameters are the best
            self.best_step = self.step
        step_s = time.perf_counter() - t0
        self.elapsed_s += step_s
        tokens = sum(len(s.ids) for s in batch)
        report = StepReport(self.step, self.total_steps, loss, val_loss, lr, float(norm[0]), tokens / train_s,
                            self.elapsed_s, self.elapsed_s / self.step * (self.total_steps - self.step))
        self.log.append({"step": self.step, "loss": loss, "val_loss": val_loss, "lr": lr,
                         "grad_norm": report.grad_norm, "tokens_per_s": report.tokens_per_s})
        return report

    def train_step(self) -> StepReport:
        return drive(self._update_steps(), handler(self.dev, self.source))

    async def train_step_async(self) -> StepReport:
        return await drive_async(self._update_steps(), handler(self.dev, self.source, asynchronous=True))

    def validate(self) -> float | None:
        """The held-out split's mean loss with the current parameters (None: no held-out data)."""
        if not self.data.val:
            return None
        return drive(self._losses(self.data.val, backward=False), handler(self.dev, self.source))

    # -- results ----------------------------------------------------------------------------------------

    def _read(self, buf, asynchronous: bool = False):
        return (self.dev.read_async if asynchronous else self.dev.read)(buf, 0, 4 * self.params.n_floats)

    def _adapter(self, data: bytes) -> bytes:
        name = self.engine.gguf.metadata.get("general.name")
        return adapter_gguf(self.params.adapter_pairs(data), self.config.rank, self.config.alpha,
                            self.engine.gguf.architecture, f"LoRA for {name}" if name else None)

    def adapter_gguf(self, best: bool = True) -> bytes:
        """llama.cpp's LoRA adapter GGUF of the best parameters (by validation loss; the latest without
        held-out data), or of the latest with best=False."""
        return self._adapter(self._read(self.best if best else self.params.params))

    async def adapter_gguf_async(self, best: bool = True) -> bytes:
        return self._adapter(await self._read(self.best if best else self.params.params, asynchronous=True))

    def _checkpoint(self, params: bytes, m: bytes, v: bytes) -> bytes:
        opt = AdamW(self.params.split(params), betas=self.opt.betas, eps=self.opt.eps,
                    weight_decay=self.opt.weight_decay)
        opt.m, opt.v, opt.t = self.params.split(m), self.params.split(v), self.step
        meta = {"model": self.engine.gguf.metadata.get("general.name", ""), "config": asdict(self.config),
                "best_val_loss": self.best_val_loss if math.isfinite(self.best_val_loss) else None,
                "best_step": self.best_step}
        data = {"seed": self.config.seed, "epoch": self.epoch, "position": self.position}
        return b"".join(checkpoint_parts(self.step, opt, self.schedule, None, data, meta, self.log))

    def checkpoint_bytes(self) -> bytes:
        """A resumable checkpoint (pyapp.train.checkpoint) of the latest parameters and the optimizer."""
        m, v, _ = self.opt.state_bytes()
        return self._checkpoint(self._read(self.params.params), m, v)

    async def checkpoint_bytes_async(self) -> bytes:
        m, v, _ = await self.opt.state_bytes_async()
        return self._checkpoint(await self._read(self.params.params, asynchronous=True), m, v)

    def _resume(self, ck: Checkpoint) -> None:
        saved = ck.meta.get("config", {})
        for key in ("rank", "alpha", "targets"):
            if key in saved and saved[key] != getattr(self.config, key):
                raise TrainError(f"the checkpoint was made with {key} {saved[key]!r}, not {getattr(self.config, key)!r}")
        try:
            self.params.load(ck.params)
            self.opt.load_state(self.params.join(ck.optimizer.m), self.params.join(ck.optimizer.v), ck.step)
        except (ValueError, KeyError) as e:
            raise TrainError(f"the checkpoint does not fit this model and settings: {e}") from e
        self.step, self.log = ck.step, list(ck.log)
        self.epoch, self.position = int(ck.data.get("epoch", 0)), int(ck.data.get("position", 0))
        self.order = epoch_order(len(self.data.train), self.config.seed, self.epoch)
        best = ck.meta.get("best_val_loss")
        self.best_val_loss = best if best is not None else math.inf
        self.best_step = int(ck.meta.get("best_step", ck.step))

    def close(self) -> None:
        """Take the trained deltas off the engine's layout (its later plans run the base model)."""
        if getattr(self, "params", None) is not None:
            self.params.detach()
