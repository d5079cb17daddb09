"""pyapp.train.checkpoint: a run saved at step k and resumed ends bit for bit where the uninterrupted
run ends (parameters, both moments, step, schedule, RNG, data order), on a toy problem trained with
pyapp.train.optim; damaged files are refused; a failed write keeps the previous checkpoint."""

from __future__ import annotations

import random
from array import array

import pytest

from pyapp.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from pyapp.train.data import epoch_order
from pyapp.train.optim import AdamW, WarmupCosine, clip_grad_norm

N_EXAMPLES, BATCH, STEPS, SEED = 7, 3, 12, 5
SIZES = {"blk.0.q.lora_a": 6, "blk.0.q.lora_b": 5}


def targets():
    r = random.Random(99)
    return [{n: [r.uniform(-1, 1) for _ in range(c)] for n, c in SIZES.items()} for _ in range(N_EXAMPLES)]


def fresh():
    r = random.Random(1)
    params = {n: array("f", [r.uniform(-1, 1) for _ in range(c)]) for n, c in SIZES.items()}
    return (AdamW(params, weight_decay=0.1), WarmupCosine(1e-1, 3, STEPS, 0.1), random.Random(SEED),
            {"seed": SEED, "epoch": 0, "position": 0})


def train(opt, sched, rng, data, start, stop, examples):
    """Steps start..stop-1 of a toy run: the squared distance to a batch of examples taken in
    epoch_order, with noise from the run's RNG (as dropout would draw), clipped, AdamW."""
    for step in range(start, stop):
        batch = []
        for _ in range(BATCH):
            if data["position"] == N_EXAMPLES:
                data["epoch"], data["position"] = data["epoch"] + 1, 0
            batch.append(epoch_order(N_EXAMPLES, data["seed"], data["epoch"])[data["position"]])
            data["position"] += 1
        grads = {n: array("f", [sum(2 * (p[i] - examples[e][n][i] + rng.gauss(0, 0.1)) for e in batch) / BATCH
                                for i in range(len(p))]) for n, p in opt.params.items()}
        clip_grad_norm(grads, 1.0)
        opt.step(grads, sched.lr(step))


def test_resume_continues_identically(tmp_path):
    examples = targets()
    opt, sched, rng, data = fresh()
    train(opt, sched, rng, data, 0, STEPS, examples)

    opt2, sched2, rng2, data2 = fresh()
    k = 5
    train(opt2, sched2, rng2, data2, 0, k, examples)
    path = tmp_path / "run.ckpt"
    log = [{"step": 4, "loss": 0.25, "val_loss": None}]
    size = save_checkpoint(path, k, opt2, sched2, rng2, data2, meta={"rank": 4, "targets": "q"}, log=log)
    assert size == path.stat().st_size and not (tmp_path / "run.ckpt.tmp").exists()
    del opt2, sched2, rng2, data2

    ck = load_checkpoint(path)
    assert (ck.step, ck.meta, ck.log, ck.schedule) == (k, {"rank": 4, "targets": "q"}, log, sched)
    assert ck.optimizer.t == k and ck.data == {"seed": SEED, "epoch": 2, "position": 1}
    assert (ck.optimizer.b1, ck.optimizer.b2, ck.optimizer.eps, ck.optimizer.weight_decay) == (0.9, 0.999, 1e-8, 0.1)
    train(ck.optimizer, ck.schedule, ck.rng, ck.data, ck.step, STEPS, examples)
    for n in SIZES:
        assert ck.params[n] == opt.params[n]          # array('f') equality: every value bit for bit
        assert ck.optimizer.m[n] == opt.m[n] and ck.optimizer.v[n] == opt.v[n]
    assert ck.rng.random() == rng.random() and ck.data == data and ck.optimizer.t == opt.t == STEPS
    assert max(abs(x) for x in opt.m["blk.0.q.lora_a"]) > 0      # the run did train


def test_damaged_files_are_refused(tmp_path):
    opt, sched, rng, data = fresh()
    path = tmp_path / "run.ckpt"
    save_checkpoint(path, 0, opt, sched, rng, data)
    good = path.read_bytes()
    cases = {
        "truncated": (good[:-4], "truncated or damaged"),
        "flipped byte": (good[:-9] + bytes([good[-9] ^ 1]) + good[-8:], "does not match its checksum"),
        "not a checkpoint": (b"GGUF" + good[4:], "not a training checkpoint"),
        "other version": (good[:8] + b"\x02" + good[9:], "version 2 checkpoint"),
    }
    for case, (raw, message) in cases.items():
        path.write_bytes(raw)
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(path)
    path.write_bytes(good)
    ck = load_checkpoint(path)
    assert ck.schedule == sched and ck.rng.getstate() == rng.getstate() and ck.params == opt.params


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    opt, sched, rng, data = fresh()
    path = tmp_path / "run.ckpt"
    save_checkpoint(path, 3, opt, sched, rng, data)
    before = path.read_bytes()

    def fail(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr("pyapp.train.files.os.fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, 4, opt, sched, rng, data)
    assert path.read_bytes() == before and not (tmp_path / "run.ckpt.tmp").exists()
    assert load_checkpoint(path).step == 3
